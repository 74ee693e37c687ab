package system_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"unbounded-cloud.io/agent/lib/repave"
)

// repaveChain is every crash point a blue/green repave (modes nspawn and
// container: lib/modes/bluegreen) passes, in the order it reaches them:
// lib/repave's, with the mode's and the Fence hook's inside the switch.
func repaveChain() []string {
	var out []string
	for _, p := range repave.CrashPoints {
		if p == "repave/after-"+repave.StepSwitch {
			out = append(out, "repave/after-new-built", "repave/after-old-stopped", "repave/after-network-cleaned",
				"repave/after-node-deleted", "repave/after-fence", "repave/after-new-started", "repave/after-healthy")
		}
		out = append(out, p)
	}
	return out
}

// crashRepave starts the repave with the crash point set and checks it
// was killed there. The crash line is looked up by the process's syslog
// identifier, which journald keeps per stream: a line written just before
// the SIGKILL often lacks the unit's fields (journald reads them from the
// cgroup, gone by then), so the unit's own journal may not show it.
func crashRepave(t *testing.T, f *firstBoot, point string) {
	t.Helper()
	begin := time.Now()
	setCrashPoint(t, f, repaveService, point)
	f.m.Systemctl("reset-failed", repaveService)
	cursor := journalCursor(t, f)
	if out, err := f.m.Systemctl("start", "--no-block", repaveService); err != nil {
		t.Fatalf("start %s: %v\n%s", repaveService, err, out)
	}
	p := waitUnitDone(t, f, repaveService, cursor, 8*time.Minute)
	if p["ExecMainCode"] != "2" || p["ExecMainStatus"] != "9" || p["ActiveState"] != "failed" {
		t.Fatalf("%s with crash point %s: %v, want killed by SIGKILL\n%s", repaveService, point, p, f.m.Journal(repaveService))
	}
	f.waitJournalLine(t, "crash point "+point+" reached", crashLineLag, "-t", "repave", "--after-cursor", cursor)
	t.Logf("%s crashed at %s after %v", repaveService, point, time.Since(begin).Round(time.Millisecond))
}

// crashRepaveAtEveryPoint runs one blue/green repave of f killed at
// every crash point in turn, each start resuming the one before from its
// journal and going on to the next point, then a start without a crash
// point, which must succeed.
func crashRepaveAtEveryPoint(t *testing.T, f *firstBoot) {
	t.Helper()
	begin := time.Now()
	for _, point := range repaveChain() {
		crashRepave(t, f, point)
	}
	runToSuccess(t, f, repaveService, 8*time.Minute)
	t.Logf("repave crashed at %d points then a clean run: %v", len(repaveChain()), time.Since(begin).Round(time.Millisecond))
}

// TestRepaveCrashAtEveryPointThenPowerCutsConverge: (1) one repave
// (kube1 -> kube2) killed at every crash point in turn, each start
// resuming the one before from its journal and going on to the next
// point, then a start without a crash point: the host converges to kube2,
// Ready, the pod Running. (2) Three power cuts of the whole host (every
// process SIGKILLed, no shutdown) in a repave, at a point where the old
// node still serves (after-build), between the stacks (after-old-stopped)
// and with two applied records (after-record): the host boots the same
// state, the generator resumes the repave, and it ends with exactly one
// slot, healthy, and one consistent applied config.
func TestRepaveCrashAtEveryPointThenPowerCutsConverge(t *testing.T) {
	defer scenario(t)()
	f := newFirstBoot(t, firstBootOptions{prepared: true})
	ns := f.bootNode(t)

	// (1) Every crash point of one repave.
	ref2 := f.setNodeImage(t, "bookworm-2")
	crashRepaveAtEveryPoint(t, f)
	f.wantSlot(t, "kube2", ref2)
	waitUntil(t, 3*time.Minute, "Node Ready", f.nodeReady)
	f.waitPodRunning(t, ns, 3*time.Minute)
	if t.Failed() {
		return
	}

	// (2) Power cuts.
	for i, c := range []struct{ point, to, tag string }{
		{"repave/after-build", "kube1", "bookworm-3"},
		{"repave/after-old-stopped", "kube2", "bookworm-4"},
		{"repave/after-record", "kube1", "bookworm-5"},
	} {
		ref := f.setNodeImage(t, c.tag)
		crashRepave(t, f, c.point)
		f.m.PowerCut()
		setCrashPoint(t, f, repaveService, "")
		begin := time.Now()
		f.m.Start()
		// The host is owned by the repave: the generator resumes it at
		// boot (in the boot transaction: Start returns once it ended),
		// and nothing else of the node starts before it.
		var j string
		waitUntil(t, 10*time.Minute, "the repave resumed at boot ended", func(context.Context) (bool, error) {
			j = f.m.Journal(repaveService)
			return strings.Contains(j, "Deactivated successfully") || strings.Contains(j, "Failed with result"), nil
		})
		if !strings.Contains(j, "Deactivated successfully") {
			t.Fatalf("power cut %d at %s: the repave resumed at boot failed:\n%s", i+1, c.point, j)
		}
		if !strings.Contains(j, "resuming the repave") {
			t.Errorf("power cut %d at %s: the repave at boot did not resume from its journal:\n%s", i+1, c.point, j)
		}
		t.Logf("power cut %d at %s: boot to the repave's end %v", i+1, c.point, time.Since(begin).Round(time.Millisecond))
		f.wantSlot(t, c.to, ref)
		waitUntil(t, 3*time.Minute, "Node Ready", func(ctx context.Context) (bool, error) { return f.nodeReady(ctx) })
		f.waitPodRunning(t, ns, 3*time.Minute)
		if t.Failed() {
			return
		}
	}
}
