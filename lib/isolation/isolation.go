// Package isolation changes a bootstrapped host's isolation mode
// (unbounded-isolation.service, ARCHITECTURE section 2): the desired
// config (the daemon's request, carrying the Machine's spec.isolation,
// else the config on disk) in another mode than the running one.
//
// It owns what is the change's own: the method (modes.ChangeMethodAsked:
// the request's, else --method, else the table's), the bootstrap token's
// review before anything is touched (the new mode's kubelet joins with
// it), the reprovision handoff (lib/reprovision: reset and bootstrap,
// from a handoff that survives the reset), and the change's outcome for
// the daemon (lib/outcome's record). In place, the change is carried
// out by the repave's steps (lib/repave, as its Kind): its lock (owner
// "isolation"), journal (journal/isolation.json, whose running-slot says
// which of two records runs), drain, fence, readiness wait and failure
// path, the switch across modes being modes.Change (the new mode's node
// built into the other slot while the old one serves; the old node
// stopped entirely before the new one starts; rolled back to the old
// mode on failure).
package isolation

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"unbounded-cloud.io/agent/lib/config"
	"unbounded-cloud.io/agent/lib/exitcode"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/kube"
	"unbounded-cloud.io/agent/lib/modes"
	"unbounded-cloud.io/agent/lib/outcome"
	"unbounded-cloud.io/agent/lib/repave"
	"unbounded-cloud.io/agent/lib/reprovision"
	"unbounded-cloud.io/agent/lib/request"
	"unbounded-cloud.io/agent/lib/state"
	"unbounded-cloud.io/agent/lib/steps"
	"unbounded-cloud.io/agent/lib/unitnames"
)

// Operation is the lock's owner and the journal's name
// (journal/isolation.json, state.ReadInPlaceJournal), Unit the unit that
// runs a change, Concern its request file's name.
const (
	Operation = "isolation"
	Unit      = unitnames.Isolation
	Concern   = "isolation"
)

// ParamMethod is the request parameter (MachineOperation
// spec.parameters; the daemon passes the Machine's spec.isolation.method)
// that forces the method (modes.MethodInPlace or
// modes.MethodReprovision); absent or empty: --method, else the table's
// (modes.ChangeMethodAsked).
const ParamMethod = "method"

// CrashPoints are the crash points of an isolation change in the order
// a run reaches them: the repave's steps', with modes.Change's inside the
// switch and the Node's deletion (the Fence hook's) after the old node's
// stop. The order is the one a chain of runs each cut at the next point
// follows: a point a run passed and journaled is not passed again.
var CrashPoints = func() []string {
	out := []string{Operation + "/after-lock"}
	for _, s := range repave.Steps {
		if s == repave.StepSwitch {
			out = append(out, modes.ChangeCrashPoints[0], Operation+"/after-node-deleted")
			out = append(out, modes.ChangeCrashPoints[1:]...)
		}
		out = append(out, steps.CrashPoint(Operation, s))
	}
	return append(out, Operation+"/after-release")
}()

// StepDocs are the change's steps in the order they run, each with what
// it does: the repave's (repave.StepDocs), planned and switched as a
// change of mode.
var StepDocs = func() []steps.Doc {
	docs := slices.Clone(repave.StepDocs)
	for i := range docs {
		switch docs[i].Name {
		case repave.StepPlan:
			docs[i].Does = "the desired mode against the running one, the method, and the bootstrap token checked with the API server before anything is touched (a reprovision is handed off here)"
		case repave.StepBuild:
			docs[i].Does = "the new mode's node built into the other slot while the old node serves"
		case repave.StepSwitch:
			docs[i].Does = "the old mode's node stopped entirely, the Node deleted, the allocation fence, the new node started and waited for until Ready; rolled back to the old mode when it does not come up"
		case repave.StepRetire:
			docs[i].Does = "the old slot's record, then every file of the old mode, removed"
		}
	}
	return docs
}()

// ErrTokenRejected: the change found the bootstrap token refused by the
// API server before it touched the host. The new mode's kubelet joins by
// TLS bootstrap with that token: the change would end in a node that
// cannot register.
var ErrTokenRejected = errors.New("the API server does not accept the bootstrap token")

// ErrHandedOff: the change staged a reprovision handoff and started
// unbounded-reprovision.service, which resets the host and bootstraps
// the target mode; the change is still in progress (exit 0).
var ErrHandedOff = errors.New("handed off to the reprovision")

// Change runs one isolation change on one host: the repave's steps
// (Repave, whose seams it shares) as this Kind. The zero value of every
// field but Paths is the real host.
type Change struct {
	repave.Repave
	// Method forces the method (modes.MethodInPlace,
	// modes.MethodReprovision; the request's "method" parameter wins);
	// "": the table's (modes.ChangeMethod).
	Method string
	// GiveUpAfter is how long after the handoff began a reprovision
	// gives up; 0: reprovision.DefaultGiveUpAfter.
	GiveUpAfter time.Duration
	// Self is the executable a reprovision handoff copies; "": this
	// process's (os.Executable).
	Self string
	// ReviewToken asks the API server whether cfg's bootstrap token
	// authenticates; nil: a TokenReview with the token itself.
	ReviewToken func(ctx context.Context, cfg *config.Config) error

	// outcome is the change this run carries out, once planned or
	// resumed: its end is recorded for the daemon.
	outcome *outcome.Record
}

// Run changes the host's isolation mode, or resumes an interrupted
// change. Its error maps to the exit code with exitcode.For;
// repave.ErrNothingToDo (the desired mode runs) and ErrHandedOff are
// successes.
func (c *Change) Run(ctx context.Context) error {
	c.Kind = c
	err := c.Repave.Run(ctx)
	c.recordOutcome(ctx, err)
	return err
}

// Names implements repave.Kind.
func (c *Change) Names() repave.Names {
	return repave.Names{Operation: Operation, Unit: Unit, Concern: Concern}
}

// Start implements repave.Kind: a handoff staged by an earlier run (cut
// before it started the reprovision) is the change now.
func (c *Change) Start(ctx context.Context) (bool, error) {
	live, err := state.HandoffLive(c.Paths)
	if err != nil {
		return true, fmt.Errorf("the reprovision handoff: %w", err)
	}
	if !live {
		return false, nil
	}
	c.Status("a reprovision handoff is in progress (%s): starting %s", reprovision.Dir(c.Paths), unitnames.Reprovision)
	return true, c.startHandoff(ctx, "the target mode")
}

// Decide implements repave.Kind: the desired config in the running mode
// is no change to make.
func (c *Change) Decide(active *state.AppliedConfig, cfg *config.Config) (bool, error) {
	if cfg.Mode == active.Mode {
		c.Status("the desired mode %s is the running one: no isolation change to make", cfg.Mode)
		return true, nil
	}
	return false, nil
}

// Plan implements repave.Kind: the method, the other slot, and the
// bootstrap token checked with the API server, all before anything on
// the host is touched.
func (c *Change) Plan(ctx context.Context, j *repave.Journal, active *state.AppliedConfig, cfg *config.Config, req *request.Request) error {
	c.outcome = &outcome.Record{Concern: outcome.Isolation, From: active.Mode, To: cfg.Mode, StartedAt: j.StartedAt}
	if req != nil {
		c.outcome.Operation, c.outcome.UID, c.outcome.Generation = req.Operation, req.UID, outcome.GenerationOf(req.Parameters)
	}
	// The method asked for: the request's (the Machine's
	// spec.isolation.method), else --method, else the table's.
	asked, by := c.Method, "--method"
	if req != nil && req.Parameters[ParamMethod] != "" {
		asked, by = req.Parameters[ParamMethod], "the daemon's request"
	}
	method, err := modes.ChangeMethodAsked(active.Mode, cfg.Mode, asked)
	if err != nil {
		if asked != "" {
			err = fmt.Errorf("%w (asked by %s)", err, by)
		}
		return fmt.Errorf("%w (%s); the node was left as it is", err, strings.Join(cfg.Files, ", "))
	}
	c.outcome.Method = method
	// Before anything is touched, and before a reprovision's handoff
	// too (Planned comes after the plan): the new mode's kubelet joins
	// with the token.
	c.Status("step %s: asking the API server whether it accepts the bootstrap token (the new mode's kubelet joins with it)", repave.StepPlan)
	if err := c.reviewToken(ctx, cfg); err != nil {
		return err
	}
	j.FromMode, j.Method = active.Mode, method
	j.To, j.RunningSlot = hostpaths.OtherSlot(active.Slot), active.Slot
	j.Mode = cfg.Mode
	c.Logger().Info("isolation change planned", "from_mode", active.Mode, "to_mode", cfg.Mode, "method", method, "from", j.From, "to", j.To)
	return nil
}

// Planned implements repave.Kind: a resumed change's outcome is the
// journal's; a change by reprovision is handed off.
func (c *Change) Planned(ctx context.Context, lock *state.Lock, j *repave.Journal, cfg *config.Config) (bool, error) {
	if c.outcome == nil {
		c.outcome = &outcome.Record{Concern: outcome.Isolation, From: j.RunningMode(), To: j.Mode, Method: j.Method, StartedAt: j.StartedAt}
	}
	if j.Method != modes.MethodReprovision {
		return false, nil
	}
	return true, c.handOff(ctx, lock, j, cfg)
}

// Done implements repave.Kind.
func (c *Change) Done(j *repave.Journal) string {
	return fmt.Sprintf("isolation changed from %s to %s: slot %s runs the node in mode %s, slot %s (mode %s) retired",
		j.RunningMode(), j.Mode, j.To, j.Mode, j.From, j.RunningMode())
}

// recordOutcome leaves the change's end on the host for the daemon
// (lib/outcome), which reports it on the Machine: a change
// carried out, or one that failed (rolled back, refused before it
// touched the host, or stopped with its journal left for the next run).
// Nothing to do, a handoff (the reprovision reports itself), another
// installation's lock and a stop by SIGTERM (the journal resumes) are no
// outcome.
func (c *Change) recordOutcome(ctx context.Context, err error) {
	if c.outcome == nil || errors.Is(err, repave.ErrNothingToDo) || errors.Is(err, ErrHandedOff) || errors.Is(err, state.ErrOwned) || ctx.Err() != nil {
		return
	}
	o := *c.outcome
	o.Time = c.Time().UTC()
	if err == nil {
		o.State = outcome.Succeeded
		o.Message = fmt.Sprintf("the node runs in mode %s (isolation changed %s from %s)", o.To, o.Method, o.From)
	} else {
		o.State, o.Reason = outcome.Failed, "IsolationChangeFailed"
		o.Step, _ = steps.Failed(err)
		o.Message = err.Error()
	}
	if werr := outcome.Write(c.Paths, o); werr != nil {
		c.Logger().Error("the isolation change's outcome was not recorded for the daemon", "error", werr.Error())
	}
}

// handOff stages the reprovision handoff of j (lib/reprovision), releases
// the lock and starts unbounded-reprovision.service. Nothing of the node
// was touched before: the reprovision's reset is its first change.
func (c *Change) handOff(ctx context.Context, lock *state.Lock, j *repave.Journal, cfg *config.Config) error {
	self := c.Self
	if self == "" {
		var err error
		if self, err = os.Executable(); err != nil {
			lock.Release()
			return err
		}
	}
	giveUp := c.GiveUpAfter
	if giveUp <= 0 {
		giveUp = reprovision.DefaultGiveUpAfter
	}
	now := c.Time().UTC()
	h := reprovision.Journal{FromMode: j.FromMode, ToMode: j.Mode, Machine: cfg.Machine, Request: j.Request, StartedAt: now, Deadline: now.Add(giveUp)}
	// The lock goes first: the handoff's reset and bootstrap take it
	// themselves, and a handoff staged under a lock a crash left would
	// find the host owned. A crash before the staging leaves the host as
	// it was.
	if err := request.MarkTaken(c.Paths, Concern, j.Request); err != nil {
		lock.Release()
		return err
	}
	if err := lock.Release(); err != nil {
		return err
	}
	c.Status("staging the reprovision handoff %s -> %s in %s (gives up at %s)", j.FromMode, j.Mode, reprovision.Dir(c.Paths), h.Deadline.Format(time.RFC3339))
	if err := reprovision.Stage(c.Paths, h, j.Config, self); err != nil {
		return err
	}
	c.Crash(Operation + "/after-handoff-staged")
	return c.startHandoff(ctx, j.Mode)
}

// startHandoff starts unbounded-reprovision.service on the staged
// handoff (after a daemon-reload: the generator then names it too).
func (c *Change) startHandoff(ctx context.Context, to string) error {
	sd, err := c.Manager(ctx)
	if err != nil {
		return err
	}
	defer sd.Close()
	if err := sd.Reload(ctx); err != nil {
		return err
	}
	if err := sd.EnqueueStart(ctx, unitnames.Reprovision); err != nil {
		return err
	}
	c.Status("handed off: %s resets the host and bootstraps mode %s", unitnames.Reprovision, to)
	return ErrHandedOff
}

// reviewToken says whether the API server accepts cfg's bootstrap token:
// ErrTokenRejected when it does not (nothing on the host was touched), a
// temporary error when it cannot be asked.
func (c *Change) reviewToken(ctx context.Context, cfg *config.Config) error {
	if c.ReviewToken != nil {
		return c.ReviewToken(ctx, cfg)
	}
	bc, err := kube.CredentialsFor(cfg, c.Paths.PKIDir()).BootstrapConfig()
	if err != nil {
		return fmt.Errorf("%w: %v", ErrTokenRejected, err)
	}
	st, err := kube.ReviewOwnToken(ctx, bc)
	switch {
	case err == nil && st.Authenticated:
		return nil
	case err == nil, apierrors.IsUnauthorized(err):
		return fmt.Errorf("%w (%s: revoked or expired); the node was left as it is in its mode: a node of the new mode could not join", ErrTokenRejected, cfg.Cluster.BootstrapTokenFile)
	case kube.NoAnswer(err):
		return fmt.Errorf("%w: the bootstrap token could not be checked: %w (the node was left as it is)", exitcode.ErrTemporary, err)
	}
	return fmt.Errorf("the bootstrap token could not be checked: %w (the node was left as it is)", err)
}
