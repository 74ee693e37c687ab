// Package unitstest is the service manager of unit tests: the one fake of
// lib/units.Manager (and so of every narrower interface the packages
// declare for it).
package unitstest

import (
	"context"
	"slices"
	"sync"
	"time"

	"unbounded-cloud.io/agent/lib/units"
)

// Fake keeps unit states that jobs change as systemd would, when each
// unit's main process last started, and a log of the calls ("start U",
// "restart U", "stop U", "enqueue U", "reset-failed U", "reload"). Its
// methods are safe for concurrent use; set the fields before the first
// call, or through Set.
type Fake struct {
	mu sync.Mutex
	// Calls is the log; read it with CallList while calls may run.
	Calls []string
	// States are the units' ActiveStates.
	States map[string]string
	// Default is the ActiveState of a unit not in States; "" is
	// "inactive" (what systemd says of a unit it does not know).
	Default string
	// StartsTo is the ActiveState a start or restart job leaves a unit
	// in; a unit not in it becomes "active" (one in it stays, say,
	// "activating": a Type=notify unit that never reports ready).
	StartsTo map[string]string
	// Started is when each unit's main process last started; a start or
	// restart job sets it to Now.
	Started map[string]time.Time
	// Statuses are the units' properties beyond their ActiveState
	// (LoadState, Result, ExecMainStatus, ...); set them with SetStatus.
	Statuses map[string]units.Status
	// OnStart, when set, runs before each start and restart job; an
	// error fails the job and leaves the unit as it was.
	OnStart func(unit string) error
	// OnReload, when set, runs at each daemon-reload (a generator's
	// output, say).
	OnReload func()
	// Now is the clock; nil is time.Now.
	Now func() time.Time
}

var _ units.Manager = (*Fake)(nil)

// Dial returns f as a connection (the Systemd fields of the operations).
func (f *Fake) Dial(context.Context) (units.Manager, error) { return f, nil }

func (f *Fake) log(c string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.Calls = append(f.Calls, c)
}

// Set sets a unit's ActiveState.
func (f *Fake) Set(unit, activeState string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.States == nil {
		f.States = map[string]string{}
	}
	f.States[unit] = activeState
}

// SetStarted sets when a unit's main process last started.
func (f *Fake) SetStarted(unit string, at time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.Started == nil {
		f.Started = map[string]time.Time{}
	}
	f.Started[unit] = at
}

// CallList is a copy of the log.
func (f *Fake) CallList() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.Calls)
}

// Called says whether the log holds c.
func (f *Fake) Called(c string) bool { return slices.Contains(f.CallList(), c) }

func (f *Fake) now() time.Time {
	if f.Now != nil {
		return f.Now()
	}
	return time.Now()
}

func (f *Fake) start(verb, unit string) error {
	f.log(verb + " " + unit)
	if f.OnStart != nil {
		if err := f.OnStart(unit); err != nil {
			return err
		}
	}
	at := f.now()
	f.mu.Lock()
	st, ok := f.StartsTo[unit]
	f.mu.Unlock()
	if !ok {
		st = "active"
	}
	f.Set(unit, st)
	f.SetStarted(unit, at)
	return nil
}

func (f *Fake) Reload(context.Context) error {
	f.log("reload")
	if f.OnReload != nil {
		f.OnReload()
	}
	return nil
}

// SetStatus sets a unit's properties, its ActiveState among them.
func (f *Fake) SetStatus(unit string, st units.Status) {
	f.mu.Lock()
	if f.Statuses == nil {
		f.Statuses = map[string]units.Status{}
	}
	f.Statuses[unit] = st
	f.mu.Unlock()
	f.Set(unit, st.ActiveState)
}

// UnitStatus is the unit's properties: a unit never set or started is
// "not-found", one set without a LoadState "loaded".
func (f *Fake) UnitStatus(ctx context.Context, unit string) (units.Status, error) {
	active, _ := f.ActiveState(ctx, unit)
	f.mu.Lock()
	defer f.mu.Unlock()
	st, ok := f.Statuses[unit]
	_, known := f.States[unit]
	switch {
	case !ok && !known:
		st.LoadState = "not-found"
	case st.LoadState == "":
		st.LoadState = "loaded"
	}
	st.ActiveState = active
	return st, nil
}

// Unmask makes a masked unit loaded again.
func (f *Fake) Unmask(_ context.Context, unit string) error {
	f.log("unmask " + unit)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.Statuses == nil {
		f.Statuses = map[string]units.Status{}
	}
	st := f.Statuses[unit]
	st.LoadState = "loaded"
	f.Statuses[unit] = st
	return nil
}

func (f *Fake) StartUnit(_ context.Context, unit string) error { return f.start("start", unit) }

func (f *Fake) RestartUnit(_ context.Context, unit string) error { return f.start("restart", unit) }

func (f *Fake) StopUnit(_ context.Context, unit string) error {
	f.log("stop " + unit)
	f.Set(unit, "inactive")
	return nil
}

// EnqueueStart only logs: the job is queued, not run.
func (f *Fake) EnqueueStart(_ context.Context, unit string) error {
	f.log("enqueue " + unit)
	return nil
}

func (f *Fake) ActiveState(_ context.Context, unit string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if st, ok := f.States[unit]; ok {
		return st, nil
	}
	if f.Default != "" {
		return f.Default, nil
	}
	return "inactive", nil
}

func (f *Fake) ExecMainStatus(_ context.Context, unit string) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.Statuses[unit].ExecMainStatus, nil
}

func (f *Fake) MainStartedAt(_ context.Context, unit string) (time.Time, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.Started[unit], nil
}

func (f *Fake) ResetFailed(_ context.Context, unit string) error {
	f.log("reset-failed " + unit)
	return nil
}

func (f *Fake) Close() {}
