package system_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/reprovision"
	"unbounded-cloud.io/agent/lib/unitnames"
)

// TestIsolationChangeByReprovisionCrashesAndPowerCutsConverge: the
// reprovision method of an isolation change (forced: both modes could
// share the host) on one first-booted host of mode nspawn that can also
// run mode none.
//
//  1. A revoked bootstrap token fails the change before anything is
//     staged or reset: the node runs on in mode nspawn.
//  2. nspawn -> none killed at every crash point of the method in turn:
//     the isolation unit's (after the lock; with the handoff staged but
//     its unit not started), then the handoff's own and one inside each
//     of the reset and the bootstrap it drives. Each kill is followed by
//     what an operator or systemd does anyway (the isolation unit
//     started again; the handoff's Restart=on-failure), and the change
//     goes on from its journals to mode none, Succeeded.
//  3. The host loses power at three points of a reprovision, each time
//     in the other direction: with the handoff staged and its unit not
//     started; with the host reset and no node at all; in the
//     bootstrap of the new mode, its node started but not yet recorded.
//     The host boots the same state, the generator pulls in the handoff
//     and nothing else, and the change ends Succeeded in the new mode:
//     exactly one mode, never two node stacks.
//
// Every time: the Node Ready under the same name, nothing of the old mode
// left, the daemon reporting the change and removing the handoff, the
// Deployment's pod started again.
func TestIsolationChangeByReprovisionCrashesAndPowerCutsConverge(t *testing.T) {
	defer scenario(t)()
	f, ns := isolationHost(t, firstBootOptions{alsoNone: true})
	if t.Failed() {
		return
	}
	f.waitPodRunning(t, ns, time.Minute)
	f.reprovisionDropIns(t, "", "--ready-timeout=2m")

	// 1. A revoked token: nothing staged, nothing reset.
	f.wantRevokedTokenRefusesTheChange(t, "none")
	if t.Failed() {
		return
	}

	// 2. Every crash point of the method, in the order a change reaches
	// them.
	begin := time.Now()
	for _, point := range []string{"isolation/after-lock", "isolation/after-handoff-staged"} {
		setCrashPoint(t, f, isolationUnit, point)
		_, p := f.changeIsolation(t)
		wantCrashedAt(t, f, isolationUnit, point, p)
	}
	if j, err := reprovision.ReadJournal(f.paths); err != nil || !j.Live() || j.Attempts != 0 {
		t.Fatalf("after the kill at isolation/after-handoff-staged: handoff %+v (%v), want staged and not begun", j, err)
	}
	setCrashPoint(t, f, isolationUnit, "")
	// The handoff's points: its unit, killed, is started again by
	// systemd (Restart=on-failure) and dies at the same point until the
	// point moves on; each start after a daemon-reload runs to the next.
	points := []string{"reset/after-node", "reprovision/after-reset", "bootstrap/after-slot", "reprovision/after-bootstrap"}
	// Time for the test to move the point on before systemd starts the
	// killed unit again (the unit's own RestartSec is a second or two):
	// a resumed run does not pass a point whose step it finished
	// (bootstrap/after-slot), and ran to its end past the next point,
	// not set yet, on a loaded CI machine.
	restartConf := "/etc/systemd/system/" + unitnames.Reprovision + ".d/restart.conf"
	f.m.WriteFile(restartConf, []byte("[Service]\nRestartSec=10s\n"), 0o644)
	cursor := journalCursor(t, f)
	setCrashPoint(t, f, unitnames.Reprovision, points[0])
	// The isolation unit, started again, finds the staged handoff and
	// starts its unit.
	if _, p := f.changeIsolation(t); p["Result"] != "success" {
		t.Fatalf("the isolation unit did not start the staged handoff: %v\n%s", p, f.lastRunJournal(t, p))
	}
	for i, point := range points {
		if i > 0 {
			cursor = journalCursor(t, f)
			setCrashPoint(t, f, unitnames.Reprovision, point)
		}
		f.waitCrashLine(t, cursor, point, 8*time.Minute)
	}
	os.Remove(filepath.Join(f.m.Root(), restartConf))
	setCrashPoint(t, f, unitnames.Reprovision, "")
	h := f.waitHandoffReported(t, "none", v1alpha3.IsolationChangeSucceeded)
	t.Logf("reprovision nspawn -> none killed at %d points, converged %v after the first kill: %s", 2+len(points), time.Since(begin).Round(time.Millisecond), h.Message)
	f.wantMode(t, "none", "kube1")
	f.waitPodStartedSince(t, ns, begin)
	if t.Failed() {
		return
	}

	// 3. Power cuts.
	for _, c := range []struct{ mode, unit, point string }{
		{"nspawn", isolationUnit, "isolation/after-handoff-staged"},
		{"none", unitnames.Reprovision, "reprovision/after-reset"},
		{"nspawn", unitnames.Reprovision, "bootstrap/after-start"},
	} {
		f.setMode(t, c.mode)
		cursor := journalCursor(t, f)
		setCrashPoint(t, f, c.unit, c.point)
		_, p := f.changeIsolation(t)
		if c.unit == isolationUnit {
			wantCrashedAt(t, f, isolationUnit, c.point, p)
		} else {
			if p["Result"] != "success" {
				t.Fatalf("the isolation unit did not hand off: %v\n%s", p, f.lastRunJournal(t, p))
			}
			f.waitCrashLine(t, cursor, c.point, 8*time.Minute)
		}
		f.m.PowerCut()
		setCrashPoint(t, f, c.unit, "")
		begin := time.Now()
		f.m.Start()
		// Only the handoff runs at boot: a bootstrap of the config on
		// disk would build a second node stack, which the reset would
		// remove.
		if s := isActive(f.m, bootstrapUnit); s == "active" || s == "activating" {
			t.Errorf("power cut at %s: %s is %s at boot while the handoff runs", c.point, bootstrapUnit, s)
		}
		h := f.waitHandoffReported(t, c.mode, v1alpha3.IsolationChangeSucceeded)
		t.Logf("power cut at %s: the reprovision to %s ended %v after the boot: %s", c.point, c.mode, time.Since(begin).Round(time.Millisecond), h.Message)
		f.wantMode(t, c.mode, "kube1")
		f.waitPodStartedSince(t, ns, begin)
		if t.Failed() {
			return
		}
	}
}

// waitCrashLine waits until a process of the host said, after cursor,
// that it reached crash point point (the line crashpoint writes before
// its SIGKILL). By the whole journal, not the unit's: journald often
// cannot attribute a line of a process gone by the time it reads it.
func (f *firstBoot) waitCrashLine(t *testing.T, cursor, point string, timeout time.Duration) {
	t.Helper()
	begin := time.Now()
	f.waitJournalLine(t, "crash point "+point+" reached", timeout, "--after-cursor", cursor, "--grep", "crash point "+point+" reached")
	t.Logf("killed at %s after %v", point, time.Since(begin).Round(time.Millisecond))
}

// crashLineLag bounds how long journald may take to store a line a
// process wrote just before it was killed: it reads the stream when it
// gets to it, which on a loaded host is after systemd saw the unit fail.
const crashLineLag = 30 * time.Second

// waitJournalLine waits until the host's journal (narrowed by match:
// journalctl's arguments) has a line containing line, and fails with
// what it had at the end of timeout. The lines a unit writes just before
// it ends reach journald through a stream it reads on its own time: a
// single look right after the unit's end may miss them. It follows the
// journal (harness.Machine.WaitJournal): it ends on the line.
func (f *firstBoot) waitJournalLine(t *testing.T, line string, timeout time.Duration, match ...string) {
	t.Helper()
	if _, err := f.m.WaitJournal(timeout, func(l string) bool { return strings.Contains(l, line) }, match...); err != nil {
		t.Fatalf("the journal (%s) has no line %q: %v", strings.Join(match, " "), line, err)
	}
}

// waitHandoffReported waits until the reprovision handoff has ended and
// the daemon of the new node has reported it on the Machine (to mode to,
// in state st, by reprovision) and removed it; it returns the handoff's
// last journal seen.
func (f *firstBoot) waitHandoffReported(t *testing.T, to string, st v1alpha3.IsolationChangeState) *reprovision.Journal {
	t.Helper()
	var h *reprovision.Journal
	gone := false
	waitUntil(t, 10*time.Minute, "the reprovision to "+to+" ended", func(context.Context) (bool, error) {
		j, err := reprovision.ReadJournal(f.paths)
		if err == nil && j.ToMode == to {
			h = j
		}
		// The daemon removes the handoff once it reported it, which
		// may be before a look saw its end.
		gone = os.IsNotExist(err)
		return (h != nil && !h.Live()) || gone, nil
	})
	if h != nil && !h.Live() && h.State != string(st) {
		t.Fatalf("the reprovision to %s ended %s, want %s: %s", to, h.State, st, h.Message)
	}
	f.waitAgentCertificate(t)
	waitUntil(t, 2*time.Minute, "the Machine reports the reprovision to "+to+" "+string(st), func(context.Context) (bool, error) {
		ch := f.machine(t).Status.IsolationChange
		if ch != nil && ch.State == st && ch.Method == v1alpha3.IsolationChangeReprovision && string(ch.To) == to {
			if h == nil || h.Live() {
				h = &reprovision.Journal{ToMode: to, State: string(st), Message: ch.Message}
			}
			return true, nil
		}
		return false, nil
	})
	waitUntil(t, time.Minute, "the handoff removed once reported", func(context.Context) (bool, error) {
		ents, err := os.ReadDir(f.paths.ReprovisionDir())
		return os.IsNotExist(err) || (err == nil && len(ents) == 0), nil
	})
	return h
}
