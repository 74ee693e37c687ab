package none

import (
	"fmt"

	"unbounded-cloud.io/agent/lib/steps"
)

// JournalName is the none mode's own repave journal,
// /var/lib/unbounded/journal/repave-none.json (lib/state: atomic, with
// a SHA-256 sidecar, 0600). lib/repave keeps its own beside it.
const JournalName = "repave-none"

// The steps of an in-place repave (lib/steps), named as the crash points
// after them end ("repave/after-<step>"). The journal records the steps
// done; a run cut in a step does it again from its beginning (every one
// is idempotent), a failure rolls back the steps done (each one's Undo,
// in reverse), and a run that finds the journal rolling back finishes
// the rollback.
const (
	// stepBuilt: the new version directory is built beside the running
	// one; the old stack runs untouched. Undo: the new directory removed.
	stepBuilt = "new-built"
	// stepFlipped: the old stack stopped and its networking cleaned
	// (crash points after-old-stopped, after-network-cleaned), the fence
	// run (after-fence), the CNI configuration and `current` flipped to
	// the new version. Undo: whatever runs stopped and cleaned, the CNI
	// configuration and `current` flipped back, the fence run again, the
	// old version started and waited healthy.
	stepFlipped = "flipped"
	// stepHealthy: the new version started (after-new-started) and
	// waited healthy; the journal is removed (the caller records the new
	// applied config). No undo of its own: stepFlipped's stops it.
	stepHealthy = "healthy"
)

// Formats of the journal: journalSteps is lib/steps' record; a journal
// without a format is of an earlier build, whose "step" named the step
// under way (install, switch, start, rollback, done) and is migrated once
// when read (migrate).
const journalSteps = 2

// The steps under way of a format-1 journal.
const (
	v1Install  = "install"
	v1Switch   = "switch"
	v1Start    = "start"
	v1Rollback = "rollback"
	v1Done     = "done"
)

// repaveJournal is what a resumed Repave needs: which repave it was
// (Input), what to go back to (Old) and what to remove on a rollback
// (New), beside the steps done.
type repaveJournal struct {
	Format int `json:"format"`
	// Running is the slot whose record names the running stack; Slot is
	// s.Name, the record the caller writes after success.
	Running string `json:"running"`
	Slot    string `json:"slot"`
	// Input is a digest of Repave's arguments (the node configuration,
	// the bootstrap token included only through the digest, and the
	// artifact files): a call with other arguments is another repave.
	Input string `json:"input"`
	// Old is the version directory `current` pointed at before; New is
	// the one this repave builds.
	Old string `json:"old"`
	New string `json:"new"`
	// Version is s.Node.KubernetesVersion, what the caller's record of
	// the new stack names (EnsureHooks compares them).
	Version string `json:"version"`
	steps.Record
	// Stopped says that the rollback stopped whatever ran and started
	// the old version again (format 1: that the old stack may have been
	// stopped, so a rollback must start it again).
	Stopped bool `json:"stopped,omitempty"`
	// Cause is a format-1 journal's rollback's reason.
	Cause string `json:"cause,omitempty"`
}

// migrate turns a format-1 journal into the steps done (and the
// rollback under way) that its step under way stood for; done reports a
// journal of a finished repave (format 1's "done"), which is removed.
func (j *repaveJournal) migrate() (done bool, err error) {
	if j.Format == journalSteps {
		return false, nil
	}
	if j.Format != 0 {
		return false, fmt.Errorf("format %d: not one this build reads (%d)", j.Format, journalSteps)
	}
	switch j.Step {
	case v1Install:
		j.Done = nil
	case v1Switch:
		j.Done = []string{stepBuilt}
	case v1Start:
		j.Done = []string{stepBuilt, stepFlipped}
	case v1Rollback:
		// The rollback of format 1 stopped, flipped back and started
		// the old stack again when the old one may have been stopped,
		// then removed the new version: the undos of these steps.
		j.Done = []string{stepBuilt}
		if j.Stopped {
			j.Done = append(j.Done, stepFlipped)
		}
		j.RollingBack = j.Cause
		if j.RollingBack == "" {
			j.RollingBack = "a repave of an earlier build failed"
		}
	case v1Done:
		return true, nil
	default:
		return false, fmt.Errorf("unknown step %q", j.Step)
	}
	j.Format, j.Step, j.Stopped, j.Cause = journalSteps, "", false, ""
	return false, nil
}

// unfinished says whether a journal read is of a repave not finished: a
// format-1 journal could say "done".
func (j *repaveJournal) unfinished() bool { return j.Format != 0 || j.Step != v1Done }

// CrashPoints are Repave's crash points (lib/crashpoint, through
// h.Crash) in the order a repave reaches them; those named as in the
// nspawn mode mark the same step. The rollback's comes first when a step
// fails, then RollbackCrashPoints.
var CrashPoints = []string{"repave/after-" + stepBuilt, "repave/after-old-stopped", "repave/after-network-cleaned",
	"repave/after-fence", "repave/after-" + stepFlipped, "repave/after-new-started", "repave/after-" + stepHealthy, steps.CrashRollbackBegun("repave")}

// RollbackCrashPoints are the crash points of a rollback after it began,
// in order: each step undone.
var RollbackCrashPoints = []string{steps.CrashUndone("repave", stepFlipped), steps.CrashUndone("repave", stepBuilt)}
