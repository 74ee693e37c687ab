// Package unitjournal reads the journal lines of one unit's run: what the
// daemon copies into a failed operation's message and recovery into its
// report of a failed unit on the Machine. One reader, so that both say
// the same thing about a failure and both survive journald's quirks (see
// Query.StartedAt).
package unitjournal

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"time"
)

// Query selects the journal lines of one unit.
type Query struct {
	Unit string
	// Invocation limits the lines to one run of the unit when not empty.
	Invocation string
	// StartedAt is when that run began, when known. journalctl then
	// selects the unit's lines since then instead of matching the
	// invocation ID: journald attaches _SYSTEMD_INVOCATION_ID to a line
	// of the unit's stdout only if it can still read it from the unit's
	// cgroup, which a short-lived process may have left already (seen
	// under real systemd in tests/system: a failed oneshot's own lines
	// carried _SYSTEMD_UNIT but no invocation ID, and the report held
	// only systemd's lines about the unit).
	StartedAt time.Time
	// Since limits the lines to those logged at or after it when not zero.
	Since time.Time
	// Lines is how many of the last lines to return.
	Lines int
	// PID, when not 0, is the run's main process: its lines are the
	// unit's too. journald attributes a line to its unit from the
	// sender's cgroup, which a process that has exited by the time
	// journald reads its last line has left (the line then has _PID and
	// no _SYSTEMD_UNIT); _PID is the kernel's and always there.
	PID int
}

// journalOutputWait bounds how long journalctl waits for a finished
// unit's own output to reach the journal. systemd's messages about the unit
// ("Failed with result ...") come over the native protocol and can be in
// the journal before journald has read the last lines the unit's process
// wrote to its stdout stream. `journalctl --sync` is the barrier journald
// offers (it answers once what is queued has been processed); this bound
// is the fallback for a journald that refuses it or a unit that printed
// nothing, short enough not to delay the report of a failure noticeably.
const journalOutputWait = 2 * time.Second

// journalOutputPoll is the step of that wait.
const journalOutputPoll = 100 * time.Millisecond

// Read returns the journal lines q selects, oldest first. It reads the
// journal through journalctl: the journal's own C
// library (sdjournal) needs cgo, and the agent is built CGO_ENABLED=0.
func Read(ctx context.Context, q Query) ([]string, error) {
	if !q.StartedAt.IsZero() {
		// One run of the unit: every line about it or from it since it
		// began (see JournalQuery.StartedAt), once its own output is in.
		awaitUnitOutput(ctx, q.Unit, q.PID, q.StartedAt)
		q.Since, q.Invocation = q.StartedAt, ""
	}
	args := []string{"--no-pager", "-q", "-o", "cat"}
	if q.Since.IsZero() {
		args = append(args, "-n", fmt.Sprint(q.Lines))
	} else {
		// No -n with --since: journalctl (252) seeks to the date and
		// shows the first N lines from there, not the last (a repave
		// that rolled back was reported with its first 20 lines, which
		// end long before the rollback). The last N are kept below.
		// To the microsecond: whole seconds would take in the lines of a
		// run that ended earlier in the same second.
		args = append(args, "--since", journalTime(q.Since))
	}
	if q.Invocation != "" {
		// The unit's own output carries _SYSTEMD_INVOCATION_ID; systemd's
		// messages about the unit ("Failed with result ...") carry
		// INVOCATION_ID. journalctl 252 has no --invocation.
		args = append(args, "_SYSTEMD_INVOCATION_ID="+q.Invocation, "+", "INVOCATION_ID="+q.Invocation)
	} else if q.PID > 0 {
		// What -u matches for a system unit, or the run's main process.
		args = append(args, "_SYSTEMD_UNIT="+q.Unit, "+", "UNIT="+q.Unit, "+", "OBJECT_SYSTEMD_UNIT="+q.Unit, "+", "_PID="+fmt.Sprint(q.PID))
	} else {
		args = append(args, "-u", q.Unit)
	}
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "journalctl", args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return nil, fmt.Errorf("journalctl %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
		}
		return nil, fmt.Errorf("journalctl: %w", err)
	}
	text := strings.TrimRight(string(out), "\n")
	if text == "" {
		return nil, nil
	}
	lines := strings.Split(text, "\n")
	if q.Lines > 0 && len(lines) > q.Lines {
		lines = lines[len(lines)-q.Lines:]
	}
	return lines, nil
}

// journalTime is a --since argument to the microsecond.
func journalTime(t time.Time) string {
	return fmt.Sprintf("@%d.%06d", t.Unix(), t.Nanosecond()/1000)
}

// awaitUnitOutput returns once the journal holds a line that the unit's own
// processes wrote since since (_SYSTEMD_UNIT: systemd's lines about the
// unit carry UNIT= instead), or after journalOutputWait. Errors are not
// reported here: the read that follows reports its own.
func awaitUnitOutput(ctx context.Context, unit string, pid int, since time.Time) {
	// Best effort: without the privilege to ask, the poll below still
	// bounds the wait.
	_ = exec.CommandContext(ctx, "journalctl", "--sync").Run()
	deadline := time.Now().Add(journalOutputWait)
	for {
		match := []string{"--no-pager", "-q", "-o", "cat", "-n", "1", "--since", journalTime(since), "_SYSTEMD_UNIT=" + unit}
		if pid > 0 {
			match = append(match, "+", "_PID="+fmt.Sprint(pid))
		}
		out, err := exec.CommandContext(ctx, "journalctl", match...).Output()
		if err != nil || len(bytes.TrimSpace(out)) > 0 || !time.Now().Before(deadline) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(journalOutputPoll):
		}
	}
}
