package readiness

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/noderecord"
	"unbounded-cloud.io/agent/lib/unitnames"
	"unbounded-cloud.io/agent/lib/units/unitstest"
)

// node is a test host's node stack in mode none: its units, its healthz
// and its Node, which tests change.
type node struct {
	units   *unitstest.Fake
	healthz error
	n       Node
	err     error
	reads   int
}

func newNode() *node {
	u := &unitstest.Fake{}
	u.Set(unitnames.Containerd, "active")
	u.Set(unitnames.Kubelet, "active")
	u.SetStarted(unitnames.Kubelet, time.Now().Add(-time.Minute))
	return &node{units: u, n: Node{Known: true, Present: true, Ready: true, Status: "True", Reason: "KubeletReady", Heartbeat: time.Now()}}
}

func (n *node) check() *Check {
	return &Check{Units: n.units, Mode: "none", Slot: "kube1", Name: "w1",
		Healthz: func(context.Context) error { return n.healthz },
		Node:    func(context.Context) (Node, error) { n.reads++; return n.n, n.err }}
}

func TestUpNeedsTheUnitsTheHealthzAndAReadyNodeOfTheRunningKubelet(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		name   string
		change func(n *node)
		want   string // "" is up
	}{
		{"all up", func(*node) {}, ""},
		{"kubelet unit failed", func(n *node) { n.units.Set(unitnames.Kubelet, "failed") }, "unbounded-kubelet.service is failed"},
		{"healthz refused", func(n *node) { n.healthz = errors.New("connection refused") }, "kubelet healthz (127.0.0.1:10248): connection refused"},
		{"Node not read", func(n *node) { n.err = errors.New("connection refused") }, "Node w1 not read (connection refused)"},
		{"Node not registered", func(n *node) { n.n = Node{Known: true} }, "Node w1 is not registered"},
		{"Node NotReady", func(n *node) {
			n.n.Ready, n.n.Status, n.n.Reason, n.n.Message = false, "False", "KubeletNotReady", "container runtime network not ready"
		}, "Node w1 is not Ready (Ready False, reason KubeletNotReady: container runtime network not ready)"},
		{"Ready of the kubelet before", func(n *node) { n.units.SetStarted(unitnames.Kubelet, n.n.Heartbeat.Add(time.Second)) }, "Node w1 is Ready from before its kubelet's start"},
		{"kubelet never started", func(n *node) { n.units.Started = nil }, "has no start time"},
		{"Ready without a heartbeat", func(n *node) { n.n.Heartbeat = time.Time{} }, "without a heartbeat time"},
		{"Node not known", func(n *node) { n.n = Node{} }, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			n := newNode()
			c.change(n)
			r := n.check().Look(ctx)
			got := strings.Join(r.Problems, "; ")
			if c.want == "" && !r.Up() || c.want != "" && !strings.Contains(got, c.want) {
				t.Fatalf("problems %q, want %q", got, c.want)
			}
			if c.want != "" && len(r.Problems) != 1 {
				t.Errorf("problems %q: want exactly the one", got)
			}
		})
	}
}

func TestANilNodeSourceIsNeverUp(t *testing.T) {
	n := newNode()
	c := n.check()
	c.Node = nil
	if r := c.Look(context.Background()); r.Up() {
		t.Fatal("up without a Node source")
	}
}

// A kubelet that answers now and then between crashes is not up: the
// wait needs every look of the settle window to pass, and says so when
// the timeout ends it.
func TestWaitNeedsTheSettleWindowWithoutAFailedLook(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newNode()
		c := n.check()
		looks := 0
		c.Healthz = func(context.Context) error {
			looks++
			if looks%3 == 0 {
				return errors.New("connection refused")
			}
			return nil
		}
		err := c.Wait(context.Background(), Wait{Timeout: time.Minute, Settle: 5 * time.Second, Poll: time.Second})
		var nu *NotUpError
		if !errors.As(err, &nu) || !strings.Contains(err.Error(), "not healthy within 1m0s") || !strings.Contains(err.Error(), "connection refused") {
			t.Fatalf("flapping healthz: %v, want a timeout naming the failed look", err)
		}

		c.Healthz = func(context.Context) error { return nil }
		n.reads = 0
		begin := time.Now()
		if err := c.Wait(context.Background(), Wait{Timeout: time.Minute, Settle: 5 * time.Second, Poll: time.Second}); err != nil {
			t.Fatalf("steady node: %v", err)
		}
		if took := time.Since(begin); took != 5*time.Second || n.reads != 6 {
			t.Errorf("returned after %v and %d looks: want the 5s settle window, a look each second", took, n.reads)
		}
		n.reads = 0
		if err := c.Wait(context.Background(), Wait{Timeout: time.Minute, Poll: time.Second}); err != nil || n.reads != 1 {
			t.Errorf("settle 0: %v after %d looks, want nil after 1", err, n.reads)
		}
	})
}

func TestWaitEndsWithTheContextNamingWhatIsMissing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newNode()
		n.healthz = errors.New("connection refused")
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		err := n.check().Wait(ctx, Wait{Timeout: time.Minute})
		if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "connection refused") {
			t.Fatalf("%v: want the context's error and what is missing", err)
		}
	})
}

// A restarted kubelet's Node stays Ready in the cluster from before the
// restart: the wait ends only once the new kubelet has written it.
func TestWaitEndsOnlyAtTheRestartedKubeletsFirstWrite(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newNode()
		n.n.Heartbeat = time.Now().Add(-time.Minute)
		n.units.SetStarted(unitnames.Kubelet, time.Now())
		written := time.Now().Add(3 * time.Second)
		c := n.check()
		c.Node = func(context.Context) (Node, error) {
			if time.Now().Before(written) {
				return n.n, nil
			}
			m := n.n
			m.Heartbeat = written.Truncate(time.Second)
			return m, nil
		}
		begin := time.Now()
		if err := c.Wait(context.Background(), Wait{Timeout: time.Minute, Poll: time.Second}); err != nil {
			t.Fatal(err)
		}
		if took := time.Since(begin); took != 3*time.Second {
			t.Fatalf("up after %v, want at the kubelet's write 3s after its start", took)
		}
	})
}

// The kubelet's CSINode race: a registered Node that waits for its
// CSINode past the grace gets one restart of the node stack, never two,
// and a Node NotReady for another reason gets none.
func TestWaitRestartsTheNodeStackOnceForTheCSINode(t *testing.T) {
	for _, c := range []struct {
		name, message string
		sticky        bool
		restarts      int
		up            bool
	}{
		{"CSINode", "CSINode is not yet initialized", false, 1, true},
		{"CSINode that stays", "CSINode is not yet initialized", true, 1, false},
		{"network", "container runtime network not ready", false, 0, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				n := newNode()
				n.n.Ready, n.n.Status, n.n.Reason, n.n.Message = false, "False", "KubeletNotReady", c.message
				restarts := 0
				g := &CSINode{Grace: 10 * time.Second, Restart: func(context.Context) error {
					restarts++
					if !c.sticky {
						n.n.Ready, n.n.Status, n.n.Message, n.n.Heartbeat = true, "True", "", time.Now().Add(time.Second)
					}
					return nil
				}}
				begin := time.Now()
				err := n.check().Wait(context.Background(), Wait{Timeout: time.Minute, Poll: time.Second, CSINode: g})
				if (err == nil) != c.up || restarts != c.restarts {
					t.Fatalf("err %v after %d restarts; want up %v after %d", err, restarts, c.up, c.restarts)
				}
				if c.up && time.Since(begin) < 10*time.Second {
					t.Errorf("restarted after %v, before the grace", time.Since(begin))
				}
			})
		})
	}
}

func TestWaitRestartsForTheCSINodeAtOnceOnceTheEarlyTriesAreOver(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newNode()
		n.n.Ready, n.n.Reason, n.n.Message = false, "KubeletNotReady", "failed to initialize CSINode"
		var at time.Duration
		begin := time.Now()
		g := &CSINode{Grace: time.Hour, AfterStart: 5 * time.Second, Restart: func(context.Context) error {
			at = time.Since(begin)
			n.n.Ready, n.n.Message, n.n.Heartbeat = true, "", time.Now().Add(time.Second)
			return nil
		}}
		if err := n.check().Wait(context.Background(), Wait{Timeout: time.Minute, Poll: time.Second, CSINode: g}); err != nil {
			t.Fatal(err)
		}
		if at != 5*time.Second {
			t.Fatalf("restarted %v after the wait began, want at AfterStart", at)
		}
	})
}

func TestAFailedCSINodeRestartEndsTheWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newNode()
		n.n.Ready, n.n.Message = false, "CSINode is not yet initialized"
		g := &CSINode{Grace: time.Second, Restart: func(context.Context) error { return errors.New("machine did not stop") }}
		err := n.check().Wait(context.Background(), Wait{Timeout: time.Minute, Poll: time.Second, CSINode: g})
		if !errors.Is(err, ErrCSINodeRestart) || !strings.Contains(err.Error(), "machine did not stop") {
			t.Fatalf("%v", err)
		}
	})
}

// FromDaemon counts the Node only when the daemon's watch is live (a
// record exists and the daemon runs); unknown counts as nothing.
func TestFromDaemonKnowsOnlyWhatTheDaemonsLiveWatchSays(t *testing.T) {
	p := hostpaths.New(t.TempDir())
	if err := os.MkdirAll(p.RunDir(), 0o755); err != nil {
		t.Fatal(err)
	}
	u := &unitstest.Fake{}
	ctx := context.Background()
	src := FromDaemon(p, u)
	read := func(r *noderecord.Record) Node {
		t.Helper()
		if r != nil {
			if err := noderecord.Write(p, *r); err != nil {
				t.Fatal(err)
			}
		}
		n, err := src(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	hb := time.Unix(5000, 0)
	u.Set(unitnames.Daemon, "active")
	if n := read(nil); n.Known {
		t.Errorf("no record (watch not live): %+v", n)
	}
	if n := read(&noderecord.Record{Node: "w1", Present: true, Ready: true, Status: "True", Heartbeat: hb}); !n.Known || !n.Ready || !n.Heartbeat.Equal(hb) {
		t.Errorf("Ready: %+v", n)
	}
	if n := read(&noderecord.Record{Node: "w1", Present: true, Status: "False", Reason: "KubeletNotReady", Message: "network"}); !n.Known || n.Ready || n.Reason != "KubeletNotReady" {
		t.Errorf("NotReady: %+v", n)
	}
	if n := read(&noderecord.Record{Node: "w1", Present: true, Ready: true, Status: "True"}); n.Known {
		t.Errorf("Ready without a heartbeat (an older daemon's record): %+v", n)
	}
	if n := read(&noderecord.Record{Node: "w1", Present: false}); n.Known {
		t.Errorf("no Node (registration is the kubelet's, a vanished one the daemon's): %+v", n)
	}
	u.Set(unitnames.Daemon, "activating")
	if n := read(&noderecord.Record{Node: "w1", Present: true, Status: "False"}); n.Known {
		t.Errorf("daemon not running (its record is not current): %+v", n)
	}
}

// With FirstPoll the looks come every FirstPoll for the wait's first
// QuickFor, then every Poll: a node up 0.9 s after the wait began is seen
// at 1 s, and one up after 20 s is seen on the 2 s cadence.
func TestWaitLooksFastFirstThenEveryPoll(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := newNode()
		c := n.check()
		begin := time.Now()
		upAt := begin.Add(900 * time.Millisecond)
		c.Healthz = func(context.Context) error {
			if time.Now().Before(upAt) {
				return errors.New("connection refused")
			}
			return nil
		}
		if err := c.Wait(context.Background(), Wait{Timeout: time.Minute, Poll: 2 * time.Second, FirstPoll: QuickPoll}); err != nil {
			t.Fatal(err)
		}
		if took := time.Since(begin); took != time.Second || n.reads != 5 {
			t.Errorf("up after 0.9s, seen after %v and %d looks: want 1s and 5 (every 0.25 s)", took, n.reads)
		}

		n.reads = 0
		begin = time.Now()
		upAt = begin.Add(20 * time.Second)
		if err := c.Wait(context.Background(), Wait{Timeout: time.Minute, Poll: 2 * time.Second, FirstPoll: QuickPoll}); err != nil {
			t.Fatal(err)
		}
		// 0 ... 5 s every 0.25 s (21 looks), then 7, 9, ... 21 s (8).
		if took := time.Since(begin); took != 21*time.Second || n.reads != 29 {
			t.Errorf("up after 20s, seen after %v and %d looks: want 21s and 29 (0.25 s for 5 s, then the 2 s poll)", took, n.reads)
		}
	})
}

func TestTheLocalDNSCacheCountsOnlyOnANodeThatRunsIt(t *testing.T) {
	ctx := context.Background()
	n := newNode()
	c := n.check()
	asked := 0
	c.DNSReady = func(context.Context) error { asked++; return errors.New("connection refused") }
	if r := c.Look(ctx); !r.Up() || asked != 0 {
		t.Fatalf("a node without the cache: problems %q, asked %d times", r.Problems, asked)
	}
	c.LocalDNS = true
	r := c.Look(ctx)
	if r.Up() || !strings.Contains(strings.Join(r.Problems, "; "), "node-local DNS cache (169.254.10.10:8181/ready): connection refused") {
		t.Fatalf("a cache that does not answer: problems %q", r.Problems)
	}
	c.DNSReady = func(context.Context) error { return nil }
	if r := c.Look(ctx); !r.Up() {
		t.Fatalf("a ready cache: problems %q", r.Problems)
	}
}
