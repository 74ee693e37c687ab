package daemon

import (
	"context"
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/outcome"
	"unbounded-cloud.io/agent/lib/upgrade"
	"unbounded-cloud.io/agent/lib/version"
)

// upgradeOutcome puts the outcome of the agent's last self-upgrade into
// want's AgentUpgraded condition, from the record the upgrade left
// (lib/outcome: a failure, or a success that made this daemon's
// version), and returns what to do once the status holds it (the record
// removed, an Event), or nil. While an upgrade's journal exists the
// outcome is not known yet: the report is looked at again in 5 s (a local
// read; nothing is written until it changes).
func (d *daemon) upgradeOutcome(ctx context.Context, want *v1alpha3.Machine) func() {
	if upgrade.InProgress(d.p) {
		if d.statusRetry == nil {
			d.statusRetry = time.After(5 * time.Second)
		}
		return nil
	}
	o, err := outcome.Read(d.p, outcome.Upgrade)
	if err != nil {
		d.log.Warn("the upgrade's outcome is unreadable", "error", err)
		return nil
	}
	if o == nil || (o.State == outcome.Succeeded && !upgrade.SameVersion(o.To, version.Version)) {
		return nil
	}
	cond := metav1.Condition{Type: v1alpha3.ConditionAgentUpgraded, ObservedGeneration: want.Generation,
		LastTransitionTime: metav1.NewTime(o.Time)}
	evType := corev1.EventTypeNormal
	if o.State == outcome.Failed {
		cond.Status, cond.Reason = metav1.ConditionFalse, "UpgradeFailed"
		if o.RolledBack() {
			cond.Reason = outcome.ReasonRolledBack
		}
		cond.Message = truncate(fmt.Sprintf("upgrade from %s to %s failed at step %s: %s", orUnknown(o.From), orUnknown(o.To), o.Step, o.Message), 1024)
		evType = corev1.EventTypeWarning
	} else {
		cond.Status, cond.Reason = metav1.ConditionTrue, "Upgraded"
		cond.Message = fmt.Sprintf("agent upgraded from %s to %s", o.From, o.To)
	}
	msg := cond.Message
	meta.SetStatusCondition(&want.Status.Conditions, cond)
	return func() {
		if err := outcome.Remove(d.p, outcome.Upgrade); err != nil {
			d.log.Warn("the upgrade's outcome was reported but not removed", "error", err)
			return
		}
		d.log.Info("reported the agent upgrade's outcome", "status", cond.Status, "reason", cond.Reason, "message", msg)
		go d.recordEvent(context.WithoutCancel(ctx), evType, "AgentUpgrade"+cond.Reason, msg) // after reportMachine returned and cancelled its ctx
	}
}

// agentUpgradeJob is the upgrade the Machine's spec.agent asks for (a
// version other than this daemon's, with the package's URL and SHA-256),
// or nil. It is asked once per spec: not again while an upgrade runs or
// its outcome is still to be reported, nor after one for this generation
// of the Machine failed (AgentUpgraded=False observed at it: a rollback
// restarts the daemon, which must not try again until the spec changes).
func (d *daemon) agentUpgradeJob() *job {
	m := d.machineObj
	if m == nil || m.Spec.Agent == nil || d.tokenOnly {
		return nil
	}
	a := m.Spec.Agent
	if a.Version == "" || upgrade.SameVersion(a.Version, version.Version) {
		return nil
	}
	uid := "agent:" + a.Version + ":" + a.SHA256
	if d.handled[uid] {
		return nil
	}
	if a.URL == "" || a.SHA256 == "" {
		d.handled[uid] = true
		d.log.Warn("spec.agent asks for another version but names no package URL and SHA-256; this host upgrades only from both", "version", a.Version)
		return nil
	}
	if upgrade.InProgress(d.p) {
		return nil
	}
	if o, err := outcome.Read(d.p, outcome.Upgrade); err != nil || (o != nil && o.State == outcome.Failed) {
		return nil // reported first (reportMachine), then judged
	}
	if c := meta.FindStatusCondition(m.Status.Conditions, v1alpha3.ConditionAgentUpgraded); c != nil &&
		c.Status == metav1.ConditionFalse && c.ObservedGeneration == m.Generation {
		return nil
	}
	d.log.Info("spec.agent asks for another version: upgrading", "from", version.Version, "to", a.Version)
	return &job{uid: uid, typ: v1alpha3.OperationAgentUpgrade, params: map[string]string{"version": a.Version, "url": a.URL, "sha256": a.SHA256,
		outcome.ParamGeneration: strconv.FormatInt(m.Generation, 10)}}
}
