package modes_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"unbounded-cloud.io/agent/lib/modes"
)

// switchRig is a Switch whose every step appends to events, and fails
// when fail names it.
type switchRig struct {
	events  []string
	fail    map[string]error
	running bool // the new node's units run already
}

func (r *switchRig) step(name string) error {
	r.events = append(r.events, name)
	return r.fail[name]
}

func (r *switchRig) sw() *modes.Switch {
	return &modes.Switch{
		What:      "test repave",
		Operation: "repave",
		Old: modes.Side{
			Desc:  "slot kube1",
			Slot:  "kube1",
			Stop:  func(context.Context) error { return r.step("stop old") },
			Clean: func(context.Context) { r.step("clean old") },
			Start: func(context.Context) error { return r.step("start old") },
		},
		New: modes.Side{
			Desc:    "slot kube2",
			Slot:    "kube2",
			Start:   func(context.Context) error { return r.step("start new") },
			Clean:   func(context.Context) { r.step("clean new") },
			Destroy: func(context.Context) error { return r.step("destroy new") },
		},
		Build:      func(context.Context) error { return r.step("build") },
		NewRunning: func(context.Context) (bool, error) { return r.running, nil },
		Hooks: modes.RepaveHooks{
			Fence:   func(context.Context) error { return r.step("fence") },
			Healthy: func(_ context.Context, slot string) error { return r.step("healthy " + slot) },
			Crash:   func(p string) { r.events = append(r.events, "crash "+p) },
		},
	}
}

func TestSwitchGoesThroughEveryStepAndCrashPointInOrder(t *testing.T) {
	r := &switchRig{}
	if err := r.sw().Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	want := []string{"build", "crash repave/after-new-built", "stop old", "crash repave/after-old-stopped",
		"clean old", "crash repave/after-network-cleaned", "fence", "crash repave/after-fence",
		"start new", "crash repave/after-new-started", "healthy kube2", "crash repave/after-healthy"}
	if !slices.Equal(r.events, want) {
		t.Fatalf("steps:\n got %q\nwant %q", r.events, want)
	}
	var points []string
	for _, e := range r.events {
		if p, ok := strings.CutPrefix(e, "crash "); ok {
			points = append(points, p)
		}
	}
	if !slices.Equal(points, modes.SwitchPoints("repave")) {
		t.Errorf("crash points %q, SwitchPoints says %q", points, modes.SwitchPoints("repave"))
	}
}

func TestSwitchRerunAfterTheNewNodeStartedOnlyStopsTheOldOneAndWaits(t *testing.T) {
	r := &switchRig{running: true}
	if err := r.sw().Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	if want := []string{"stop old", "healthy kube2", "crash repave/after-healthy"}; !slices.Equal(r.events, want) {
		t.Fatalf("steps %q, want %q", r.events, want)
	}
}

func TestSwitchRollsBackANewNodeThatDoesNotComeUp(t *testing.T) {
	for _, failing := range []string{"start new", "healthy kube2"} {
		t.Run(failing, func(t *testing.T) {
			r := &switchRig{fail: map[string]error{failing: errors.New("boom")}}
			err := r.sw().Run(context.Background())
			if !errors.Is(err, modes.ErrRolledBack) {
				t.Fatalf("err %v, want one wrapping ErrRolledBack", err)
			}
			for _, words := range []string{"test repave: ", "boom", "rolled back", "slot kube2 stopped and removed", "slot kube1 started again and healthy"} {
				if !strings.Contains(err.Error(), words) {
					t.Errorf("error %q does not say %q", err, words)
				}
			}
			i := slices.Index(r.events, failing)
			if want := []string{failing, "destroy new", "clean new", "fence", "start old", "healthy kube1"}; !slices.Equal(r.events[i:], want) {
				t.Errorf("rollback %q, want %q", r.events[i:], want)
			}
		})
	}
}

// A rollback that cannot finish says what is left and does not wrap
// ErrRolledBack: the caller reports a node that may be down, not one
// that runs as before.
func TestSwitchRollbackThatFailsSaysWhatIsLeft(t *testing.T) {
	for failing, words := range map[string]string{
		"destroy new":   "rollback failed: slot kube2 not removed",
		"start old":     "rollback failed: slot kube1 did not start again",
		"healthy kube1": "slot kube1 started again but is not healthy",
	} {
		t.Run(failing, func(t *testing.T) {
			r := &switchRig{fail: map[string]error{"healthy kube2": errors.New("not up"), failing: errors.New("boom")}}
			err := r.sw().Run(context.Background())
			if err == nil || errors.Is(err, modes.ErrRolledBack) || !strings.Contains(err.Error(), words) {
				t.Fatalf("err %v, want one saying %q, not wrapping ErrRolledBack", err, words)
			}
		})
	}
	// The fence refusing the old node's start again: nothing runs.
	r := &switchRig{fail: map[string]error{"healthy kube2": errors.New("not up")}}
	w := r.sw()
	fences := 0
	w.Hooks.Fence = func(context.Context) error {
		if fences++; fences > 1 {
			return errors.New("refused")
		}
		return nil
	}
	err := w.Run(context.Background())
	if err == nil || errors.Is(err, modes.ErrRolledBack) || !strings.Contains(err.Error(), "no node runs") || slices.Contains(r.events, "start old") {
		t.Fatalf("err %v after %q: want the old node not started and the error saying no node runs", err, r.events)
	}
}

func TestSwitchStartsNothingAfterTheFenceRefusedOrWithoutItsHooks(t *testing.T) {
	r := &switchRig{fail: map[string]error{"fence": errors.New("refused")}}
	err := r.sw().Run(context.Background())
	if err == nil || errors.Is(err, modes.ErrRolledBack) || !strings.Contains(err.Error(), "no node runs") {
		t.Fatalf("err %v, want a refusal with no node running", err)
	}
	if slices.Contains(r.events, "start new") || slices.Contains(r.events, "destroy new") {
		t.Errorf("after a refused fence: %q", r.events)
	}
	r = &switchRig{}
	w := r.sw()
	w.Hooks.Healthy = nil
	if err := w.Run(context.Background()); !errors.Is(err, modes.ErrHookMissing) || len(r.events) > 0 {
		t.Fatalf("without Healthy: %v after %q, want ErrHookMissing before any step", err, r.events)
	}
}
