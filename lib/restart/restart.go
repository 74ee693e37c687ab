// Package restart is unbounded-restart: the soft reboot of the node stack
// in the active mode and slot, never of the host (ARCHITECTURE section 6;
// lib/modes/softreboot says what each mode restarts). Restart.Run holds the
// order and why it takes no ownership lock.
package restart

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"unbounded-cloud.io/agent/lib/exitcode"
	"unbounded-cloud.io/agent/lib/fence/record"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/modes/facts"
	"unbounded-cloud.io/agent/lib/modes/softreboot"
	"unbounded-cloud.io/agent/lib/readiness"
	"unbounded-cloud.io/agent/lib/state"
	"unbounded-cloud.io/agent/lib/unitnames"
)

// DefaultTimeout bounds the wait for the node to be healthy after the
// restart: an nspawn machine boots and its kubelet answers in about a
// minute; five leave room for a slow host without hiding a node that
// does not come back.
const DefaultTimeout = 5 * time.Minute

// DefaultSettle is how long the node must stay up, on every look, before
// the restart counts as done.
const DefaultSettle = readiness.DefaultSettle

// Units is the service manager as a restart uses it (lib/units.Manager).
type Units interface {
	softreboot.Units
	readiness.Units
	StartUnit(ctx context.Context, unit string) error
	ResetFailed(ctx context.Context, unit string) error
}

// ErrNotBootstrapped: the host has no applied config, so no node stack.
var ErrNotBootstrapped = errors.New("the host is not bootstrapped: no node stack to restart")

// Restart is one run. The zero value of each host-touching field is the
// real host, except Units, which the caller dials.
type Restart struct {
	Paths   hostpaths.Paths
	Timeout time.Duration
	// Settle is how long the node must stay healthy; 0 means
	// DefaultSettle, a negative value none.
	Settle time.Duration
	// PollInterval is the health wait's; 0 means 1 s.
	PollInterval time.Duration
	Units        Units
	Healthz      func(context.Context) error
	// DNSReady asks the node-local DNS cache (nil: readiness.LocalDNSReady),
	// on a node that runs it.
	DNSReady func(context.Context) error
	// Node reads the Node; nil is the daemon's Node record
	// /run/unbounded/node.json (readiness.FromDaemon).
	Node readiness.NodeSource
	Log  *slog.Logger
}

// Run restarts the node stack and waits until it is healthy. The restart
// goes through the mode's own Restart body (softreboot.Restart), which
// re-runs the allocation fence: a refused fence leaves the node down and
// Run fails with exit 77, the fence record (/run/unbounded/fence.json)
// saying why. Then it starts unbounded-node.target (a no-op for the units
// already running) so that the target is active again even if it had
// failed, and waits, bounded by Timeout, until the node is up on every look
// for Settle (lib/readiness, the Node read from the daemon's Node record
// /run/unbounded/node.json).
//
// It takes no ownership lock: the lock marks installations that resume
// across reboots (bootstrap, reset, reprovision), and a restart interrupted
// by a power cut has nothing to resume (the boot starts the node anyway).
// It does not run while an installation owns the host (state.ErrOwned,
// exit 69).
func (r *Restart) Run(ctx context.Context) error {
	log := r.Log
	if log == nil {
		log = slog.Default()
	}
	own, err := state.ReadOwnership(r.Paths)
	if own != nil {
		log.Info("an installation owns the host; not restarting its node", "owner", own.Owner, "unit", own.Unit)
		return fmt.Errorf("%w (owner %s)", state.ErrOwned, own.Owner)
	}
	if err != nil {
		return err
	}
	// The older agent's node, not adopted yet (unbounded-lifecycle.service
	// adopts it): not this agent's to restart. Deferred (69), as for an
	// installation.
	if err := state.CheckAdopted(r.Paths); err != nil {
		log.Info("the older agent's node is not adopted yet; not restarting it", "error", err.Error())
		return err
	}
	active, err := state.ReadActive(r.Paths)
	if err != nil {
		return fmt.Errorf("applied state: %w", err)
	}
	if active == nil {
		return ErrNotBootstrapped
	}
	timeout := r.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	settle := r.Settle
	if settle == 0 {
		settle = DefaultSettle
	} else if settle < 0 {
		settle = 0
	}
	interval := r.PollInterval
	if interval <= 0 {
		interval = time.Second
	}
	node := r.Node
	if node == nil {
		node = readiness.FromDaemon(r.Paths, r.Units)
	}
	chk := &readiness.Check{Units: r.Units, Mode: active.Mode, Slot: active.Slot, Name: active.Machine, Healthz: r.Healthz, Node: node,
		LocalDNS: active.LocalDNS(), DNSReady: r.DNSReady}
	log = log.With("mode", active.Mode, "slot", active.Slot)
	begin := time.Now()
	log.Info("restarting the node stack (the host is not restarted)", "units", strings.Join(facts.Supervising(active.Mode, active.Slot), " "))
	// A unit that hit its start limit (a payload that kept dying) would
	// refuse the restart job; the restart is the deliberate new start.
	for _, u := range facts.Supervising(active.Mode, active.Slot) {
		if err := r.Units.ResetFailed(ctx, u); err != nil {
			log.Warn("reset-failed", "unit", u, "error", err.Error())
		}
	}
	if err := softreboot.Restart(ctx, r.Units, active.Mode, active.Slot); err != nil {
		if rec, _ := record.Read(r.Paths); rec != nil && !rec.At.Before(begin) && (rec.Outcome == record.Refused || rec.Outcome == record.NoAnswer) {
			return fmt.Errorf("%w: the allocation fence refused the restarted node (%s: %s); it stays down: %w",
				exitcode.ErrRefused, rec.Reason, rec.Message, err)
		}
		return err
	}
	restarted := time.Since(begin)
	if err := r.Units.StartUnit(ctx, unitnames.NodeTarget); err != nil {
		return fmt.Errorf("the node stack restarted, but %s did not start: %w", unitnames.NodeTarget, err)
	}
	log.Info("node stack restarted; waiting for it to be healthy", "took", restarted.Round(time.Millisecond), "atMost", timeout)
	if err := chk.Wait(ctx, readiness.Wait{Timeout: timeout, Settle: settle, Poll: interval}); err != nil {
		return fmt.Errorf("the node stack restarted in %s but is %w", restarted.Round(time.Millisecond), err)
	}
	log.Info("node stack healthy again", "restart", restarted.Round(time.Millisecond), "total", time.Since(begin).Round(time.Millisecond))
	return nil
}
