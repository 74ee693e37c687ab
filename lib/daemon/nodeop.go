package daemon

import (
	"context"
	"reflect"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/types"
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
	"repave":    true, // lib/repave's Operation
	"isolation": true, // lib/isolation's Operation
}

// busyUnit returns the node operation's unit that runs now without the
// daemon having started it (a repave or an isolation change started by
// hand, or by a daemon process before this one), or "": the unit that
// the installation lock's record names when its owner is a node
// operation, else unbounded-repave.service or
// unbounded-isolation.service when it runs (before it took the lock, or
// after it released it).
func (d *daemon) busyUnit(ctx context.Context) (string, error) {
	var units []string
	if own, err := state.ReadOwnership(d.p); own != nil && err == nil && nodeOperationOwners[own.Owner] && own.Unit != "" {
		units = append(units, own.Unit)
	}
	for _, typ := range []v1alpha3.OperationType{v1alpha3.OperationRepave, OperationIsolationChange} {
		if u := targets[typ].unit; !slices.Contains(units, u) {
			units = append(units, u)
		}
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
// repave or the isolation change, which deleted the Node and register it
// afresh, and kept for later otherwise.
func (d *daemon) waitBusy(ctx context.Context, j *job) bool {
	unit, err := d.busyUnit(ctx)
	if err != nil {
		d.log.Warn("cannot tell whether a node operation runs; going on", "error", err)
		return false
	}
	if unit == "" {
		return false
	}
	if j != nil && j.op == nil && j.typ == v1alpha3.OperationRepave {
		// Both delete the Node once the old kubelet is stopped and
		// wait for the new one to register it afresh.
		if unit == targets[v1alpha3.OperationRepave].unit || unit == targets[OperationIsolationChange].unit {
			d.log.Info("Node deleted while "+unit+" runs; not a loss", "node", d.node)
			d.handled[j.uid] = true
		} else {
			d.loss.repave = j
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

// nodeLoss is the job source of a Node that vanished (observeNode,
// armNodeAbsent): the repave of the Machine, since the node stack lost
// its registration.
type nodeLoss struct {
	// readyUID is the UID of the Node last seen Ready.
	readyUID types.UID
	// repave is the repave to run for the vanished Node.
	repave *job
	// gone: the Node was deleted and no job of the daemon ran (step
	// looks whether a unit started by hand runs).
	gone bool
	// absent fires when the Node, absent from the first list, has not
	// appeared within the grace.
	absent <-chan time.Time
}

// DefaultNodeGoneGrace is Options.NodeGoneGrace's default: time for a
// node stack that starts with the daemon (at boot) to register a Node
// deleted while the host was down.
const DefaultNodeGoneGrace = time.Minute

// armNodeAbsent runs when the first list of the Node (of this following of
// the Machine) finds none. On a bootstrapped host (an applied config is
// recorded only once its Node was Ready) the Node existed: it vanished
// while the daemon was down. A kubelet that starts registers it again by
// itself, so the daemon gives the node stack the grace to do that before
// it repaves; a kubelet that ran while its Node was deleted does not.
func (d *daemon) armNodeAbsent() {
	if d.active == nil {
		return // not bootstrapped: bootstrap registers the first Node
	}
	d.log.Info("no Node on this bootstrapped host at the daemon's start: it vanished while the daemon was down; repaving unless it registers within the grace",
		"node", d.node, "grace", d.grace.String())
	d.loss.absent = time.After(d.grace)
}

// nodeStillAbsent queues the repave of a Node that vanished while the
// daemon was down and has not registered within the grace.
func (d *daemon) nodeStillAbsent() {
	if d.followStop == nil || d.loss.repave != nil {
		return
	}
	d.log.Warn("the Node vanished while the daemon was down and has not registered again", "node", d.node, "grace", d.grace.String())
	// Unique per daemon start: the repave takes a request UID once
	// (lib/repave), and a Node can vanish again another time.
	d.loss.repave = &job{uid: "node:absent-since-" + d.started.UTC().Format("20060102T150405.000000000Z"), typ: v1alpha3.OperationRepave}
}
