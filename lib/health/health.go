// Package health is the periodic check of the node stack
// (unbounded-health.service, started by unbounded-health.timer;
// ARCHITECTURE section 6). "Healthy" is lib/readiness's "up", with the Node
// read from the daemon's Node record /run/unbounded/node.json
// (readiness.FromDaemon): this binary has no TLS client (ARCHITECTURE
// section 3: under 5 MB). Check.Run says what one run decides.
package health

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"unbounded-cloud.io/agent/lib/fence/record"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/modes/facts"
	"unbounded-cloud.io/agent/lib/readiness"
	"unbounded-cloud.io/agent/lib/state"
	"unbounded-cloud.io/agent/lib/unitnames"
)

// Defaults of Check's knobs (flags of unbounded-health; an operator's
// drop-in on the unit changes them).
const (
	// DefaultFailures (K): consecutive unhealthy runs before a restart.
	// With the timer's 30 s, a node down for 1.5 min is restarted; one
	// missed healthz (a kubelet restarting itself) is not enough.
	DefaultFailures = 3
	// DefaultMaxRestarts: restarts without a healthy run in between
	// before health gives up. A restart that did not help twice will not
	// help a third time; a person must look.
	DefaultMaxRestarts = 2
	// DefaultBootWait bounds the first run of a boot: the node stack
	// starts in about a minute (nspawn machine boot, kubelet).
	DefaultBootWait = 4 * time.Minute
	// DefaultSettle: the first check of a boot needs the node up on
	// every look for readiness.DefaultSettle.
	DefaultSettle = readiness.DefaultSettle
	// FirstFenceRetry and MaxFenceRetry: the delay between node starts
	// after a fence that got no answer doubles from the first to the
	// cap. The cap of 10 min: a cluster back after an outage is noticed
	// within 10 min, and a fleet of hosts does not hammer an API server
	// that is coming back.
	FirstFenceRetry = 30 * time.Second
	MaxFenceRetry   = 10 * time.Minute
)

// Units whose run means "an operation changes the node right now": health
// neither judges nor restarts the node under them.
var busyUnits = []string{
	unitnames.Restart, unitnames.Repave, unitnames.Bootstrap,
	unitnames.Lifecycle, unitnames.Reset, unitnames.Isolation,
}

// Units is the part of the service manager health uses (lib/units.Manager).
type Units interface {
	readiness.Units
	// EnqueueStart queues a start job and returns at once.
	EnqueueStart(ctx context.Context, unit string) error
}

// ErrGaveUp is returned by the run that gives up (exit 1).
var ErrGaveUp = errors.New("gave up restarting the node stack")

// Check is one run of unbounded-health. The zero value of each
// host-touching field is the real host; tests replace them.
type Check struct {
	Paths       hostpaths.Paths
	Failures    int
	MaxRestarts int
	BootWait    time.Duration
	// Settle is how long the first check of a boot needs the node healthy
	// on every check; 0 means DefaultSettle, a negative value none.
	Settle time.Duration
	// PollInterval is the boot wait's poll; 0 means 2 s.
	PollInterval time.Duration

	Units   Units
	Healthz func(context.Context) error
	// DNSReady asks the node-local DNS cache (nil: readiness.LocalDNSReady),
	// on a node that runs it.
	DNSReady func(context.Context) error
	// Node reads the Node; nil is the daemon's Node record under Paths,
	// /run/unbounded/node.json (readiness.FromDaemon).
	Node readiness.NodeSource
	Now  func() time.Time
	Log  *slog.Logger
}

func (c *Check) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}

// readiness is what "healthy" means for the active slot.
func (c *Check) readiness(a *state.AppliedConfig) *readiness.Check {
	node := c.Node
	if node == nil {
		node = readiness.FromDaemon(c.Paths, c.Units)
	}
	return &readiness.Check{Units: c.Units, Mode: a.Mode, Slot: a.Slot, Name: a.Machine, Healthz: c.Healthz, Node: node,
		LocalDNS: a.LocalDNS(), DNSReady: c.DNSReady}
}

// Run is one check. It decides, from the state it keeps between runs:
//
//   - the host is not bootstrapped, an installation owns it, or an
//     operation on the node runs (restart, repave, bootstrap, lifecycle,
//     reset): nothing to check, exit 0.
//   - the last fence check refused explicitly (the fence record,
//     lib/fence/record): the node is down on purpose; the daemon starts it
//     once the Machine no longer refuses. Exit 0.
//   - the last fence check refused for lack of an answer and the node is
//     not up: the node start (which runs the fence again) is retried, with
//     a delay that doubles from FirstFenceRetry up to MaxFenceRetry.
//     Exit 0.
//   - healthy: the counters are reset; if it had given up, it says the
//     node is healthy again. Exit 0.
//   - unhealthy: Failures consecutive unhealthy runs start
//     unbounded-restart.service (at most MaxRestarts times without a
//     healthy run in between); when the node is still unhealthy after
//     those, it gives up: this run fails (exit 1, the message says why),
//     so that recovery (OnFailure=) reports it on the Machine, and the
//     runs after it stay quiet (exit 0, no restart) until something
//     changes: the node healthy again, a new applied config (a repave), or
//     a new boot.
//
// The first run of a boot waits (bounded by BootWait) for the node to
// become healthy, and fails when it does not: the unit is ordered
// Before=boot-complete.target, so systemd's boot assessment sees an
// unhealthy node as a bad boot (greenboot's pattern).
//
// Its error is the give-up (ErrGaveUp) or the boot's failed first check
// (both exit 1), or a host it cannot read.
func (c *Check) Run(ctx context.Context) error {
	err := c.run(ctx)
	if err != nil && ctx.Err() != nil {
		// Stopped in the middle of a check (systemctl stop, a reset, a
		// shutdown): nothing was found wrong with the node, and a failed
		// run would start a recovery that reports a failure there never
		// was, as a check stopped during the first check's wait of a boot
		// would (TestHealthStoppedInTheMiddleOfACheckIsNotAFailure).
		log := c.Log
		if log == nil {
			log = slog.Default()
		}
		log.Info("stopped before the check finished: not counted", "error", err.Error())
		return nil
	}
	return err
}

func (c *Check) run(ctx context.Context) error {
	log := c.Log
	if log == nil {
		log = slog.Default()
	}
	k, maxRestarts, wait, settle, interval := c.limits()
	active, err := state.ReadActive(c.Paths)
	if err != nil {
		return fmt.Errorf("applied state: %w", err)
	}
	if active == nil {
		log.Info("host not bootstrapped: no node to check")
		return nil
	}
	if own, _ := state.ReadOwnership(c.Paths); own != nil {
		log.Info("an installation owns the host; not checking the node", "owner", own.Owner)
		return nil
	}
	// All of them are oneshots: one runs while "activating" (or stops
	// while "deactivating"); "active" is one that has finished and
	// remains (lifecycle's RemainAfterExit=yes, for the whole boot).
	for _, u := range busyUnits {
		if st, err := c.Units.ActiveState(ctx, u); err == nil && unitnames.InTransition(st) {
			log.Info("an operation on the node runs; not checking it", "unit", u, "state", st)
			return nil
		}
	}

	st, err := loadState(c.Paths)
	if err != nil {
		log.Warn("health state unreadable; starting afresh", "file", stateFile(c.Paths), "error", err.Error())
		st = &State{}
	}
	applied := appliedID(active)
	if st.Applied != applied {
		if st.Applied != "" {
			log.Info("new applied config: counters reset", "applied", applied)
		}
		*st = State{Applied: applied, BootChecked: st.BootChecked}
	}
	defer func() {
		if ctx.Err() != nil {
			return // stopped: this check counts for nothing (see Run)
		}
		if err := st.save(c.Paths); err != nil {
			log.Warn("cannot save the health state", "file", stateFile(c.Paths), "error", err.Error())
		}
	}()

	nodeUp, _ := c.Units.ActiveState(ctx, unitnames.NodeTarget)
	if done, err := c.fenceKeepsDown(ctx, log, st, nodeUp); done {
		return err
	}
	st.FenceRetries, st.NextFenceRetry = 0, time.Time{}
	if nodeUp == "inactive" && c.stoppedCleanly(ctx, active) {
		// Stopped (not failed) by someone: an operator's `systemctl
		// stop`, a drain before maintenance. Not health's to undo.
		log.Info("the node stack is stopped, not failed: left alone (start unbounded-node.target to bring it back)")
		st.BootChecked = true
		return nil
	}

	chk := c.readiness(active)
	probs := chk.Look(ctx).Problems
	if !st.BootChecked {
		// The boot's verdict (boot-complete.target waits for it): healthy
		// means healthy for the settle window, not one lucky answer.
		if len(probs) > 0 {
			log.Info("first check of this boot: waiting for the node to become healthy", "atMost", wait, "problems", strings.Join(probs, "; "))
		}
		if err := chk.Wait(ctx, readiness.Wait{Timeout: wait, Settle: min(settle, wait), Poll: interval}); err == nil {
			probs = nil
		} else if ctx.Err() != nil {
			return err // stopped: nothing counted, nothing started (see Run)
		} else if probs = chk.Look(ctx).Problems; len(probs) == 0 {
			// Healthy right now, but not for the whole window.
			probs = []string{err.Error()}
		}
	}
	if len(probs) == 0 && st.BootChecked && (st.GaveUp || st.Failures > 0 || st.Restarts > 0) {
		// Healthy again after failures, which ends the counting (and a
		// give-up): one answer between two crashes of a kubelet that keeps
		// dying is not that, and would lift a give-up only for the
		// restarts to begin again (TestHealthGiveUpIsNotLiftedByOneLuckyCheck).
		// The settle window again.
		if err := chk.Wait(ctx, readiness.Wait{Timeout: settle + 2*interval, Settle: settle, Poll: interval}); err != nil {
			if ctx.Err() != nil {
				return err // stopped: nothing counted (see Run)
			}
			probs = []string{err.Error()}
		}
	}
	if len(probs) == 0 {
		if st.GaveUp {
			log.Info("the node is healthy again; restarts are allowed again", "gaveUpAt", st.GaveUpAt.Format(time.RFC3339))
		} else if st.Failures > 0 || st.Restarts > 0 {
			log.Info("the node is healthy again", "failures", st.Failures, "restarts", st.Restarts)
		} else {
			log.Debug("node healthy")
		}
		*st = State{Applied: applied, BootChecked: true}
		return nil
	}
	return c.judgeUnhealthy(ctx, log, st, active, probs, k, maxRestarts, wait)
}

// limits are the check's bounds, defaults filled in: failures before a
// restart, restarts before the give-up, the boot's wait, the settle
// window and the poll interval.
func (c *Check) limits() (k, maxRestarts int, wait, settle, interval time.Duration) {
	k = max(c.Failures, 1)
	if c.Failures == 0 {
		k = DefaultFailures
	}
	maxRestarts = max(c.MaxRestarts, 0)
	wait = c.BootWait
	if wait <= 0 {
		wait = DefaultBootWait
	}
	settle = c.Settle
	if settle == 0 {
		settle = DefaultSettle
	}
	settle = max(settle, 0)
	interval = c.PollInterval
	if interval <= 0 {
		interval = 2 * time.Second
	}
	return k, maxRestarts, wait, settle, interval
}

// fenceKeepsDown handles a node the allocation fence keeps down (refused,
// no answer, or a fence that failed before it decided): done says the
// check ends there, with err.
func (c *Check) fenceKeepsDown(ctx context.Context, log *slog.Logger, st *State, nodeUp string) (done bool, err error) {
	rec, err := record.Read(c.Paths)
	if err != nil {
		log.Warn("fence record unreadable", "error", err.Error())
	}
	if rec != nil && nodeUp != "active" && nodeUp != "activating" {
		switch rec.Outcome {
		case record.Refused:
			st.BootChecked = true
			log.Info("the node is kept down by the allocation fence; the daemon starts it once the Machine no longer refuses",
				"reason", rec.Reason, "message", rec.Message, "since", rec.At.Format(time.RFC3339))
			return true, nil
		case record.NoAnswer:
			st.BootChecked = true
			return true, c.retryFence(ctx, log, st, rec)
		}
	}
	if rec == nil && err == nil && nodeUp != "active" && nodeUp != "activating" {
		// The fence failed without deciding: it never ran (its sandbox
		// could not be set up, its executable could not be started) or
		// it crashed, so it wrote no record. Nobody said no: the node's
		// start failed by a dependency, which is not an operator's stop.
		// Retried like a fence without an answer.
		if fs, ferr := c.Units.ActiveState(ctx, unitnames.Fence); ferr == nil && fs == "failed" {
			st.BootChecked = true
			return true, c.retryFence(ctx, log, st, &record.Record{Reason: "FenceFailed",
				Message: unitnames.Fence + " failed before it decided (no " + record.File(c.Paths) + "); see its journal"})
		}
	}
	return false, nil
}

// judgeUnhealthy counts a check that found the node unhealthy (probs):
// the boot's verdict, a failure, a restart once Failures (k) were
// counted, or the give-up after maxRestarts.
func (c *Check) judgeUnhealthy(ctx context.Context, log *slog.Logger, st *State, active *state.AppliedConfig, probs []string, k, maxRestarts int, wait time.Duration) error {
	what := strings.Join(probs, "; ")
	if !st.BootChecked {
		// The boot's assessment: a node that does not come up is a bad
		// boot. The next runs restart it as usual.
		st.BootChecked = true
		st.Failures = k
		return fmt.Errorf("the node stack (%s, slot %s) did not become healthy within %s, the first check of this boot: %s", active.Mode, active.Slot, wait, what)
	}
	if st.GaveUp {
		log.Info("node still unhealthy; gave up earlier, not restarting until the node is healthy again, a new config is applied, or the host reboots",
			"gaveUpAt", st.GaveUpAt.Format(time.RFC3339), "problems", what)
		return nil
	}
	st.Failures++
	if st.Failures < k {
		log.Warn("node unhealthy", "failures", st.Failures, "of", k, "problems", what)
		return nil
	}
	if st.Restarts >= maxRestarts {
		st.GaveUp, st.GaveUpAt = true, c.now().UTC()
		return fmt.Errorf("%w: the node stack (%s, slot %s) is still unhealthy after %d restart(s) by %s (%s); "+
			"no more restarts until the node is healthy again, a new config is applied, or the host reboots",
			ErrGaveUp, active.Mode, active.Slot, st.Restarts, unitnames.Restart, what)
	}
	st.Restarts++
	st.Failures = 0
	log.Warn("node unhealthy; starting a restart of the node stack", "unit", unitnames.Restart,
		"restart", st.Restarts, "of", maxRestarts, "problems", what)
	if err := c.Units.EnqueueStart(ctx, unitnames.Restart); err != nil {
		return fmt.Errorf("start %s: %w", unitnames.Restart, err)
	}
	return nil
}

// stoppedCleanly says whether every supervising unit of the active slot is
// inactive (stopped, or never started) rather than failed or restarting.
func (c *Check) stoppedCleanly(ctx context.Context, a *state.AppliedConfig) bool {
	for _, u := range facts.Supervising(a.Mode, a.Slot) {
		if st, err := c.Units.ActiveState(ctx, u); err != nil || st != "inactive" {
			return false
		}
	}
	return true
}

// retryFence starts the node again (and with it the fence) once the
// current delay has passed.
func (c *Check) retryFence(ctx context.Context, log *slog.Logger, st *State, rec *record.Record) error {
	now := c.now()
	if !st.NextFenceRetry.IsZero() && now.Before(st.NextFenceRetry) {
		log.Info("the allocation fence did not decide; waiting before the next try",
			"reason", rec.Reason, "nextTry", st.NextFenceRetry.UTC().Format(time.RFC3339), "tries", st.FenceRetries)
		return nil
	}
	delay := FirstFenceRetry << min(st.FenceRetries, 10)
	delay = min(delay, MaxFenceRetry)
	st.FenceRetries++
	st.NextFenceRetry = now.Add(delay)
	log.Warn("the allocation fence did not decide; starting the node again, which runs the fence again",
		"reason", rec.Reason, "message", rec.Message, "try", st.FenceRetries, "nextTryIn", delay)
	if err := c.Units.EnqueueStart(ctx, unitnames.NodeTarget); err != nil {
		return fmt.Errorf("start %s: %w", unitnames.NodeTarget, err)
	}
	return nil
}

// appliedID names the applied config: a repave writes a new one.
func appliedID(a *state.AppliedConfig) string {
	return a.Mode + "/" + a.Slot + "@" + a.AppliedAt.UTC().Format(time.RFC3339Nano)
}
