package daemon

import (
	"context"
	"reflect"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/state"
)

// nodeOperationOwners are the owners of the installation lock that work on
// the node of a bootstrapped host and hand it back when they end (the
// repave starts the node target and the daemon again). Unlike an
// installation (bootstrap, reprovision, reset), such a lock does not stop
// a running daemon: the daemon waits for the unit, as for a unit it ran
// itself, and a Node the unit deletes meanwhile is not a loss. A daemon
// that starts while one holds the lock still defers (69): the unit starts
// it again at its end.
var nodeOperationOwners = map[string]bool{
	"repave": true, // lib/repave's Operation
}

// busyUnit returns the node operation's unit that runs now without the
// daemon having started it (a repave started by hand), or "": the unit
// that the installation lock's record names when its owner is a node
// operation, else unbounded-repave.service when it runs (before it took
// the lock, or after it released it).
func (d *daemon) busyUnit(ctx context.Context) (string, error) {
	var units []string
	if own, err := state.ReadOwnership(d.p); own != nil && err == nil && nodeOperationOwners[own.Owner] && own.Unit != "" {
		units = append(units, own.Unit)
	}
	if u := targets[v1alpha3.OperationRepave].unit; len(units) == 0 || units[0] != u {
		units = append(units, u)
	}
	for _, u := range units {
		st, err := d.sd.UnitState(ctx, u)
		if err != nil {
			return "", err
		}
		if st.Running() {
			return u, nil
		}
	}
	return "", nil
}

// waitBusy looks, before the daemon starts a job (j, nil when it has none
// but saw its Node go), for a node operation's unit that runs outside the
// daemon. When one runs it waits for that unit as its in-flight job and
// reports true: a pending operation stays pending and is started after
// it; the repave of a vanished Node is dropped when the unit is the
// repave, which deleted the Node and registers it afresh, and kept for
// later otherwise.
func (d *daemon) waitBusy(ctx context.Context, j *job) bool {
	unit, err := d.busyUnit(ctx)
	if err != nil {
		d.log.Warn("cannot tell whether a node operation runs; going on", "error", err)
		return false
	}
	if unit == "" {
		return false
	}
	if j != nil && j.op == nil {
		if unit == targets[v1alpha3.OperationRepave].unit {
			d.log.Info("Node deleted while "+unit+" runs; not a loss", "node", d.node)
			d.handled[j.uid] = true
		} else {
			d.nodeRepave = j
		}
	}
	d.log.Info("a node operation runs; waiting for it before anything else", "unit", unit)
	d.inflight = "unit:" + unit
	w := &job{uid: d.inflight, wait: unit}
	go func() { d.finished <- d.run(ctx, w, nil) }()
	return true
}

// refreshActive reads the applied config again (after every unit the
// daemon ran or waited for, and when its Node changes) and reports a
// changed mode or slot on the Machine. A repave changes the active slot
// without restarting the daemon. While a repave holds two records (for a
// moment, between its record and the old one's removal) the read fails,
// and the config known before is kept until the next look.
func (d *daemon) refreshActive(ctx context.Context) {
	a, err := state.ReadActive(d.p)
	if err != nil {
		d.log.Debug("applied config not readable now; keeping the one known", "error", err)
		return
	}
	if a == nil || reflect.DeepEqual(a, d.active) {
		return
	}
	if d.active == nil || d.active.Slot != a.Slot || d.active.Mode != a.Mode {
		d.log.Info("applied config changed", "mode", a.Mode, "slot", a.Slot)
	}
	d.active = a
	d.reportMachine(ctx)
}
