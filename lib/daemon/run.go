package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/kube"
	"unbounded-cloud.io/agent/lib/owed"
	"unbounded-cloud.io/agent/lib/request"
	"unbounded-cloud.io/agent/lib/state"
	"unbounded-cloud.io/agent/lib/unitnames"
)

// Reasons the daemon writes into a MachineOperation's status and its Events.
const (
	ReasonDispatched    = "Dispatched"
	ReasonUnitSucceeded = "UnitSucceeded"
	ReasonUnitFailed    = "UnitFailed"
	ReasonStartFailed   = "StartFailed"
	ReasonRebooting     = "Rebooting"
	ReasonRebooted      = "Rebooted"
	ReasonInterrupted   = "Interrupted"
	ReasonUnsupported   = "UnsupportedOperation"
	ReasonNodeGone      = "NodeGone"
)

// JournalLines is how many of a failed unit's last journal lines go into
// the operation's message.
const JournalLines = 20

// target is where an operation type is carried out: the concern (the
// request file's name) and its unit. Reboot has no unit of ours.
type target struct{ concern, unit string }

var targets = map[v1alpha3.OperationType]target{
	v1alpha3.OperationRepave:       {"repave", unitnames.Repave},
	v1alpha3.OperationRestart:      {"restart", unitnames.Restart},
	v1alpha3.OperationAgentUpgrade: {"upgrade", unitnames.Upgrade},
	v1alpha3.OperationReboot:       {"reboot", ""},
	OperationIsolationChange:       {"isolation", unitnames.Isolation},
}

// errOperationGone: the MachineOperation was deleted while the daemon
// worked on it. Its status cannot be written any more, so the job is over
// (a retry would fail the same way forever, and a retried job is resumed
// before any other operation is started).
var errOperationGone = errors.New("operation deleted")

// run carries out one job in its own goroutine. It returns the operation's
// final state; a job cut short by the daemon's context is "interrupted"
// and left to the next serve (or the next process) to resume.
func (d *daemon) run(ctx context.Context, j *job, desired json.RawMessage) result {
	r := result{job: j, uid: j.uid, op: j.op}
	err := d.runJob(ctx, j, desired, &r)
	if ctx.Err() != nil {
		r.interrupted = true
		return r
	}
	if errors.Is(err, state.ErrOwned) {
		r.err = err
		return r
	}
	if errors.Is(err, errOperationGone) {
		// Done, and not put back into the loop's view of the operations
		// (the watch has removed it, or is about to).
		d.log.Info("operation deleted while the daemon worked on it; dropping it", "uid", j.uid, "type", j.typ)
		r.op = nil
		return r
	}
	if err != nil {
		// Not finished (the cluster did not take a status, D-Bus
		// failed): try again after a pause, from what the cluster and
		// the unit say then.
		d.log.Error("operation not finished; retrying in 5s", "uid", j.uid, "type", j.typ, "error", err)
		r.retry = true
		select {
		case <-ctx.Done():
			r.interrupted = true
		case <-time.After(5 * time.Second):
		}
	}
	return r
}

func (d *daemon) runJob(ctx context.Context, j *job, desired json.RawMessage, r *result) error {
	if j.wait != "" {
		_, err := d.waitFinished(ctx, j.wait)
		if err == nil {
			d.log.Info("the node operation the daemon waited for has ended", "unit", j.wait)
		}
		return err
	}
	t, ok := targets[j.typ]
	if !ok {
		return d.finish(ctx, j, r, v1alpha3.OperationFailed, ReasonUnsupported,
			fmt.Sprintf("operation %q is not supported by agent on this host", j.typ))
	}
	if j.resume {
		return d.resume(ctx, j, t, r)
	}
	return d.dispatch(ctx, j, t, desired, r)
}

// dispatch is the first start of a job: request file, InProgress, unit.
func (d *daemon) dispatch(ctx context.Context, j *job, t target, desired json.RawMessage, r *result) error {
	req := &request.Request{
		UID:     j.uid,
		Type:    string(j.typ),
		Machine: d.machine,
		Unit:    t.unit,
	}
	if j.op != nil {
		req.Operation = j.op.Name
		req.Parameters = j.op.Spec.Parameters
	} else if j.params != nil {
		req.Parameters = j.params
	}
	if j.typ == v1alpha3.OperationRepave || j.typ == OperationIsolationChange {
		req.Desired = desired
	}
	if id, err := d.host.bootID(); err == nil {
		req.BootID = id
	}
	if t.unit != "" {
		st, err := d.sd.UnitState(ctx, t.unit)
		if err != nil {
			return d.finish(ctx, j, r, v1alpha3.OperationFailed, ReasonStartFailed, err.Error())
		}
		if st.Running() {
			// Started by hand (or by a path unit): joining it would
			// report someone else's run as this operation's. Wait for it
			// to end, then start the unit for this operation.
			d.log.Info("unit already running; waiting for it before dispatching", "unit", t.unit, "uid", j.uid)
			if _, err := d.waitFinished(ctx, t.unit); err != nil {
				return err
			}
			if st, err = d.sd.UnitState(ctx, t.unit); err != nil {
				return d.finish(ctx, j, r, v1alpha3.OperationFailed, ReasonStartFailed, err.Error())
			}
		}
		req.PreviousInvocation = st.InvocationID
	}
	// Taken after any wait for a run started by hand: a restarted daemon
	// reads the journal from this time on as this operation's run.
	req.RequestedAt = d.host.now().UTC()
	// The request is on disk before anything else happens: the unit reads
	// it, and a restarted daemon finds in it what it had handed over.
	if err := request.Write(d.p, t.concern, req); err != nil {
		return d.finish(ctx, j, r, v1alpha3.OperationFailed, ReasonStartFailed, fmt.Sprintf("write request: %v", err))
	}
	if j.typ == OperationIsolationChange {
		d.host.crash(CrashIsolationRequested)
		d.markIsolationAsked(j.params["to"])
	}
	// From here on the request names this job, and a retry or an
	// interruption must resume it, never dispatch it again (which would
	// start the unit a second time). An operation's job gets this from its
	// InProgress state; the repave of a vanished Node has no operation and
	// is handed back to the loop as this same job (see serve).
	j.resume = true
	what := t.unit
	if j.typ == v1alpha3.OperationReboot {
		what = "a host reboot"
	}
	if err := d.setState(ctx, j, r, d.host.now(), v1alpha3.OperationInProgress, ReasonDispatched, "started "+what, true); err != nil {
		return err
	}
	if j.typ == v1alpha3.OperationReboot {
		d.recordEvent(ctx, corev1.EventTypeNormal, ReasonRebooting, d.describe(j)+": rebooting the host")
		// Completed by the daemon of the next boot (see resume).
		return d.sd.Reboot(ctx)
	}
	// Not in the way of the start: the Event is best effort, the unit is
	// what the operation waits for.
	reason := ReasonDispatched
	if j.op == nil && j.typ == v1alpha3.OperationRepave {
		reason = ReasonNodeGone
	}
	go d.recordEvent(ctx, corev1.EventTypeNormal, reason, d.describe(j)+": started "+t.unit)
	d.log.Info("starting unit", "unit", t.unit, "uid", j.uid, "operation", req.Operation)
	jobResult, err := d.sd.StartUnit(ctx, t.unit)
	if err != nil {
		if ctx.Err() != nil {
			return err
		}
		return d.finish(ctx, j, r, v1alpha3.OperationFailed, ReasonStartFailed, err.Error())
	}
	st, err := d.waitFinished(ctx, t.unit)
	if err != nil {
		return err
	}
	return d.report(ctx, j, t, req, jobResult, st, r)
}

// resume picks up an operation that an earlier daemon process left
// InProgress: the daemon is restartable at any point. The operation's
// status, the request file (written before the unit starts, with the
// unit's previous InvocationID) and the unit's own state together say
// whether a unit is running for the operation, has finished for it, or was
// never started; resume then waits, reports, or starts it. It starts the
// unit only when it can tell that the unit has not run for this operation;
// it never starts it twice for the same operation UID.
func (d *daemon) resume(ctx context.Context, j *job, t target, r *result) error {
	if ok, err := d.finishOwed(ctx, j, r); ok {
		return err
	}
	req, rerr := request.Read(d.p, t.concern)
	ours := rerr == nil && req.UID == j.uid
	if j.typ == v1alpha3.OperationReboot {
		boot, _ := d.host.bootID()
		if ours && req.BootID != "" && req.BootID == boot {
			// Marked InProgress, but this is still the same boot: the
			// reboot was never carried out. Ask again (a queued reboot
			// is not duplicated by a second request).
			d.log.Info("reboot requested but not carried out yet; requesting it", "uid", j.uid)
			return d.sd.Reboot(ctx)
		}
		// /run is empty after a reboot: the request is gone, or names
		// the boot it was written in.
		return d.finish(ctx, j, r, v1alpha3.OperationComplete, ReasonRebooted, "the host rebooted")
	}
	if !ours {
		msg := fmt.Sprintf("the request %s for this operation is gone", d.p.Request(t.concern))
		if rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
			msg = rerr.Error()
		} else if rerr == nil {
			msg = fmt.Sprintf("the request %s names another run (uid %s)", d.p.Request(t.concern), req.UID)
		}
		return d.finish(ctx, j, r, v1alpha3.OperationFailed, ReasonInterrupted,
			msg+": the host rebooted (or the request was replaced) while it ran; the unit's own journal finishes or rolls back its work")
	}
	st, err := d.sd.UnitState(ctx, t.unit)
	if err != nil {
		return err // retried by the next process; nothing was decided
	}
	boot, _ := d.host.bootID()
	why := "unit was never started for this operation"
	switch {
	case st.Running():
		d.log.Info("resuming: unit still runs for this operation; waiting", "unit", t.unit, "uid", j.uid)
		if st, err = d.waitFinished(ctx, t.unit); err != nil {
			return err
		}
		return d.report(ctx, j, t, req, "", st, r)
	case st.InvocationID != "" && st.InvocationID != req.PreviousInvocation:
		d.log.Info("resuming: unit finished while the daemon was down", "unit", t.unit, "uid", j.uid)
		return d.report(ctx, j, t, req, "", st, r)
	case st.InvocationID == "" && req.BootID != "" && boot != "" && req.BootID != boot:
		// The request (under /var) is from an earlier boot and the unit
		// has not run in this one (a repave with a journal is resumed at
		// boot, before the daemon starts: it would have). Its run there
		// was cut by the reboot, or never began: a run that ended there
		// left its final status owed (finishOwed, above). Its work is
		// idempotent, so it runs again for this operation.
		why = "the host rebooted while the unit ran for this operation, or before it began"
	case st.InvocationID == "":
		// No invocation: either the unit never started (the daemon
		// stopped between InProgress and StartUnit), or it ran,
		// succeeded, and systemd unloaded it (garbage collection forgets
		// a unit's invocation, and spares failed units). systemd's own
		// journal messages about the unit since the request tell the two
		// apart.
		lines, err := d.host.journal(ctx, JournalQuery{Unit: t.unit, Since: req.RequestedAt, Lines: 1})
		if err != nil {
			return err
		}
		if len(lines) > 0 {
			return d.finish(ctx, j, r, v1alpha3.OperationComplete, ReasonUnitSucceeded,
				t.unit+" finished with success while the daemon was down")
		}
	}
	// Still the invocation recorded in the request (a unit that stays
	// loaded keeps its ID until the next start), or none and no journal
	// line since the request: the unit has not run for this operation. The
	// journal is not asked in the first case: it is matched by time, and
	// the last lines of the run before (by hand, or for the previous
	// operation) can come after RequestedAt.
	d.log.Info("resuming: "+why+"; starting it", "unit", t.unit, "uid", j.uid)
	jobResult, err := d.sd.StartUnit(ctx, t.unit)
	if err != nil {
		if ctx.Err() != nil {
			return err
		}
		return d.finish(ctx, j, r, v1alpha3.OperationFailed, ReasonStartFailed, err.Error())
	}
	if st, err = d.waitFinished(ctx, t.unit); err != nil {
		return err
	}
	return d.report(ctx, j, t, req, jobResult, st, r)
}

// waitFinished returns the unit's state once it is no longer in a
// transition. After a start job of a oneshot it is already final; it polls
// only for a unit found running after a restart of the daemon.
func (d *daemon) waitFinished(ctx context.Context, unit string) (UnitState, error) {
	for {
		st, err := d.sd.UnitState(ctx, unit)
		if err != nil || !st.Running() {
			return st, err
		}
		select {
		case <-ctx.Done():
			return st, ctx.Err()
		case <-time.After(d.poll):
		}
	}
}

// report turns a finished unit into the operation's final state. The job
// result decides when there is one ("done" is success); after a restart
// the unit's own Result does.
func (d *daemon) report(ctx context.Context, j *job, t target, req *request.Request, jobResult string, st UnitState, r *result) error {
	ok := st.Succeeded()
	if jobResult != "" {
		ok = jobResult == "done" && st.ActiveState != "failed"
	}
	if ok {
		return d.finish(ctx, j, r, v1alpha3.OperationComplete, ReasonUnitSucceeded, t.unit+" finished with success")
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s failed:", t.unit)
	if jobResult != "" {
		fmt.Fprintf(&b, " job %s,", jobResult)
	}
	fmt.Fprintf(&b, " result %s, exit status %d", orUnknown(st.Result), st.ExecMainStatus)
	q := JournalQuery{Unit: t.unit, Invocation: st.InvocationID, StartedAt: st.StartedAt, PID: st.MainPID, Lines: JournalLines}
	if q.Invocation == "" {
		q.Since = req.RequestedAt
	}
	lines, err := d.host.journal(ctx, q)
	switch {
	case err != nil:
		fmt.Fprintf(&b, "\n(journal unreadable: %v)", err)
	case len(lines) > 0:
		b.WriteString("\nlast journal lines:\n")
		b.WriteString(strings.Join(lines, "\n"))
	}
	return d.finish(ctx, j, r, v1alpha3.OperationFailed, ReasonUnitFailed, b.String())
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

func (d *daemon) describe(j *job) string {
	if j.op == nil && j.typ == v1alpha3.OperationAgentUpgrade {
		return "upgrade to spec.agent " + j.params["version"]
	}
	if j.typ == OperationIsolationChange {
		return "isolation change from " + j.params["from"] + " to spec.isolation.mode " + j.params["to"]
	}
	if j.op == nil {
		return "repave of vanished Node " + d.node
	}
	return fmt.Sprintf("%s %s", j.typ, j.op.Name)
}

// finish sets a final state and records the matching Event. The state is
// owed to the cluster (lib/owed) before it is written and settled once it
// is: a daemon stopped, or a host power-cut, before the write lands
// leaves the decision on disk, and the next daemon writes it (resume)
// instead of deciding again from a unit that may have run since.
func (d *daemon) finish(ctx context.Context, j *job, r *result, s v1alpha3.OperationState, reason, msg string) error {
	return d.finishAt(ctx, j, r, d.host.now(), s, reason, msg)
}

// finishAt is finish for a state decided at a given time: the operation's
// completion time is when it ended, not when the cluster took the write.
func (d *daemon) finishAt(ctx context.Context, j *job, r *result, at time.Time, s v1alpha3.OperationState, reason, msg string) error {
	evType := corev1.EventTypeNormal
	if s == v1alpha3.OperationFailed {
		evType = corev1.EventTypeWarning
	}
	d.log.Info("operation finished", "uid", j.uid, "type", j.typ, "state", s, "reason", reason)
	r.state, r.message = s, msg
	var w *owed.Write
	if j.op != nil {
		w = &owed.Write{
			Kind: owed.OperationStatus, Operation: j.op.Name, UID: j.uid,
			State: string(s), Reason: reason, Message: truncate(msg, 4096),
			By: "daemon", Why: "the operation's final status", Since: at.UTC(),
		}
		if err := owed.Owe(d.p, *w); err != nil {
			d.log.Error("the operation's final status not recorded on the host; writing it anyway", "uid", j.uid, "error", err)
			w = nil
		}
	}
	err := d.setState(ctx, j, r, at, s, reason, msg, false)
	if err == nil {
		// Once, as the Event below: a refused write is tried again.
		var took time.Duration
		for _, op := range []*v1alpha3.MachineOperation{r.op, j.op} {
			if op != nil && op.Status.StartTime != nil {
				took = at.Sub(op.Status.StartTime.Time)
				break
			}
		}
		d.metrics.observe(string(j.typ), string(s), took)
	}
	if w != nil && (err == nil || errors.Is(err, errOperationGone)) {
		if serr := owed.Settle(d.p, w.ID()); serr != nil {
			d.log.Warn("final status written, its owed record stays", "uid", j.uid, "error", serr)
		}
	}
	if err == nil && j.typ != OperationIsolationChange {
		// Once: a refused write is tried again (resume), and its Event
		// with it. An isolation change's Events are its status's
		// transitions (isolationReport).
		d.recordEvent(ctx, evType, "Operation"+string(s), d.describe(j)+": "+msg)
	}
	return err
}

// finishOwed writes the final status an earlier daemon decided and could
// not write (lib/owed), if there is one for the job; ok says whether
// there was.
func (d *daemon) finishOwed(ctx context.Context, j *job, r *result) (ok bool, err error) {
	w, err := owed.Find(d.p, owed.Write{Kind: owed.OperationStatus, UID: j.uid}.ID())
	if err != nil {
		d.log.Warn("owed final status unreadable; deciding the operation's state again", "uid", j.uid, "error", err)
		return false, nil
	}
	if w == nil {
		return false, nil
	}
	d.log.Info("resuming: writing the final status decided before the daemon stopped", "uid", j.uid, "state", w.State, "reason", w.Reason, "since", w.Since)
	return true, d.finishAt(ctx, j, r, w.Since, v1alpha3.OperationState(w.State), w.Reason, w.Message)
}

// opStatusRetryFor bounds the retries of an operation's status write
// that gets no answer.
const opStatusRetryFor = 2 * time.Minute

// setState writes the operation's status, retrying conflicts (someone
// else, a label change for example, updated the object in between). Jobs
// without an operation (a vanished Node) only log.
func (d *daemon) setState(ctx context.Context, j *job, r *result, at time.Time, s v1alpha3.OperationState, reason, msg string, starting bool) error {
	if j.op == nil {
		return nil
	}
	now := metav1.NewTime(at)
	op := j.op
	// A conflict reads the operation again; no answer (the API server
	// restarting, a cut) is tried again for two minutes (kube.Retry, the
	// rule of every cluster write of the host's operations); past that
	// the daemon stops, and its next start reports the finished unit
	// from its request.
	conflicts := 0
	retriable := func(err error) bool {
		if apierrors.IsConflict(err) {
			conflicts++
			return conflicts < 10
		}
		return kube.NoAnswer(err)
	}
	err := kube.Retry(ctx, time.Now().Add(opStatusRetryFor), d.log, "set the status of operation "+op.Name, retriable, func(ctx context.Context) error {
		want := op.DeepCopy()
		want.Status.State = s
		want.Status.Reason = reason
		want.Status.Message = truncate(msg, 4096)
		if starting || want.Status.StartTime == nil {
			want.Status.StartTime = &now
		}
		if s.Finished() {
			want.Status.CompletionTime = &now
		}
		c, cancel := context.WithTimeout(ctx, 15*time.Second)
		defer cancel()
		updated, err := d.cluster.updateOpStatus(c, want)
		if apierrors.IsConflict(err) {
			if fresh, gerr := d.cluster.getOp(c, op.Name); gerr == nil {
				op = fresh
			}
		}
		if err == nil {
			op = updated
		}
		return err
	})
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("set operation %s to %s: %w", j.op.Name, s, errOperationGone)
	}
	if err != nil {
		return fmt.Errorf("set operation %s to %s: %w", j.op.Name, s, err)
	}
	j.op, r.op = op, op
	return nil
}
