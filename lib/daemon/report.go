package daemon

import (
	"context"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/report"
	"unbounded-cloud.io/agent/lib/version"
)

// reportMachine keeps the part of the Machine's status that the daemon
// owns (agent version, isolation mode and slot) current. It writes only
// when something differs, so that its own write, coming back through the
// watch, ends the exchange. It never creates the Machine (bootstrap
// registers it) and writes nothing to one that is being deleted.
func (d *daemon) reportMachine(ctx context.Context) {
	if !d.live() {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	want := d.machineObj.DeepCopy()
	want.Status.Agent = &v1alpha3.AgentStatus{Version: version.Version}
	if d.active != nil && (want.Status.Bootstrap == nil || want.Status.Bootstrap.State != v1alpha3.BootstrapSucceeded) {
		// A host with an applied record was bootstrapped (a record is
		// written only once its node is healthy), so the Machine is owed
		// the bootstrap's Succeeded: a power cut between the record and
		// its report, or an API server down then, lost it, and the next
		// boot only hands the node over. Either credential may write it.
		report.SetBootstrap(want, v1alpha3.BootstrapSucceeded, report.ReasonSucceeded, "node bootstrapped (reported by the daemon: the bootstrap's own report did not land)", d.host.now())
		d.log.Info("reporting the bootstrap's Succeeded, which the Machine lacks", "slot", d.active.Slot)
	}
	// With the bootstrap token only the agent version: the rest is not
	// the bootstrap's, and the token may not write it (useCredential).
	if d.active != nil && !d.tokenOnly {
		iso := &v1alpha3.IsolationStatus{Mode: v1alpha3.IsolationMode(d.active.Mode)}
		if d.active.Mode != string(v1alpha3.IsolationNone) {
			iso.Slot = v1alpha3.Slot(d.active.Slot)
		}
		want.Status.Isolation = iso
	}
	if d.nodeSeen != "" && !d.tokenOnly {
		want.Status.NodeName = d.nodeSeen
	}
	if !d.tokenOnly && d.active != nil && d.loss.readyUID != "" && want.Status.Phase == v1alpha3.MachinePending &&
		!meta.IsStatusConditionTrue(want.Status.Conditions, v1alpha3.ConditionAllocationLaunchRefused) {
		// The fence leaves a node it allowed after a refusal Pending (it
		// cannot tell when the node is up); the daemon sees the Node
		// Ready.
		want.Status.Phase = v1alpha3.MachineReady
	}
	var signals []func()
	if !d.tokenOnly {
		for _, s := range []func() func(){
			func() func() { return d.upgradeOutcome(ctx, want) },
			func() func() { return d.isolationReport(ctx, want) },
		} {
			if f := s(); f != nil {
				signals = append(signals, f)
			}
		}
	}
	reported := func() {
		for _, f := range signals {
			f()
		}
	}
	if equality.Semantic.DeepEqual(want.Status, d.machineObj.Status) {
		reported()
		return
	}
	updated, err := d.cluster.machines.UpdateStatus(ctx, want)
	switch {
	case err == nil:
		d.machineObj = updated
		reported()
	case apierrors.IsConflict(err), apierrors.IsNotFound(err):
		// The watch brings the newer object (or the deletion) and the
		// report runs again.
	default:
		d.log.Warn("cannot report the Machine status; retrying in 30s", "error", err)
		d.statusRetry = time.After(30 * time.Second)
	}
}
