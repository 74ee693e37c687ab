package modes

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"unbounded-cloud.io/agent/lib/unitnames"
)

// How an isolation change is carried out (lib/repave's isolation
// variant, unbounded-isolation.service): the values of the Machine's
// status.isolationChange.method.
const (
	// MethodInPlace: both modes can share the host; the target mode's
	// node stack is built into the other slot beside the running one,
	// then the switch is a blue/green one across modes, rolled back when
	// the new node does not come up.
	MethodInPlace = "InPlace"
	// MethodReprovision: the host is reset and bootstrapped again in the
	// target mode (unbounded-reprovision.service).
	MethodReprovision = "Reprovision"
)

// changeMethods is the table of isolation changes this build carries
// out: from mode, to mode, method. A mode that joins adds its rows here;
// a pair without a row is refused (ChangeMethod's error). Every pair of
// today's modes can share the host, so every change is in place by
// default: the two blue/green modes' nodes are in different slots and
// trees (a machine /var/lib/machines/<slot>, a bundle
// /var/lib/unbounded/slots/<slot>/bundle), and mode none's stack is on
// the host beside either.
var changeMethods = map[[2]string]string{
	{"nspawn", "none"}:      MethodInPlace,
	{"none", "nspawn"}:      MethodInPlace,
	{"nspawn", "container"}: MethodInPlace,
	{"container", "nspawn"}: MethodInPlace,
	{"container", "none"}:   MethodInPlace,
	{"none", "container"}:   MethodInPlace,
}

// ChangeMethod returns how a change of isolation mode from one mode to
// another is carried out; an error says that this build cannot change
// between them (and changes nothing).
func ChangeMethod(from, to string) (string, error) {
	if from == to {
		return "", fmt.Errorf("isolation change from %s to %s: the same mode", from, to)
	}
	if m, ok := changeMethods[[2]string{from, to}]; ok {
		return m, nil
	}
	return "", fmt.Errorf("isolation change from %s to %s: not carried out by this build (it changes between %s)", from, to, changePairs())
}

// ChangeMethodAsked returns the method of a change of isolation mode
// from one mode to another when asked is the method asked for (the
// Machine's spec.isolation.method, the isolation unit's --method or its
// request's method parameter): asked, when this build carries it out
// for the pair, or the table's (ChangeMethod) when asked is "". Both
// methods are carried out for every pair with a row (a reprovision
// resets the host and bootstraps the target mode, which needs nothing
// of the old one); an error says that this build does not make the
// change so (and changes nothing).
func ChangeMethodAsked(from, to, asked string) (string, error) {
	m, err := ChangeMethod(from, to)
	if err != nil || asked == "" {
		return m, err
	}
	if asked != MethodInPlace && asked != MethodReprovision {
		return "", fmt.Errorf("isolation change from %s to %s: method %q: not carried out by this build (it knows %s and %s)", from, to, asked, MethodInPlace, MethodReprovision)
	}
	return asked, nil
}

func changePairs() string {
	var s []string
	for p := range changeMethods {
		s = append(s, p[0]+" -> "+p[1])
	}
	slices.Sort(s)
	return strings.Join(s, ", ")
}

// The crash points of Change, in the order it reaches them.
const (
	CrashChangeOldStopped = "isolation/after-old-stopped"
	CrashChangeFence      = "isolation/after-fence"
	CrashChangeNewStarted = "isolation/after-new-started"
	CrashChangeHealthy    = "isolation/after-healthy"
)

// ChangeCrashPoints are Change's crash points in order.
var ChangeCrashPoints = []string{CrashChangeOldStopped, CrashChangeFence, CrashChangeNewStarted, CrashChangeHealthy}

// Change switches the node from slot running of mode from to slot s.Name
// of mode to, built already (Prepare) in the other slot: the blue/green
// switch of a repave, across modes. It is written once over the Mode
// operations, so that a mode joining the table of changes brings no
// switch of its own:
//
//  1. the old node stopped entirely (from.Stop: its units, its pods, its
//     networking), so that the new node has the host's network and the
//     kubelet's port; CrashChangeOldStopped
//  2. h.Fence (the caller deletes the Node, then runs the allocation
//     fence); a refusal stops here with no node running and both slots
//     kept (a rerun tries again); CrashChangeFence
//  3. the new node started (to.Start); CrashChangeNewStarted
//  4. h.Healthy waits for it, bounded; CrashChangeHealthy.
//
// A new node that does not start or get healthy is rolled back: its slot
// destroyed (to.Destroy, checked gone), the fence run again, the old node
// started and waited for; the error wraps ErrRolledBack. A rollback that
// fails returns an error that does not wrap it and says what is left.
//
// A rerun after a crash finds the new node running (after 3: it goes on
// at 4, after making sure the old one is stopped), or not (from 1:
// stopping a stopped node is a no-op).
func Change(ctx context.Context, sd Systemd, from Mode, running string, to Mode, s Slot, h RepaveHooks) error {
	if s.Name == running {
		return fmt.Errorf("isolation change: the new slot must be the other one than %s", running)
	}
	if err := h.Check(); err != nil {
		return fmt.Errorf("isolation change: %w", err)
	}
	if err := s.Check(); err != nil {
		return err
	}
	crash := h.Crash
	if crash == nil {
		crash = func(string) {}
	}
	up, err := supervisingRuns(ctx, sd, to.Name(), s.Name)
	if err != nil {
		return err
	}
	if !up {
		stopped := time.Now()
		if err := from.Stop(ctx, running); err != nil {
			return fmt.Errorf("isolation change: stop the old node (mode %s, slot %s): %w", from.Name(), running, err)
		}
		crash(CrashChangeOldStopped)
		if err := h.Fence(ctx); err != nil {
			return fmt.Errorf("isolation change: before starting mode %s in slot %s: %w; no node runs (slot %s of mode %s stopped, slot %s built; a rerun tries again)",
				to.Name(), s.Name, err, running, from.Name(), s.Name)
		}
		crash(CrashChangeFence)
		if err := to.Start(ctx, s.Name); err != nil {
			return changeRollback(ctx, from, running, to, s.Name, h, fmt.Errorf("start of mode %s in slot %s failed: %w", to.Name(), s.Name, err))
		}
		slog.Default().Info("new node started", "mode", to.Name(), "slot", s.Name, "old_stopped_ago", time.Since(stopped).Round(time.Millisecond).String())
		crash(CrashChangeNewStarted)
	} else if err := from.Stop(ctx, running); err != nil {
		return fmt.Errorf("isolation change: stop the old node (mode %s, slot %s): %w", from.Name(), running, err)
	}
	if err := h.Healthy(ctx, s.Name); err != nil {
		return changeRollback(ctx, from, running, to, s.Name, h, fmt.Errorf("mode %s in slot %s did not become healthy: %w", to.Name(), s.Name, err))
	}
	crash(CrashChangeHealthy)
	return nil
}

// supervisingRuns says whether a supervising unit of mode's slot runs.
func supervisingRuns(ctx context.Context, sd Systemd, mode, slot string) (bool, error) {
	for _, u := range unitnames.Supervising(mode, slot) {
		st, err := sd.ActiveState(ctx, u)
		if err != nil {
			return false, err
		}
		if unitnames.Running(st) {
			return true, nil
		}
	}
	return false, nil
}

// changeRollback undoes a Change that failed at cause.
func changeRollback(ctx context.Context, from Mode, old string, to Mode, newSlot string, h RepaveHooks, cause error) error {
	// A context that a SIGTERM or a timeout ended must still let the
	// rollback through.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Minute)
	defer cancel()
	slog.Default().Error("new node failed; rolling back to the old mode", "new_mode", to.Name(), "new_slot", newSlot, "old_mode", from.Name(), "old_slot", old, "error", cause.Error())
	if err := to.Destroy(ctx, newSlot); err != nil {
		return fmt.Errorf("isolation change: %w; rollback failed: slot %s of mode %s not removed: %v (slot %s of mode %s is stopped)", cause, newSlot, to.Name(), err, old, from.Name())
	}
	if err := h.Fence(ctx); err != nil {
		return fmt.Errorf("isolation change: %w; slot %s of mode %s removed; rollback stopped before starting slot %s of mode %s again: %v; no node runs", cause, newSlot, to.Name(), old, from.Name(), err)
	}
	if err := from.Start(ctx, old); err != nil {
		return fmt.Errorf("isolation change: %w; slot %s of mode %s removed; rollback failed: slot %s of mode %s did not start again: %v", cause, newSlot, to.Name(), old, from.Name(), err)
	}
	if err := h.Healthy(ctx, old); err != nil {
		return fmt.Errorf("isolation change: %w; slot %s of mode %s removed; slot %s of mode %s started again but is not healthy: %v", cause, newSlot, to.Name(), old, from.Name(), err)
	}
	return fmt.Errorf("isolation change: %w; rolled back: slot %s of mode %s removed (checked gone), slot %s of mode %s started again and healthy: %w", cause, newSlot, to.Name(), old, from.Name(), ErrRolledBack)
}
