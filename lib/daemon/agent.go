package daemon

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/state"
	"unbounded-cloud.io/agent/lib/upgrade"
	"unbounded-cloud.io/agent/lib/version"
)

// upgradeOutcome puts the outcome of the agent's last self-upgrade into
// want's AgentUpgraded condition, from the signal the upgrade left
// (lib/upgrade: failed.json, or upgraded.json from a run that succeeded),
// and returns what to do once the status holds it (the signal removed,
// an Event), or nil. While an upgrade's journal exists the outcome is not
// known yet: the report is looked at again in 5 s (a local read; nothing
// is written until it changes).
func (d *daemon) upgradeOutcome(ctx context.Context, want *v1alpha3.Machine) func() {
	if upgrade.InProgress(d.p) {
		if d.statusRetry == nil {
			d.statusRetry = time.After(5 * time.Second)
		}
		return nil
	}
	cond := metav1.Condition{Type: v1alpha3.ConditionAgentUpgraded, ObservedGeneration: want.Generation}
	var file, evType, msg string
	if f, err := upgrade.ReadFailed(d.p); err != nil {
		d.log.Warn("the upgrade's failure signal is unreadable", "error", err)
		return nil
	} else if f != nil {
		cond.Status, cond.Reason = metav1.ConditionFalse, "UpgradeFailed"
		if f.RolledBack {
			cond.Reason = "RolledBack"
		}
		cond.Message = truncate(fmt.Sprintf("upgrade from %s to %s failed at step %s: %s", orUnknown(f.From), orUnknown(f.To), f.Step, f.Message), 1024)
		cond.LastTransitionTime = metav1.NewTime(f.At)
		file, evType = d.p.UpgradeFailed(), corev1.EventTypeWarning
	} else if u, err := upgrade.ReadUpgraded(d.p); err != nil {
		d.log.Warn("the upgrade's success signal is unreadable", "error", err)
		return nil
	} else if u != nil && upgrade.SameVersion(u.To, version.Version) {
		cond.Status, cond.Reason = metav1.ConditionTrue, "Upgraded"
		cond.Message = fmt.Sprintf("agent upgraded from %s to %s", u.From, u.To)
		cond.LastTransitionTime = metav1.NewTime(u.At)
		file, evType = upgrade.UpgradedFile(d.p), corev1.EventTypeNormal
	} else {
		return nil
	}
	msg = cond.Message
	meta.SetStatusCondition(&want.Status.Conditions, cond)
	return func() {
		if err := state.RemoveDurable(file); err != nil && !errors.Is(err, os.ErrNotExist) {
			d.log.Warn("the upgrade's signal was reported but not removed", "file", file, "error", err)
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
	if f, err := upgrade.ReadFailed(d.p); err != nil || f != nil {
		return nil // reported first (reportMachine), then judged
	}
	if c := meta.FindStatusCondition(m.Status.Conditions, v1alpha3.ConditionAgentUpgraded); c != nil &&
		c.Status == metav1.ConditionFalse && c.ObservedGeneration == m.Generation {
		return nil
	}
	d.log.Info("spec.agent asks for another version: upgrading", "from", version.Version, "to", a.Version)
	return &job{uid: uid, typ: v1alpha3.OperationAgentUpgrade, params: map[string]string{"version": a.Version, "url": a.URL, "sha256": a.SHA256}}
}
