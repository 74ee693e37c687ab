package daemon

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/kube"
	"unbounded-cloud.io/agent/lib/owed"
)

// owedTimeout bounds one attempt at an owed write; the next Node update
// (any status write of the kubelet, or the watch's next list) tries again.
const owedTimeout = 30 * time.Second

// settleOwed makes the cluster writes an operation of this host owes
// (lib/owed) once the API server answers: the Node's watch just delivered
// node. An uncordon is made while the Node is still cordoned and nothing
// else decides its schedulability (no repave or installation runs: a new
// repave cordons and takes the Node over); a Node that is schedulable
// already settles it. The write runs beside the loop; the Node update it
// causes comes back through the watch and settles the record.
func (d *daemon) settleOwed(ctx context.Context, node *corev1.Node) {
	if node == nil || d.tokenOnly {
		return // the bootstrap token may not write Nodes
	}
	ws, err := owed.List(d.p)
	if err != nil {
		d.log.Warn("owed cluster writes unreadable", "error", err)
	}
	for _, w := range ws {
		if w.Kind != owed.Uncordon || w.Node != node.Name {
			continue
		}
		if !node.Spec.Unschedulable {
			if err := owed.Settle(d.p, w.ID()); err != nil {
				d.log.Warn("owed uncordon made, record stays", "error", err)
				continue
			}
			d.log.Info("owed uncordon settled: the Node is schedulable", "node", node.Name, "owed_by", w.By, "since", w.Since)
			continue
		}
		if unit, err := d.busyUnit(ctx); err != nil || unit != "" || checkOwnership(d.p) != nil {
			continue // its end brings the Node back, and this check with it
		}
		if !d.owedRunning.CompareAndSwap(false, true) {
			continue
		}
		d.log.Info("making the uncordon a failed operation owes the cluster", "node", node.Name, "owed_by", w.By, "why", w.Why)
		cfg, name := d.cfg, node.Name
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			defer d.owedRunning.Store(false)
			dr, err := kube.NewDrainer(cfg, name)
			if err == nil {
				dr.RetryFor = owedTimeout
				err = dr.SetUnschedulable(ctx, false)
			}
			if err != nil {
				d.log.Warn("owed uncordon not made yet; the next Node update tries again", "node", name, "error", err)
			}
		}()
	}
}

// settleOwedStatuses removes the owed final statuses (finish) that the
// cluster no longer needs: the operation is gone, or already shows a final
// state (the write landed, and the daemon stopped before it removed the
// record). An operation still InProgress keeps its record: its resume
// writes it. Called with the operations' full list.
func (d *daemon) settleOwedStatuses() {
	ws, err := owed.List(d.p)
	if err != nil {
		d.log.Warn("owed cluster writes unreadable", "error", err)
	}
	for _, w := range ws {
		if w.Kind != owed.OperationStatus {
			continue
		}
		var op *v1alpha3.MachineOperation
		for _, o := range d.ops {
			if string(o.UID) == w.UID {
				op = o
			}
		}
		if op != nil && !op.Status.State.Finished() {
			continue
		}
		if err := owed.Settle(d.p, w.ID()); err != nil {
			d.log.Warn("owed final status not removed", "operation", w.Operation, "error", err)
			continue
		}
		d.log.Info("owed final status settled: the operation is gone or finished", "operation", w.Operation, "uid", w.UID)
	}
}
