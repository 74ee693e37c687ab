package nspawn

import (
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"

	"unbounded-cloud.io/agent/lib/modes/bluegreen/tree/treetest"

	"unbounded-cloud.io/agent/lib/modes"
)

// repaveFixture is slot kube1 prepared and running, and slot kube2's
// input (the same node, another image tag).
func repaveFixture(t *testing.T) (*fixture, modes.Slot, *[]string) {
	t.Helper()
	treetest.RequireRoot(t)
	ref := treetest.ServeRegistry(t, "unbounded/node:1.36.3", treetest.NodeImage(t))
	f := newFixture(t, mountsLegacy, ref)
	ctx := context.Background()
	if err := f.m.Prepare(ctx, f.slot); err != nil {
		t.Fatal(err)
	}
	if err := f.m.Start(ctx, "kube1"); err != nil {
		t.Fatal(err)
	}
	var cleaned []string
	f.m.NetworkCleaner = func(_ context.Context, slot string) { cleaned = append(cleaned, slot) }
	f.sd.Calls = nil
	s := f.slot
	s.Name = "kube2"
	return f, s, &cleaned
}

func hooks(events *[]string, healthy func(slot string) error) modes.RepaveHooks {
	return modes.RepaveHooks{
		Fence: func(context.Context) error { *events = append(*events, "fence"); return nil },
		Healthy: func(_ context.Context, slot string) error {
			*events = append(*events, "healthy "+slot)
			return healthy(slot)
		},
		Crash: func(p string) { *events = append(*events, p) },
	}
}

func TestRepaveStopsTheOldMachineBeforeTheFenceAndStartsTheNewOne(t *testing.T) {
	f, s, cleaned := repaveFixture(t)
	var ev []string
	if err := f.m.Repave(context.Background(), "kube1", s, hooks(&ev, func(string) error { return nil })); err != nil {
		t.Fatal(err)
	}
	wantCalls := []string{"reload", "stop systemd-nspawn@kube1.service", "start systemd-nspawn@kube2.service"}
	var got []string
	for _, c := range f.sd.Calls {
		if strings.HasPrefix(c, "stop") || strings.HasPrefix(c, "start") || c == "reload" {
			got = append(got, c)
		}
	}
	if !slices.Equal(got, wantCalls) {
		t.Errorf("systemd calls %q, want %q", got, wantCalls)
	}
	wantEv := []string{"repave/after-new-built", "repave/after-old-stopped", "repave/after-network-cleaned", "fence",
		"repave/after-fence", "repave/after-new-started", "healthy kube2", "repave/after-healthy"}
	if !slices.Equal(ev, wantEv) {
		t.Errorf("hooks %q, want %q", ev, wantEv)
	}
	if !slices.Equal(*cleaned, []string{"kube1"}) {
		t.Errorf("network cleaned for %q, want kube1 once", *cleaned)
	}
	if !f.m.prepared(s) {
		t.Errorf("slot kube2 is not prepared after the repave")
	}
	// Called again with the new node running and no journal of the
	// switch (a switch an earlier build began, cut past the start): the
	// old network is not cleaned under the new node; only the health
	// wait is left.
	ev, f.sd.Calls = nil, nil
	if err := f.m.Repave(context.Background(), "kube1", s, hooks(&ev, func(string) error { return nil })); err != nil {
		t.Fatal(err)
	}
	if want := []string{"healthy kube2", "repave/after-healthy"}; !slices.Equal(ev, want) || len(*cleaned) != 1 || slices.Contains(f.sd.Calls, "start systemd-nspawn@kube2.service") {
		t.Errorf("rerun: calls %q, hooks %q, cleaned %q: want hooks %q and no second cleaning", f.sd.Calls, ev, *cleaned, want)
	}
}

func TestRepaveSkipsTheBuildOfASlotPreparedForTheSameInput(t *testing.T) {
	f, s, _ := repaveFixture(t)
	if err := f.m.Prepare(context.Background(), s); err != nil {
		t.Fatal(err)
	}
	marker := f.p.MachineDir("kube2") + "/built-before"
	os.WriteFile(marker, nil, 0o644)
	var ev []string
	if err := f.m.Repave(context.Background(), "kube1", s, hooks(&ev, func(string) error { return nil })); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(marker); err != nil {
		t.Errorf("the slot built beside was built again: %v", err)
	}
	// Another input (another Kubernetes version) is built again.
	s2 := s
	s2.Node.KubernetesVersion = "1.36.4"
	if f.m.prepared(s2) {
		t.Errorf("a slot prepared for 1.36.3 counts as prepared for 1.36.4")
	}
}

func TestRepaveRollsBackWhenTheNewNodeIsNotHealthy(t *testing.T) {
	f, s, cleaned := repaveFixture(t)
	var ev []string
	err := f.m.Repave(context.Background(), "kube1", s, hooks(&ev, func(slot string) error {
		if slot == "kube2" {
			return errors.New("node not up within 1s; still missing: Node site-w1 Ready")
		}
		return nil
	}))
	if !errors.Is(err, modes.ErrRolledBack) {
		t.Fatalf("repave with a new node never healthy: %v, want ErrRolledBack", err)
	}
	for _, words := range []string{"kube2 did not become healthy", "stopped and removed", "checked gone", "kube1 started again"} {
		if !strings.Contains(err.Error(), words) {
			t.Errorf("the error does not say %q: %v", words, err)
		}
	}
	for _, p := range f.m.SlotPaths("kube2") {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s left after the rollback (%v)", f.p.Rel(p), err)
		}
	}
	if st, _ := f.sd.ActiveState(context.Background(), Unit("kube1")); st != "active" {
		t.Errorf("kube1 is %s after the rollback", st)
	}
	if st, _ := f.sd.ActiveState(context.Background(), Unit("kube2")); st == "active" {
		t.Errorf("kube2 still runs after the rollback")
	}
	if !slices.Equal(*cleaned, []string{"kube1", "kube2"}) {
		t.Errorf("network cleaned for %q, want kube1 then kube2", *cleaned)
	}
	n := 0
	for _, e := range ev {
		if e == "fence" {
			n++
		}
	}
	if n != 2 {
		t.Errorf("fence ran %d times, want 2 (before each start): %q", n, ev)
	}
}

func TestRepaveWithARefusedFenceStartsNothing(t *testing.T) {
	f, s, _ := repaveFixture(t)
	h := modes.RepaveHooks{Fence: func(context.Context) error { return errors.New("refused by the allocation fence") },
		Healthy: func(_ context.Context, slot string) error {
			t.Errorf("health wait for %s after a refused fence", slot)
			return nil
		}}
	err := f.m.Repave(context.Background(), "kube1", s, h)
	if err == nil || errors.Is(err, modes.ErrRolledBack) || !strings.Contains(err.Error(), "no node runs") {
		t.Fatalf("repave with a refused fence: %v, want an error saying no node runs", err)
	}
	for _, u := range []string{Unit("kube1"), Unit("kube2")} {
		if st, _ := f.sd.ActiveState(context.Background(), u); st == "active" {
			t.Errorf("%s runs after a refused fence", u)
		}
	}
}

// A repave without its fence or its health wait fails closed: refused
// before anything changes.
func TestRepaveWithoutItsHooksChangesNothing(t *testing.T) {
	f, s, _ := repaveFixture(t)
	for _, h := range []modes.RepaveHooks{{}, {Fence: func(context.Context) error { return nil }}, {Healthy: func(context.Context, string) error { return nil }}} {
		f.sd.Calls = nil
		err := f.m.Repave(context.Background(), "kube1", s, h)
		if !errors.Is(err, modes.ErrHookMissing) || len(f.sd.Calls) != 0 {
			t.Errorf("hooks %+v: %v, calls %q; want ErrHookMissing and no call", h, err, f.sd.Calls)
		}
	}
	if _, err := os.Stat(f.p.MachineDir("kube2")); !os.IsNotExist(err) {
		t.Errorf("new slot built without hooks: %v", err)
	}
}

func TestEnsureHooksRewritesOnlyWhatDiffersAndNeverRestarts(t *testing.T) {
	f, _, _ := repaveFixture(t)
	ctx := context.Background()
	if err := f.m.EnsureHooks(ctx, "kube1"); err != nil {
		t.Fatal(err)
	}
	if len(f.sd.Calls) != 0 {
		t.Errorf("current hooks: calls %q, want none", f.sd.Calls)
	}
	os.WriteFile(f.p.NspawnConfig("kube1"), []byte("[Exec]\nBoot=yes\n"), 0o644)
	if err := f.m.EnsureHooks(ctx, "kube1"); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(f.sd.Calls, []string{"reload"}) {
		t.Errorf("stale settings file: calls %q, want one reload and no restart", f.sd.Calls)
	}
	if b, _ := os.ReadFile(f.p.NspawnConfig("kube1")); !strings.Contains(string(b), "PrivateUsers=no") {
		t.Errorf("the settings file was not rewritten:\n%s", b)
	}
}
