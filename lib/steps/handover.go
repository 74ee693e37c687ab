package steps

import (
	"context"

	"unbounded-cloud.io/agent/lib/unitnames"
	"unbounded-cloud.io/agent/lib/units"
)

// Waited says which start of a hand-over (HandOver) its caller waits for;
// the other one is queued. The choice follows from where the caller runs
// in the boot's and the daemon's ordering, and is documented there.
type Waited int

const (
	// WaitNeither queues both: for a caller that the daemon's start waits
	// for (unbounded-lifecycle.service, which adopts an older agent's
	// node: the daemon is After= it).
	WaitNeither Waited = iota
	// WaitNode waits for the node target and queues the daemon: for a
	// caller that the running daemon started and waits for (a repave),
	// which returns once the node is up.
	WaitNode
	// WaitDaemon queues the node target and waits for the daemon: for a
	// caller the node target is ordered after (bootstrap: waiting for it
	// would wait for itself); the daemon, which exits 69 while the host
	// is owned, starts once the caller released it.
	WaitDaemon
)

// HandOver is the one end of every operation that installs or replaces
// a node: it hands the recorded node over to systemd. daemon-reload (the
// generator wires the node target, the mode's target and the fence's
// drop-in from the applied config; afterReload, when set, runs then: a
// crash point), then the start of the node target, then the daemon's,
// each waited for or queued as wait says. Starting what runs is a no-op,
// so a hand-over done twice (a rerun after a crash) is one.
func HandOver(ctx context.Context, sd units.Manager, wait Waited, afterReload func()) error {
	if err := sd.Reload(ctx); err != nil {
		return err
	}
	if afterReload != nil {
		afterReload()
	}
	start := func(unit string, waited bool) error {
		if waited {
			return sd.StartUnit(ctx, unit)
		}
		return sd.EnqueueStart(ctx, unit)
	}
	if err := start(unitnames.NodeTarget, wait == WaitNode); err != nil {
		return err
	}
	return start(unitnames.Daemon, wait == WaitDaemon)
}
