package system_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/modes/none"
	"unbounded-cloud.io/agent/lib/state"
	"unbounded-cloud.io/agent/tests/system/nodestack"
)

// In-place repave of a mode none host (ARCHITECTURE section 2), on the
// first-boot fixture: one host, bootstrapped in mode none with the
// staged Kubernetes version, is repaved by hand (`systemctl start
// unbounded-repave.service`) to a second version, then to a third whose
// kubelet exits at once, which rolls back.
//
// The tests have one kubelet: the loopback mirror serves it under a
// second version name (nodestack.Stage.ServeAsVersion), so that the
// repave installs a new version directory and flips `current` to it, and
// serves a kubelet that exits at once under a third.

// repaveReadyTimeout bounds the repave's wait for the new node in this
// test (a drop-in on the unit): the kubelet that exits at once never gets
// healthy, and the default (10 min) would be the test's whole budget.
const repaveReadyTimeout = "3m"

// neverHealthyReadyTimeout bounds the wait where the new node is known
// never to get healthy (the rollback is what is tested): all of it is
// waiting, and the rollback is the same after 60 s as after 3 min (not
// shorter: the rollback waits as long for the old node, and an nspawn
// machine booting again on a loaded CI takes tens of seconds).
const neverHealthyReadyTimeout = "60s"

func TestRepaveNoneInPlaceToAnotherVersionAndRollBackFromOneThatNeverGetsHealthy(t *testing.T) {
	defer scenario(t)()
	f := newFirstBoot(t, firstBootOptions{mode: "none"})
	t.Cleanup(func() {
		if t.Failed() {
			f.diagnoseNone(t)
			t.Logf("repave journal:\n%s", f.m.Journal(repaveUnit))
		}
	})
	begin := time.Now()
	f.m.Start()
	waitUntil(t, 8*time.Minute, "bootstrap finished", func(context.Context) (bool, error) {
		p := showProps(t, f.m, bootstrapUnit, "ActiveState", "ExecMainStatus", "InvocationID")
		return p["InvocationID"] != "" && p["ActiveState"] == "inactive" && p["ExecMainStatus"] == "0", nil
	})
	t.Logf("bootstrapped %v after the boot began", time.Since(begin).Round(time.Millisecond))
	f.wantBootstrapped(t, "none", none.KubeletUnit)
	// Only the daemon's certificate may cordon, drain and delete the Node.
	f.waitAgentCertificate(t)
	ns := f.runPod(t)
	if t.Failed() {
		return
	}
	pod0 := f.waitPodRunning(t, ns, time.Minute).Name
	v1 := f.stage.Versions["kubelet"]
	uid1 := f.nodeUID(t)
	f.setRepaveDropIns(t, "", repaveReadyTimeout)

	// 1. A version change: the repave drains, deletes the Node, installs
	// the new version beside the running one, stops the stack, flips
	// `current`, starts it; the Node registers afresh under the same
	// name, the Deployment's pod runs again, the old version is gone.
	v2 := bumpPatch(t, v1, 1)
	f.stage.ServeAsVersion(t, f.mirrorDir, "kubelet", v2, f.stage.Kubelet)
	f.setKubernetesVersion(t, v1, v2)
	watch := f.watchReadyAgain(t, uid1)
	took, p := f.repaveNone(t, nil)
	if p["Result"] != "success" || p["ExecMainStatus"] != "0" {
		t.Fatalf("repave to %s: %v\n%s", v2, p, f.m.Journal(repaveUnit))
	}
	t.Logf("repave %s -> %s took %v", v1, v2, took)
	down := watch(t)
	f.wantRepavedTo(t, v1, v2)
	if uid2 := f.nodeUID(t); uid2 == uid1 {
		t.Errorf("Node %s has the UID it had before the repave (%s): it was not deleted and registered afresh", f.name, uid1)
	}
	waitUntil(t, 2*time.Minute, "Node Ready after the repave", f.nodeReady)
	pod1 := f.waitPodRunningAgain(t, ns, pod0)
	f.wantApplied(t, v2)
	if fu := failedUnits(t, f.m, "unbounded*"); len(fu) != 0 {
		t.Errorf("failed units after the repave: %v", fu)
	}
	if out, err := f.m.Run("unbounded", "status"); err != nil || !strings.Contains(out, v2) {
		t.Errorf("unbounded status does not show %s (%v):\n%s", v2, err, out)
	}

	// 1b. A repave killed (SIGKILL, lib/crashpoint) with the old stack
	// stopped and `current` flipped, before the new one starts: the
	// next run resumes from the journals and finishes it.
	vc := bumpPatch(t, v1, 3)
	f.stage.ServeAsVersion(t, f.mirrorDir, "kubelet", vc, f.stage.Kubelet)
	f.setKubernetesVersion(t, v2, vc)
	f.setRepaveDropIns(t, "repave/after-flipped", repaveReadyTimeout)
	_, p = f.repaveNone(t, nil)
	if p["ExecMainCode"] != "2" || p["ExecMainStatus"] != "9" {
		t.Fatalf("the repave was not killed at its crash point: %v\n%s", p, f.m.Journal(repaveUnit))
	}
	if target, _ := f.m.Readlink(none.Current); target != vc || isActive(f.m, none.KubeletUnit) == "active" {
		t.Errorf("killed after the flip: current -> %s, kubelet %s; want %s and stopped", target, isActive(f.m, none.KubeletUnit), vc)
	}
	f.setRepaveDropIns(t, "", repaveReadyTimeout)
	took, p = f.repaveNone(t, nil)
	if p["Result"] != "success" || p["ExecMainStatus"] != "0" {
		t.Fatalf("the repave run again after the crash: %v\n%s", p, f.m.Journal(repaveUnit))
	}
	t.Logf("repave %s -> %s resumed after a crash at repave/after-flipped: %v", v2, vc, took)
	if j := f.m.Journal(repaveUnit); !strings.Contains(j, "repave resumed mode=none step=flipped") {
		t.Errorf("the second run did not resume the mode's journal:\n%s", j)
	}
	waitUntil(t, 3*time.Minute, "Node Ready after the resumed repave", f.nodeReady)
	f.wantRepavedTo(t, v2, vc)
	pod1 = f.waitPodRunningAgain(t, ns, pod1)
	f.wantApplied(t, vc)
	v2 = vc

	// 2. A version whose kubelet exits at once: never healthy. The
	// repave flips back, starts the previous version with the
	// configuration it ran, removes the new one and fails saying so.
	v3 := bumpPatch(t, v1, 2)
	broken := filepath.Join(t.TempDir(), "kubelet")
	if err := os.WriteFile(broken, []byte("#!/bin/sh\necho 'kubelet of a broken release: exiting' >&2\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	f.setRepaveDropIns(t, "", neverHealthyReadyTimeout)
	f.stage.ServeAsVersion(t, f.mirrorDir, "kubelet", v3, broken)
	f.setKubernetesVersion(t, v2, v3)
	envBefore, err := f.m.ReadFile(hostpaths.VersionsDirHost + "/" + v2 + "/etc/kubelet/kubelet.env")
	if err != nil {
		t.Fatal(err)
	}
	uid2 := f.nodeUID(t)
	// Once the repave has planned (its journal holds the desired
	// config from then on), agent.toml names the running version again,
	// as an operator reverts a bad change: the daemon repaves a Machine
	// whose Node vanished (the repave deletes it), and its repave after
	// this one must find nothing to do rather than try the broken
	// version again.
	cursor := journalCursor(t, f)
	took, p = f.repaveNone(t, func() {
		planned := "repave begun mode=none running=kube1 slot=kube1 old=" + v2 + " new=" + v3
		if _, err := f.m.WaitJournal(2*time.Minute, func(l string) bool { return strings.Contains(l, planned) },
			"-u", repaveUnit, "--after-cursor", cursor); err != nil {
			t.Fatalf("the repave planned: %v", err)
		}
		f.setKubernetesVersion(t, v3, v2)
	})
	t.Logf("repave %s -> %s (never healthy) ended after %v: %v", v2, v3, took, p)
	if p["Result"] == "success" || p["ExecMainStatus"] != "1" {
		t.Errorf("a repave that rolled back: %v, want exit 1", p)
	}
	j := f.m.Journal(repaveUnit)
	for _, want := range []string{"rolled back", "version " + v2 + " runs", v3 + " removed"} {
		if !strings.Contains(j, want) {
			t.Errorf("the repave's journal does not say %q:\n%s", want, j)
		}
	}
	f.wantVersionRunning(t, v2, []string{v2})
	if env, _ := f.m.ReadFile(hostpaths.VersionsDirHost + "/" + v2 + "/etc/kubelet/kubelet.env"); string(env) != string(envBefore) {
		t.Errorf("the previous version runs with another configuration:\n%s\nwant\n%s", env, envBefore)
	}
	waitUntil(t, 3*time.Minute, "Node Ready after the rollback", f.nodeReady)
	if uid := f.nodeUID(t); uid == uid2 {
		t.Logf("Node %s kept its UID across the rolled-back repave", f.name)
	}
	f.waitPodRunningAgain(t, ns, pod1)
	f.wantApplied(t, v2)
	// The repave's own unit failed (unless the daemon's repave of the
	// vanished Node has run it since, finding nothing to do); nothing
	// else did.
	for _, u := range failedUnits(t, f.m, "unbounded*") {
		if u != repaveUnit {
			t.Errorf("%s failed after the rollback", u)
		}
	}

	// The floor: the same node stack stopped, its Node deleted and
	// started again by hand (what the repave's downtime contains without
	// the product), measured as the repave's downtime is.
	floor := f.restartByHand(t)
	if down > 0 && floor > 0 {
		t.Logf("none repave downtime (old kubelet stopped -> Node Ready again): %v; floor (stop, Node deleted, start by hand -> Node Ready): %v; ratio %.2f (goal: under floor + 1 s: %v)",
			down, floor, down.Seconds()/floor.Seconds(), down < floor+time.Second)
	}

	f.drainAndPowerOff(t, ns)
}

// watchReadyAgain follows the Node while a repave runs; the function it
// returns ends the watch and gives the downtime: from the old kubelet's
// stop (its unit's first stop from now on) to the first Ready Node with
// a UID other than uid (registered afresh).
func (f *firstBoot) watchReadyAgain(t *testing.T, uid string) func(*testing.T) time.Duration {
	t.Helper()
	cursor := journalCursor(t, f)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan time.Time, 1)
	go func() {
		var ready time.Time
		defer func() { done <- ready }()
		for ctx.Err() == nil {
			n, err := f.env.kube.CoreV1().Nodes().Get(ctx, f.name, metav1.GetOptions{})
			if err == nil && string(n.UID) != uid {
				for _, c := range n.Status.Conditions {
					if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
						ready = time.Now()
						return
					}
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	return func(t *testing.T) time.Duration {
		t.Helper()
		waitUntil(t, 3*time.Minute, "the watch saw the Node Ready again", func(context.Context) (bool, error) {
			return len(done) > 0, nil
		})
		cancel()
		ready := <-done
		stopped := f.kubeletStopped(t, cursor)
		if ready.IsZero() || stopped.IsZero() {
			return 0
		}
		return ready.Sub(stopped).Round(time.Millisecond)
	}
}

// kubeletStopped is when unbounded-kubelet.service first stopped after
// the journal position cursor (systemd's "Stopped" line): a later
// restart of the new kubelet (the ready wait's one restart for its
// CSINode) is part of the downtime, not its start.
func (f *firstBoot) kubeletStopped(t *testing.T, cursor string) time.Time {
	t.Helper()
	out, err := f.m.Run("journalctl", "-q", "--no-pager", "-o", "short-unix", "-u", none.KubeletUnit, "--after-cursor", cursor)
	if err != nil {
		t.Logf("journal of %s: %v", none.KubeletUnit, err)
		return time.Time{}
	}
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) < 3 || !strings.Contains(l, "Stopped "+none.KubeletUnit) && !strings.Contains(l, "Stopped unbounded node stack: kubelet") {
			continue
		}
		sec, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			continue
		}
		return time.Unix(0, int64(sec*1e9))
	}
	t.Logf("no stop of %s in its journal after the cursor:\n%s", none.KubeletUnit, out)
	return time.Time{}
}

// restartByHand stops the node stack, deletes the Node and starts the
// stack again, and returns the time from the kubelet's stop to the Node
// Ready again (registered afresh).
func (f *firstBoot) restartByHand(t *testing.T) time.Duration {
	t.Helper()
	uid := f.nodeUID(t)
	watch := f.watchReadyAgain(t, uid)
	if out, err := f.m.Systemctl("stop", none.KubeletUnit, none.ContainerdUnit); err != nil {
		t.Errorf("stop the node stack by hand: %v\n%s", err, out)
		return 0
	}
	if err := f.env.kube.CoreV1().Nodes().Delete(context.Background(), f.name, metav1.DeleteOptions{}); err != nil {
		t.Errorf("delete Node: %v", err)
		return 0
	}
	if out, err := f.m.Systemctl("start", none.ContainerdUnit, none.KubeletUnit); err != nil {
		t.Errorf("start the node stack by hand: %v\n%s", err, out)
		return 0
	}
	return watch(t)
}

// repaveNone starts unbounded-repave.service without waiting for its job
// (the harness bounds a command at 2 minutes), runs during (when not
// nil), and waits, bounded, until the run systemd journals from now on
// has ended. (A finished oneshot nothing refers to is unloaded: its
// InvocationID is gone by then.)
func (f *firstBoot) repaveNone(t *testing.T, during func()) (time.Duration, map[string]string) {
	t.Helper()
	cursor := journalCursor(t, f)
	begin := time.Now()
	if out, err := f.m.Systemctl("start", "--no-block", repaveUnit); err != nil {
		t.Fatalf("systemctl start %s: %v\n%s", repaveUnit, err, out)
	}
	if during != nil {
		during()
	}
	p := waitUnitDone(t, f, repaveUnit, cursor, 12*time.Minute)
	return time.Since(begin).Round(time.Millisecond), p
}

// setRepaveDropIns writes the test's drop-ins on the repave's unit: its
// ready wait bounded by ready, and the crash point (none when ""); then
// daemon-reload.
func (f *firstBoot) setRepaveDropIns(t *testing.T, crash, ready string) {
	t.Helper()
	setCrashPoint(t, f, repaveUnit, crash)
	f.m.WriteFile("/etc/systemd/system/"+repaveUnit+".d/50-test-ready-timeout.conf",
		[]byte("[Service]\nExecStart=\nExecStart=/usr/libexec/unbounded/repave --ready-timeout="+ready+"\n"), 0o644)
	if out, err := f.m.Systemctl("daemon-reload"); err != nil {
		t.Fatalf("daemon-reload: %v\n%s", err, out)
	}
}

// waitPodRunningAgain waits until the Deployment's pod that replaced the
// drained pod `drained` runs on the Node, and returns its name.
func (f *firstBoot) waitPodRunningAgain(t *testing.T, ns, drained string) string {
	t.Helper()
	begin := time.Now()
	var name string
	waitUntil(t, 3*time.Minute, "the Deployment's pod Running again on "+f.name, func(ctx context.Context) (bool, error) {
		pods, err := f.env.kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		for _, p := range pods.Items {
			if p.Name != drained && p.DeletionTimestamp == nil && p.Spec.NodeName == f.name && p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" {
				name = p.Name
				return true, nil
			}
		}
		return false, nil
	})
	t.Logf("pod %s (replacing the drained %s) Running after %v", name, drained, time.Since(begin).Round(time.Millisecond))
	return name
}

// setKubernetesVersion changes the cluster's Kubernetes version in
// agent.toml (nodestack.SetKubernetesVersion).
func (f *firstBoot) setKubernetesVersion(t *testing.T, from, to string) {
	nodestack.SetKubernetesVersion(t, f.m, from, to)
}

// wantRepavedTo asserts that version to runs after a repave from
// version from, which is gone: lib/repave's retire step had the mode
// remove it (Mode.RemoveSuperseded) once the new applied config was
// recorded.
func (f *firstBoot) wantRepavedTo(t *testing.T, from, to string) {
	t.Helper()
	f.wantVersionRunning(t, to, []string{to})
	if _, err := f.m.ReadDir(hostpaths.VersionsDirHost + "/" + from); !os.IsNotExist(err) {
		t.Errorf("version %s is still installed after the repave (%v)", from, err)
	}
}

// wantVersionRunning asserts that `current` points at v, that the
// version directories are exactly dirs, and that both units run from v.
func (f *firstBoot) wantVersionRunning(t *testing.T, v string, dirs []string) {
	t.Helper()
	if target, err := f.m.Readlink(none.Current); err != nil || target != v {
		t.Errorf("%s -> %q (%v), want %s", none.Current, target, err, v)
	}
	ents, err := f.m.ReadDir(hostpaths.VersionsDirHost)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range ents {
		if e.Name() != "current" {
			got = append(got, e.Name())
		}
	}
	dirs = slices.Sorted(slices.Values(dirs))
	if !slices.Equal(got, dirs) {
		t.Errorf("version directories %q, want %q", got, dirs)
	}
	for unit, bin := range map[string]string{none.KubeletUnit: "kubelet", none.ContainerdUnit: "containerd"} {
		waitUntil(t, time.Minute, unit+" active", func(context.Context) (bool, error) { return isActive(f.m, unit) == "active", nil })
		pid := showProps(t, f.m, unit, "MainPID")["MainPID"]
		exe, err := f.m.Run("readlink", "/proc/"+pid+"/exe")
		if want := hostpaths.VersionsDirHost + "/" + v + "/bin/" + bin; err != nil || strings.TrimSpace(exe) != want {
			t.Errorf("%s runs %q (PID %s, %v), want %s", unit, strings.TrimSpace(exe), pid, err, want)
		}
	}
	if _, err := f.m.ReadFile(hostpaths.HostRootHost + "/journal/" + none.JournalName + ".json"); !os.IsNotExist(err) {
		t.Errorf("the none mode's repave journal is still there (%v)", err)
	}
}

// wantApplied asserts exactly one applied record, of mode none and
// Kubernetes version v, and that the generator runs the node from it.
func (f *firstBoot) wantApplied(t *testing.T, v string) {
	t.Helper()
	var found []*state.AppliedConfig
	for _, slot := range hostpaths.Slots {
		a, err := state.ReadApplied(f.paths, slot)
		if err == nil {
			found = append(found, a)
		} else if !os.IsNotExist(err) {
			t.Errorf("applied config of %s: %v", slot, err)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d applied records, want exactly one", len(found))
	}
	a := found[0]
	if a.Mode != "none" || strings.TrimPrefix(a.KubernetesVersion, "v") != v {
		b, _ := json.Marshal(a)
		t.Errorf("applied record of slot %s: %s, want mode none and version %s", a.Slot, b, v)
	}
	for _, u := range []string{"unbounded-node.target", "unbounded-mode-none.target", "unbounded-daemon.service"} {
		waitUntil(t, time.Minute, u+" active", func(context.Context) (bool, error) { return isActive(f.m, u) == "active", nil })
	}
	wantFencedUnit(t, f.m, "unbounded-mode-none.target", none.KubeletUnit)
}

func (f *firstBoot) nodeUID(t *testing.T) string {
	t.Helper()
	var uid string
	waitUntil(t, 3*time.Minute, "Node "+f.name+" registered", func(ctx context.Context) (bool, error) {
		n, err := f.env.kube.CoreV1().Nodes().Get(ctx, f.name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		uid = string(n.UID)
		return true, nil
	})
	return uid
}

// bumpPatch is v with its patch number raised by n ("1.36.3", 1 ->
// "1.36.4").
func bumpPatch(t *testing.T, v string, n int) string {
	t.Helper()
	parts := strings.SplitN(v, ".", 3)
	if len(parts) != 3 {
		t.Fatalf("version %q is not MAJOR.MINOR.PATCH", v)
	}
	patch, err := strconv.Atoi(parts[2])
	if err != nil {
		t.Fatalf("version %q: %v", v, err)
	}
	return parts[0] + "." + parts[1] + "." + strconv.Itoa(patch+n)
}
