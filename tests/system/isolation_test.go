package system_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/modes/none"
	"unbounded-cloud.io/agent/lib/state"
	"unbounded-cloud.io/agent/lib/unitnames"
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
	t.Parallel()
	f := newFirstBoot(t, firstBootOptions{alsoNone: true})
	t.Cleanup(func() {
		if t.Failed() {
			f.diagnoseNone(t)
			t.Logf("isolation change's journal:\n%s", f.m.Journal(isolationUnit))
		}
	})
	ns := f.bootNode(t)
	if t.Failed() {
		return
	}
	pod := f.waitPodRunning(t, ns, time.Minute).Name
	f.isolationDropIns(t, "")

	// 1. The bootstrap token no longer authenticates: the change fails
	// before it touches the host; the node runs on in mode nspawn.
	token, err := f.m.ReadFile("/etc/unbounded/bootstrap-token")
	if err != nil {
		t.Fatal(err)
	}
	f.m.WriteFile("/etc/unbounded/bootstrap-token", []byte("abcdef.0123456789abcdef\n"), 0o600)
	f.setMode(t, "none")
	_, p := f.changeIsolation(t)
	if p["Result"] == "success" {
		t.Fatalf("isolation change with a revoked token succeeded: %v", p)
	}
	if j := f.lastRunJournal(t, p); !strings.Contains(j, "does not accept the bootstrap token") {
		t.Errorf("the failed change does not say why:\n%s", j)
	}
	f.wantSlot(t, "kube1", "")
	for _, p := range []string{f.paths.Journal("isolation"), f.paths.Ownership(), f.paths.MachineDir("kube2"), f.paths.VersionsDir()} {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("the refused change left %s (%v)", f.paths.Rel(p), err)
		}
	}
	f.m.WriteFile("/etc/unbounded/bootstrap-token", token, 0o600)
	if t.Failed() {
		return
	}

	// 2. nspawn -> none: the node moves into slot kube2 on the host.
	uid := f.nodeUID(t)
	watch := f.watchReadyAgain(t, uid)
	took, p := f.changeIsolation(t)
	if p["Result"] != "success" {
		t.Fatalf("isolation change nspawn -> none: %v\n%s", p, f.lastRunJournal(t, p))
	}
	down := watch(t)
	t.Logf("isolation change nspawn -> none: %v, Node not Ready for %v", took, down)
	f.wantMode(t, "none", "kube2")
	pod = f.waitPodRunningAgain(t, ns, pod)
	if t.Failed() {
		return
	}

	// 3. none -> nspawn: back into slot kube1, in a machine.
	f.setMode(t, "nspawn")
	watch = f.watchReadyAgain(t, f.nodeUID(t))
	took, p = f.changeIsolation(t)
	if p["Result"] != "success" {
		t.Fatalf("isolation change none -> nspawn: %v\n%s", p, f.lastRunJournal(t, p))
	}
	down = watch(t)
	t.Logf("isolation change none -> nspawn: %v, Node not Ready for %v", took, down)
	f.wantMode(t, "nspawn", "kube1")
	f.waitPodRunningAgain(t, ns, pod)
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
	var gone []string
	switch mode {
	case "none":
		f.wantVersionRunning(t, f.stage.Versions["kubelet"], []string{f.stage.Versions["kubelet"]})
		wantFencedUnit(t, f.m, "unbounded-mode-none.target", none.KubeletUnit)
		for _, s := range hostpaths.Slots {
			gone = append(gone, f.paths.MachineDir(s), f.paths.NspawnConfig(s), f.paths.NspawnDropInDir(s))
		}
	case "nspawn":
		wantFencedUnit(t, f.m, "unbounded-mode-nspawn.target", "systemd-nspawn@"+slot+".service")
		gone = append(gone, f.paths.MachineDir(hostpaths.OtherSlot(slot)), f.paths.NspawnConfig(hostpaths.OtherSlot(slot)), f.paths.VersionsDir())
		for _, d := range none.StateDirs {
			gone = append(gone, f.paths.Join(d))
		}
		for _, u := range []string{none.KubeletUnit, none.ContainerdUnit} {
			if s := isActive(f.m, u); s == "active" || s == "activating" {
				t.Errorf("%s is %s in mode nspawn", u, s)
			}
		}
	}
	for _, p := range gone {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("mode %s: %s of the old mode is left (%v)", mode, f.paths.Rel(p), err)
		}
	}
	for _, u := range []string{"unbounded-node.target", "unbounded-mode-" + mode + ".target", "unbounded-daemon.service"} {
		waitUntil(t, time.Minute, u+" active", func(context.Context) (bool, error) { return isActive(f.m, u) == "active", nil })
	}
	waitUntil(t, 2*time.Minute, "Node Ready in mode "+mode, f.nodeReady)
	if fu := failedUnits(t, f.m, "unbounded*"); len(fu) != 0 {
		t.Errorf("failed units after the isolation change: %v", fu)
	}
	waitUntil(t, time.Minute, "the Machine reports mode "+mode, func(context.Context) (bool, error) {
		iso := f.machine(t).Status.Isolation
		return iso != nil && string(iso.Mode) == mode, nil
	})
}
