package daemon

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"unbounded-cloud.io/agent/lib/request"
	"unbounded-cloud.io/agent/lib/state"
)

// The repave of a vanished Node has no MachineOperation to carry its
// progress: once its unit was started, a retry (here: the unit's state
// could not be read after the run) must resume it, not start the unit again.
func TestRepaveOfVanishedNodeRetriedAfterItsUnitRanIsNotStartedAgain(t *testing.T) {
	f := newFixture(t)
	f.env.createReadyNode(t, f.machine)
	var once sync.Once
	f.fake.onStart = func(string) {
		once.Do(func() {
			f.fake.mu.Lock()
			f.fake.stateErrs = 1 // the first look at the unit after its run fails
			f.fake.mu.Unlock()
		})
	}
	startDaemon(t, f.opts)
	eventually(t, opTimeout, "daemon saw its Node", func() bool {
		m, err := f.env.ops.machines.Get(context.Background(), f.machine)
		return err == nil && m.Status.NodeName == f.machine
	})
	if err := f.env.kube.CoreV1().Nodes().Delete(context.Background(), f.machine, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, opTimeout, "repave started", func() bool { return f.fake.startCount("unbounded-repave.service") >= 1 })
	// The retry comes 5s after the failed look.
	eventually(t, opTimeout, "event OperationComplete on the Machine", func() bool {
		return strings.Contains(strings.Join(f.machineEvents(t), ","), "OperationComplete")
	})
	f.settled(t)
	if n := f.fake.startCount("unbounded-repave.service"); n != 1 {
		t.Fatalf("unbounded-repave.service started %d times, want 1", n)
	}
}

// A Node that vanished while the daemon was down (none at its first look,
// on a bootstrapped host) is repaved once the grace has passed, and the
// repave's request says it is for the vanished Node.
func TestNodeGoneWhileTheDaemonWasDownIsRepavedAfterTheGrace(t *testing.T) {
	f := newFixture(t)
	f.opts.NodeGoneGrace = 500 * time.Millisecond
	logs := f.recordLogs(t)
	startDaemon(t, f.opts)
	waitLogged(t, logs, 1, "vanished while the daemon was down")
	eventually(t, opTimeout, "repave started", func() bool { return f.fake.startCount("unbounded-repave.service") == 1 })
	req, err := request.Read(f.opts.Paths, "repave")
	if err != nil || !strings.HasPrefix(req.UID, "node:") || req.Operation != "" {
		t.Fatalf("repave request = %+v, %v; want a node: uid and no operation", req, err)
	}
	eventually(t, opTimeout, "events NodeGone and OperationComplete on the Machine", func() bool {
		ev := strings.Join(f.machineEvents(t), ",")
		return strings.Contains(ev, ReasonNodeGone) && strings.Contains(ev, "OperationComplete")
	})
	f.settled(t)
	if n := f.fake.startCount("unbounded-repave.service"); n != 1 {
		t.Fatalf("unbounded-repave.service started %d times, want 1", n)
	}
}

// A Node that registers within the grace (its kubelet started with the
// daemon, at boot) is not repaved; nor is a host never bootstrapped.
func TestNodeThatRegistersWithinTheGraceIsNotRepaved(t *testing.T) {
	f := newFixture(t)
	f.opts.NodeGoneGrace = 3 * time.Second
	logs := f.recordLogs(t)
	startDaemon(t, f.opts)
	waitLogged(t, logs, 1, "vanished while the daemon was down")
	f.env.createReadyNode(t, f.machine)
	waitLogged(t, logs, 1, "Node registered within the grace")
	f.settled(t)
	if n := f.fake.startCount("unbounded-repave.service"); n != 0 {
		t.Fatalf("unbounded-repave.service started %d times, want 0", n)
	}

	g := newFixture(t)
	g.opts.NodeGoneGrace = 100 * time.Millisecond
	if err := state.RemoveApplied(g.opts.Paths, "kube1"); err != nil {
		t.Fatal(err)
	}
	glogs := g.recordLogs(t)
	begin := time.Now()
	startDaemon(t, g.opts)
	waitLogged(t, glogs, 1, "daemon started")
	// An absence: looked at once the grace is long over.
	eventually(t, opTimeout, "ten times the grace passed", func() bool { return time.Since(begin) > 10*g.opts.NodeGoneGrace })
	g.settled(t)
	if glogs.count("vanished while the daemon was down") != 0 {
		t.Errorf("a host never bootstrapped took its absent Node for vanished")
	}
	if n := g.fake.startCount("unbounded-repave.service"); n != 0 {
		t.Fatalf("not bootstrapped: unbounded-repave.service started %d times, want 0", n)
	}
}
