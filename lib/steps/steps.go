// Package steps runs the named, journaled steps of a multi-step operation
// (bootstrap, repave, reset; ARCHITECTURE section 5): in order, each one
// shown as STATUS=, journaled once done and followed by the crash point
// "<operation>/after-<step>" (lib/crashpoint), so that the next run after
// a crash, a reboot or a failure resumes from the journal.
//
// An operation whose steps have an Undo is rolled back when a step fails:
// the journal says "rolling back" and why, then the failed step and the
// steps done are undone in reverse, each journaled once undone and
// followed by the crash point "<operation>/after-undo-<step>", so that a
// run cut in the rollback goes on with the rollback, never forward.
//
// The operation owns its journal type and everything in it but the steps;
// it embeds Record, which is what this package keeps there.
package steps

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"

	"unbounded-cloud.io/agent/lib/crashpoint"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/sdstatus"
	"unbounded-cloud.io/agent/lib/state"
)

// Step is one named step of an operation. Every step is idempotent: a
// run cut anywhere in it does it again from its beginning.
type Step struct {
	Name string
	// Always runs the step in every run, also when the journal says it
	// is done: its result is needed by the steps after it, or it holds
	// only for the run that did it (a fence check, a start, a wait).
	// Otherwise a step journaled done is skipped.
	Always bool
	// Status, when set, is shown (STATUS= and the log) as the step
	// begins: "<label> <name>: <Status>". A step that says more, or says
	// it only in some cases, shows it itself.
	Status string
	// Run does the step; nil is a step whose work was done before the
	// runner started (a plan, a lock): the runner only journals it.
	Run func(ctx context.Context) error
	// Unjournaled is a step that changes nothing on the host: it is
	// recorded done with the next step's journal write, not on its own.
	Unjournaled bool
	// Final removes the journal once the step is done instead of writing
	// it: from there on what the operation did is recorded elsewhere (an
	// applied config), or the state the journal lived in is gone.
	Final bool
	// Undo, when set, undoes the step in a rollback: for a step done, and
	// for the step whose failure began the rollback (it may have done
	// part of its work). It is idempotent, succeeds on a step that did
	// nothing, and a rollback cut in it calls it again.
	Undo func(ctx context.Context) error
}

// Record is what the runner keeps in an operation's journal. Its field
// names are those the journals had before this package (a host upgraded
// mid-operation resumes a journal of the previous build), and
// `unbounded status` shows "step" of every journal.
type Record struct {
	// Done are the steps done, in the order they were first done.
	Done []string `json:"done"`
	// Step is where the last run got to: the last step done, or
	// "<step> failed: <reason>", or in a rollback the last step undone,
	// or "<step> undo failed: <reason>".
	Step string `json:"step,omitempty"`
	// RollingBack, when set, is why the operation is being rolled back:
	// a run goes on undoing (Runner.Run), never forward.
	RollingBack string `json:"rolling_back,omitempty"`
	// Failed is the step whose failure began the rollback, until it is
	// undone.
	Failed string `json:"failed,omitempty"`
}

// Steps returns r; an operation's journal has it by embedding Record.
func (r *Record) Steps() *Record { return r }

// IsDone says whether step is journaled done.
func (r *Record) IsDone(step string) bool { return slices.Contains(r.Done, step) }

// Forget drops steps from Done (a node stopped after a failure is no
// longer started).
func (r *Record) Forget(steps ...string) {
	r.Done = slices.DeleteFunc(r.Done, func(s string) bool { return slices.Contains(steps, s) })
}

// SetFailed records that step failed for reason.
func (r *Record) SetFailed(step, reason string) {
	r.Step = step + " failed: " + Truncate(reason, MaxReason)
}

// MaxReason bounds the reason a journal keeps: enough for a status line
// and an error chain, never a journal a reader refuses for its size.
const MaxReason = 512

// Truncate shortens s to at most n bytes, marking the cut.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-3] + "..."
}

// Journal is an operation's journal: a struct that embeds Record. The
// runner writes all of it (lib/state: atomic, SHA-256 sidecar, 0600).
type Journal interface{ Steps() *Record }

// Runner runs the steps of one operation on one host. The zero value of
// Notify, CrashPoint and Log is the real process.
type Runner struct {
	Paths hostpaths.Paths
	// Operation names the journal (/var/lib/unbounded/journal/
	// <Operation>.json) and the crash points.
	Operation string
	// JournalName, when set, names the journal instead of Operation: a
	// part of an operation with a journal of its own (the none mode's
	// in-place switch, "repave-none"), whose crash points are the
	// operation's.
	JournalName string
	Journal     Journal
	// Label is what the operation calls its steps in STATUS= lines and
	// errors ("phase" for bootstrap); "" is "step".
	Label string
	// OnDone, when set, is called when a step is done, before its
	// journal is written: the operation updates the rest of its journal.
	OnDone func(step string)
	// Notify sends an sd_notify state; nil: sd_notify.
	Notify func(state string)
	// CrashPoint is called at each crash point; nil: crashpoint.Hit.
	CrashPoint func(name string)
	Log        *slog.Logger
}

func (r *Runner) label() string {
	if r.Label == "" {
		return "step"
	}
	return r.Label
}

func (r *Runner) log() *slog.Logger {
	if r.Log != nil {
		return r.Log
	}
	return slog.Default()
}

// CrashPoint is the crash point after step of operation.
func CrashPoint(operation, step string) string { return operation + "/after-" + step }

// The crash points of a rollback: once the journal says rolling back, and
// once each step is undone.
func CrashRollbackBegun(operation string) string { return CrashPoint(operation, "rollback-begun") }
func CrashUndone(operation, step string) string  { return CrashPoint(operation, "undo-"+step) }

func (r *Runner) journalName() string {
	if r.JournalName != "" {
		return r.JournalName
	}
	return r.Operation
}

func (r *Runner) writeJournal() error { return state.WriteJournal(r.Paths, r.journalName(), r.Journal) }

// Run runs steps in order, each but the Always ones skipped when the
// journal says it is done. The first failure ends the run: the journal's
// Step says which step failed and why (in memory: the operation's
// failure path writes it, or removes the journal), and the error is an
// *Error. A journal that cannot be written is the failure of the step
// whose record it is.
//
// When the failed step or a step done has an Undo, the failure begins a
// rollback instead, unless the step's error wraps ErrHold: the journal
// says so (RollingBack, written before anything is undone), then each
// such step is undone in reverse order (RollBack). A journal that says
// rolling back makes Run go on with the rollback and run no step
// forward.
func (r *Runner) Run(ctx context.Context, steps []Step) error {
	rec := r.Journal.Steps()
	if rec.RollingBack != "" {
		return r.rollBack(ctx, steps, nil)
	}
	for _, s := range steps {
		if !s.Always && rec.IsDone(s.Name) {
			r.log().Info(r.label()+" already done", r.label(), s.Name)
			continue
		}
		if s.Status != "" {
			sdstatus.Show(r.log(), r.Notify, "%s %s: %s", r.label(), s.Name, s.Status)
		}
		if s.Run != nil {
			if err := s.Run(ctx); err != nil {
				if !errors.Is(err, ErrHold) && undoable(steps, rec, s.Name) {
					return r.beginRollback(ctx, steps, s.Name, err)
				}
				return r.fail(s.Name, err)
			}
		}
		if !rec.IsDone(s.Name) {
			rec.Done = append(rec.Done, s.Name)
		}
		rec.Step = s.Name
		if r.OnDone != nil {
			r.OnDone(s.Name)
		}
		var err error
		switch {
		case s.Final:
			err = state.RemoveJournal(r.Paths, r.journalName())
		case !s.Unjournaled:
			err = r.writeJournal()
		}
		if err != nil {
			return r.fail(s.Name, fmt.Errorf("done, but its journal was not written: %w", err))
		}
		crashpoint.Via(r.CrashPoint, CrashPoint(r.Operation, s.Name))
	}
	return nil
}

// undoable says whether a rollback after step failed has anything to
// undo: step itself or a step done has an Undo.
func undoable(steps []Step, rec *Record, failed string) bool {
	for _, s := range steps {
		if s.Undo != nil && (s.Name == failed || rec.IsDone(s.Name)) {
			return true
		}
	}
	return false
}

// beginRollback journals that step failed with err and that the
// operation is rolling back, then rolls it back.
func (r *Runner) beginRollback(ctx context.Context, steps []Step, step string, err error) error {
	rec := r.Journal.Steps()
	rec.SetFailed(step, err.Error())
	rec.RollingBack, rec.Failed = Truncate(err.Error(), MaxReason), step
	if werr := r.writeJournal(); werr != nil {
		return &Error{Label: r.label(), Step: step, Err: fmt.Errorf("%w; and the rollback could not be journaled (nothing undone): %w", err, werr)}
	}
	r.log().Error(r.label()+" failed; rolling back", r.label(), step, "error", err.Error())
	crashpoint.Via(r.CrashPoint, CrashRollbackBegun(r.Operation))
	return r.rollBack(ctx, steps, err)
}

// RollBack begins the rollback of an operation whose journal is not
// rolling back yet, for reason (a run of other arguments replaces it):
// the steps done are undone as after a failure (Run's), and the error is
// a *RolledBackError once they are.
func (r *Runner) RollBack(ctx context.Context, steps []Step, reason string) error {
	rec := r.Journal.Steps()
	if rec.RollingBack == "" {
		rec.RollingBack = Truncate(reason, MaxReason)
		if err := r.writeJournal(); err != nil {
			return fmt.Errorf("roll back (%s): the journal could not be written (nothing undone): %w", reason, err)
		}
		crashpoint.Via(r.CrashPoint, CrashRollbackBegun(r.Operation))
	}
	return r.rollBack(ctx, steps, nil)
}

// rollBack undoes, in reverse order, every step with an Undo that is
// done or whose failure began the rollback (cause: that failure, when
// this run saw it), each journaled once undone. The journal stays (still
// rolling back) for the operation to remove: it knows what else to
// clean.
func (r *Runner) rollBack(ctx context.Context, steps []Step, cause error) error {
	rec := r.Journal.Steps()
	failed := rec.Failed
	for i := len(steps) - 1; i >= 0; i-- {
		s := steps[i]
		if s.Undo == nil || (!rec.IsDone(s.Name) && rec.Failed != s.Name) {
			continue
		}
		sdstatus.Show(r.log(), r.Notify, "%s %s: undoing (rolling back: %s)", r.label(), s.Name, rec.RollingBack)
		if err := s.Undo(ctx); err != nil {
			rec.Step = s.Name + " undo failed: " + Truncate(err.Error(), MaxReason)
			if werr := r.writeJournal(); werr != nil {
				err = fmt.Errorf("%w (and the journal was not written: %v)", err, werr)
			}
			return &UndoError{Label: r.label(), Step: s.Name, Reason: rec.RollingBack, Cause: cause, Err: err}
		}
		rec.Forget(s.Name)
		if rec.Failed == s.Name {
			rec.Failed = ""
		}
		rec.Step = s.Name + " undone"
		if err := r.writeJournal(); err != nil {
			return &UndoError{Label: r.label(), Step: s.Name, Reason: rec.RollingBack, Cause: cause, Err: fmt.Errorf("undone, but its journal was not written: %w", err)}
		}
		crashpoint.Via(r.CrashPoint, CrashUndone(r.Operation, s.Name))
	}
	return &RolledBackError{Label: r.label(), Step: failed, Reason: rec.RollingBack, Cause: cause}
}

// ErrHold, wrapped by a step's error, fails the run without a rollback
// although steps have an Undo: what the step met holds the operation
// where it is (an allocation fence's refusal: no node may start, the old
// one no more than the new), and the next run does the step again.
var ErrHold = errors.New("held")

// Hold wraps err with ErrHold (nil stays nil); its text is err's.
func Hold(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%w%.0w", err, ErrHold)
}

// ErrRolledBack is wrapped by the error of a run whose rollback is done:
// every step it undoes was undone.
var ErrRolledBack = errors.New("rolled back")

// RolledBackError is the end of a rollback that undid every step.
type RolledBackError struct {
	Label string
	// Step failed and began the rollback ("" when RollBack began it, or
	// the step was undone by an earlier run).
	Step string
	// Reason is why the operation was rolled back (the journal's).
	Reason string
	// Cause is the step's own error, when this run saw it fail.
	Cause error
}

func (e *RolledBackError) Error() string {
	if e.Step != "" {
		return fmt.Sprintf("%s %s failed (%s); rolled back", labelOr(e.Label), e.Step, e.Reason)
	}
	return fmt.Sprintf("rolled back (%s)", e.Reason)
}

// Unwrap gives ErrRolledBack and the step's own error (lib/exitcode sees
// through to it).
func (e *RolledBackError) Unwrap() []error {
	if e.Cause != nil {
		return []error{ErrRolledBack, e.Cause}
	}
	return []error{ErrRolledBack}
}

// UndoError is a rollback that stopped at a step it could not undo: the
// journal still says rolling back, and the next run goes on from there.
type UndoError struct {
	Label, Step string
	// Reason is why the operation is being rolled back.
	Reason string
	// Cause is the failed step's own error, when this run saw it fail.
	Cause error
	// Err is the undo's.
	Err error
}

func (e *UndoError) Error() string {
	return fmt.Sprintf("rolling back (%s): undo of %s %s failed: %v", e.Reason, labelOr(e.Label), e.Step, e.Err)
}

func (e *UndoError) Unwrap() []error {
	if e.Cause != nil {
		return []error{e.Err, e.Cause}
	}
	return []error{e.Err}
}

func labelOr(l string) string {
	if l == "" {
		return "step"
	}
	return l
}

func (r *Runner) fail(step string, err error) error {
	r.Journal.Steps().SetFailed(step, err.Error())
	return &Error{Label: r.label(), Step: step, Err: err}
}

// Error is the failure of one step. It unwraps to the step's own error,
// so that errors.Is and lib/exitcode see through it.
type Error struct {
	// Label is what the operation calls its steps ("phase", "step").
	Label string
	Step  string
	Err   error
}

func (e *Error) Error() string {
	label := e.Label
	if label == "" {
		label = "step"
	}
	return label + " " + e.Step + ": " + e.Err.Error()
}

func (e *Error) Unwrap() error { return e.Err }

// Failed returns the step that err is the failure of and the step's own
// error; "" and err when err is no step's failure.
func Failed(err error) (step string, cause error) {
	var e *Error
	if errors.As(err, &e) {
		return e.Step, e.Err
	}
	return "", err
}
