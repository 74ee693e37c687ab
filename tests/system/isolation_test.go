package system_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/isolation"
	"unbounded-cloud.io/agent/lib/modes"
	"unbounded-cloud.io/agent/lib/modes/container/bundle"
	"unbounded-cloud.io/agent/lib/modes/facts"
	"unbounded-cloud.io/agent/lib/modes/none"
	"unbounded-cloud.io/agent/lib/reprovision"
	"unbounded-cloud.io/agent/lib/state"
	"unbounded-cloud.io/agent/lib/unitnames"
	"unbounded-cloud.io/agent/tests/system/nodestack"
)

// Isolation change in place (ARCHITECTURE sections 2 and 6,
// unbounded-isolation.service), on one first-booted host of mode nspawn
// that can also run mode none: a change refused for a revoked bootstrap
// token leaves the node as it was; then nspawn -> none and none ->
// nspawn, each time the Node Ready under the same name in the new mode,
// the Deployment's pod Running again, and nothing of the old mode left.

const isolationUnit = unitnames.Isolation

// modeDropIn is the operator's drop-in that changes agent.toml's mode.
const modeDropIn = hostpaths.ConfigDropinDirHost + "/60-test-mode.toml"

func TestIsolationChangeInPlaceNspawnToNoneAndBack(t *testing.T) {
	defer scenario(t)()
	f, ns := isolationHost(t, firstBootOptions{alsoNone: true})
	if t.Failed() {
		return
	}
	pod := f.waitPodRunning(t, ns, time.Minute).Name
	f.isolationDropIns(t, "")

	// 1. The bootstrap token no longer authenticates: the change fails
	// before it touches the host; the node runs on in mode nspawn.
	f.wantRevokedTokenRefusesTheChange(t, "none")
	if t.Failed() {
		return
	}

	// 2. nspawn -> none by the Machine's spec, as a fleet operator does:
	// the daemon starts the change (the spec laid over the config on
	// disk) and reports it in status.isolationChange, each transition
	// an Event. The node moves into slot kube2 on the host.
	watch := f.watchDowntime(t)
	begin := time.Now()
	f.setIsolationSpec(t, "none")
	var seen []v1alpha3.IsolationChangeState
	waitUntil(t, 10*time.Minute, "the Machine reports the isolation change to none Succeeded", func(context.Context) (bool, error) {
		ch := f.machine(t).Status.IsolationChange
		if ch == nil || ch.To != "none" || ch.Method != v1alpha3.IsolationChangeInPlace {
			return false, nil
		}
		if len(seen) == 0 || seen[len(seen)-1] != ch.State {
			seen = append(seen, ch.State)
		}
		if ch.State == v1alpha3.IsolationChangeFailed && !strings.Contains(ch.Message, "bootstrap token") {
			t.Fatalf("the isolation change failed: %s\n%s", ch.Message, f.m.Journal(isolationUnit))
		}
		return ch.State == v1alpha3.IsolationChangeSucceeded, nil
	})
	took := time.Since(begin).Round(time.Millisecond)
	down := watch(t)
	t.Logf("isolation change nspawn -> none: %v, Node not Ready or absent for %v (by the Machine's spec; states seen %v)", took, down, seen)
	m := f.machine(t)
	if ch := m.Status.IsolationChange; ch.From != "nspawn" || ch.StartTime == nil {
		t.Errorf("status.isolationChange %+v", ch)
	}
	if c := meta.FindStatusCondition(m.Status.Conditions, v1alpha3.ConditionIsolationChanged); c == nil || c.Status != metav1.ConditionTrue || c.ObservedGeneration != m.Generation {
		t.Errorf("IsolationChanged %+v, want True at generation %d", c, m.Generation)
	}
	waitUntil(t, time.Minute, "the change's Events", func(ctx context.Context) (bool, error) {
		l, err := f.env.kube.CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + f.name})
		if err != nil {
			return false, nil
		}
		got := map[string]bool{}
		for _, e := range l.Items {
			got[e.Reason] = true
		}
		return got["IsolationChangeInProgress"] && got["IsolationChangeSucceeded"] && got["IsolationChangeFailed"], nil
	})
	f.wantMode(t, "none", "kube2")
	pod = f.waitPodRunningAgain(t, ns, pod)
	if t.Failed() {
		return
	}

	// 3. none -> nspawn by hand: the config's mode, then the unit. The
	// daemon reports it and does not undo it, although the Machine's
	// spec still says none (it acts on a new spec, not on an old one).
	f.setMode(t, "nspawn")
	watch = f.watchDowntime(t)
	took, p := f.changeIsolation(t)
	if p["Result"] != "success" {
		t.Fatalf("isolation change none -> nspawn: %v\n%s", p, f.lastRunJournal(t, p))
	}
	down = watch(t)
	t.Logf("isolation change none -> nspawn: %v, Node not Ready or absent for %v (by hand)", took, down)
	f.wantMode(t, "nspawn", "kube1")
	waitUntil(t, time.Minute, "the Machine reports the change by hand", func(context.Context) (bool, error) {
		ch := f.machine(t).Status.IsolationChange
		return ch != nil && ch.To == "nspawn" && ch.State == v1alpha3.IsolationChangeSucceeded, nil
	})
	f.waitPodRunningAgain(t, ns, pod)
	if a, err := state.ReadActive(f.paths); err != nil || a.Mode != "nspawn" {
		t.Errorf("the daemon undid the change by hand: %+v (%v)", a, err)
	}
}

// setIsolationSpec sets the Machine's spec.isolation.mode.
func (f *firstBoot) setIsolationSpec(t *testing.T, mode string) {
	t.Helper()
	patch := []byte(`{"spec":{"isolation":{"mode":"` + mode + `"}}}`)
	if err := f.env.api.Patch(types.MergePatchType).Resource(v1alpha3.ResourceMachines).Name(f.name).Body(patch).Do(context.Background()).Error(); err != nil {
		t.Fatalf("Machine %s spec.isolation.mode = %s: %v", f.name, mode, err)
	}
}

// wantRevokedTokenRefusesTheChange: with a bootstrap token the API server
// no longer accepts, a change to mode (by hand, whatever the method) fails
// before it touches the host: the node runs on in slot kube1 as it was,
// with no journal, lock, new slot, mode none's versions or reprovision
// handoff left. The token is put back.
func (f *firstBoot) wantRevokedTokenRefusesTheChange(t *testing.T, mode string) {
	t.Helper()
	token, err := f.m.ReadFile("/etc/unbounded/bootstrap-token")
	if err != nil {
		t.Fatal(err)
	}
	defer f.m.WriteFile("/etc/unbounded/bootstrap-token", token, 0o600)
	f.m.WriteFile("/etc/unbounded/bootstrap-token", []byte("abcdef.0123456789abcdef\n"), 0o600)
	f.setMode(t, mode)
	_, p := f.changeIsolation(t)
	if p["Result"] == "success" {
		t.Fatalf("isolation change with a revoked token succeeded (or was handed off): %v", p)
	}
	if j := f.lastRunJournal(t, p); !strings.Contains(j, "does not accept the bootstrap token") {
		t.Errorf("the failed change does not say why:\n%s", j)
	}
	f.wantSlot(t, "kube1", "")
	for _, p := range []string{f.paths.Journal("isolation"), f.paths.Ownership(), f.paths.MachineDir("kube2"), f.paths.VersionsDir(), f.paths.ReprovisionDir()} {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("the refused change left %s (%v)", f.paths.Rel(p), err)
		}
	}
}

// watchDowntime follows the Node while an operation runs; the function
// it returns, called once the operation ended, ends the watch and gives
// the downtime as the cluster sees it: from the first look at a Node not
// Ready or absent to the first look at it Ready again (looks every
// 100 ms). It is 0 when the cluster saw none: a Node that is Ready when
// the operation ended and was never seen otherwise (a kubelet away for
// less than the node monitor's grace period, kube-testenv's 20 s, and
// back Ready at its first report, as a fast reprovision is). Unlike
// watchReadyAgain, which starts at mode none's kubelet stop, it needs no
// unit of either mode.
func (f *firstBoot) watchDowntime(t *testing.T) func(*testing.T) time.Duration {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan time.Duration, 1)
	var sawDown atomic.Bool
	go func() {
		var down time.Time
		var took time.Duration
		defer func() { done <- took }()
		for ctx.Err() == nil {
			ready, _ := f.nodeReady(ctx)
			switch {
			case !ready && down.IsZero() && ctx.Err() == nil:
				down = time.Now()
				sawDown.Store(true)
			case ready && !down.IsZero():
				took = time.Since(down).Round(time.Millisecond)
				return
			}
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	return func(t *testing.T) time.Duration {
		t.Helper()
		waitUntil(t, 3*time.Minute, "the watch saw the Node Ready again, or never down", func(ctx context.Context) (bool, error) {
			if len(done) > 0 {
				return true, nil
			}
			if sawDown.Load() {
				return false, nil
			}
			ready, _ := f.nodeReady(ctx)
			return ready, nil
		})
		cancel()
		return <-done
	}
}

// isolationHost is a first-booted host for the isolation scenarios, its
// node Ready with a pod of a Deployment in ns and the daemon's
// certificate; a failed test logs the node stack's, the change's and the
// reprovision's journals.
func isolationHost(t *testing.T, o firstBootOptions) (*firstBoot, string) {
	t.Helper()
	f := newFirstBoot(t, o)
	t.Cleanup(func() {
		if t.Failed() {
			f.diagnoseNone(t)
			t.Logf("isolation change's journal:\n%s", f.m.Journal(isolationUnit))
			// Every boot's (a handoff spans power cuts), with systemd's
			// own lines on the agent's and the node's units.
			out, _ := f.m.Run("sh", "-c", `journalctl --no-pager -q -o short-precise -u unbounded-reprovision.service -u unbounded-isolation.service -u unbounded-containerd.service -u unbounded-kubelet.service -u unbounded-restart.service -u unbounded-health.service | grep -v -e 'kubelet\[' -e 'containerd\[' | tail -n 400`)
			t.Logf("reprovision's, the isolation change's and systemd's lines on the units, every boot:\n%s", out)
		}
	})
	return f, f.bootNode(t)
}

// reprovisionDropIns forces the reprovision method on the isolation unit
// (with more flags) and gives the handoff the test's short delays (its
// unit restarted after 1 s; the handoff's own wait 5 s, doubling, at
// most 20 s), then reloads.
func (f *firstBoot) reprovisionDropIns(t *testing.T, isolationFlags, reprovisionFlags string) {
	t.Helper()
	f.m.WriteFile("/etc/systemd/system/"+isolationUnit+".d/50-test-method.conf",
		[]byte("[Service]\nExecStart=\nExecStart=/usr/libexec/unbounded/isolation --method=Reprovision "+isolationFlags+"\n"), 0o644)
	f.m.WriteFile("/etc/systemd/system/"+unitnames.Reprovision+".d/50-test-delays.conf",
		[]byte("[Service]\nExecStart=\nExecStart=/var/lib/unbounded-agent-reprovision/unbounded-agent reprovision --first-delay=5s --max-delay=20s "+reprovisionFlags+"\nRestartSec=1s\n"), 0o644)
	if out, err := f.m.Systemctl("daemon-reload"); err != nil {
		t.Fatalf("daemon-reload: %v\n%s", err, out)
	}
}

// setMode makes the host's config name mode (an operator's drop-in).
func (f *firstBoot) setMode(t *testing.T, mode string) {
	t.Helper()
	f.m.WriteFile(modeDropIn, []byte("# tests/system: the isolation change's desired mode\nmode = \""+mode+"\"\n"), 0o644)
}

// isolationDropIns writes the test's drop-ins on the isolation unit: the
// ready wait bounded by repaveReadyTimeout, and the crash point (none
// when ""); then daemon-reload.
func (f *firstBoot) isolationDropIns(t *testing.T, crash string) {
	t.Helper()
	setCrashPoint(t, f, isolationUnit, crash)
	f.m.WriteFile("/etc/systemd/system/"+isolationUnit+".d/50-test-ready-timeout.conf",
		[]byte("[Service]\nExecStart=\nExecStart=/usr/libexec/unbounded/isolation --ready-timeout="+repaveReadyTimeout+"\n"), 0o644)
	if out, err := f.m.Systemctl("daemon-reload"); err != nil {
		t.Fatalf("daemon-reload: %v\n%s", err, out)
	}
}

// changeIsolation starts unbounded-isolation.service by hand and waits,
// bounded, until its run has ended.
func (f *firstBoot) changeIsolation(t *testing.T) (time.Duration, map[string]string) {
	t.Helper()
	cursor := journalCursor(t, f)
	begin := time.Now()
	if out, err := f.m.Systemctl("start", "--no-block", isolationUnit); err != nil {
		t.Fatalf("systemctl start %s: %v\n%s", isolationUnit, err, out)
	}
	p := waitUnitDone(t, f, isolationUnit, cursor, 15*time.Minute)
	return time.Since(begin).Round(time.Millisecond), p
}

// wantMode asserts the host after an isolation change into mode in
// slot: one applied record, of that mode and slot; the mode's node units
// running behind the fence; nothing of the other mode left; no journal or
// lock of the change; the Node Ready; the Machine reporting mode and slot.
func (f *firstBoot) wantMode(t *testing.T, mode, slot string) {
	t.Helper()
	a, err := state.ReadActive(f.paths)
	if err != nil || a == nil || a.Slot != slot || a.Mode != mode {
		t.Fatalf("active applied config %+v (%v), want mode %s in slot %s", a, err, mode, slot)
	}
	if _, err := os.Stat(f.paths.AppliedConfig(hostpaths.OtherSlot(slot))); !os.IsNotExist(err) {
		t.Errorf("slot %s still has an applied config (%v)", hostpaths.OtherSlot(slot), err)
	}
	for _, p := range []string{f.paths.Journal("isolation"), f.paths.Ownership()} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("the isolation change left %s (%v)", f.paths.Rel(p), err)
		}
	}
	var gone, kept []string
	switch mode {
	case "none":
		f.wantVersionRunning(t, f.stage.Versions["kubelet"], []string{f.stage.Versions["kubelet"]})
		wantFencedUnit(t, f.m, "unbounded-mode-none.target", none.KubeletUnit)
		for _, s := range hostpaths.Slots {
			gone = append(gone, f.paths.MachineDir(s), f.paths.NspawnConfig(s), f.paths.NspawnDropInDir(s))
		}
	case "nspawn", "container":
		wantFencedUnit(t, f.m, "unbounded-mode-"+mode+".target", facts.KubeletHost(mode, slot))
		// Mode none's kubelet raised the host's logind delay for its
		// graceful node shutdown (its own drop-in): gone with its node.
		gone = append(gone, f.paths.MachineDir(hostpaths.OtherSlot(slot)), f.paths.NspawnConfig(hostpaths.OtherSlot(slot)), f.paths.VersionsDir(),
			f.paths.Join(none.KubeletLogindOverride))
		if mode == "container" {
			gone = append(gone, f.paths.MachineDir(slot), f.paths.NspawnConfig(slot), f.paths.NspawnDropInDir(slot))
		}
		for _, d := range none.StateDirs {
			gone = append(gone, f.paths.Join(d))
		}
		// A host that can run mode none has /var/lib/containerd on a
		// file system of its own (nodestack.FirstBootHost): mode none's
		// Destroy empties it and leaves the mount point.
		kept = append(kept, f.paths.Join(none.Layout.ContainerdRoot))
		for _, u := range []string{none.KubeletUnit, none.ContainerdUnit} {
			if s := isActive(f.m, u); s == "active" || s == "activating" {
				t.Errorf("%s is %s in mode nspawn", u, s)
			}
		}
	}
	// The container mode's bundles, through the running host (the slots
	// are on a directory bound into it): only the running slot's, in
	// mode container.
	for _, s := range hostpaths.Slots {
		b := bundle.Dir(hostpaths.New("/"), s)
		if _, err := f.m.Lstat(b); (err == nil) != (mode == "container" && s == slot) {
			t.Errorf("mode %s in slot %s: bundle %s: %v", mode, slot, b, err)
		}
	}
	for _, p := range gone {
		if ents, err := os.ReadDir(p); err == nil && len(ents) == 0 && slices.Contains(kept, p) {
			continue // the test host's own mount (below), emptied
		}
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			rel := f.paths.Rel(p)
			ls, _ := f.m.Run("sh", "-c", `ls -la --full-time "$1"; find "$1" -maxdepth 3 -printf '%TT %M %u %p\n' | sort | head -40`, "sh", rel)
			t.Errorf("mode %s: %s of the old mode is left (%v):\n%s", mode, rel, err, ls)
		}
	}
	for _, u := range []string{"unbounded-node.target", "unbounded-mode-" + mode + ".target", "unbounded-daemon.service"} {
		waitUntil(t, time.Minute, u+" active", func(context.Context) (bool, error) { return isActive(f.m, u) == "active", nil })
	}
	waitUntil(t, 2*time.Minute, "Node Ready in mode "+mode, f.nodeReady)
	for _, u := range failedUnits(t, f.m, "unbounded*") {
		t.Errorf("%s failed after the isolation change:\n%s", u, f.m.Journal(u))
	}
	waitUntil(t, time.Minute, "the Machine reports mode "+mode, func(context.Context) (bool, error) {
		iso := f.machine(t).Status.Isolation
		return iso != nil && string(iso.Mode) == mode, nil
	})
}

// TestIsolationChangeInPlaceBetweenContainerAndTheOtherModes: the
// container mode's four changes, in place, on one first-booted host of
// mode nspawn that can also run mode none: nspawn -> container by the
// Machine's spec, then by hand container -> none, none -> container and
// container -> nspawn. Each time the Node is Ready under the same name in
// the new mode, in the other slot, nothing of the old mode left, and the
// Deployment's pod running again.
func TestIsolationChangeInPlaceBetweenContainerAndTheOtherModes(t *testing.T) {
	defer scenario(t)()
	f, ns := isolationHost(t, firstBootOptions{alsoNone: true})
	if t.Failed() {
		return
	}
	pod := f.waitPodRunning(t, ns, time.Minute).Name
	f.isolationDropIns(t, "")

	// nspawn -> container by the Machine's spec.
	watch := f.watchDowntime(t)
	begin := time.Now()
	f.setIsolationSpec(t, "container")
	waitUntil(t, 10*time.Minute, "the Machine reports the isolation change to container Succeeded", func(context.Context) (bool, error) {
		ch := f.machine(t).Status.IsolationChange
		if ch != nil && ch.To == "container" && ch.State == v1alpha3.IsolationChangeFailed {
			t.Fatalf("the isolation change failed: %s\n%s", ch.Message, f.m.Journal(isolationUnit))
		}
		return ch != nil && ch.To == "container" && ch.Method == v1alpha3.IsolationChangeInPlace && ch.State == v1alpha3.IsolationChangeSucceeded, nil
	})
	took := time.Since(begin).Round(time.Millisecond)
	t.Logf("isolation change nspawn -> container: %v, Node not Ready or absent for %v (by the Machine's spec)", took, watch(t))
	f.wantMode(t, "container", "kube2")
	pod = f.waitPodRunningAgain(t, ns, pod)
	if t.Failed() {
		return
	}

	// Then by hand, through the other modes and back to nspawn.
	slot := "kube2"
	for _, c := range []struct{ from, to string }{{"container", "none"}, {"none", "container"}, {"container", "nspawn"}} {
		f.setMode(t, c.to)
		watch := f.watchDowntime(t)
		took, p := f.changeIsolation(t)
		if p["Result"] != "success" {
			t.Fatalf("isolation change %s -> %s: %v\n%s", c.from, c.to, p, f.lastRunJournal(t, p))
		}
		t.Logf("isolation change %s -> %s: %v, Node not Ready or absent for %v (by hand)", c.from, c.to, took, watch(t))
		slot = hostpaths.OtherSlot(slot)
		f.wantMode(t, c.to, slot)
		pod = f.waitPodRunningAgain(t, ns, pod)
		if t.Failed() {
			return
		}
	}
}

// TestIsolationChangeCrashAtEveryPointThenPowerCutsConverge: (1) one
// in-place change nspawn -> none killed at every crash point in turn
// (lib/isolation's: the repave's steps' and modes.Change's inside the switch), each rerun of the
// unit resuming the one before from its journal and going on to the next
// point, then a run without a crash point: the host ends in mode none.
// (2) The host loses power at three points of in-place changes and
// boots the same state: the generator resumes unbounded-isolation.service
// (its ownership record names it), and nothing else of the node, and the
// change finishes. Each time the host ends in exactly one mode, with its
// node Ready and the Deployment's pod Running; never two node stacks.
//
//   - none -> nspawn, cut with the new mode built beside the running node;
//   - nspawn -> none, cut with the old node stopped and no node running;
//   - none -> nspawn, cut with both records written (the journal's
//     running-slot names the new one).
func TestIsolationChangeCrashAtEveryPointThenPowerCutsConverge(t *testing.T) {
	defer scenario(t)()
	f, ns := isolationHost(t, firstBootOptions{alsoNone: true})
	if t.Failed() {
		return
	}
	f.waitPodRunning(t, ns, time.Minute)
	f.isolationDropIns(t, "")

	// (1) Every crash point of one change.
	f.setMode(t, "none")
	begin := time.Now()
	for _, point := range isolation.CrashPoints {
		f.isolationDropIns(t, point)
		_, p := f.changeIsolation(t)
		wantCrashedAt(t, f, isolationUnit, point, p)
	}
	f.isolationDropIns(t, "")
	if _, p := f.changeIsolation(t); p["Result"] != "success" {
		t.Fatalf("the isolation change after the kills: %v\n%s", p, f.lastRunJournal(t, p))
	}
	t.Logf("isolation change nspawn -> none killed at %d points, then a clean run: %v", len(isolation.CrashPoints), time.Since(begin).Round(time.Millisecond))
	f.wantMode(t, "none", "kube2")
	f.waitPodStartedSince(t, ns, begin)
	if t.Failed() {
		return
	}

	// (2) Power cuts.
	for _, c := range []struct{ mode, point, slot string }{
		{"nspawn", "isolation/after-build", "kube1"},
		{"none", modes.CrashChangeOldStopped, "kube2"},
		{"nspawn", "isolation/after-record", "kube1"},
	} {
		f.setMode(t, c.mode)
		f.isolationDropIns(t, c.point)
		_, p := f.changeIsolation(t)
		wantCrashedAt(t, f, isolationUnit, c.point, p)
		setCrashPoint(t, f, isolationUnit, "")
		// The journal is persistent: the resumed run's end is read after
		// this cursor (a oneshot that succeeded and nothing references
		// any more, once the generator stopped pulling it in, is
		// unloaded at once).
		cursor := journalCursor(t, f)
		begin := time.Now()
		f.m.PowerCut()
		f.m.Start()
		p = waitUnitDone(t, f, isolationUnit, cursor, 10*time.Minute)
		if p["Result"] != "success" {
			t.Fatalf("the isolation change resumed at boot after a power cut at %s: %v\n%s", c.point, p, f.m.Journal(isolationUnit))
		}
		f.wantMode(t, c.mode, c.slot)
		t.Logf("power cut at %s: the change to %s finished %v after the boot", c.point, c.mode, time.Since(begin).Round(time.Millisecond))
		// The pod comes back: drained and placed again, or (cut before
		// the drain, its node gone with the power) the same pod object,
		// which the new kubelet runs again once it registered the Node
		// under its name before the pod garbage collector removed it.
		f.waitPodStartedSince(t, ns, begin)
		if t.Failed() {
			return
		}
	}
}

// waitPodStartedSince waits until a pod of the Deployment in ns runs on
// the Node with its container started after since: a Running status
// written before a power cut says nothing about the node after it.
func (f *firstBoot) waitPodStartedSince(t *testing.T, ns string, since time.Time) {
	t.Helper()
	waitUntil(t, 3*time.Minute, "a pod of the Deployment started again on "+f.name, func(ctx context.Context) (bool, error) {
		pods, err := f.env.kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		for _, p := range pods.Items {
			if p.DeletionTimestamp != nil || p.Spec.NodeName != f.name || p.Status.Phase != corev1.PodRunning {
				continue
			}
			for _, c := range p.Status.ContainerStatuses {
				if r := c.State.Running; r != nil && r.StartedAt.After(since) {
					return true, nil
				}
			}
		}
		return false, nil
	})
}

// TestIsolationChangeByReprovisionRetriesWhileTheAPIServerIsUnreachable:
// nspawn -> none by the reprovision method (forced: both modes could
// share the host). The isolation unit checks the token, stages the
// handoff and hands over (exit 0); then the API server becomes
// unreachable: the handoff's reset goes on (it talks to no server), its
// bootstrap fails, and the unit is started again after the handoff's
// growing delay, until the API server is back and the bootstrap of mode
// none succeeds. The node ends Ready under the same name in mode none,
// nothing of nspawn left, and the daemon reports the change Succeeded by
// reprovision and removes the handoff. Then a clean reprovision back to
// nspawn, by the Machine's spec: its whole run and its downtime are
// make bench's figures.
func TestIsolationChangeByReprovisionRetriesWhileTheAPIServerIsUnreachable(t *testing.T) {
	defer scenario(t)()
	f, ns := isolationHost(t, firstBootOptions{alsoNone: true})
	if t.Failed() {
		return
	}
	f.waitPodRunning(t, ns, time.Minute)
	// The test's bounds: the method forced, the delays short.
	f.reprovisionDropIns(t, "", "--ready-timeout=1m")
	f.setMode(t, "none")
	begin := time.Now()
	_, p := f.changeIsolation(t)
	if p["Result"] != "success" {
		t.Fatalf("the isolation unit did not hand off: %v\n%s", p, f.lastRunJournal(t, p))
	}
	f.fwd.SetFault(f.env.Host(), nodestack.ForwardFault{Down: true})
	lifted := false
	lift := func() {
		if !lifted {
			lifted = true
			f.fwd.SetFault(f.env.Host(), nodestack.ForwardFault{})
		}
	}
	t.Cleanup(lift)
	var h *reprovision.Journal
	waitUntil(t, 8*time.Minute, "an attempt of the reprovision failed with the API server unreachable", func(context.Context) (bool, error) {
		j, err := reprovision.ReadJournal(f.paths)
		if err == nil {
			h = j
		}
		return err == nil && j.LastError != "", nil
	})
	t.Logf("attempt %d failed %v after the handoff (API server unreachable): %s; next at %s", h.Attempts, time.Since(begin).Round(time.Millisecond), h.LastError, h.NextAttempt.Format(time.RFC3339))
	if !slices.Contains(h.Done, reprovision.StepReset) {
		t.Errorf("the reset, which needs no server, is not done: %+v", h)
	}
	lift()
	waitUntil(t, 10*time.Minute, "the reprovision Succeeded", func(context.Context) (bool, error) {
		j, err := reprovision.ReadJournal(f.paths)
		if err == nil {
			h = j
		}
		// The daemon removes the handoff once it reported it.
		return (err == nil && j.State == reprovision.StateSucceeded) || (os.IsNotExist(err) && h.State == reprovision.StateSucceeded), nil
	})
	t.Logf("reprovision nspawn -> none: Succeeded %v after the handoff, %d attempts: %s", time.Since(begin).Round(time.Millisecond), h.Attempts, h.Message)
	if h.Attempts < 2 {
		t.Errorf("%d attempts, want a retry after the failed one", h.Attempts)
	}
	// systemd started it again (Restart=, after the attempt's exit 75),
	// as its journal says: the unit's NRestarts property does not last,
	// since a dead unit nothing references is unloaded, and read again it
	// says 0 (CI C3 read it so).
	if out, _ := f.m.Run("journalctl", "-q", "--no-pager", "-u", unitnames.Reprovision, "-g", "Scheduled restart job"); strings.TrimSpace(out) == "" {
		t.Errorf("%s: no \"Scheduled restart job\" in its journal: systemd did not start it again", unitnames.Reprovision)
	}
	f.waitAgentCertificate(t)
	waitUntil(t, 2*time.Minute, "the Machine reports the reprovision Succeeded", func(context.Context) (bool, error) {
		ch := f.machine(t).Status.IsolationChange
		return ch != nil && ch.State == v1alpha3.IsolationChangeSucceeded && ch.Method == v1alpha3.IsolationChangeReprovision && ch.To == "none", nil
	})
	waitUntil(t, time.Minute, "the handoff removed once reported", func(context.Context) (bool, error) {
		ents, err := os.ReadDir(f.paths.ReprovisionDir())
		return os.IsNotExist(err) || (err == nil && len(ents) == 0), nil
	})
	f.wantMode(t, "none", "kube1")
	f.waitPodStartedSince(t, ns, begin)
	if t.Failed() {
		return
	}

	// A clean reprovision none -> nspawn by the Machine's spec, as a
	// fleet operator does. The new node's daemon recorded the spec at
	// its first look (nspawn, the mode bootstrap registered, left alone:
	// it acts on a change); none (the running mode, nothing to do), then
	// nspawn, is a change.
	f.reprovisionDropIns(t, "", "--ready-timeout=3m")
	f.setIsolationSpec(t, "none")
	waitUntil(t, time.Minute, "the daemon saw spec.isolation.mode none", func(context.Context) (bool, error) {
		m, ok, err := state.ReadIsolationSpecSeen(f.paths)
		return err == nil && ok && m == "none", nil
	})
	watch := f.watchDowntime(t)
	begin = time.Now()
	f.setIsolationSpec(t, "nspawn")
	h = f.waitHandoffReported(t, "nspawn", v1alpha3.IsolationChangeSucceeded)
	took := time.Since(begin)
	if !h.EndedAt.IsZero() {
		took = h.EndedAt.Sub(begin)
	}
	down := watch(t)
	t.Logf("reprovision none -> nspawn: %v, Node not Ready or absent for %v (by the Machine's spec, clean: %s)", took.Round(time.Millisecond), down, h.Message)
	f.wantMode(t, "nspawn", "kube1")
	f.waitPodStartedSince(t, ns, begin)
}

// TestIsolationChangeByReprovisionThatCannotSucceedGivesUpAtItsDeadline:
// none -> nspawn by reprovision with a node image the registry does not
// have. Every attempt fails after the host's reset; at the deadline (the
// test's 90 s; production's 90 min) the handoff gives up: its journal
// says Failed with the reason, the staged executable and configuration
// are gone, the unit no longer runs and is not pulled in at boot, and no
// copy of the bootstrap token is left anywhere on the host but the
// operator's own file. The operator puts the mode back; the next boot
// bootstraps the host again in mode none, and its daemon reports the
// change Failed on the Machine and removes the handoff.
func TestIsolationChangeByReprovisionThatCannotSucceedGivesUpAtItsDeadline(t *testing.T) {
	defer scenario(t)()
	f, ns := isolationHost(t, firstBootOptions{mode: "none"})
	if t.Failed() {
		return
	}
	f.reprovisionDropIns(t, "--give-up-after=90s", "")
	missing := f.reg.Host + "/unbounded/node:missing"
	f.m.WriteFile(modeDropIn, []byte("mode = \"nspawn\"\n\n[nspawn]\nimage = \""+missing+"\"\n"), 0o644)
	begin := time.Now()
	_, p := f.changeIsolation(t)
	if p["Result"] != "success" {
		t.Fatalf("the isolation unit did not hand off: %v\n%s", p, f.lastRunJournal(t, p))
	}
	var h *reprovision.Journal
	waitUntil(t, 6*time.Minute, "the reprovision gave up", func(context.Context) (bool, error) {
		j, err := reprovision.ReadJournal(f.paths)
		if err == nil {
			h = j
		}
		return err == nil && j.State == reprovision.StateFailed, nil
	})
	t.Logf("reprovision given up %v after the handoff, %d attempts: %s", time.Since(begin).Round(time.Millisecond), h.Attempts, h.Message)
	if h.Attempts < 2 || !strings.Contains(h.Message, "missing") {
		t.Errorf("given up after %d attempts, saying %q; want retries and the image's name", h.Attempts, h.Message)
	}
	for _, n := range []string{reprovision.ConfigFile, reprovision.Executable} {
		if _, err := os.Stat(filepath.Join(f.paths.ReprovisionDir(), n)); !os.IsNotExist(err) {
			t.Errorf("%s is left in the handoff (%v)", n, err)
		}
	}
	waitUntil(t, time.Minute, unitnames.Reprovision+" ended", func(context.Context) (bool, error) {
		s := isActive(f.m, unitnames.Reprovision)
		return s == "inactive", nil
	})
	// No copy of the token: only the operator's file holds its bytes.
	token, err := f.m.ReadFile("/etc/unbounded/bootstrap-token")
	if err != nil {
		t.Fatal(err)
	}
	tok := strings.TrimSpace(string(token))
	out, _ := f.m.Run("grep", "-rlsF", "--exclude-dir=proc", "--exclude-dir=sys", "--exclude-dir=dev", "--exclude-dir=run", tok, "/etc", "/var", "/usr", "/root", "/tmp")
	for _, l := range strings.Fields(out) {
		if l != "/etc/unbounded/bootstrap-token" {
			t.Errorf("the bootstrap token is in %s after the handoff gave up", l)
		}
	}

	// The operator puts the mode back; the next boot bootstraps none and
	// its daemon reports the change that gave up.
	if err := os.Remove(filepath.Join(f.m.Root(), modeDropIn)); err != nil {
		t.Fatal(err)
	}
	f.m.Reboot()
	waitUntil(t, 8*time.Minute, "bootstrapped again in mode none", func(context.Context) (bool, error) {
		a, err := state.ReadActive(f.paths)
		return err == nil && a != nil && a.Mode == "none", nil
	})
	f.waitAgentCertificate(t)
	waitUntil(t, 2*time.Minute, "the Machine reports the reprovision Failed", func(context.Context) (bool, error) {
		ch := f.machine(t).Status.IsolationChange
		return ch != nil && ch.State == v1alpha3.IsolationChangeFailed && ch.Method == v1alpha3.IsolationChangeReprovision && strings.Contains(ch.Message, "given up"), nil
	})
	waitUntil(t, time.Minute, "the handoff removed once reported", func(context.Context) (bool, error) {
		ents, err := os.ReadDir(f.paths.ReprovisionDir())
		return os.IsNotExist(err) || (err == nil && len(ents) == 0), nil
	})
	waitUntil(t, 2*time.Minute, "Node Ready in mode none", f.nodeReady)
	f.waitPodStartedSince(t, ns, begin)
	f.drainAndPowerOff(t, ns)
}
