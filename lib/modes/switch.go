package modes

import (
	"context"
	"fmt"
	"log/slog"
	"time"
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
// rollback, that every change of node stack in place is written on: the
// blue/green repave of modes nspawn and container (lib/modes/bluegreen)
// and the change between modes (Change). What differs between them is
// in Old, New and Build; the order, the crash points, the rollback and
// what an error says are written here once:
//
//  1. Build, when set, makes the new node ready to start while the old
//     one serves; "<op>/after-new-built"
//  2. the old node is stopped; "<op>/after-old-stopped"
//  3. Old.Clean, when set; "<op>/after-network-cleaned"
//  4. Hooks.Fence (the caller deletes the Node, then runs the allocation
//     fence); a refusal stops here with no node running and both kept (a
//     rerun tries again); "<op>/after-fence"
//  5. the new node is started; "<op>/after-new-started"
//  6. Hooks.Healthy waits for it, bounded; "<op>/after-healthy".
//
// A new node that does not start or get healthy is rolled back: New
// destroyed (checked gone) and cleaned, the fence run again, the old node
// started and waited for; the error says each of these and wraps
// ErrRolledBack. A rollback that itself fails returns an error that does
// not wrap it and says what is left.
//
// Each step is decided from what runs, so a rerun after a crash anywhere
// goes on from there: NewRunning true (a crash after 5) makes sure the
// old node is stopped and goes on at 6; otherwise it starts at 1 (a
// built node is not built again, stopping a stopped node is a no-op).
type Switch struct {
	// What begins every error ("nspawn repave", "isolation change").
	What string
	// Operation names the crash points: "<Operation>/after-<step>".
	Operation string
	Old, New  Side
	// Build, when set, is step 1 (see Switch).
	Build func(ctx context.Context) error
	// NewRunning says whether the new node's units run already.
	NewRunning func(ctx context.Context) (bool, error)
	Hooks      RepaveHooks
	Log        *slog.Logger
}

// SwitchPoints are the crash points of a Switch of operation, in the
// order it reaches them (Build's and Old.Clean's included).
func SwitchPoints(operation string) []string {
	var out []string
	for _, s := range []string{SwitchBuilt, SwitchOldStopped, SwitchCleaned, SwitchFence, SwitchNewStarted, SwitchHealthy} {
		out = append(out, operation+"/after-"+s)
	}
	return out
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

// Run carries the switch out (see Switch).
func (w *Switch) Run(ctx context.Context) error {
	if err := w.Hooks.Check(); err != nil {
		return fmt.Errorf("%s: %w", w.What, err)
	}
	up, err := w.NewRunning(ctx)
	if err != nil {
		return err
	}
	if up {
		// A rerun after the new node started: the old one was stopped
		// before it (step 2), but make sure.
		if err := w.Old.Stop(ctx); err != nil {
			return fmt.Errorf("%s: stop the old node (%s): %w", w.What, w.Old.Desc, err)
		}
	} else {
		if w.Build != nil {
			if err := w.Build(ctx); err != nil {
				return err
			}
			w.crash(SwitchBuilt)
		}
		stopped := time.Now()
		if err := w.Old.Stop(ctx); err != nil {
			return fmt.Errorf("%s: stop the old node (%s): %w", w.What, w.Old.Desc, err)
		}
		w.log().Info("old node stopped", "node", w.Old.Desc, "took", time.Since(stopped).Round(time.Millisecond).String())
		w.crash(SwitchOldStopped)
		if w.Old.Clean != nil {
			w.Old.Clean(ctx)
			w.crash(SwitchCleaned)
		}
		if err := w.Hooks.Fence(ctx); err != nil {
			return fmt.Errorf("%s: before starting %s: %w; no node runs (%s stopped, %s built; a rerun tries again)", w.What, w.New.Desc, err, w.Old.Desc, w.New.Desc)
		}
		w.crash(SwitchFence)
		if err := w.New.Start(ctx); err != nil {
			return w.rollback(ctx, fmt.Errorf("start of %s failed: %w", w.New.Desc, err))
		}
		w.log().Info("new node started", "node", w.New.Desc, "old_stopped_ago", time.Since(stopped).Round(time.Millisecond).String())
		w.crash(SwitchNewStarted)
	}
	if err := w.Hooks.Healthy(ctx, w.New.Slot); err != nil {
		return w.rollback(ctx, fmt.Errorf("%s did not become healthy: %w", w.New.Desc, err))
	}
	w.crash(SwitchHealthy)
	return nil
}

// rollback undoes a switch that failed at cause (see Switch).
func (w *Switch) rollback(ctx context.Context, cause error) error {
	// A context that a SIGTERM or a timeout ended must still let the
	// rollback through.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Minute)
	defer cancel()
	w.log().Error("new node failed; rolling back", "new", w.New.Desc, "old", w.Old.Desc, "error", cause.Error())
	start := time.Now()
	if err := w.New.Destroy(ctx); err != nil {
		return fmt.Errorf("%s: %w; rollback failed: %s not removed: %v (%s is stopped)", w.What, cause, w.New.Desc, err, w.Old.Desc)
	}
	if w.New.Clean != nil {
		w.New.Clean(ctx)
	}
	if err := w.Hooks.Fence(ctx); err != nil {
		return fmt.Errorf("%s: %w; %s stopped and removed; rollback stopped before starting %s again: %v; no node runs", w.What, cause, w.New.Desc, w.Old.Desc, err)
	}
	if err := w.Old.Start(ctx); err != nil {
		return fmt.Errorf("%s: %w; %s stopped and removed; rollback failed: %s did not start again: %v", w.What, cause, w.New.Desc, w.Old.Desc, err)
	}
	if err := w.Hooks.Healthy(ctx, w.Old.Slot); err != nil {
		return fmt.Errorf("%s: %w; %s stopped and removed; %s started again but is not healthy: %v", w.What, cause, w.New.Desc, w.Old.Desc, err)
	}
	w.log().Info("rolled back", "running", w.Old.Desc, "removed", w.New.Desc, "took", time.Since(start).Round(time.Millisecond).String())
	return fmt.Errorf("%s: %w; rolled back: %s stopped and removed (checked gone), %s started again and healthy: %w", w.What, cause, w.New.Desc, w.Old.Desc, ErrRolledBack)
}
