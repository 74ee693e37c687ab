// Package readiness defines, once, when a node stack is up: every
// supervising unit of its slot active, the kubelet's healthz ok, and its
// Node Ready as written by the kubelet that runs now. Bootstrap and repave
// read the Node from the API server, health and restart from the daemon's
// record; both come in as a NodeSource. Wait adds the bounded poll, the
// settle window and the one node-stack restart for the kubelet's CSINode.
//
// A leaf: no net/http, TLS or Kubernetes client, so that unbounded-health
// and unbounded-restart stay small (ARCHITECTURE section 3).
package readiness

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"unbounded-cloud.io/agent/lib/modes/facts"
)

// Units is what readiness reads of the service manager (lib/units.Manager).
type Units interface {
	// ActiveState is the unit's ActiveState.
	ActiveState(ctx context.Context, unit string) (string, error)
	// MainStartedAt is when the unit's main process last started
	// (ExecMainStartTimestamp); zero when it never did.
	MainStartedAt(ctx context.Context, unit string) (time.Time, error)
}

// Node is what a NodeSource says about the Node.
type Node struct {
	// Known: the source can say. A source that may not know (the
	// daemon's record while its watch is not live) says so, and then the
	// Node counts for nothing either way.
	Known bool
	// Present: the Node exists.
	Present bool
	// Ready: its Ready condition is True.
	Ready bool
	// Status, Reason and Message are the Ready condition's ("" when the
	// Node has none yet).
	Status, Reason, Message string
	// Heartbeat is the Ready condition's lastHeartbeatTime: when the
	// kubelet last wrote it. Transition is its lastTransitionTime.
	Heartbeat, Transition time.Time
}

// NodeSource reads the Node. An error is a Node that could not be read
// (it counts as not Ready).
type NodeSource func(ctx context.Context) (Node, error)

// Check is what "the node stack of Mode in Slot is up" means.
type Check struct {
	Units      Units
	Mode, Slot string
	// Name is the Node's name, for the messages.
	Name string
	// Healthz asks the kubelet's healthz; nil is Healthz on
	// KubeletHealthzAddr.
	Healthz func(ctx context.Context) error
	// Node reads the Node. Nil fails closed: the node is never up.
	Node NodeSource
	// LocalDNS: the node stack runs the node-local DNS cache, whose
	// readiness counts (LocalDNSReady); DNSReady asks it, nil is
	// LocalDNSReady on LocalDNSReadyAddr.
	LocalDNS bool
	DNSReady func(ctx context.Context) error
}

// Result is one look at the node stack.
type Result struct {
	// Problems is what is not up, each a short sentence; none: up.
	Problems []string
	// Node is what the source said, NodeErr the source's error.
	Node    Node
	NodeErr error
}

// Up says whether nothing was found wrong.
func (r Result) Up() bool { return len(r.Problems) == 0 }

// OnlyNodeUnread says whether the one thing wrong is that the Node could
// not be read: everything on the host is up.
func (r Result) OnlyNodeUnread() bool { return r.NodeErr != nil && len(r.Problems) == 1 }

// csiNodePending says whether the Node waits for its CSINode: the kubelet
// reports "CSINode is not yet initialized" (or "failed to initialize
// CSINode") in its Ready condition until its CSINode exists.
func (r Result) csiNodePending() bool {
	n := r.Node
	return r.NodeErr == nil && n.Known && n.Present && !n.Ready &&
		(strings.Contains(n.Message, "CSINode") || strings.Contains(n.Reason, "CSINode"))
}

// Look looks once.
func (c *Check) Look(ctx context.Context) Result {
	var r Result
	for _, u := range facts.Supervising(c.Mode, c.Slot) {
		st, err := c.Units.ActiveState(ctx, u)
		if err != nil {
			st = err.Error()
		}
		if st != "active" {
			r.Problems = append(r.Problems, fmt.Sprintf("%s is %s", u, st))
		}
	}
	healthz := c.Healthz
	if healthz == nil {
		healthz = func(ctx context.Context) error { return Healthz(ctx, KubeletHealthzAddr) }
	}
	if err := healthz(ctx); err != nil {
		r.Problems = append(r.Problems, fmt.Sprintf("kubelet healthz (%s): %v", KubeletHealthzAddr, err))
	}
	if c.LocalDNS {
		ready := c.DNSReady
		if ready == nil {
			ready = func(ctx context.Context) error { return LocalDNSReady(ctx, LocalDNSReadyAddr) }
		}
		if err := ready(ctx); err != nil {
			r.Problems = append(r.Problems, fmt.Sprintf("node-local DNS cache (%s/ready): %v", LocalDNSReadyAddr, err))
		}
	}
	if p := c.node(ctx, &r); p != "" {
		r.Problems = append(r.Problems, p)
	}
	return r
}

// node reads the Node into r and returns what is wrong with it, if
// anything.
func (c *Check) node(ctx context.Context, r *Result) string {
	if c.Node == nil {
		return fmt.Sprintf("Node %s: no source to read it from", c.Name)
	}
	n, err := c.Node(ctx)
	r.Node, r.NodeErr = n, err
	switch {
	case err != nil:
		return fmt.Sprintf("Node %s not read (%v)", c.Name, err)
	case !n.Known:
		return ""
	case !n.Present:
		return fmt.Sprintf("Node %s is not registered", c.Name)
	case !n.Ready:
		status := n.Status
		if status == "" {
			status = "not reported"
		}
		msg := fmt.Sprintf("Node %s is not Ready (Ready %s, reason %s", c.Name, status, orNone(n.Reason))
		if n.Message != "" {
			msg += ": " + truncate(n.Message, 200)
		}
		msg += ")"
		if !n.Transition.IsZero() {
			msg += " since " + n.Transition.UTC().Format(time.RFC3339)
		}
		return msg
	}
	return c.fresh(ctx, n)
}

// fresh says what is wrong when the Node's Ready is not the running
// kubelet's: the cluster keeps the Ready of a kubelet that has stopped
// until the node monitor's grace passes. The kubelet writes its Node at
// its start (and an unchanged one again only every
// nodeStatusReportFrequency, 5 min), so a Ready written after the start of
// the unit that runs it is the running kubelet's. Heartbeats are whole
// seconds: one in the second of the start counts (the kubelet before
// stopped before that start; a Ready refused here would wait for the
// next write, which may be 5 min away).
func (c *Check) fresh(ctx context.Context, n Node) string {
	unit := facts.KubeletHost(c.Mode, c.Slot)
	started, err := c.Units.MainStartedAt(ctx, unit)
	switch {
	case err != nil:
		return fmt.Sprintf("Node %s is Ready, but when %s started is not known (%v)", c.Name, unit, err)
	case started.IsZero():
		return fmt.Sprintf("Node %s is Ready, but %s has no start time", c.Name, unit)
	case n.Heartbeat.IsZero():
		return fmt.Sprintf("Node %s is Ready, but without a heartbeat time", c.Name)
	case n.Heartbeat.Before(started.Truncate(time.Second)):
		return fmt.Sprintf("Node %s is Ready from before its kubelet's start (heartbeat %s, %s started %s)", c.Name,
			n.Heartbeat.UTC().Format(time.RFC3339), unit, started.UTC().Format(time.RFC3339))
	}
	return ""
}

// Defaults of Wait.
const (
	// DefaultNewNodeTimeout bounds the wait for a node stack that was
	// just built (bootstrap, repave). A kubelet's TLS bootstrap, its first
	// sync and the CNI's readiness take seconds to tens of seconds on a
	// healthy host; ten minutes also covers a pull of the pause image over
	// a slow link, and ends a wait that will not succeed.
	DefaultNewNodeTimeout = 10 * time.Minute
	DefaultPoll           = 2 * time.Second
	// QuickPoll is the poll of a wait for a node that is just starting
	// (Wait.FirstPoll), for its first QuickFor: a kubelet given its
	// address is Ready within a second or two of its start.
	QuickPoll = 250 * time.Millisecond
	QuickFor  = 5 * time.Second
	// DefaultSettle is the settle window of the waits that follow a
	// restart (health's first check of a boot, unbounded-restart): a
	// kubelet that dies again within seconds of its start (a bad flag, a
	// payload killed over and over) answers healthz between two crashes,
	// and the cluster keeps its Node Ready for the node monitor's grace
	// period (40 s). Five seconds of looks with the supervising units
	// active throughout see such a kubelet restart (Restart=always,
	// RestartSec=2s) at least once.
	DefaultSettle = 5 * time.Second
	// DefaultCSINodeGrace: see CSINode.
	DefaultCSINodeGrace = 15 * time.Second
)

// Wait bounds a wait for Check.
type Wait struct {
	// Timeout bounds the wait; it must be positive.
	Timeout time.Duration
	// Settle is how long the node must be up on every look before the
	// wait ends: a kubelet that dies again within seconds of its start
	// answers healthz between two crashes, and the cluster keeps its Node
	// Ready for the node monitor's grace. 0: the first look that finds it
	// up ends the wait.
	Settle time.Duration
	// Poll is the time between looks; 0 is DefaultPoll.
	Poll time.Duration
	// FirstPoll, when set (below Poll), is the time between looks for the
	// wait's first QuickFor, Poll after that. A node that is just
	// starting is seen up within a fraction of a second, and a wait that
	// goes on (a slow image pull) costs the API server no more than
	// Poll's looks.
	FirstPoll time.Duration
	// CSINode, when set, restarts the node stack once when its Node waits
	// for its CSINode. Nil: never.
	CSINode *CSINode
	// Status, when set, is told what the wait does: what is still
	// missing after each look that did not find the node up, and the
	// CSINode restart (for STATUS=).
	Status func(line string)
	// Log is where the CSINode restart is logged; nil is slog.Default.
	Log *slog.Logger
}

// CSINode works around one upstream race. The kubelet initializes its
// CSINode object (which needs its Node) at about 0.4, 0.8, 1.4, 4 and 20 s
// after it starts, then once more two minutes later, then exits
// (k8s.io/kubernetes pkg/volume/csi/csi_plugin.go); until then the Node is
// NotReady. A kubelet that registers its Node after its early tries leaves
// the node NotReady for about two and a half minutes. When the Node is
// registered and still waits for its CSINode after Grace (or once
// AfterStart has passed since the wait began: the caller started the
// kubelet just before it and knows its early tries are over), Restart
// restarts the node stack (the mode's soft restart, never the host): the
// new kubelet finds its Node and initializes at once.
type CSINode struct {
	// Grace: how long a registered Node may wait for its CSINode; 0 is
	// DefaultCSINodeGrace.
	Grace time.Duration
	// AfterStart, when positive: from this long after the wait began,
	// the restart comes at once.
	AfterStart time.Duration
	Restart    func(ctx context.Context) error
}

// ErrCSINodeRestart wraps a failed restart of the node stack for its
// CSINode.
var ErrCSINodeRestart = errors.New("restart of the node stack (the kubelet's CSINode was not initialized)")

// NotUpError is a wait that ended without the node up.
type NotUpError struct {
	// Timeout is the wait's bound; zero when the context ended it.
	Timeout time.Duration
	// Last is the last look.
	Last Result
	// UpFor is how long the node had been up when the wait ended, when
	// it was up but not for the settle window; Before is what was wrong
	// before that.
	UpFor, Settle time.Duration
	Before        []string
	// Err is the context's error when it ended the wait.
	Err error
}

func (e *NotUpError) Error() string {
	var what string
	switch {
	case e.Last.Up():
		what = fmt.Sprintf("up for %s only, not the %s it must hold", e.UpFor.Round(time.Millisecond), e.Settle)
		if len(e.Before) > 0 {
			what += "; before that: " + strings.Join(e.Before, "; ")
		}
	default:
		what = "still missing: " + strings.Join(e.Last.Problems, "; ")
	}
	if e.Err != nil {
		return "stopped while waiting for the node (" + what + "): " + e.Err.Error()
	}
	return fmt.Sprintf("not healthy within %s; %s", e.Timeout, what)
}

func (e *NotUpError) Unwrap() error { return e.Err }

// Wait looks every w.Poll until the node has been up on every look for
// w.Settle (nil), the timeout passes or ctx ends (a *NotUpError), or the
// CSINode restart fails (wrapping ErrCSINodeRestart).
func (c *Check) Wait(ctx context.Context, w Wait) error {
	poll := w.Poll
	if poll <= 0 {
		poll = DefaultPoll
	}
	began := time.Now()
	deadline := time.NewTimer(w.Timeout)
	defer deadline.Stop()
	var upSince, csiSince time.Time
	var before []string
	restarted := false
	for {
		r := c.Look(ctx)
		now := time.Now()
		if r.Up() {
			if upSince.IsZero() {
				upSince = now
			}
			if now.Sub(upSince) >= w.Settle {
				return nil
			}
		} else {
			upSince, before = time.Time{}, r.Problems
		}
		if g := w.CSINode; g != nil && !restarted && g.Restart != nil {
			grace := g.Grace
			if grace <= 0 {
				grace = DefaultCSINodeGrace
			}
			switch {
			case !r.csiNodePending():
				csiSince = time.Time{}
			case csiSince.IsZero():
				csiSince = now
			case now.Sub(csiSince) >= grace || (g.AfterStart > 0 && now.Sub(began) >= g.AfterStart):
				restarted = true
				log := w.Log
				if log == nil {
					log = slog.Default()
				}
				log.Warn("the kubelet's CSINode is not initialized and its next try is minutes away; restarting the node stack once",
					"node", c.Name, "slot", c.Slot, "waited", now.Sub(csiSince).Round(time.Second), "detail", r.Node.Message)
				w.status("restarting the node stack once (the kubelet's CSINode was not initialized)")
				if err := g.Restart(ctx); err != nil {
					return fmt.Errorf("%w: %w", ErrCSINodeRestart, err)
				}
				csiSince = time.Time{}
				continue
			}
		}
		if !r.Up() {
			w.status("waiting for " + r.Problems[0])
		}
		notUp := func(err error, timeout time.Duration) error {
			e := &NotUpError{Timeout: timeout, Last: r, Settle: w.Settle, Before: before, Err: err}
			if r.Up() {
				e.UpFor = now.Sub(upSince)
			}
			return e
		}
		select {
		case <-ctx.Done():
			return notUp(ctx.Err(), 0)
		case <-deadline.C:
			return notUp(nil, w.Timeout)
		case <-time.After(w.next(poll, now.Sub(began))):
		}
	}
}

func (w Wait) status(line string) {
	if w.Status != nil {
		w.Status(line)
	}
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-3] + "..."
}

// next is the time to the next look, the wait having run for since.
func (w Wait) next(poll, since time.Duration) time.Duration {
	if w.FirstPoll > 0 && w.FirstPoll < poll && since < QuickFor {
		return w.FirstPoll
	}
	return poll
}
