package modes_test

import (
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"

	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/modes"
)

// switchRig is a Switch whose every step appends to events, and fails
// when fail names it.
type switchRig struct {
	p       hostpaths.Paths
	events  []string
	fail    map[string]error
	running bool // the new node's units run already
	// crashAt, when set, is the crash point at which the run stops
	// (a panic that Run's caller recovers, as a kill would).
	crashAt string
}

func newRig(t *testing.T) *switchRig { return &switchRig{p: hostpaths.New(t.TempDir())} }

// crashed is the panic of a crash point.
type crashed string

// runUntilCrash runs the switch and reports the crash point it stopped
// at ("" when it returned).
func (r *switchRig) runUntilCrash() (point string, err error) {
	defer func() {
		if c, ok := recover().(crashed); ok {
			point = string(c)
		}
	}()
	return "", r.sw().Run(context.Background())
}

func (r *switchRig) step(name string) error {
	r.events = append(r.events, name)
	return r.fail[name]
}

func (r *switchRig) sw() *modes.Switch {
	return &modes.Switch{
		What:      "test repave",
		Operation: "repave",
		Paths:     r.p,
		Old: modes.Side{
			Desc:  "slot kube1",
			Slot:  "kube1",
			Stop:  func(context.Context) error { return r.step("stop old") },
			Clean: func(context.Context) { r.step("clean old") },
			Start: func(context.Context) error { return r.step("start old") },
		},
		New: modes.Side{
			Desc: "slot kube2",
			Slot: "kube2",
			Start: func(context.Context) error {
				err := r.step("start new")
				r.running = err == nil
				return err
			},
			Clean: func(context.Context) { r.step("clean new") },
			Destroy: func(context.Context) error {
				err := r.step("destroy new")
				r.running = r.running && err != nil
				return err
			},
		},
		Build:      func(context.Context) error { return r.step("build") },
		NewRunning: func(context.Context) (bool, error) { return r.running, nil },
		Hooks: modes.RepaveHooks{
			Fence:   func(context.Context) error { return r.step("fence") },
			Healthy: func(_ context.Context, slot string) error { return r.step("healthy " + slot) },
			Crash: func(p string) {
				r.events = append(r.events, "crash "+p)
				if p == r.crashAt {
					panic(crashed(p))
				}
			},
		},
	}
}

func TestSwitchGoesThroughEveryStepAndCrashPointInOrder(t *testing.T) {
	r := newRig(t)
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

// A switch an earlier build began (no journal) whose new node runs: the
// old node is stopped again, never its network cleaned under the new
// one, and the new one waited for (no fence: its hook would delete the
// Node under the running kubelet).
func TestSwitchOfAnEarlierBuildAfterTheNewNodeStartedOnlyStopsTheOldOneAndWaits(t *testing.T) {
	r := newRig(t)
	r.running = true
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
			r := newRig(t)
			r.fail = map[string]error{failing: errors.New("boom")}
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
			if want := []string{failing, "crash repave/after-rollback-begun", "destroy new", "clean new", "crash repave/after-undo-healthy",
				"fence", "start old", "healthy kube1", "crash repave/after-undo-network-cleaned"}; !slices.Equal(r.events[i:], want) {
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
			r := newRig(t)
			r.fail = map[string]error{"healthy kube2": errors.New("not up"), failing: errors.New("boom")}
			err := r.sw().Run(context.Background())
			if err == nil || errors.Is(err, modes.ErrRolledBack) || !strings.Contains(err.Error(), words) {
				t.Fatalf("err %v, want one saying %q, not wrapping ErrRolledBack", err, words)
			}
		})
	}
	// The fence refusing the old node's start again: nothing runs.
	r := newRig(t)
	r.fail = map[string]error{"healthy kube2": errors.New("not up")}
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
	r := newRig(t)
	r.fail = map[string]error{"fence": errors.New("refused")}
	err := r.sw().Run(context.Background())
	if err == nil || errors.Is(err, modes.ErrRolledBack) || !strings.Contains(err.Error(), "no node runs") {
		t.Fatalf("err %v, want a refusal with no node running", err)
	}
	if slices.Contains(r.events, "start new") || slices.Contains(r.events, "destroy new") {
		t.Errorf("after a refused fence: %q", r.events)
	}
	r = newRig(t)
	w := r.sw()
	w.Hooks.Healthy = nil
	if err := w.Run(context.Background()); !errors.Is(err, modes.ErrHookMissing) || len(r.events) > 0 {
		t.Fatalf("without Healthy: %v after %q, want ErrHookMissing before any step", err, r.events)
	}
}

// A switch cut at every crash point, forward and in its rollback, is
// finished by the next run from its journal: no step journaled done runs
// again (the old network is never cleaned after the new node started),
// an undo journaled done is not undone again, and nothing runs forward
// once the journal says rolling back.
func TestSwitchCutAtEveryPointIsFinishedByTheNextRun(t *testing.T) {
	forward := modes.SwitchPoints("repave")
	for _, point := range forward {
		t.Run(point, func(t *testing.T) {
			r := newRig(t)
			r.crashAt = point
			if got, err := r.runUntilCrash(); got != point {
				t.Fatalf("stopped at %q (%v), want %s", got, err, point)
			}
			cut := len(r.events)
			r.crashAt = ""
			if err := r.sw().Run(context.Background()); err != nil {
				t.Fatalf("rerun after %s: %v", point, err)
			}
			after := r.events[cut:]
			cleaned := slices.Index(forward, point) >= slices.Index(forward, "repave/after-network-cleaned")
			if cleaned && slices.Contains(after, "clean old") {
				t.Errorf("rerun after %s cleaned the old network again: %q", point, after)
			}
			// After the last step was journaled the switch is done: the
			// rerun only removes its journal.
			if done := point == "repave/after-healthy"; slices.Contains(after, "healthy kube2") == done {
				t.Errorf("rerun after %s: %q (want a wait for the new node: %v)", point, after, !done)
			}
			if _, err := os.Stat(r.p.Journal(modes.SwitchJournal("repave"))); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the switch's journal is left after it finished (%v)", err)
			}
		})
	}
	for _, point := range []string{"repave/after-rollback-begun", "repave/after-undo-healthy", "repave/after-undo-network-cleaned"} {
		t.Run(point, func(t *testing.T) {
			r := newRig(t)
			r.fail = map[string]error{"healthy kube2": errors.New("not up")}
			r.crashAt = point
			if got, err := r.runUntilCrash(); got != point {
				t.Fatalf("stopped at %q (%v), want %s", got, err, point)
			}
			cut := len(r.events)
			r.crashAt, r.fail = "", nil
			err := r.sw().Run(context.Background())
			if !errors.Is(err, modes.ErrRolledBack) || !strings.Contains(err.Error(), "not up") {
				t.Fatalf("rerun after %s: %v, want the rollback finished, saying why", point, err)
			}
			after := r.events[cut:]
			if slices.Contains(after, "start new") || slices.Contains(after, "build") || slices.Contains(after, "stop old") {
				t.Errorf("rerun after %s went forward: %q", point, after)
			}
			undone := map[string]string{"repave/after-undo-healthy": "destroy new", "repave/after-undo-network-cleaned": "start old"}
			for p, call := range undone {
				if slices.Index([]string{"repave/after-rollback-begun", "repave/after-undo-healthy", "repave/after-undo-network-cleaned"}, point) >=
					slices.Index([]string{"repave/after-rollback-begun", "repave/after-undo-healthy", "repave/after-undo-network-cleaned"}, p) && slices.Contains(after, call) {
					t.Errorf("rerun after %s did %q again, journaled undone at %s: %q", point, call, p, after)
				}
			}
			if point != "repave/after-undo-network-cleaned" && !slices.Contains(after, "start old") {
				t.Errorf("rerun after %s did not start the old node: %q", point, after)
			}
		})
	}
}

// A fence that refuses holds the switch with both nodes kept: the next
// run asks the fence again and starts the new node, without stopping or
// cleaning the old one again.
func TestSwitchHeldByTheFenceGoesOnAtTheFenceNextTime(t *testing.T) {
	r := newRig(t)
	r.fail = map[string]error{"fence": errors.New("refused")}
	if err := r.sw().Run(context.Background()); err == nil || errors.Is(err, modes.ErrRolledBack) {
		t.Fatalf("refused: %v", err)
	}
	cut := len(r.events)
	r.fail = nil
	if err := r.sw().Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	if want := []string{"fence", "crash repave/after-fence", "start new", "crash repave/after-new-started", "healthy kube2", "crash repave/after-healthy"}; !slices.Equal(r.events[cut:], want) {
		t.Errorf("the run after the refusal: %q, want %q", r.events[cut:], want)
	}
}
