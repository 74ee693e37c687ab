// Package unitjournal reads the journal lines of one unit's run: what the
// daemon copies into a failed operation's message and recovery into its
// report of a failed unit on the Machine. One reader, so that both say
// the same thing about a failure and both survive journald's quirks (see
// Query.StartedAt).
package unitjournal

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// Query selects the journal lines of one unit.
type Query struct {
	Unit string
	// Invocation limits the lines to one run of the unit when not empty.
	Invocation string
	// StartedAt is when that run began, when known (the unit's
	// InactiveExitTimestamp). The run's lines are then read from a little
	// before it (startSkew) and kept by what they carry rather than by a
	// journalctl match on the invocation ID: journald attaches
	// _SYSTEMD_INVOCATION_ID to a line of the unit's stdout only if it can
	// still read it from the unit's cgroup, which a short-lived process
	// may have left already (its lines then carry _SYSTEMD_UNIT but no
	// invocation ID), and PID 1 takes the timestamp after it forked the
	// process, whose first lines journald may have stamped already: a
	// match on the ID or on the time alone would keep only systemd's own
	// lines about the unit
	// (TestJournalQueryOfARunKeepsItsOwnLinesAndNoOtherRuns).
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

// journalOutputWait bounds how long Read waits for a finished unit's own
// output to reach the journal. systemd's messages about the unit ("Failed
// with result ...") come over the native protocol and can be in the
// journal before journald has read the last lines the unit's process
// wrote to its stdout stream. `journalctl --sync` is the barrier journald
// offers (it answers once what is queued has been processed); this bound
// is the fallback for a journald that refuses it or a unit that printed
// nothing, short enough not to delay the report of a failure noticeably.
const journalOutputWait = 2 * time.Second

// journalOutputPoll is the step of that wait.
const journalOutputPoll = 100 * time.Millisecond

// startSkew is how much earlier than StartedAt a run's own first lines
// may be stamped (see Query.StartedAt); lines of the window that belong
// to another run are told apart by their invocation ID, their process
// or, lacking both, their time.
const startSkew = 2 * time.Second

// Read returns the journal lines q selects, oldest first. It reads the
// journal through journalctl: the journal's own C
// library (sdjournal) needs cgo, and the agent is built CGO_ENABLED=0.
func Read(ctx context.Context, q Query) ([]string, error) {
	if !q.StartedAt.IsZero() {
		return readRun(ctx, q)
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
	} else {
		args = append(args, "-u", q.Unit)
	}
	out, err := journalctl(ctx, args)
	if err != nil {
		return nil, err
	}
	text := strings.TrimRight(string(out), "\n")
	if text == "" {
		return nil, nil
	}
	return last(strings.Split(text, "\n"), q.Lines), nil
}

func journalctl(ctx context.Context, args []string) ([]byte, error) {
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
	return out, nil
}

// last keeps the last n of lines (all when n <= 0).
func last(lines []string, n int) []string {
	if n > 0 && len(lines) > n {
		return lines[len(lines)-n:]
	}
	return lines
}

// entry is one journal entry of a run's window, as journalctl -o json
// gives it.
type entry struct {
	message string
	// unit is _SYSTEMD_UNIT: the unit of the process that logged it.
	unit string
	// invocation is _SYSTEMD_INVOCATION_ID (the logging process's run) or,
	// on systemd's own messages about the unit, INVOCATION_ID.
	invocation string
	pid        int
	at         time.Time
}

// own reports whether e was written by q's unit's processes (not systemd
// about it).
func (e entry) own(q Query) bool {
	return e.unit == q.Unit || (q.PID > 0 && e.pid == q.PID)
}

// of reports whether e belongs to q's run: its invocation ID when it
// carries one, else its process, else its time.
func (e entry) of(q Query) bool {
	if e.invocation != "" && q.Invocation != "" {
		return e.invocation == q.Invocation
	}
	if q.PID > 0 && e.pid == q.PID {
		return true
	}
	return !e.at.Before(q.StartedAt)
}

// readRun reads one run of a unit (q.StartedAt set), once its own output
// is in (bounded by journalOutputWait).
func readRun(ctx context.Context, q Query) ([]string, error) {
	// Best effort: without the privilege to ask, the poll below still
	// bounds the wait.
	_ = exec.CommandContext(ctx, "journalctl", "--sync").Run()
	deadline := time.Now().Add(journalOutputWait)
	for {
		es, err := runEntries(ctx, q)
		if err != nil {
			return nil, err
		}
		done := !time.Now().Before(deadline)
		for _, e := range es {
			done = done || e.own(q)
		}
		if done {
			lines := make([]string, 0, len(es))
			for _, e := range es {
				lines = append(lines, e.message)
			}
			if len(lines) == 0 {
				return nil, nil
			}
			return last(lines, q.Lines), nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(journalOutputPoll):
		}
	}
}

// runEntries returns the entries of q's run, oldest first: everything
// about or from the unit (what -u matches for a system unit) and from the
// run's main process, from startSkew before the run began, less what
// belongs to another run.
func runEntries(ctx context.Context, q Query) ([]entry, error) {
	args := []string{"--no-pager", "-q", "-o", "json",
		"--output-fields=MESSAGE,_SYSTEMD_UNIT,_SYSTEMD_INVOCATION_ID,INVOCATION_ID,_PID",
		"--since", journalTime(q.StartedAt.Add(-startSkew)),
		"_SYSTEMD_UNIT=" + q.Unit, "+", "UNIT=" + q.Unit, "+", "OBJECT_SYSTEMD_UNIT=" + q.Unit}
	if q.PID > 0 {
		args = append(args, "+", "_PID="+strconv.Itoa(q.PID))
	}
	out, err := journalctl(ctx, args)
	if err != nil {
		return nil, err
	}
	var es []entry
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		e, ok := parseEntry(line)
		if ok && e.of(q) {
			es = append(es, e)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("journalctl -o json: %w", err)
	}
	return es, nil
}

// parseEntry decodes one line of journalctl -o json. A field is a string,
// an array of bytes (not valid UTF-8), or null (too large to show); ok is
// false for a line that is not an entry or has no message to show.
func parseEntry(line []byte) (entry, bool) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(line, &raw); err != nil {
		return entry{}, false
	}
	field := func(name string) string {
		v, ok := raw[name]
		if !ok {
			return ""
		}
		var s string
		if json.Unmarshal(v, &s) == nil {
			return s
		}
		var b []byte
		var ints []int
		if json.Unmarshal(v, &ints) == nil {
			for _, i := range ints {
				b = append(b, byte(i))
			}
			return string(b)
		}
		return ""
	}
	e := entry{message: field("MESSAGE"), unit: field("_SYSTEMD_UNIT"), invocation: field("_SYSTEMD_INVOCATION_ID")}
	if e.invocation == "" {
		e.invocation = field("INVOCATION_ID")
	}
	e.pid, _ = strconv.Atoi(field("_PID"))
	if us, err := strconv.ParseInt(field("__REALTIME_TIMESTAMP"), 10, 64); err == nil {
		e.at = time.UnixMicro(us)
	}
	if _, ok := raw["MESSAGE"]; !ok {
		return entry{}, false
	}
	return e, true
}

// journalTime is a --since argument to the microsecond.
func journalTime(t time.Time) string {
	return fmt.Sprintf("@%d.%06d", t.Unix(), t.Nanosecond()/1000)
}
