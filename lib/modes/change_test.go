package modes_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/modes"
	"unbounded-cloud.io/agent/lib/modes/facts"
	"unbounded-cloud.io/agent/lib/modes/modestest"
	"unbounded-cloud.io/agent/lib/unitnames"
)

// changeWorld is two recording modes and the unit states they change.
type changeWorld struct {
	p      hostpaths.Paths
	events []string
	active map[string]string
}

func (w *changeWorld) Reload(context.Context) error { return nil }
func (w *changeWorld) StartUnit(_ context.Context, u string) error {
	w.active[u] = "active"
	return nil
}
func (w *changeWorld) RestartUnit(context.Context, string) error { return nil }
func (w *changeWorld) StopUnit(_ context.Context, u string) error {
	w.active[u] = "inactive"
	return nil
}
func (w *changeWorld) ActiveState(_ context.Context, u string) (string, error) {
	if s := w.active[u]; s != "" {
		return s, nil
	}
	return "inactive", nil
}
func (w *changeWorld) Close() {}

// fakeMode records the operations Change calls and moves its supervising
// units as the real mode would.
type fakeMode struct {
	name     string
	w        *changeWorld
	startErr error
}

func (m *fakeMode) Name() string           { return m.name }
func (m *fakeMode) NodeRoot(string) string { return "/" }
func (m *fakeMode) Installed() bool        { return true }
func (m *fakeMode) InPlace() bool          { return m.name == "none" }
func (m *fakeMode) log(op, slot string)    { m.w.events = append(m.w.events, op+" "+m.name+" "+slot) }
func (m *fakeMode) Prepare(context.Context, modes.Slot) error {
	return errors.New("not called by Change")
}
func (m *fakeMode) EnsureHooks(context.Context, string) error { return nil }
func (m *fakeMode) Restart(context.Context, string) error     { return nil }
func (m *fakeMode) Repave(context.Context, string, modes.Slot, modes.RepaveHooks) error {
	return errors.New("not called by Change")
}

func (m *fakeMode) Start(ctx context.Context, slot string) error {
	m.log("start", slot)
	if m.startErr != nil {
		return m.startErr
	}
	for _, u := range facts.Supervising(m.name, slot) {
		m.w.StartUnit(ctx, u)
	}
	return nil
}

func (m *fakeMode) Stop(ctx context.Context, slot string) error {
	m.log("stop", slot)
	for _, u := range facts.Supervising(m.name, slot) {
		m.w.StopUnit(ctx, u)
	}
	return nil
}

func (m *fakeMode) Destroy(ctx context.Context, slot string) error {
	m.log("destroy", slot)
	return m.Stop(ctx, slot)
}

func changeFixture(t *testing.T) (*changeWorld, *fakeMode, *fakeMode, modes.Slot) {
	w := &changeWorld{p: hostpaths.New(t.TempDir()), active: map[string]string{}}
	from, to := &fakeMode{name: "nspawn", w: w}, &fakeMode{name: "none", w: w}
	from.Start(context.Background(), "kube1")
	w.events = nil
	return w, from, to, modes.Slot{Name: "kube2", Node: modestest.Node(), Artifacts: modestest.Artifacts(t)}
}

func changeHooks(w *changeWorld, fence error, healthy func(slot string) error) modes.RepaveHooks {
	return modes.RepaveHooks{
		Fence: func(context.Context) error { w.events = append(w.events, "fence"); return fence },
		Healthy: func(_ context.Context, slot string) error {
			w.events = append(w.events, "healthy "+slot)
			return healthy(slot)
		},
		Crash: func(p string) { w.events = append(w.events, p) },
	}
}

func ok(string) error { return nil }

// The old node is stopped entirely before the fence, the new one started
// only after the fence allowed it, then waited for; a rerun after the
// new node started only stops the old one again and waits.
func TestChangeStopsTheOldModeBeforeTheFenceAndStartsTheNewMode(t *testing.T) {
	w, from, to, s := changeFixture(t)
	if err := modes.Change(context.Background(), w.p, w, from, "kube1", to, s, changeHooks(w, nil, ok)); err != nil {
		t.Fatal(err)
	}
	want := []string{"stop nspawn kube1", modes.CrashChangeOldStopped, "fence", modes.CrashChangeFence,
		"start none kube2", modes.CrashChangeNewStarted, "healthy kube2", modes.CrashChangeHealthy}
	if !slices.Equal(w.events, want) {
		t.Errorf("events\n%q, want\n%q", w.events, want)
	}
	w.events = nil
	if err := modes.Change(context.Background(), w.p, w, from, "kube1", to, s, changeHooks(w, nil, ok)); err != nil {
		t.Fatal(err)
	}
	if want := []string{"stop nspawn kube1", "healthy kube2", modes.CrashChangeHealthy}; !slices.Equal(w.events, want) {
		t.Errorf("rerun: events %q, want %q", w.events, want)
	}
}

// A new node that never gets healthy is removed, the fence asked again,
// and the old mode's node started and waited for: ErrRolledBack.
func TestChangeRollsBackToTheOldModeWhenTheNewNodeIsNotHealthy(t *testing.T) {
	w, from, to, s := changeFixture(t)
	err := modes.Change(context.Background(), w.p, w, from, "kube1", to, s, changeHooks(w, nil, func(slot string) error {
		if slot == "kube2" {
			return errors.New("kubelet healthz: connection refused")
		}
		return nil
	}))
	if !errors.Is(err, modes.ErrRolledBack) || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("error %v, want one that wraps ErrRolledBack and says why", err)
	}
	want := []string{"stop nspawn kube1", modes.CrashChangeOldStopped, "fence", modes.CrashChangeFence,
		"start none kube2", modes.CrashChangeNewStarted, "healthy kube2", "isolation/after-rollback-begun",
		"destroy none kube2", "stop none kube2", "isolation/after-undo-healthy",
		"fence", "start nspawn kube1", "healthy kube1", "isolation/after-undo-old-stopped"}
	if !slices.Equal(w.events, want) {
		t.Errorf("events\n%q, want\n%q", w.events, want)
	}
	if w.active["systemd-nspawn@kube1.service"] != "active" || w.active[unitnames.Kubelet] == "active" {
		t.Errorf("after the rollback: %v", w.active)
	}
	// A new node that does not even start rolls back the same way.
	w, from, to, s = changeFixture(t)
	to.startErr = errors.New("job failed")
	if err := modes.Change(context.Background(), w.p, w, from, "kube1", to, s, changeHooks(w, nil, ok)); !errors.Is(err, modes.ErrRolledBack) {
		t.Fatalf("start failure: %v, want ErrRolledBack", err)
	}
}

// A fence that refuses leaves no node running and rolls nothing back: a
// rerun asks again (nothing starts without a fence that allowed it).
func TestChangeStartsNothingAfterTheFenceRefused(t *testing.T) {
	w, from, to, s := changeFixture(t)
	err := modes.Change(context.Background(), w.p, w, from, "kube1", to, s, changeHooks(w, errors.New("refused"), ok))
	if err == nil || errors.Is(err, modes.ErrRolledBack) {
		t.Fatalf("error %v, want a failure that is no rollback", err)
	}
	if want := []string{"stop nspawn kube1", modes.CrashChangeOldStopped, "fence"}; !slices.Equal(w.events, want) {
		t.Errorf("events %q, want %q", w.events, want)
	}
}

func TestChangeRefusesWhatItCannotDo(t *testing.T) {
	w, from, to, s := changeFixture(t)
	s.Name = "kube1"
	if err := modes.Change(context.Background(), w.p, w, from, "kube1", to, s, changeHooks(w, nil, ok)); err == nil {
		t.Error("a change into the running slot was not refused")
	}
	s.Name = "kube2"
	if err := modes.Change(context.Background(), w.p, w, from, "kube1", to, s, modes.RepaveHooks{}); !errors.Is(err, modes.ErrHookMissing) {
		t.Errorf("no hooks: %v, want ErrHookMissing", err)
	}
	if len(w.events) != 0 {
		t.Errorf("a refused change did %q", w.events)
	}
}

func TestChangeMethodIsTheTables(t *testing.T) {
	for _, c := range []struct{ from, to, want string }{
		{"nspawn", "none", modes.MethodInPlace},
		{"none", "nspawn", modes.MethodInPlace},
		{"nspawn", "container", modes.MethodInPlace},
		{"container", "nspawn", modes.MethodInPlace},
		{"container", "none", modes.MethodInPlace},
		{"none", "container", modes.MethodInPlace},
		{"none", "none", ""},
		{"nspawn", "docker", ""},
	} {
		got, err := modes.ChangeMethod(c.from, c.to)
		if got != c.want || (err == nil) != (c.want != "") {
			t.Errorf("ChangeMethod(%s, %s) = %q, %v; want %q", c.from, c.to, got, err, c.want)
		}
		if err != nil && c.from != c.to && !strings.Contains(err.Error(), "nspawn -> none") {
			t.Errorf("ChangeMethod(%s, %s): %v does not say what this build changes", c.from, c.to, err)
		}
	}
}

// A method asked for is the change's when this build carries it out for
// the pair (both, for every pair of the table); "" is the table's; a
// pair without a row or an unknown method is refused.
func TestChangeMethodAskedIsTheAskedOneForAPairOfTheTable(t *testing.T) {
	for _, c := range []struct{ from, to, asked, want, wantErr string }{
		{"nspawn", "none", "", modes.MethodInPlace, ""},
		{"nspawn", "none", modes.MethodReprovision, modes.MethodReprovision, ""},
		{"container", "none", modes.MethodInPlace, modes.MethodInPlace, ""},
		{"none", "nspawn", "Teleport", "", `method "Teleport": not carried out by this build`},
		{"nspawn", "docker", modes.MethodReprovision, "", "not carried out by this build"},
		{"none", "none", modes.MethodReprovision, "", "the same mode"},
	} {
		got, err := modes.ChangeMethodAsked(c.from, c.to, c.asked)
		if got != c.want || (err == nil) != (c.wantErr == "") || (err != nil && !strings.Contains(err.Error(), c.wantErr)) {
			t.Errorf("ChangeMethodAsked(%s, %s, %q) = %q, %v; want %q, error %q", c.from, c.to, c.asked, got, err, c.want, c.wantErr)
		}
	}
}
