package modes

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/state"
	"unbounded-cloud.io/agent/lib/steps"
)

// Side is one side of a Switch: the node that runs before it (Old) or the
// one it switches to (New).
type Side struct {
	// Desc names the node in errors and logs ("slot kube1", "slot kube1
	// of mode nspawn").
	Desc string
	// Slot is the slot whose health Hooks.Healthy waits for.
	Slot string
	// Stop stops the node, bounded; stopping a stopped node is a no-op
	// (Old only).
	Stop func(ctx context.Context) error
	// Clean, when set, cleans what the stopped node left on the host (its
	// networking; best effort, logged) after Stop (Old), and after
	// Destroy in a rollback (New).
	Clean func(ctx context.Context)
	// Start starts the node's supervising units.
	Start func(ctx context.Context) error
	// Destroy stops the node and removes its slot, and fails unless both
	// are gone (New only: a rollback's first step).
	Destroy func(ctx context.Context) error
}

// The steps of a Switch, named as its crash points end:
// "<operation>/after-<step>" (SwitchPoints).
const (
	SwitchBuilt      = "new-built"
	SwitchOldStopped = "old-stopped"
	SwitchCleaned    = "network-cleaned"
	SwitchFence      = "fence"
	SwitchNewStarted = "new-started"
	SwitchHealthy    = "healthy"
)

// Switch is the one switch from a running node to a new one, with its
// rollback, that every change of node stack between slots is written on:
// the blue/green repave of modes nspawn and container
// (lib/modes/bluegreen) and the change between modes (Change). It is a
// list of steps on lib/steps, whose journal (SwitchJournal, beside the
// operation's) it keeps, and whose undo is its rollback; mode none's
// in-place switch is another list on the same runner. What differs
// between the switches is in Old, New and Build; the order, the crash
// points, the rollback and what an error says are written here once:
//
//  1. new-built: Build, when set, makes the new node ready to start while
//     the old one serves; "<op>/after-new-built"
//  2. network-cleaned (old-stopped without Old.Clean): the old node is
//     stopped, "<op>/after-old-stopped"; Old.Clean, when set,
//     "<op>/after-network-cleaned"
//  3. healthy: unless the new node runs already (a run cut after its
//     start), Hooks.Fence (the caller deletes the Node, then runs the
//     allocation fence), "<op>/after-fence", and the new node is started,
//     "<op>/after-new-started"; then Hooks.Healthy waits for it, bounded,
//     "<op>/after-healthy".
//
// A failure of Build, of the old node's stop or of the fence holds the
// switch where it is (steps.ErrHold): a refusal starts no node, the old
// no more than the new, and a rerun tries that step again. A new node
// that does not start or get healthy is rolled back, journaled and
// resumable (steps.Step.Undo, crash points "<op>/after-rollback-begun",
// "<op>/after-undo-<step>"): New destroyed (checked gone) and cleaned,
// the fence run again, the old node started and waited for; the error
// says each of these and wraps ErrRolledBack. A rollback that stops
// returns an error that does not wrap it and says what is left; the
// next run goes on with it.
//
// A rerun after a crash goes on from the journal: a step journaled done
// is not done again (the old network is never cleaned under a new node
// that runs), the last one always starts what a reboot stopped. A switch
// an earlier build began has no journal: when its new node runs
// (NewRunning) the old one is stopped again and the steps before the
// last are taken as done.
type Switch struct {
	// What begins every error ("nspawn repave", "isolation change").
	What string
	// Operation names the crash points: "<Operation>/after-<step>".
	Operation string
	// Paths is the host whose journal directory keeps the switch's
	// journal (SwitchJournal(Operation)).
	Paths    hostpaths.Paths
	Old, New Side
	// Build, when set, is step 1 (see Switch).
	Build func(ctx context.Context) error
	// NewRunning says whether the new node's units run already.
	NewRunning func(ctx context.Context) (bool, error)
	Hooks      RepaveHooks
	Log        *slog.Logger
}

// SwitchJournal is the name of the journal of operation's switch
// (/var/lib/unbounded/journal/<operation>-switch.json): the operation
// removes a stale one when it plans anew.
func SwitchJournal(operation string) string { return operation + "-switch" }

// SwitchPoints are the crash points of a Switch of operation with Build
// and Old.Clean, in the order it reaches them.
func SwitchPoints(operation string) []string {
	var out []string
	for _, s := range []string{SwitchBuilt, SwitchOldStopped, SwitchCleaned, SwitchFence, SwitchNewStarted, SwitchHealthy} {
		out = append(out, operation+"/after-"+s)
	}
	return out
}

// switchJournal is what a Switch keeps: the runner's record.
type switchJournal struct {
	steps.Record
}

func (w *Switch) log() *slog.Logger {
	if w.Log != nil {
		return w.Log
	}
	return slog.Default()
}

func (w *Switch) crash(step string) {
	if w.Hooks.Crash != nil {
		w.Hooks.Crash(w.Operation + "/after-" + step)
	}
}

// Run carries the switch out, or goes on with one a crash cut (see
// Switch).
func (w *Switch) Run(ctx context.Context) error {
	if err := w.Hooks.Check(); err != nil {
		return fmt.Errorf("%s: %w", w.What, err)
	}
	name := SwitchJournal(w.Operation)
	var j switchJournal
	found, err := state.ReadJournal(w.Paths, name, &j)
	if err != nil {
		return fmt.Errorf("%s: %w", w.What, err)
	}
	list := w.steps()
	if !found {
		up, err := w.NewRunning(ctx)
		if err != nil {
			return err
		}
		if up {
			// An earlier build's switch cut after the new node started:
			// the old one was stopped before it, but make sure (its
			// network was cleaned then: never under a new node).
			if err := w.Old.Stop(ctx); err != nil {
				return fmt.Errorf("%s: stop the old node (%s): %w", w.What, w.Old.Desc, err)
			}
			for _, s := range list[:len(list)-1] {
				j.Done = append(j.Done, s.Name)
			}
		}
	}
	crash := w.Hooks.Crash
	if crash == nil {
		crash = func(string) {}
	}
	run := &steps.Runner{Paths: w.Paths, Operation: w.Operation, JournalName: name, Journal: &j, Notify: func(string) {}, CrashPoint: crash, Log: w.log()}
	err = run.Run(ctx, list)
	var rb *steps.RolledBackError
	var ue *steps.UndoError
	switch {
	case err == nil:
		return state.RemoveJournal(w.Paths, name)
	case errors.As(err, &rb):
		if rerr := state.RemoveJournal(w.Paths, name); rerr != nil {
			return fmt.Errorf("%s: %w; rolled back, but its journal was not removed: %w", w.What, causeOf(rb.Cause, rb.Reason), rerr)
		}
		w.log().Info("rolled back", "running", w.Old.Desc, "removed", w.New.Desc)
		return fmt.Errorf("%s: %w; rolled back: %s stopped and removed (checked gone), %s started again and healthy: %w", w.What, causeOf(rb.Cause, rb.Reason), w.New.Desc, w.Old.Desc, ErrRolledBack)
	case errors.As(err, &ue):
		return fmt.Errorf("%s: %w; %w", w.What, causeOf(ue.Cause, ue.Reason), ue.Err)
	}
	step, cause := steps.Failed(err)
	if step == SwitchBuilt {
		return cause // Build's error says whose build it is
	}
	return fmt.Errorf("%s: %w", w.What, cause)
}

// causeOf is the failure that began a rollback: the step's error when
// this run saw it, else the reason the journal kept.
func causeOf(cause error, reason string) error {
	if cause != nil {
		return cause
	}
	return errors.New(reason)
}

// rollbackContext is the context of a rollback's undo: one that a
// SIGTERM or a timeout ended must still let the rollback through.
func rollbackContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), 15*time.Minute)
}

// steps are the switch's steps (see Switch).
func (w *Switch) steps() []steps.Step {
	var list []steps.Step
	if w.Build != nil {
		list = append(list, steps.Step{Name: SwitchBuilt, Run: func(ctx context.Context) error { return steps.Hold(w.Build(ctx)) }})
	}
	stopName := SwitchOldStopped
	if w.Old.Clean != nil {
		stopName = SwitchCleaned
	}
	list = append(list, steps.Step{
		Name: stopName,
		Run: func(ctx context.Context) error {
			stopped := time.Now()
			if err := w.Old.Stop(ctx); err != nil {
				return steps.Hold(fmt.Errorf("stop the old node (%s): %w", w.Old.Desc, err))
			}
			w.log().Info("old node stopped", "node", w.Old.Desc, "took", time.Since(stopped).Round(time.Millisecond).String())
			if w.Old.Clean != nil {
				w.crash(SwitchOldStopped)
				w.Old.Clean(ctx)
			}
			return nil
		},
		// The rollback's start of the old node, fenced like any start.
		Undo: func(ctx context.Context) error {
			ctx, cancel := rollbackContext(ctx)
			defer cancel()
			if err := w.Hooks.Fence(ctx); err != nil {
				return fmt.Errorf("%s stopped and removed; rollback stopped before starting %s again: %v; no node runs", w.New.Desc, w.Old.Desc, err)
			}
			if err := w.Old.Start(ctx); err != nil {
				return fmt.Errorf("%s stopped and removed; rollback failed: %s did not start again: %v", w.New.Desc, w.Old.Desc, err)
			}
			if err := w.Hooks.Healthy(ctx, w.Old.Slot); err != nil {
				return fmt.Errorf("%s stopped and removed; %s started again but is not healthy: %v", w.New.Desc, w.Old.Desc, err)
			}
			return nil
		},
	})
	return append(list, steps.Step{
		Name: SwitchHealthy,
		Run: func(ctx context.Context) error {
			// A run cut after the new node's start finds it running:
			// only the wait is left (the fence hook would delete the
			// Node under its kubelet, which would not register it again).
			up, err := w.NewRunning(ctx)
			if err != nil {
				return steps.Hold(err)
			}
			if !up {
				if err := w.Hooks.Fence(ctx); err != nil {
					return steps.Hold(fmt.Errorf("before starting %s: %w; no node runs (%s stopped, %s built; a rerun tries again)", w.New.Desc, err, w.Old.Desc, w.New.Desc))
				}
				w.crash(SwitchFence)
				if err := w.New.Start(ctx); err != nil {
					return fmt.Errorf("start of %s failed: %w", w.New.Desc, err)
				}
				w.log().Info("new node started", "node", w.New.Desc)
				w.crash(SwitchNewStarted)
			}
			if err := w.Hooks.Healthy(ctx, w.New.Slot); err != nil {
				return fmt.Errorf("%s did not become healthy: %w", w.New.Desc, err)
			}
			return nil
		},
		// The new node goes first in a rollback, checked gone.
		Undo: func(ctx context.Context) error {
			ctx, cancel := rollbackContext(ctx)
			defer cancel()
			w.log().Error("new node failed; rolling back", "new", w.New.Desc, "old", w.Old.Desc)
			if err := w.New.Destroy(ctx); err != nil {
				return fmt.Errorf("rollback failed: %s not removed: %v (%s is stopped)", w.New.Desc, err, w.Old.Desc)
			}
			if w.New.Clean != nil {
				w.New.Clean(ctx)
			}
			return nil
		},
	})
}
