package daemon

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/outcome"
	"unbounded-cloud.io/agent/lib/reprovision"
	"unbounded-cloud.io/agent/lib/request"
	"unbounded-cloud.io/agent/lib/state"
)

// OperationIsolationChange is the daemon's own job type for an isolation
// change: no MachineOperation carries it, the Machine's
// spec.isolation.mode does (its request file is requests/isolation.json,
// its unit unbounded-isolation.service).
const OperationIsolationChange v1alpha3.OperationType = "IsolationChange"

// The parameters of an isolation change's request: the running mode, the
// spec's, and the spec's isolation.method when it names one (absent: the
// build's method for the pair). The isolation unit reads the method as
// lib/isolation's ParamMethod (named here: lib/daemon does not link
// lib/isolation).
const (
	paramFrom   = "from"
	paramTo     = "to"
	paramMethod = "method"
)

// isolationState is the isolation change's job source's own state.
type isolationState struct {
	// started is the change this process handed to its unit,
	// InProgress until the unit has ended (startIsolation,
	// isolationEnded).
	started *v1alpha3.IsolationChangeStatus
	// resume is a change to resume: its job was retried (D-Bus or the
	// cluster failed it), or an earlier process handed it to its
	// request and stopped before its unit ran (isolationUnrecorded).
	// Like a vanished Node's repave, it has no operation that would
	// bring it back.
	resume *job
}

// firstLook records spec.isolation.mode as the daemon first sees it (the
// running mode known), when its Machine is observed, whatever job runs
// first. Recorded only by isolationJob, which the job sources ask after
// the pending operations, a spec changed while the daemon's first
// operation ran was taken for the spec at the first look and never acted
// on: an operator's change of mode lost (CI H1 caught it, a marker
// operation running first and the spec changed under it).
func (d *daemon) firstLook() {
	m := d.machineObj
	if m == nil || d.tokenOnly || d.active == nil || m.Spec.Isolation.Mode == "" {
		return
	}
	if _, known, err := state.ReadIsolationSpecSeen(d.p); err != nil || known {
		return
	}
	d.isolationJob() // not known: it records the spec as seen and asks for nothing
}

// isolationJob is the isolation change the Machine's spec.isolation.mode
// asks for (a mode other than the running one), or nil. It is asked once
// per generation of the Machine: not while a change runs (its journal,
// a live handoff) or its outcome is still to be reported, nor after a
// change was reported at this generation (IsolationChanged observed at
// it): a failed change is not looped on, and a change made by hand is
// not undone, until the spec changes. The job carries
// spec.isolation.method, when set, as its request's method. A pair of
// modes this build does not change between, or not by the method asked
// for, is reported Failed without a unit.
func (d *daemon) isolationJob() *job {
	m := d.machineObj
	if m == nil || d.tokenOnly || d.active == nil {
		return nil
	}
	to := string(m.Spec.Isolation.Mode)
	if to == "" {
		return nil
	}
	// A change of the spec, not a spec that differed before the daemon
	// looked (state.IsolationSpecFile says why): the spec is recorded
	// as seen at the first look, when it names the running mode, and as
	// the daemon dispatches a change to it.
	seen, known, err := state.ReadIsolationSpecSeen(d.p)
	if err != nil {
		d.log.Warn("the isolation spec the daemon last saw is unreadable; not acting on spec.isolation.mode", "error", err)
		return nil
	}
	if !known || to == d.active.Mode {
		if seen != to {
			if err := state.WriteIsolationSpecSeen(d.p, to); err != nil {
				d.log.Warn("the isolation spec seen not recorded", "error", err)
			}
			if to != d.active.Mode {
				d.log.Warn("spec.isolation.mode differs from the running mode at the daemon's first look: not acted on (a change of the spec is)", "spec", to, "running", d.active.Mode)
			}
		}
		return nil
	}
	cond := meta.FindStatusCondition(m.Status.Conditions, v1alpha3.ConditionIsolationChanged)
	if seen == to && (cond == nil || cond.Status != metav1.ConditionFalse) {
		// Asked for already: only a change that failed is asked again,
		// at a later generation (below).
		return nil
	}
	uid := fmt.Sprintf("isolation:%s:%d", to, m.Generation)
	if d.handled[uid] {
		return nil
	}
	if c := cond; seen == to && c != nil && c.ObservedGeneration >= m.Generation {
		// The spec's mode was asked for already and a change was
		// reported at this generation: one that failed is not tried
		// again until the spec changes. (A mode the daemon has not
		// asked for is a new spec, whatever was reported: the outcome
		// of a change made by hand that fails while the spec changes is
		// reported at the new generation, and held the new spec back
		// for good; CI caught it. A change made by hand is not undone:
		// its spec was asked for, or seen at the first look, above.)
		return nil
	}
	if d.isolationGoesOn() {
		return nil
	}
	if o, err := outcome.Read(d.p, outcome.Isolation); err != nil || o != nil {
		return nil // reported first (reportMachine), then judged
	}
	asked := string(m.Spec.Isolation.Method)
	if _, err := d.host.changeMethod(d.active.Mode, to, asked); err != nil {
		d.handled[uid] = true
		if err := state.WriteIsolationSpecSeen(d.p, to); err != nil {
			d.log.Warn("the isolation spec seen not recorded", "error", err)
		}
		d.log.Warn("spec.isolation asks for a change this build does not make", "from", d.active.Mode, "to", to, "method", asked, "error", err)
		now := d.host.now().UTC()
		o := outcome.Record{Concern: outcome.Isolation, Generation: m.Generation, UID: uid, From: d.active.Mode, To: to, State: outcome.Failed,
			Reason: "MethodRefused", StartedAt: now, Time: now, Message: err.Error() + "; the node was left as it is"}
		if werr := outcome.Write(d.p, o); werr != nil {
			d.log.Error("the refused isolation change's outcome not recorded", "error", werr)
		}
		d.statusRetry = time.After(0)
		return nil
	}
	// The spec is recorded as seen once the change is handed to its
	// request (dispatch, markIsolationAsked), not here: a daemon stopped
	// in between would otherwise leave it seen and never asked for, and
	// the host silently in the old mode.
	d.log.Info("spec.isolation.mode asks for another mode: changing the isolation mode", "from", d.active.Mode, "to", to, "method", asked)
	// InProgress before the unit starts (startIsolation); its journal,
	// once its plan is made, carries the change's own start time, and
	// isolationReport looks again every 5 s while it exists.
	d.statusRetry = time.After(2 * time.Second)
	params := map[string]string{paramFrom: d.active.Mode, paramTo: to, outcome.ParamGeneration: strconv.FormatInt(m.Generation, 10)}
	if asked != "" {
		params[paramMethod] = asked
	}
	return &job{uid: uid, typ: OperationIsolationChange, params: params}
}

// isolationJournal is the in-place change's journal (lib/isolation's
// Operation, named here: lib/daemon does not link lib/isolation).
const isolationJournal = "isolation"

// isolationReport puts the isolation change the host shows into want's
// status.isolationChange (and, once ended, the IsolationChanged
// condition), from, in this order: a reprovision handoff's journal, the
// in-place change's journal (InProgress, looked at again in 5 s), the
// outcome an isolation change left (lib/outcome), then what
// the host has no record of (isolationUnrecorded). The phase follows
// (isolationPhase). It returns what to do once the status holds it (an
// Event when the state changed; an ended change's record removed), or
// nil.
func (d *daemon) isolationReport(ctx context.Context, want *v1alpha3.Machine) func() {
	var ch *v1alpha3.IsolationChangeStatus
	var remove func() error
	if h, err := reprovision.ReadJournal(d.p); err == nil {
		ch = &v1alpha3.IsolationChangeStatus{From: v1alpha3.IsolationMode(h.FromMode), To: v1alpha3.IsolationMode(h.ToMode),
			Method: v1alpha3.IsolationChangeReprovision, State: v1alpha3.IsolationChangeState(h.State), StartTime: statusTime(h.StartedAt), Message: h.Message}
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
			Method: v1alpha3.IsolationChangeInPlace, State: v1alpha3.IsolationChangeInProgress, StartTime: statusTime(j.StartedAt),
			Message: "the node moves into the other slot in the new mode (unbounded-isolation.service)"}
		if d.statusRetry == nil {
			d.statusRetry = time.After(5 * time.Second)
		}
	} else if o, err := outcome.Read(d.p, outcome.Isolation); err != nil {
		d.log.Warn("the isolation change's outcome is unreadable", "error", err)
		return nil
	} else if o != nil && d.iso.started == nil {
		// (The outcome of the daemon's own change waits for its unit's
		// end: isolationEnded adds the unit's result to it.)
		ch = outcomeStatus(*o)
		remove = func() error { return outcome.Remove(d.p, outcome.Isolation) }
	} else if ch = d.isolationUnrecorded(ctx); ch == nil {
		return nil
	}
	ch.Message = truncate(ch.Message, 1024)
	want.Status.IsolationChange = ch
	isolationPhase(want, ch.State)
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

// markIsolationAsked records spec.isolation.mode to as asked for, once
// the change to it is handed to its request (a request file names it):
// from then on it is not asked for again at this generation. A record that
// fails only means the next daemon may ask once more.
func (d *daemon) markIsolationAsked(to string) {
	if err := state.WriteIsolationSpecSeen(d.p, to); err != nil {
		d.log.Warn("the isolation spec asked for not recorded; a later daemon may ask for it again", "to", to, "error", err)
	}
}

// statusTime is t as the status holds it: the API server keeps whole
// seconds, and a time with more would differ from the Machine read back
// at every report (a write each time).
func statusTime(t time.Time) *metav1.Time {
	if t.IsZero() {
		return nil
	}
	mt := metav1.NewTime(t.UTC().Truncate(time.Second))
	return &mt
}

// outcomeStatus is an ended change's status.isolationChange.
func outcomeStatus(o outcome.Record) *v1alpha3.IsolationChangeStatus {
	return &v1alpha3.IsolationChangeStatus{From: v1alpha3.IsolationMode(o.From), To: v1alpha3.IsolationMode(o.To),
		Method: v1alpha3.IsolationChangeMethod(o.Method), State: v1alpha3.IsolationChangeState(o.State), StartTime: statusTime(o.StartedAt), Message: o.Message}
}

// isolationPhase makes the phase follow the change: ChangingIsolation
// while it is InProgress, Ready again once it ended (the node runs, in
// the new mode or rolled back to the old one). A refusal of the
// allocation fence is not painted over (as report.SetBootstrap).
func isolationPhase(want *v1alpha3.Machine, s v1alpha3.IsolationChangeState) {
	if meta.IsStatusConditionTrue(want.Status.Conditions, v1alpha3.ConditionAllocationLaunchRefused) {
		return
	}
	switch {
	case s == v1alpha3.IsolationChangeInProgress:
		want.Status.Phase = v1alpha3.MachineChangingIsolation
	case want.Status.Phase == v1alpha3.MachineChangingIsolation:
		want.Status.Phase = v1alpha3.MachineReady
	}
}

// startIsolation shows the change j asks for InProgress on the Machine
// before its unit starts (status.isolationChange, the phase, an Event),
// by the method the unit will use (the one asked for, else the build's):
// the unit's journal appears only once its plan is made (the bootstrap
// token checked with the API server), and a unit that fails before it
// still ends a change the Machine showed started. isolationReport keeps
// it until the unit has ended (isolationEnded).
func (d *daemon) startIsolation(ctx context.Context, j *job) {
	from, to := j.params[paramFrom], j.params[paramTo]
	method, _ := d.host.changeMethod(from, to, j.params[paramMethod]) // a change isolationJob let through
	d.iso.started = &v1alpha3.IsolationChangeStatus{From: v1alpha3.IsolationMode(from), To: v1alpha3.IsolationMode(to),
		Method: v1alpha3.IsolationChangeMethod(method), State: v1alpha3.IsolationChangeInProgress, StartTime: statusTime(d.host.now()),
		Message: fmt.Sprintf("%s started for spec.isolation.mode %s (generation %d)", targets[OperationIsolationChange].unit, to, d.machineObj.Generation)}
	d.reportMachine(ctx)
	d.host.crash(CrashIsolationInProgress)
}

// isolationEnded turns the end of the unit the daemon ran for an
// isolation change (r) into the change's outcome when the unit left none
// and nothing on the host carries the change on (a handoff, the change's
// journal): judged by the host (isolationJudged), with the unit's result
// and last journal lines when it failed (a crash, a refusal before its
// plan). A Failed outcome the unit left gets them added. Recorded on the
// host, it is reported as the unit's own (reportMachine), and by the next
// daemon when the status write does not land. A job that did not end
// (retried: the daemon asks again later) only stops holding the status.
func (d *daemon) isolationEnded(r result) {
	if r.retry {
		return // resumed (iso.resume): still InProgress
	}
	started := d.iso.started
	d.iso.started = nil
	if started == nil || r.state == "" || d.isolationGoesOn() {
		return
	}
	o, err := outcome.Read(d.p, outcome.Isolation)
	if err != nil {
		d.log.Warn("the isolation change's outcome is unreadable", "error", err)
		return
	}
	switch {
	case o != nil && o.State == outcome.Failed && r.state == v1alpha3.OperationFailed:
		o.Message += "\n" + r.message
	case o != nil:
		return
	default:
		j := d.isolationJudged(r.job.params[paramFrom], r.job.params[paramTo], string(started.Method), started.StartTime, r.message)
		j.UID, j.Generation = r.job.uid, outcome.GenerationOf(r.job.params)
		o = &j
	}
	if err := outcome.Write(d.p, *o); err != nil {
		d.log.Error("the isolation change's outcome not recorded", "error", err)
	}
}

// isolationGoesOn reports whether the host carries an isolation change
// on: a live handoff, or the in-place change's journal (also when they
// cannot be read: not judged from a guess).
func (d *daemon) isolationGoesOn() bool {
	if live, err := state.HandoffLive(d.p); err != nil || live {
		return true
	}
	_, err := os.Stat(d.p.Journal(isolationJournal))
	return !errors.Is(err, os.ErrNotExist)
}

// isolationJudged is the end of a change from -> to that left no outcome,
// judged by the host: Succeeded when the active applied config (read
// again: the change's unit may just have switched it) runs the target
// mode, else Failed. why says how the change ended.
func (d *daemon) isolationJudged(from, to, method string, started *metav1.Time, why string) outcome.Record {
	o := outcome.Record{Concern: outcome.Isolation, From: from, To: to, Method: method, Time: d.host.now().UTC(), State: outcome.Failed, Reason: "JudgedByHost"}
	if started != nil {
		o.StartedAt = started.Time
	}
	mode := "unknown"
	if a, err := state.ReadActive(d.p); err == nil && a != nil {
		mode = a.Mode
	} else if d.active != nil {
		mode = d.active.Mode
	}
	if mode == to {
		o.State, o.Reason, o.Message = outcome.Succeeded, "", "the node runs in mode "+to
	} else {
		o.Message = "the change ended with the node in mode " + mode
	}
	if why != "" {
		o.Message += ": " + why
	}
	return o
}

// isolationUnrecorded is the change the host has no record of: the one
// this daemon handed to its unit, until the unit has ended
// (startIsolation), or the end of one the Machine shows InProgress while
// its unit does not run and left nothing (killed before its journal or
// its outcome, with the daemon or the host stopped meanwhile): judged by
// the host, unless this boot's request for it was never carried out (the
// daemon stopped between the request and the unit's start): that one is
// resumed. While the unit runs it is looked at again in 5 s. nil:
// nothing to report.
func (d *daemon) isolationUnrecorded(ctx context.Context) *v1alpha3.IsolationChangeStatus {
	if d.iso.started != nil {
		return d.iso.started.DeepCopy()
	}
	prev := d.machineObj.Status.IsolationChange
	unit := targets[OperationIsolationChange].unit
	if prev == nil || prev.State != v1alpha3.IsolationChangeInProgress || d.active == nil || d.inflight == "unit:"+unit {
		return nil // (a unit waited for: its end reports)
	}
	if st, err := d.sd.UnitState(ctx, unit); err != nil || st.Running() {
		if d.statusRetry == nil {
			d.statusRetry = time.After(5 * time.Second)
		}
		return nil
	}
	// Handed to its request by an earlier process that stopped before
	// the unit ran (or before it saw the unit's end): resumed, which
	// starts the unit only if it has not run for the request, and
	// otherwise reports the run it had (run.go, resume).
	concern := targets[OperationIsolationChange].concern
	if req, err := request.Read(d.p, concern); err == nil && req.Type == string(OperationIsolationChange) && req.Parameters[paramTo] == string(prev.To) &&
		!request.Taken(d.p, concern, req.UID) && !d.handled[req.UID] {
		d.log.Info("resuming the isolation change an earlier daemon process handed to its request", "uid", req.UID, "to", prev.To)
		d.markIsolationAsked(string(prev.To))
		d.iso.resume = &job{uid: req.UID, typ: OperationIsolationChange, params: req.Parameters, resume: true}
		d.iso.started = prev.DeepCopy()
		return prev.DeepCopy()
	}
	// Shown InProgress by an earlier process that stopped before it
	// handed the change to its request (the spec is recorded as seen
	// only then): nothing ran, and the change is asked for again
	// (isolationJob), not judged.
	if seen, known, err := state.ReadIsolationSpecSeen(d.p); err == nil && known && seen != string(prev.To) && d.active.Mode != string(prev.To) {
		d.log.Info("the isolation change the Machine shows in progress was never handed to its unit (the daemon stopped first): asking for it again", "to", prev.To)
		return nil
	}
	o := d.isolationJudged(string(prev.From), string(prev.To), string(prev.Method), prev.StartTime,
		unit+" does not run and left neither a journal nor an outcome (stopped with the daemon or the host while it ran)")
	d.log.Warn("the Machine shows an isolation change in progress that nothing on the host carries on; judged by the host", "to", prev.To, "state", o.State)
	return outcomeStatus(o)
}
