package bootstrap

import (
	"context"
	"errors"
	"fmt"
	"time"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/artifacts"
	"unbounded-cloud.io/agent/lib/config"
	"unbounded-cloud.io/agent/lib/exitcode"
	"unbounded-cloud.io/agent/lib/modes/bluegreen/tree"
	"unbounded-cloud.io/agent/lib/modes/facts"
	"unbounded-cloud.io/agent/lib/outcome"
	"unbounded-cloud.io/agent/lib/report"
	"unbounded-cloud.io/agent/lib/state"
	"unbounded-cloud.io/agent/lib/steps"
	"unbounded-cloud.io/agent/lib/unitnames"
)

// fail ends a run that failed in a phase.
func (b *Bootstrap) fail(ctx context.Context, cfg *config.Config, j *Journal, rep Reporter, lock *state.Lock, err error) error {
	// cause is err without its "phase X: " prefix, for the lines that
	// name the phase themselves.
	phase, cause := steps.Failed(err)
	temporary := exitcode.For(err) == exitcode.TempFail
	if temporary {
		j.TempFailures++
		j.LastTempFailure = b.Time().UTC()
		j.LastError = steps.Truncate(err.Error(), steps.MaxReason)
		j.Step = fmt.Sprintf("%s failed for now (retry %d follows): %s", phase, j.TempFailures, steps.Truncate(cause.Error(), steps.MaxReason))
		b.Logger().Warn("bootstrap failed for now; the unit retries", "phase", phase, "retry", j.TempFailures,
			"delay", Backoff(b.Backoff, j.TempFailures).String(), "error", err.Error())
	} else {
		b.Logger().Error("bootstrap failed", "phase", phase, "error", err.Error())
		j.SetFailed(phase, cause.Error())
	}
	if werr := state.WriteJournal(b.Paths, Operation, j); werr != nil {
		b.Logger().Error("bootstrap journal not written", "error", werr.Error())
	}
	// No node runs without its record: a node started by this run is
	// stopped (the journal keeps the slot; the next run starts it again
	// behind a new fence check).
	if j.IsDone(PhaseStart) || phase == PhaseStart || phase == PhaseReady {
		b.stopNode(ctx, cfg.Mode, j.Slot)
		j.Forget(PhaseStart, PhaseReady)
		if werr := state.WriteJournal(b.Paths, Operation, j); werr != nil {
			b.Logger().Error("bootstrap journal not written", "error", werr.Error())
		}
	}
	if !temporary {
		b.Status("failed in phase %s: %v", phase, cause)
		_ = rep.Failed(ctx, reason(phase, err), err.Error())
		b.recordOutcome(outcome.Record{State: outcome.Failed, Reason: reason(phase, err), Step: phase, To: cfg.Mode, Message: err.Error()})
	} else {
		b.Status("phase %s failed for now (retry %d follows): %v", phase, j.TempFailures, cause)
	}
	if rerr := lock.Release(); rerr != nil {
		b.Logger().Error("ownership lock not released", "error", rerr.Error())
	}
	return err
}

func (b *Bootstrap) stopNode(ctx context.Context, mode, slot string) {
	// A context that a SIGTERM ended must still let the stop through.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	sd, err := b.Manager(ctx)
	if err != nil {
		b.Logger().Error("node not stopped after the failed bootstrap", "error", err.Error())
		return
	}
	defer sd.Close()
	us := facts.Supervising(mode, slot)
	for i := len(us) - 1; i >= 0; i-- {
		if err := sd.StopUnit(ctx, us[i]); err != nil {
			b.Logger().Error("node unit not stopped after the failed bootstrap", "unit", us[i], "error", err.Error())
		}
	}
}

// reason is the Bootstrapped condition's reason for a failure.
func reason(phase string, err error) string {
	switch {
	case errors.Is(err, exitcode.ErrRefused):
		return v1alpha3.ConditionAllocationLaunchRefused
	case errors.Is(err, artifacts.ErrChecksumMismatch):
		return "ArtifactChecksumMismatch"
	case errors.Is(err, tree.ErrImageNotFound):
		// The usual cause is a typo in [nspawn] image, or an image not
		// pushed yet: say it on the Machine, not only "the slot failed".
		return "NodeImageNotFound"
	case errors.Is(err, exitcode.ErrConfigInvalid):
		return "ConfigurationInvalid"
	}
	switch phase {
	case PhaseHostPrep:
		return "HostPreparationFailed"
	case PhaseArtifacts:
		return "ArtifactsFailed"
	case PhaseSlot:
		return "SlotPreparationFailed"
	case PhaseFence:
		return "FenceFailed"
	case PhaseStart:
		return "NodeStartFailed"
	case PhaseReady:
		return "NodeNotReady"
	case PhaseRecord:
		return "RecordFailed"
	}
	return report.ReasonFailed
}

// handOver releases the lock of a host that is bootstrapped already and
// starts its node and daemon.
func (b *Bootstrap) handOver(ctx context.Context, lock *state.Lock) error {
	if err := lock.Release(); err != nil {
		return fmt.Errorf("release the ownership lock: %w", err)
	}
	b.Crash("bootstrap/after-release")
	return b.start(ctx)
}

// HandOver hands the recorded node over to systemd, as the end of a
// bootstrap does: a reprovision does it again once its handoff has ended,
// since the generator wires no node while a handoff is in progress.
func (b *Bootstrap) HandOver(ctx context.Context) error { return b.start(ctx) }

// start hands the recorded node over to systemd: reload (the generator
// wires the node target), start the node target without waiting (it is
// ordered after this unit), and start the daemon.
func (b *Bootstrap) start(ctx context.Context) error {
	b.Status("handing over: daemon-reload, starting %s and %s", unitnames.NodeTarget, unitnames.Daemon)
	sd, err := b.Manager(ctx)
	if err != nil {
		return err
	}
	defer sd.Close()
	if err := steps.HandOver(ctx, sd, steps.WaitDaemon, func() { b.Crash("bootstrap/after-reload") }); err != nil {
		return err
	}
	b.Status("bootstrapped: %s queued, %s started", unitnames.NodeTarget, unitnames.Daemon)
	return nil
}
