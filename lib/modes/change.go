package modes

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/modes/facts"
	"unbounded-cloud.io/agent/lib/unitnames"
)

// How an isolation change is carried out (the facts table's methods):
// the values of the Machine's status.isolationChange.method.
const (
	MethodInPlace     = facts.MethodInPlace
	MethodReprovision = facts.MethodReprovision
)

// ChangeMethod returns how a change of isolation mode from one mode to
// another is carried out; an error says that this build cannot change
// between them (and changes nothing).
func ChangeMethod(from, to string) (string, error) {
	if from == to {
		return "", fmt.Errorf("isolation change from %s to %s: the same mode", from, to)
	}
	if m, ok := facts.Changes[[2]string{from, to}]; ok {
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
	for p := range facts.Changes {
		s = append(s, p[0]+" -> "+p[1])
	}
	slices.Sort(s)
	return strings.Join(s, ", ")
}

// The crash points of Change, in the order it reaches them (Switch's
// under operation "isolation": the old mode's Stop cleans its own
// networking, and the new slot is built before Change).
const (
	CrashChangeOldStopped = "isolation/after-" + SwitchOldStopped
	CrashChangeFence      = "isolation/after-" + SwitchFence
	CrashChangeNewStarted = "isolation/after-" + SwitchNewStarted
	CrashChangeHealthy    = "isolation/after-" + SwitchHealthy
)

// ChangeCrashPoints are Change's crash points in order.
var ChangeCrashPoints = []string{CrashChangeOldStopped, CrashChangeFence, CrashChangeNewStarted, CrashChangeHealthy}

// Change switches the node from slot running of mode from to slot s.Name
// of mode to, built already (Prepare) in the other slot: the blue/green
// switch of a repave, across modes, on the one Switch. The old node is
// stopped entirely (from.Stop: its units, its pods, its networking), so
// that the new node has the host's network and the kubelet's port; a
// rollback destroys the new slot (to.Destroy, checked gone) and starts
// the old one again (from.Start). A mode joining the table of changes
// brings no switch of its own.
func Change(ctx context.Context, p hostpaths.Paths, sd Systemd, from Mode, running string, to Mode, s Slot, h RepaveHooks) error {
	if s.Name == running {
		return fmt.Errorf("isolation change: the new slot must be the other one than %s", running)
	}
	if err := h.Check(); err != nil {
		return fmt.Errorf("isolation change: %w", err)
	}
	if err := s.Check(); err != nil {
		return err
	}
	w := Switch{
		What:      "isolation change",
		Operation: "isolation",
		Paths:     p,
		Old: Side{
			Desc:  fmt.Sprintf("slot %s of mode %s", running, from.Name()),
			Slot:  running,
			Stop:  func(ctx context.Context) error { return from.Stop(ctx, running) },
			Start: func(ctx context.Context) error { return from.Start(ctx, running) },
		},
		New: Side{
			Desc:    fmt.Sprintf("slot %s of mode %s", s.Name, to.Name()),
			Slot:    s.Name,
			Start:   func(ctx context.Context) error { return to.Start(ctx, s.Name) },
			Destroy: func(ctx context.Context) error { return to.Destroy(ctx, s.Name) },
		},
		NewRunning: func(ctx context.Context) (bool, error) { return supervisingRuns(ctx, sd, to.Name(), s.Name) },
		Hooks:      h,
	}
	return w.Run(ctx)
}

// supervisingRuns says whether a supervising unit of mode's slot runs.
func supervisingRuns(ctx context.Context, sd Systemd, mode, slot string) (bool, error) {
	for _, u := range facts.Supervising(mode, slot) {
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
