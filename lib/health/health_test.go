package health

import (
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"unbounded-cloud.io/agent/lib/fence/record"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/state"
	"unbounded-cloud.io/agent/lib/unitnames"
	"unbounded-cloud.io/agent/lib/units/unitstest"
)

type host struct {
	p       hostpaths.Paths
	units   *unitstest.Fake
	healthy bool
	now     time.Time
}

func newHost(t *testing.T) *host {
	t.Helper()
	p := hostpaths.New(t.TempDir())
	if err := os.MkdirAll(p.RunDir(), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := state.WriteApplied(p, &state.AppliedConfig{Slot: "kube1", Mode: "none", Machine: "w1", AppliedAt: time.Unix(1000, 0)}); err != nil {
		t.Fatal(err)
	}
	u := &unitstest.Fake{}
	for _, unit := range []string{unitnames.Containerd, unitnames.Kubelet, unitnames.NodeTarget} {
		u.Set(unit, "active")
	}
	u.SetStarted(unitnames.Kubelet, time.Now().Add(-time.Hour))
	return &host{p: p, healthy: true, now: time.Unix(2000, 0), units: u}
}

// started are the units health started.
func (h *host) started() []string {
	var out []string
	for _, c := range h.units.CallList() {
		if u, ok := strings.CutPrefix(c, "enqueue "); ok {
			out = append(out, u)
		}
	}
	return out
}

// nodeStartsOver runs health once a second for secs seconds and returns
// when (from the first run) it started the node; it fails the test if it
// started anything else.
func (h *host) nodeStartsOver(t *testing.T, secs int) []time.Duration {
	t.Helper()
	var at []time.Duration
	start := h.now
	for range secs {
		n := len(h.started())
		if err := h.run(t); err != nil {
			t.Fatal(err)
		}
		if len(h.started()) > n {
			at = append(at, h.now.Sub(start))
		}
		h.now = h.now.Add(time.Second)
	}
	for _, u := range h.started() {
		if u != unitnames.NodeTarget {
			t.Errorf("started %s, want only %s", u, unitnames.NodeTarget)
		}
	}
	return at
}

func (h *host) check() *Check {
	return &Check{Paths: h.p, Failures: 2, MaxRestarts: 1, BootWait: time.Millisecond, Settle: -1, PollInterval: time.Millisecond,
		Units: h.units, Now: func() time.Time { return h.now },
		Healthz: func(context.Context) error {
			if h.healthy {
				return nil
			}
			return errors.New("connection refused")
		}}
}

func (h *host) run(t *testing.T) error {
	t.Helper()
	return h.check().Run(context.Background())
}

// A kubelet that keeps dying: a restart after Failures checks, then,
// still unhealthy after MaxRestarts restarts, one failed run saying it
// gave up, then quiet runs without restarts until the node is healthy
// again, which allows restarts again.
func TestHealthRestartsThenGivesUpOnceThenStaysQuietUntilHealthyAgain(t *testing.T) {
	h := newHost(t)
	if err := h.run(t); err != nil { // the boot's first check: healthy
		t.Fatal(err)
	}
	h.healthy = false
	var errs []error
	for range 8 {
		errs = append(errs, h.run(t))
	}
	if n := slices.Index(h.started(), unitnames.Restart); n != 0 || len(h.started()) != 1 {
		t.Fatalf("starts %v, want one %s", h.started(), unitnames.Restart)
	}
	var gaveUp []int
	for i, err := range errs {
		if err != nil {
			if !errors.Is(err, ErrGaveUp) {
				t.Fatalf("run %d: %v", i, err)
			}
			gaveUp = append(gaveUp, i)
		}
	}
	// Runs 0,1: failures 1,2 -> restart at run 1; runs 2,3 -> give up at 3.
	if !slices.Equal(gaveUp, []int{3}) {
		t.Fatalf("gave up at runs %v, want [3] (errors %v)", gaveUp, errs)
	}
	h.healthy = true
	if err := h.run(t); err != nil {
		t.Fatal(err)
	}
	h.healthy = false
	for range 2 {
		if err := h.run(t); err != nil {
			t.Fatal(err)
		}
	}
	if len(h.started()) != 2 {
		t.Errorf("after the node was healthy again: starts %v, want a second restart", h.started())
	}
}

// After a give-up, one healthy answer between two crashes does not lift
// it: the node must be healthy for the settle window.
func TestHealthGiveUpIsNotLiftedByOneLuckyCheck(t *testing.T) {
	// Its windows are virtual time (testing/synctest): a loaded machine
	// cannot stretch them.
	synctest.Test(t, func(t *testing.T) {
		h := newHost(t)
		if err := h.run(t); err != nil {
			t.Fatal(err)
		}
		h.healthy = false
		for range 4 {
			h.run(t)
		}
		if len(h.started()) != 1 {
			t.Fatalf("starts %v, want one restart before the give-up", h.started())
		}
		flapping := flappingHealthz(3)
		for range 3 {
			c := h.check()
			c.Settle, c.Healthz = 20*time.Millisecond, flapping
			if err := c.Run(context.Background()); err != nil {
				t.Fatalf("a quiet check after the give-up: %v", err)
			}
		}
		h.healthy = false
		h.run(t)
		h.run(t)
		if len(h.started()) != 1 {
			t.Errorf("starts %v: a kubelet answering between crashes lifted the give-up, and health restarted again", h.started())
		}
		// Steady for the window: lifted.
		c := h.check()
		c.Settle = 20 * time.Millisecond
		h.healthy = true
		if err := c.Run(context.Background()); err != nil {
			t.Fatal(err)
		}
		h.healthy = false
		h.run(t)
		h.run(t)
		if len(h.started()) != 2 {
			t.Errorf("starts %v: a node healthy for the settle window did not lift the give-up", h.started())
		}
	})
}

// A new applied config (a repave) ends a give-up too.
func TestHealthGiveUpEndsWithANewAppliedConfig(t *testing.T) {
	h := newHost(t)
	_ = h.run(t)
	h.healthy = false
	for range 4 {
		_ = h.run(t)
	}
	st, _ := loadState(h.p)
	if !st.GaveUp {
		t.Fatalf("state %+v, want given up", st)
	}
	if err := state.WriteApplied(h.p, &state.AppliedConfig{Slot: "kube1", Mode: "none", Machine: "w1", AppliedAt: time.Unix(3000, 0)}); err != nil {
		t.Fatal(err)
	}
	_ = h.run(t)
	if st, _ := loadState(h.p); st.GaveUp || st.Failures != 1 {
		t.Errorf("state after a new applied config %+v, want counting afresh", st)
	}
}

// The first check of a boot fails (boot assessment) when the node does
// not come up within the boot wait.
func TestHealthFirstCheckOfABootFailsForANodeThatIsNotUp(t *testing.T) {
	h := newHost(t)
	h.healthy = false
	if err := h.run(t); err == nil || errors.Is(err, ErrGaveUp) {
		t.Fatalf("first check of the boot with the kubelet down: %v, want a failure", err)
	}
	if err := h.run(t); err != nil {
		t.Fatalf("second check: %v, want quiet (counting)", err)
	}
}

// The boot's verdict needs the settle window: a kubelet that answers
// healthz between two crashes, and happens to answer the first check, is
// a bad boot; a steady one passes once the window is over.
func TestHealthFirstCheckOfABootNeedsTheNodeSteadyForTheSettleWindow(t *testing.T) {
	// Its windows are virtual time (testing/synctest): a loaded machine
	// cannot stretch them.
	synctest.Test(t, func(t *testing.T) {
		h := newHost(t)
		c := h.check()
		c.BootWait, c.Settle = 80*time.Millisecond, 30*time.Millisecond
		c.Healthz = flappingHealthz(4)
		err := c.Run(context.Background())
		if err == nil || errors.Is(err, ErrGaveUp) {
			t.Fatalf("first check of the boot with a kubelet that keeps dying: %v, want the boot's failure", err)
		}

		h = newHost(t)
		c = h.check()
		c.BootWait, c.Settle = time.Second, 30*time.Millisecond
		begin := time.Now()
		if err := c.Run(context.Background()); err != nil {
			t.Fatalf("first check of the boot with a steady node: %v", err)
		}
		if took := time.Since(begin); took < 30*time.Millisecond {
			t.Errorf("the first check passed after %v, before the 30ms settle window", took)
		}
	})
}

// A check stopped in the middle (systemctl stop, a reset) is not a
// failed run: recovery would report a failure there never was.
func TestHealthStoppedInTheMiddleOfACheckIsNotAFailure(t *testing.T) {
	// Its windows are virtual time (testing/synctest): a loaded machine
	// cannot stretch them.
	synctest.Test(t, func(t *testing.T) {
		h := newHost(t)
		h.healthy = false
		c := h.check()
		c.BootWait = time.Minute
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
		defer cancel()
		if err := c.Run(ctx); err != nil {
			t.Fatalf("a check stopped during the boot's wait: %v, want nil (not a failure)", err)
		}
		if err := h.run(t); err == nil {
			t.Errorf("the next check, not stopped, of a node that is down: nil, want the boot's failure")
		}
	})
}

// A fence that got no answer: health starts the node again with a delay
// that doubles up to the cap; an explicit refusal is left to the daemon.
func TestHealthRetriesAFenceWithoutAnswerWithAGrowingDelayButNotAnExplicitRefusal(t *testing.T) {
	h := newHost(t)
	h.units.States = nil // node down
	if err := record.Write(h.p, record.Record{Outcome: record.Refused, Reason: "AllocationFenced", At: h.now}); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := h.run(t); err != nil {
			t.Fatal(err)
		}
	}
	if len(h.started()) != 0 {
		t.Fatalf("explicit refusal: health started %v", h.started())
	}
	if err := record.Write(h.p, record.Record{Outcome: record.NoAnswer, Reason: "ClusterUnreachable", At: h.now}); err != nil {
		t.Fatal(err)
	}
	at := h.nodeStartsOver(t, 60*30) // 30 min in steps of 1 s
	want := []time.Duration{0, 30 * time.Second, 90 * time.Second, 210 * time.Second, 450 * time.Second, 930 * time.Second, 1530 * time.Second}
	if !slices.Equal(at, want) {
		t.Errorf("node starts at %v, want %v (30 s doubling, capped at 10 min)", at, want)
	}
}

// A fence that failed before it decided (its sandbox could not be set
// up: no record) fails the node's start by dependency: not an operator's
// stop, so health starts the node again, with the fence's delays; a node
// stopped with the fence not failed is left alone.
func TestHealthRetriesAFenceThatFailedWithoutDecidingButNotAStoppedNode(t *testing.T) {
	h := newHost(t)
	h.units.States = nil // node down, fence never failed: stopped by someone
	for range 3 {
		if err := h.run(t); err != nil {
			t.Fatal(err)
		}
		h.now = h.now.Add(time.Minute)
	}
	if len(h.started()) != 0 {
		t.Fatalf("stopped node: health started %v", h.started())
	}
	h.units.Set(unitnames.Fence, "failed")
	if at, want := h.nodeStartsOver(t, 120), []time.Duration{0, 30 * time.Second, 90 * time.Second}; !slices.Equal(at, want) {
		t.Errorf("node starts at %v, want %v", at, want)
	}
}

// A oneshot that runs (activating) holds the check back; one that has
// finished and remains active (lifecycle's RemainAfterExit=yes, all boot
// long) does not: health would otherwise never check a node again.
func TestARunningOperationHoldsTheCheckBackAFinishedOneDoesNot(t *testing.T) {
	h := newHost(t)
	h.healthy = false
	h.units.Set("unbounded-lifecycle.service", "activating")
	for range 3 {
		if err := h.run(t); err != nil {
			t.Fatal(err)
		}
	}
	if len(h.started()) != 0 {
		t.Fatalf("health started %v while lifecycle runs; want nothing", h.started())
	}
	h.units.Set("unbounded-lifecycle.service", "active")
	for range 3 {
		h.run(t)
	}
	if !slices.Contains(h.started(), unitnames.Restart) {
		t.Fatalf("health started %v with lifecycle finished (active, remaining); want %s after %d unhealthy checks", h.started(), unitnames.Restart, 2)
	}
}

// flappingHealthz is a kubelet that keeps dying: every nth healthz call is
// refused, the others answer ok.
func flappingHealthz(every int) func(context.Context) error {
	n := 0
	return func(context.Context) error {
		n++
		if n%every == 0 {
			return errors.New("connection refused")
		}
		return nil
	}
}
