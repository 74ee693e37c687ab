package lifecycle_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"testing"

	"unbounded-cloud.io/agent/lib/lifecycle"
	"unbounded-cloud.io/agent/lib/modes"
	"unbounded-cloud.io/agent/lib/state"
	"unbounded-cloud.io/agent/lib/steps"
	"unbounded-cloud.io/agent/lib/testhost"
	"unbounded-cloud.io/agent/lib/unitnames"
	"unbounded-cloud.io/agent/lib/units"
	"unbounded-cloud.io/agent/lib/upgrade"
)

// hooksMode records EnsureHooks on the world's fake mode.
type hooksMode struct {
	modes.Mode
	w *testhost.World
}

func (m hooksMode) EnsureHooks(_ context.Context, slot string) error {
	m.w.Log("ensure-hooks " + slot)
	return nil
}

func newWorld(t *testing.T, bootstrapped bool) *testhost.World {
	t.Helper()
	w, err := testhost.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if bootstrapped {
		if err := w.Bootstrap(nil).Run(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	w.ClearCalls()
	return w
}

func run(t *testing.T, w *testhost.World) error {
	t.Helper()
	b := w.Bootstrap(nil)
	l := &lifecycle.Lifecycle{
		Host: steps.Host{Paths: w.P, Systemd: func(ctx context.Context) (units.Manager, error) { return b.Systemd(ctx) }, Log: slog.New(slog.NewTextHandler(io.Discard, nil))},
		Mode: func(name string) (modes.Mode, error) {
			m, err := w.Mode(name)
			return hooksMode{m, w}, err
		},
	}
	return l.Run(context.Background())
}

func TestLifecycleMakesTheRunningNodesHooksCurrent(t *testing.T) {
	w := newWorld(t, true)
	if err := run(t, w); err != nil {
		t.Fatal(err)
	}
	if c := w.Calls(); !slices.Equal(c, []string{"ensure-hooks kube1"}) {
		t.Errorf("calls %q, want only the hooks of kube1", c)
	}
}

func TestLifecycleOnAFreshHostDoesNothing(t *testing.T) {
	w := newWorld(t, false)
	if err := run(t, w); err != nil {
		t.Fatal(err)
	}
	if c := w.Calls(); len(c) != 0 {
		t.Errorf("calls %q on a fresh host", c)
	}
}

func TestLifecycleResumesTheRepaveThatOwnsTheHost(t *testing.T) {
	w := newWorld(t, true)
	lock, err := state.AcquireOwnership(w.P, "repave", unitnames.Repave)
	if err != nil {
		t.Fatal(err)
	}
	// The repave's process is gone (a reboot), its record stays.
	lock.Release()
	if err := state.WriteFileAtomic(w.P.Ownership(), []byte(`{"owner":"repave","unit":"unbounded-repave.service","since":"2026-12-01T00:00:00Z"}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := run(t, w); err != nil {
		t.Fatal(err)
	}
	if c := w.Calls(); !slices.Equal(c, []string{"enqueue unbounded-repave.service(owned)"}) {
		t.Errorf("calls %q, want the repave queued and nothing else while owned", c)
	}
	// Running already: not queued twice.
	w.ClearCalls()
	w.SetUnitState(unitnames.Repave, "activating")
	if err := run(t, w); err != nil {
		t.Fatal(err)
	}
	if c := w.Calls(); len(c) != 0 {
		t.Errorf("calls %q with the repave running", c)
	}
}

func TestLifecycleFinishesARepaveWhoseJournalIsLeft(t *testing.T) {
	w := newWorld(t, true)
	if err := state.WriteJournal(w.P, lifecycle.RepaveJournal, map[string]any{"from": "kube1", "to": "kube2", "done": []string{"plan"}}); err != nil {
		t.Fatal(err)
	}
	if err := run(t, w); err != nil {
		t.Fatal(err)
	}
	if c := w.Calls(); !slices.Equal(c, []string{"enqueue unbounded-repave.service"}) {
		t.Errorf("calls %q, want the repave queued (it finishes or rolls back from its journal)", c)
	}
	// A journal that does not verify is an error (recovery's), never a
	// guess.
	if err := w.Write(w.P.Rel(w.P.Journal(lifecycle.RepaveJournal)), "{}\n"); err != nil {
		t.Fatal(err)
	}
	if err := run(t, w); !errors.Is(err, state.ErrCorrupt) {
		t.Errorf("corrupt journal: %v, want ErrCorrupt", err)
	}
}

// A power cut between the staging of first boot's record and its renames
// leaves only the staged pair: the next boot's lifecycle puts the record
// under its own name, and the node's hooks are kept current as usual.
func TestLifecyclePutsAStagedAppliedRecordUnderItsOwnName(t *testing.T) {
	w := newWorld(t, true)
	rec := w.P.AppliedConfig("kube1")
	for _, f := range []string{rec, rec + ".sha256"} {
		if err := os.Rename(f, strings.Replace(f, ".json", ".json.next", 1)); err != nil {
			t.Fatal(err)
		}
	}
	if err := run(t, w); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(rec); err != nil {
		t.Errorf("the record is not under its own name after lifecycle: %v", err)
	}
	for _, f := range []string{rec + ".next", rec + ".next.sha256"} {
		if _, err := os.Lstat(f); !os.IsNotExist(err) {
			t.Errorf("%s is left (%v)", f, err)
		}
	}
	if a, err := state.ReadApplied(w.P, "kube1"); err != nil || a.Slot != "kube1" {
		t.Errorf("the record after lifecycle: %+v, %v", a, err)
	}
	if c := w.Calls(); !slices.Equal(c, []string{"ensure-hooks kube1"}) {
		t.Errorf("calls %q, want only the hooks of kube1", c)
	}
}

// An agent upgrade's override on an image-based host stays while the
// image's agent is older, and goes (record, drop-ins) once an image as new
// or newer was booted.
func TestLifecycleRemovesAnOverrideANewerImageSupersedes(t *testing.T) {
	w := newWorld(t, true)
	dropIn := w.P.Join("/etc/systemd/system/unbounded-daemon.service.d/" + upgrade.OverrideDropIn)
	os.MkdirAll(w.P.Join("/usr/lib/systemd/system"), 0o755)
	os.WriteFile(w.P.Join("/usr/lib/systemd/system/unbounded-daemon.service"), []byte("[Service]\nExecStart=/usr/libexec/unbounded/daemon\n"), 0o644)
	os.MkdirAll(w.P.Join("/var/lib/unbounded/agent/1.1.0/libexec"), 0o700)
	os.WriteFile(w.P.Join("/var/lib/unbounded/agent/override.json"),
		[]byte(`{"version":"1.1.0","dir":"/var/lib/unbounded/agent/1.1.0/libexec","units":["unbounded-daemon.service"]}`), 0o600)
	os.MkdirAll(w.P.Join("/etc/systemd/system/unbounded-daemon.service.d"), 0o755)
	os.WriteFile(dropIn, []byte("[Service]\nBindReadOnlyPaths=/var/lib/unbounded/agent/1.1.0/libexec:/usr/libexec/unbounded\n"), 0o644)
	b := w.Bootstrap(nil)
	for _, tc := range []struct {
		image string
		gone  bool
	}{{"1.0.0", false}, {"1.1.0-rc.1", false}, {"1.1.0", true}} {
		l := &lifecycle.Lifecycle{
			Host:         steps.Host{Paths: w.P, Systemd: func(ctx context.Context) (units.Manager, error) { return b.Systemd(ctx) }, Log: slog.New(slog.NewTextHandler(io.Discard, nil))},
			Mode:         func(name string) (modes.Mode, error) { m, err := w.Mode(name); return hooksMode{m, w}, err },
			ImageVersion: func(context.Context) (string, error) { return tc.image, nil },
		}
		if err := l.Run(context.Background()); err != nil {
			t.Fatal(err)
		}
		o, _ := state.ReadAgentOverride(w.P)
		_, derr := os.Stat(dropIn)
		if gone := o == nil && os.IsNotExist(derr); gone != tc.gone {
			t.Errorf("image %s: override %+v, drop-in %v; want gone=%v", tc.image, o, derr, tc.gone)
		}
	}
}

// On a host the older agent installed, lifecycle adopts its node first
// (lib/adopt has the details), then goes on as on any host of this agent:
// the adopted node's hooks are made current, and nothing restarts it.
func TestLifecycleAdoptsTheOlderAgentsNodeFirst(t *testing.T) {
	w := newWorld(t, false)
	older := `{"MachineName": "site-w1", "Cluster": {"Version": "v1.36.3"}, "Kubelet": {"ApiServer": "127.0.0.1:6443", "BootstrapToken": "abcdef.0123456789abcdef"}}`
	for f, c := range map[string]string{
		"/etc/unbounded/agent/kube1-applied-config.json":     older,
		"/etc/systemd/system/unbounded-agent-daemon.service": "[Service]\n",
		"/var/lib/machines/kube1/etc/os-release":             "ID=debian\n",
	} {
		if err := w.Write(f, c); err != nil {
			t.Fatal(err)
		}
	}
	w.SetUnitState("systemd-nspawn@kube1.service", "active")
	if err := run(t, w); err != nil {
		t.Fatal(err)
	}
	if a, err := state.ReadActive(w.P); err != nil || a == nil || a.Slot != "kube1" || a.Machine != "site-w1" {
		t.Fatalf("adopted record %+v, %v", a, err)
	}
	want := []string{"reload", "reload", "enqueue " + unitnames.NodeTarget, "enqueue " + unitnames.Daemon, "ensure-hooks kube1"}
	if c := w.Calls(); !slices.Equal(c, want) {
		t.Errorf("calls %q, want %q", c, want)
	}
	if st := w.UnitState("systemd-nspawn@kube1.service"); st != "active" {
		t.Errorf("the node machine is %s", st)
	}
}
