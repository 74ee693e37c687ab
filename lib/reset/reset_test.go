package reset_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"unbounded-cloud.io/agent/lib/adopt"
	"unbounded-cloud.io/agent/lib/crashpoint"
	"unbounded-cloud.io/agent/lib/exitcode"
	"unbounded-cloud.io/agent/lib/reset"
	"unbounded-cloud.io/agent/lib/state"
	"unbounded-cloud.io/agent/lib/steps"
	"unbounded-cloud.io/agent/lib/testhost"
	"unbounded-cloud.io/agent/lib/unitnames"
)

// The child runs one bootstrap or one reset on the world whose root it
// names, so that a crash point kills a real process.
const (
	childRoot = "RESET_TEST_CHILD_ROOT"
	childOp   = "RESET_TEST_CHILD_OP"
)

func TestMain(m *testing.M) {
	if root := os.Getenv(childRoot); root != "" {
		w := &testhost.World{Root: root}
		w.P.Root = root
		log := slog.New(slog.NewTextHandler(os.Stderr, nil))
		var err error
		if os.Getenv(childOp) == "bootstrap" {
			err = w.Bootstrap(log).Run(context.Background())
		} else {
			r := resetOn(w, log)
			r.KeepHandoff = os.Getenv(childOp) == "reset-keep-handoff"
			err = r.Run(context.Background())
		}
		os.Exit(exitcode.For(err))
	}
	os.Exit(m.Run())
}

func child(t *testing.T, w *testhost.World, op, point string) (int, string) {
	t.Helper()
	return testhost.RunChild(t, childRoot+"="+w.Root, childOp+"="+op, crashpoint.Env+"="+point)
}

func newWorld(t *testing.T) *testhost.World {
	t.Helper()
	w, err := testhost.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	// A reprovision handoff, as a reprovision leaves it before it resets.
	if err := w.Write("/var/lib/unbounded-agent-reprovision/journal.json", "{}\n"); err != nil {
		t.Fatal(err)
	}
	return w
}

// pristine is a snapshot without what the fakes keep for themselves (the
// fake units' states), the lock file under /run (a tmpfs in real life,
// and the flock's anchor), and /proc/swaps, whose line the fake swapon
// writes in its own spacing (checked on its own).
func pristine(t *testing.T, w *testhost.World) map[string]string {
	t.Helper()
	s, err := w.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	for k := range s {
		if strings.HasPrefix(k, "fake/units") || k == "run/unbounded/ownership.lock" || k == "proc/swaps" {
			delete(s, k)
		}
	}
	return s
}

func TestResetAfterBootstrapLeavesNothingOfOursAndTheHostAsBefore(t *testing.T) {
	w := newWorld(t)
	before := pristine(t, w)
	if code, out := child(t, w, "bootstrap", ""); code != 0 {
		t.Fatalf("bootstrap: exit %d\n%s", code, out)
	}
	w.ClearCalls()
	if code, out := child(t, w, "reset", ""); code != 0 {
		t.Fatalf("reset: exit %d\n%s", code, out)
	}
	after := pristine(t, w)
	// /var/lib/machines is systemd's directory of machines (machinectl
	// and importctl make it too); the mode creates it when missing and
	// reset leaves it, empty.
	if v, ok := after["var/lib/machines"]; ok && strings.HasPrefix(v, "dir ") {
		delete(after, "var/lib/machines")
	}
	// Gone with the reset: the handoff (not kept) and nothing else.
	delete(before, "var/lib/unbounded-agent-reprovision")
	delete(before, "var/lib/unbounded-agent-reprovision/journal.json")
	if d := testhost.Diff(before, after); len(d) > 0 {
		t.Errorf("host after bootstrap + reset differs from before bootstrap:\n%s", strings.Join(d, "\n"))
	}
	swaps, _ := os.ReadFile(w.P.Join("/proc/swaps"))
	if !strings.Contains(string(swaps), "/dev/vda2") || !strings.Contains(string(swaps), "-2") {
		t.Errorf("swap not given back with its priority: %q", swaps)
	}
	calls := w.Calls()
	if len(calls) == 0 || calls[0] != "stop unbounded-daemon.service" {
		t.Errorf("the daemon must be stopped first: %q", calls)
	}
	for _, u := range []string{"unbounded-daemon.service", "systemd-nspawn@kube1.service"} {
		if st := w.UnitState(u); st != "inactive" {
			t.Errorf("%s is %s after reset", u, st)
		}
	}
	// The operator's config stays, so a bootstrap under the same name
	// works again.
	if code, out := child(t, w, "bootstrap", ""); code != 0 {
		t.Fatalf("bootstrap after reset: exit %d\n%s", code, out)
	}
	if a, err := state.ReadActive(w.P); err != nil || a == nil || a.Machine != testhost.Machine {
		t.Errorf("applied config after a second bootstrap: %+v %v", a, err)
	}
}

func TestResetKeepsTheHandoffWhenAskedEvenWhenResumedWithoutTheFlag(t *testing.T) {
	w := newWorld(t)
	if code, out := child(t, w, "bootstrap", ""); code != 0 {
		t.Fatalf("bootstrap: exit %d\n%s", code, out)
	}
	if code, _ := child(t, w, "reset-keep-handoff", "reset/after-hostprep"); code != crashpoint.ExitCode {
		t.Fatalf("crash: exit %d", code)
	}
	// Resumed by the unit at boot, without the flag.
	if code, out := child(t, w, "reset", ""); code != 0 {
		t.Fatalf("resumed reset: exit %d\n%s", code, out)
	}
	if _, err := os.Stat(w.P.Join("/var/lib/unbounded-agent-reprovision/journal.json")); err != nil {
		t.Errorf("handoff removed: %v", err)
	}
	if _, err := os.Stat(w.P.AppliedConfig("kube1")); !os.IsNotExist(err) {
		t.Errorf("applied config left: %v", err)
	}
}

func TestResetTakesOverFromAnInterruptedBootstrap(t *testing.T) {
	w := newWorld(t)
	if code, _ := child(t, w, "bootstrap", "bootstrap/after-start"); code != crashpoint.ExitCode {
		t.Fatalf("crash: exit %d", code)
	}
	if o, _ := state.ReadOwnership(w.P); o == nil || o.Owner != "bootstrap" {
		t.Fatalf("ownership after the crash: %+v", o)
	}
	if code, out := child(t, w, "reset", ""); code != 0 {
		t.Fatalf("reset: exit %d\n%s", code, out)
	}
	if o, _ := state.ReadOwnership(w.P); o != nil {
		t.Errorf("ownership after reset: %+v", o)
	}
	if st := w.UnitState("systemd-nspawn@kube1.service"); st != "inactive" {
		t.Errorf("node of the interrupted bootstrap is %s after reset", st)
	}
	if _, err := os.Stat(w.P.MachineDir("kube1")); !os.IsNotExist(err) {
		t.Errorf("slot left: %v", err)
	}
}

func TestResetDefersToAReprovision(t *testing.T) {
	w := newWorld(t)
	lock, err := state.AcquireOwnership(w.P, "reprovision", "unbounded-reprovision.service")
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Release()
	r := resetOn(w, nil)
	if code := exitcode.For(r.Run(context.Background())); code != exitcode.Deferred {
		t.Errorf("exit %d, want 69", code)
	}
}

func TestResetCrashAtEveryPointThenRerunEndsAsAnUninterruptedReset(t *testing.T) {
	if testing.Short() {
		t.Skip("runs child processes; skipped with -short")
	}
	ref := newWorld(t)
	child(t, ref, "bootstrap", "")
	if code, out := child(t, ref, "reset", ""); code != 0 {
		t.Fatalf("reset: exit %d\n%s", code, out)
	}
	want := pristine(t, ref)
	for _, point := range append([]string{"hostprep/after-undo"}, reset.CrashPoints...) {
		t.Run(strings.ReplaceAll(point, "/", "_"), func(t *testing.T) {
			w := newWorld(t)
			if code, out := child(t, w, "bootstrap", ""); code != 0 {
				t.Fatalf("bootstrap: exit %d\n%s", code, out)
			}
			code, out := child(t, w, "reset", point)
			if code != crashpoint.ExitCode || !strings.Contains(out, "crash point "+point) {
				t.Fatalf("crash at %s: exit %d\n%s", point, code, out)
			}
			if code, out := child(t, w, "reset", ""); code != 0 {
				t.Fatalf("rerun after the crash at %s: exit %d\n%s", point, code, out)
			}
			got := pristine(t, w)
			for _, s := range []map[string]string{want, got} {
				s["etc/unbounded/ca.crt"] = "(ca)"
			}
			if d := testhost.Diff(want, got); len(d) > 0 {
				t.Errorf("end state after a crash at %s differs:\n%s", point, strings.Join(d, "\n"))
			}
		})
	}
}

// A file system the operator mounted under /var/lib/unbounded (the slots
// on a disk of their own) cannot be removed, and is not reset's to
// unmount: it is emptied and stays.
func TestResetEmptiesAMountPointUnderTheHostRootAndKeepsIt(t *testing.T) {
	w := newWorld(t)
	if code, out := child(t, w, "bootstrap", ""); code != 0 {
		t.Fatalf("bootstrap: exit %d\n%s", code, out)
	}
	slots := w.P.Join("/var/lib/unbounded/slots")
	if err := w.Write("/var/lib/unbounded/slots/kube1/containerd/leftover", "x"); err != nil {
		t.Fatal(err)
	}
	r := resetOn(w, slog.New(slog.DiscardHandler))
	r.MountInfo = func() ([]byte, error) {
		return []byte("1 0 8:1 / / rw - ext4 /dev/vda1 rw\n" +
			"99 1 8:17 /slots /var/lib/unbounded/slots rw - ext4 /dev/vdb1 rw\n"), nil
	}
	if err := r.Run(context.Background()); err != nil {
		t.Fatalf("reset: %v", err)
	}
	ents, err := os.ReadDir(slots)
	if err != nil || len(ents) != 0 {
		t.Errorf("mount point %s after reset: %v %v, want kept and empty", slots, ents, err)
	}
	// The world's pre-staged offline directory is the operator's, and
	// stays too.
	ents, _ = os.ReadDir(w.P.Join("/var/lib/unbounded"))
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if strings.Join(names, " ") != "offline slots" {
		t.Errorf("/var/lib/unbounded after reset holds %v, want the offline directory and the mount point", names)
	}
}

// resetOn is a reset run on the world, with the same fakes as its
// bootstrap (testhost sits below lib/reset: it serves bootstrap's
// tests too, and must not import a package that imports bootstrap).
func resetOn(w *testhost.World, log *slog.Logger) *reset.Reset {
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return &reset.Reset{
		Host:     steps.Host{Paths: w.P, Systemd: w.Systemd, Notify: func(string) {}, Log: log},
		Mode:     w.Mode,
		HostPrep: func(ctx context.Context) ([]string, error) { return w.HostPrep(log).Undo(ctx) },
	}
}

// The journal of the build before lib/steps held KeepHandoff only; a host
// upgraded mid-reset resumes it, and keeps the handoff.
func TestAJournalOfThePreviousBuildKeepsTheHandoff(t *testing.T) {
	w := newWorld(t)
	if code, out := child(t, w, "bootstrap", ""); code != 0 {
		t.Fatalf("bootstrap: exit %d\n%s", code, out)
	}
	if code, _ := child(t, w, "reset-keep-handoff", "reset/after-node"); code != crashpoint.ExitCode {
		t.Fatalf("crash: exit %d", code)
	}
	if err := state.WriteVerified(w.P.Journal(reset.Operation), []byte("{\n  \"keep-handoff\": true\n}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, out := child(t, w, "reset", ""); code != 0 {
		t.Fatalf("resumed reset: exit %d\n%s", code, out)
	}
	if _, err := os.Stat(w.P.Join("/var/lib/unbounded-agent-reprovision/journal.json")); err != nil {
		t.Errorf("handoff removed: %v", err)
	}
	if _, err := os.Stat(w.P.Journal(reset.Operation)); !os.IsNotExist(err) {
		t.Errorf("journal left after the reset: %v", err)
	}
}

// A reset that fails says in its journal which step failed and why
// (`unbounded status` shows it), releases the lock, and the next run
// finishes.
func TestAFailedResetJournalsTheStepAndWhy(t *testing.T) {
	w := newWorld(t)
	if code, out := child(t, w, "bootstrap", ""); code != 0 {
		t.Fatalf("bootstrap: exit %d\n%s", code, out)
	}
	r := resetOn(w, nil)
	r.HostPrep = func(context.Context) ([]string, error) { return nil, errors.New("sysctl: read-only file system") }
	err := r.Run(context.Background())
	if exitcode.For(err) != exitcode.Failed || !strings.Contains(err.Error(), "step hostprep: sysctl: read-only file system") {
		t.Fatalf("reset with a failing undo: %v (exit %d)", err, exitcode.For(err))
	}
	var j reset.Journal
	if ok, err := state.ReadJournal(w.P, reset.Operation, &j); !ok || err != nil || j.Step != "hostprep failed: sysctl: read-only file system" {
		t.Errorf("journal %+v (%v %v), want the failed step and why", j, ok, err)
	}
	if o, _ := state.ReadOwnership(w.P); o != nil {
		t.Errorf("lock not released: %+v", o)
	}
	if err := resetOn(w, nil).Run(context.Background()); err != nil {
		t.Fatalf("second reset: %v", err)
	}
	if _, err := os.Stat(w.P.Journal(reset.Operation)); !os.IsNotExist(err) {
		t.Errorf("journal left after the reset: %v", err)
	}
}

// olderLayout puts what the older agent installs on w: its applied config
// (for w's machine and cluster), its state, binaries and links, its units
// enabled and its daemon running, its node machine enabled and running.
func olderLayout(t *testing.T, w *testhost.World) {
	t.Helper()
	for f, c := range map[string]string{
		"/etc/unbounded/agent/kube1-applied-config.json":              `{"MachineName": "site-w1", "Cluster": {"Version": "v1.36.3"}, "Kubelet": {"ApiServer": "127.0.0.1:6443", "BootstrapToken": "abcdef.0123456789abcdef"}}`,
		"/etc/unbounded/agent/agent-upgrade-signal":                   "{}",
		"/usr/local/bin/unbounded-agent":                              "#!/bin/sh\n",
		"/usr/local/bin/unbounded-agent-daemon-recovery.sh":           "#!/bin/bash\n",
		"/etc/systemd/system/unbounded-agent-daemon.service":          "[Service]\n",
		"/etc/systemd/system/unbounded-agent-daemon-recovery.service": "[Service]\n",
		"/var/lib/machines/kube1/etc/os-release":                      "ID=debian\n",
	} {
		if err := w.Write(f, c); err != nil {
			t.Fatal(err)
		}
	}
	for link, target := range map[string]string{
		"/usr/local/bin/unbounded-agent-current":                                     "/usr/local/bin/unbounded-agent",
		"/etc/systemd/system/multi-user.target.wants/unbounded-agent-daemon.service": "/etc/systemd/system/unbounded-agent-daemon.service",
		"/etc/systemd/system/machines.target.wants/systemd-nspawn@kube1.service":     "/lib/systemd/system/systemd-nspawn@.service",
	} {
		os.MkdirAll(w.P.Join(filepath.Dir(link)), 0o755)
		if err := os.Symlink(target, w.P.Join(link)); err != nil {
			t.Fatal(err)
		}
	}
	w.SetUnitState("systemd-nspawn@kube1.service", "active")
	w.SetUnitState(unitnames.LegacyDaemon, "active")
}

// Reset removes both layouts: the older agent's on a host it installed,
// adopted or not, and this agent's.
func TestResetOfAnOlderAgentsHostLeavesNothingOfEitherLayout(t *testing.T) {
	for _, adopted := range []bool{false, true} {
		t.Run(map[bool]string{false: "not adopted", true: "adopted"}[adopted], func(t *testing.T) {
			w := newWorld(t)
			before := pristine(t, w)
			olderLayout(t, w)
			if adopted {
				a := &adopt.Adopt{Host: steps.Host{Paths: w.P, Systemd: w.Systemd, Notify: func(string) {}, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}}
				if err := a.Run(context.Background()); err != nil {
					t.Fatal(err)
				}
				if _, err := os.Stat(w.P.AppliedConfig("kube1")); err != nil {
					t.Fatalf("not adopted: %v", err)
				}
			}
			if code, out := child(t, w, "reset", ""); code != 0 {
				t.Fatalf("reset: exit %d\n%s", code, out)
			}
			after := pristine(t, w)
			for k, v := range after {
				// Directories the older layout made and reset leaves
				// (the package's and systemd's: /usr/local/bin,
				// /var/lib/machines, the .wants directories), empty.
				if strings.HasPrefix(v, "dir ") && (k == "usr" || k == "usr/local" || k == "usr/local/bin" || k == "var/lib/machines" ||
					k == "etc/systemd" || k == "etc/systemd/system" || strings.HasSuffix(k, ".target.wants")) {
					delete(after, k)
				}
			}
			delete(before, "var/lib/unbounded-agent-reprovision")
			delete(before, "var/lib/unbounded-agent-reprovision/journal.json")
			if d := testhost.Diff(before, after); len(d) > 0 {
				t.Errorf("host after reset differs from before either agent:\n%s", strings.Join(d, "\n"))
			}
			if st := w.UnitState(unitnames.LegacyDaemon); st != "inactive" {
				t.Errorf("the older daemon is %s", st)
			}
			if st := w.UnitState("systemd-nspawn@kube1.service"); st != "inactive" {
				t.Errorf("the node machine is %s", st)
			}
		})
	}
}
