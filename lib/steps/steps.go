// Package steps runs the named, journaled steps of a multi-step operation
// (bootstrap, repave, reset; ARCHITECTURE section 5): in order, each one
// shown as STATUS=, journaled once done and followed by the crash point
// "<operation>/after-<step>" (lib/crashpoint), so that the next run after
// a crash, a reboot or a failure resumes from the journal.
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
}

// Record is what the runner keeps in an operation's journal. Its field
// names are those the journals had before this package (a host upgraded
// mid-operation resumes a journal of the previous build), and
// `unbounded status` shows "step" of every journal.
type Record struct {
	// Done are the steps done, in the order they were first done.
	Done []string `json:"done"`
	// Step is where the last run got to: the last step done, or
	// "<step> failed: <reason>".
	Step string `json:"step,omitempty"`
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
	Journal   Journal
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

// Run runs steps in order, each but the Always ones skipped when the
// journal says it is done. The first failure ends the run: the journal's
// Step says which step failed and why (in memory: the operation's
// failure path writes it, or removes the journal), and the error is an
// *Error. A journal that cannot be written is the failure of the step
// whose record it is.
func (r *Runner) Run(ctx context.Context, steps []Step) error {
	rec := r.Journal.Steps()
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
			err = state.RemoveJournal(r.Paths, r.Operation)
		case !s.Unjournaled:
			err = state.WriteJournal(r.Paths, r.Operation, r.Journal)
		}
		if err != nil {
			return r.fail(s.Name, fmt.Errorf("done, but its journal was not written: %w", err))
		}
		crashpoint.Via(r.CrashPoint, CrashPoint(r.Operation, s.Name))
	}
	return nil
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
