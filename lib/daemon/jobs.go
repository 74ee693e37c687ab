package daemon

import (
	"context"
	"encoding/json"
	"slices"
	"strings"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/state"
)

// step starts the next job when none runs, from the first of jobSources
// that has one. One at a time: operations on one host change the same
// node stack.
func (d *daemon) step(ctx context.Context) error {
	// The Machine first: a repave's request carries its spec as the
	// desired config.
	if d.inflight != "" || !d.live() || !d.synced[kindOps] || !d.synced[kindMachine] {
		return nil
	}
	var j *job
	for _, src := range jobSources {
		if j = src.next(d); j != nil {
			d.log.Debug("next job", "source", src.name, "uid", j.uid, "type", j.typ)
			break
		}
	}
	gone := d.loss.gone
	d.loss.gone = false
	if j == nil && !gone {
		return nil
	}
	// A node operation started by hand (a repave) runs: the daemon waits
	// for it as for its own job, before it starts one.
	if (j == nil || !j.resume) && d.waitBusy(ctx, j) {
		return nil
	}
	if j == nil {
		return nil
	}
	if j.op == nil && !j.resume && j.typ == v1alpha3.OperationRepave {
		d.log.Warn("Node was Ready and is gone: repaving", "node", d.node)
	}
	// An installation that took the host while the daemon ran wins: the
	// operation stays Pending, and the daemon stops as it would at start.
	if !j.resume {
		if err := checkOwnership(d.p); err != nil {
			return err
		}
		if own, err := state.ReadOwnership(d.p); err == nil && own != nil && own.Owner == state.OwnerUpgrade {
			// Pending until the upgrade's end, which restarts this
			// daemon or ends its job (finished: the loop steps again).
			d.log.Info("the agent's upgrade runs; the operation waits for its end", "uid", j.uid, "type", j.typ)
			return nil
		}
	}
	if j.typ == OperationIsolationChange && !j.resume {
		d.startIsolation(ctx, j)
	}
	d.inflight = j.uid
	var spec json.RawMessage
	if d.machineObj != nil {
		spec, _ = json.Marshal(d.machineObj.Spec)
	}
	// Counted in serve's wait group: serve (and Run) return only once the
	// job has ended (it ends when ctx does: "interrupted"), never while
	// it still writes a request under the host root.
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		r := d.run(ctx, j, spec)
		select {
		case d.finished <- r:
		case <-ctx.Done():
		}
	}()
	return nil
}

// A jobSource is one place the daemon's next job comes from, owning its
// own state: step asks the sources in the order of jobSources and starts
// the first job one has (one job at a time).
type jobSource struct {
	name string
	next func(d *daemon) *job
}

// jobSources, in the order step asks them: an operation an earlier
// process left InProgress (resumed), the repave of a vanished Node, an
// isolation change to resume (neither has an operation that would bring
// it back), the Pending operations oldest first, then what the
// Machine's spec asks for: the agent first (a change of mode runs on the
// agent the spec asks for, not the old one's, and an upgrade never waits
// behind a change that failed, which is not asked again at its
// generation), then the isolation mode.
var jobSources = []jobSource{
	{"operation in progress", (*daemon).inProgressOperation},
	{"vanished Node", func(d *daemon) *job { j := d.loss.repave; d.loss.repave = nil; return j }},
	{"isolation change to resume", func(d *daemon) *job { j := d.iso.resume; d.iso.resume = nil; return j }},
	{"pending operation", (*daemon).pendingOperation},
	{"spec.agent", (*daemon).agentUpgradeJob},
	{"spec.isolation", (*daemon).isolationJob},
}

// ownOperations are this Machine's operations in state, not finished by
// this process nor being deleted.
func (d *daemon) ownOperations(states ...v1alpha3.OperationState) []*v1alpha3.MachineOperation {
	var out []*v1alpha3.MachineOperation
	for _, op := range d.ops {
		if d.handled[string(op.UID)] || op.Spec.MachineRef.Name != d.machine || op.DeletionTimestamp != nil {
			continue
		}
		if slices.Contains(states, op.Status.State) {
			out = append(out, op)
		}
	}
	return out
}

// inProgressOperation resumes the oldest operation an earlier process
// left InProgress (once per process).
func (d *daemon) inProgressOperation() *job {
	ops := slices.DeleteFunc(d.ownOperations(v1alpha3.OperationInProgress), func(op *v1alpha3.MachineOperation) bool { return d.resumed[string(op.UID)] })
	if len(ops) == 0 {
		return nil
	}
	op := oldest(ops)
	d.resumed[string(op.UID)] = true
	return &job{op: op, uid: string(op.UID), typ: op.Spec.Operation, resume: true}
}

// pendingOperation is the oldest Pending operation.
func (d *daemon) pendingOperation() *job {
	ops := d.ownOperations("", v1alpha3.OperationPending)
	if len(ops) == 0 {
		return nil
	}
	op := oldest(ops)
	return &job{op: op, uid: string(op.UID), typ: op.Spec.Operation}
}

func oldest(ops []*v1alpha3.MachineOperation) *v1alpha3.MachineOperation {
	return slices.MinFunc(ops, func(a, b *v1alpha3.MachineOperation) int {
		if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
}
