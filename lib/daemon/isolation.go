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
	"unbounded-cloud.io/agent/lib/modes"
	"unbounded-cloud.io/agent/lib/reprovision"
	"unbounded-cloud.io/agent/lib/state"
)

// OperationIsolationChange is the daemon's own job type for an isolation
// change: no MachineOperation carries it, the Machine's
// spec.isolation.mode does (its request file is requests/isolation.json,
// its unit unbounded-isolation.service).
const OperationIsolationChange v1alpha3.OperationType = "IsolationChange"

// isolationJob is the isolation change the Machine's spec.isolation.mode
// asks for (a mode other than the running one), or nil. It is asked once
// per generation of the Machine: not while a change runs (its journal,
// a live handoff) or its outcome is still to be reported, nor after a
// change was reported at this generation (IsolationChanged observed at
// it): a failed change is not looped on, and a change made by hand is
// not undone, until the spec changes. A pair of
// modes this build does not change between is reported Failed without a
// unit.
func (d *daemon) isolationJob() *job {
	m := d.machineObj
	if m == nil || d.tokenOnly || d.active == nil {
		return nil
	}
	to := string(m.Spec.Isolation.Mode)
	if to == "" || to == d.active.Mode {
		return nil
	}
	uid := fmt.Sprintf("isolation:%s:%d", to, m.Generation)
	if d.handled[uid] {
		return nil
	}
	if c := meta.FindStatusCondition(m.Status.Conditions, v1alpha3.ConditionIsolationChanged); c != nil && c.ObservedGeneration >= m.Generation {
		// A change was reported at this generation of the spec: one that
		// failed is not tried again, and one made by hand (the config on
		// disk, unbounded-isolation.service started by an operator) is
		// not undone, until the spec changes.
		return nil
	}
	if live, err := state.HandoffLive(d.p); err != nil || live {
		return nil
	}
	if _, err := os.Stat(d.p.Journal(isolationJournal)); err == nil {
		return nil
	}
	if o, err := state.ReadIsolationOutcome(d.p); err != nil || o != nil {
		return nil // reported first (reportMachine), then judged
	}
	if _, err := modes.ChangeMethod(d.active.Mode, to); err != nil {
		d.handled[uid] = true
		d.log.Warn("spec.isolation.mode asks for a change this build does not make", "from", d.active.Mode, "to", to, "error", err)
		now := d.host.now().UTC()
		o := state.IsolationOutcome{From: d.active.Mode, To: to, State: string(v1alpha3.IsolationChangeFailed), StartedAt: now, EndedAt: now,
			Message: err.Error() + "; the node was left as it is"}
		if werr := state.WriteIsolationOutcome(d.p, o); werr != nil {
			d.log.Error("the refused isolation change's outcome not recorded", "error", werr)
		}
		d.statusRetry = time.After(0)
		return nil
	}
	d.log.Info("spec.isolation.mode asks for another mode: changing the isolation mode", "from", d.active.Mode, "to", to)
	// The change's journal appears once its plan is made: the status
	// says InProgress from then on (isolationReport looks again every
	// 5 s while the journal exists).
	d.statusRetry = time.After(2 * time.Second)
	return &job{uid: uid, typ: OperationIsolationChange, params: map[string]string{"from": d.active.Mode, "to": to}}
}

// isolationJournal is the in-place change's journal (lib/repave's
// IsolationOperation, named here: lib/daemon does not link lib/repave).
const isolationJournal = "isolation"

// isolationReport puts the isolation change the host shows into want's
// status.isolationChange (and, once ended, the IsolationChanged
// condition), from, in this order: a reprovision handoff's journal, the
// in-place change's journal (InProgress, looked at again in 5 s), the
// outcome an isolation change left (state.IsolationOutcome). It returns
// what to do once the status holds it (an Event when the state changed;
// an ended change's record removed), or nil.
func (d *daemon) isolationReport(ctx context.Context, want *v1alpha3.Machine) func() {
	var ch *v1alpha3.IsolationChangeStatus
	var remove func() error
	start := func(t time.Time) *metav1.Time {
		if t.IsZero() {
			return nil
		}
		mt := metav1.NewTime(t)
		return &mt
	}
	if h, err := reprovision.ReadJournal(d.p); err == nil {
		ch = &v1alpha3.IsolationChangeStatus{From: v1alpha3.IsolationMode(h.FromMode), To: v1alpha3.IsolationMode(h.ToMode),
			Method: v1alpha3.IsolationChangeReprovision, State: v1alpha3.IsolationChangeState(h.State), StartTime: start(h.StartedAt), Message: h.Message}
		if h.Live() {
			// Looked at again: the handoff's end is its journal's.
			if d.statusRetry == nil {
				d.statusRetry = time.After(5 * time.Second)
			}
			ch.Message = fmt.Sprintf("attempt %d; gives up at %s", h.Attempts, h.Deadline.UTC().Format(time.RFC3339))
			if h.LastError != "" {
				ch.Message += "; last error: " + h.LastError
			}
		} else {
			remove = func() error { return reprovision.Remove(d.p) }
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		d.log.Warn("the reprovision handoff's journal is unreadable", "error", err)
		return nil
	} else if j, err := state.ReadInPlaceJournal(d.p); err == nil && j.FromMode != "" {
		ch = &v1alpha3.IsolationChangeStatus{From: v1alpha3.IsolationMode(j.FromMode), To: v1alpha3.IsolationMode(j.Mode),
			Method: v1alpha3.IsolationChangeInPlace, State: v1alpha3.IsolationChangeInProgress, StartTime: start(j.StartedAt),
			Message: "the node moves into the other slot in the new mode (unbounded-isolation.service)"}
		if d.statusRetry == nil {
			d.statusRetry = time.After(5 * time.Second)
		}
	} else if o, err := state.ReadIsolationOutcome(d.p); err != nil {
		d.log.Warn("the isolation change's outcome is unreadable", "error", err)
		return nil
	} else if o != nil {
		ch = &v1alpha3.IsolationChangeStatus{From: v1alpha3.IsolationMode(o.From), To: v1alpha3.IsolationMode(o.To),
			Method: v1alpha3.IsolationChangeMethod(o.Method), State: v1alpha3.IsolationChangeState(o.State), StartTime: start(o.StartedAt), Message: o.Message}
		remove = func() error { return state.RemoveIsolationOutcome(d.p) }
	} else {
		return nil
	}
	ch.Message = truncate(ch.Message, 1024)
	want.Status.IsolationChange = ch
	ended := ch.State == v1alpha3.IsolationChangeSucceeded || ch.State == v1alpha3.IsolationChangeFailed
	if ended {
		cond := metav1.Condition{Type: v1alpha3.ConditionIsolationChanged, ObservedGeneration: want.Generation,
			Status: metav1.ConditionTrue, Reason: "Succeeded", Message: ch.Message}
		if ch.State == v1alpha3.IsolationChangeFailed {
			cond.Status, cond.Reason = metav1.ConditionFalse, "Failed"
		}
		meta.SetStatusCondition(&want.Status.Conditions, cond)
	}
	prev := d.machineObj.Status.IsolationChange
	changed := prev == nil || prev.State != ch.State || prev.To != ch.To || prev.Method != ch.Method
	return func() {
		if changed {
			evType := corev1.EventTypeNormal
			if ch.State == v1alpha3.IsolationChangeFailed {
				evType = corev1.EventTypeWarning
			}
			msg := fmt.Sprintf("isolation change %s -> %s (%s) %s: %s", ch.From, ch.To, ch.Method, ch.State, ch.Message)
			d.log.Info("reported the isolation change", "from", ch.From, "to", ch.To, "method", ch.Method, "state", ch.State)
			go d.recordEvent(context.WithoutCancel(ctx), evType, "IsolationChange"+string(ch.State), msg) // after reportMachine returned and cancelled its ctx
		}
		if remove != nil {
			if err := remove(); err != nil {
				d.log.Warn("the isolation change was reported but its record not removed", "error", err)
			}
		}
	}
}
