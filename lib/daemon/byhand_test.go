package daemon

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/state"
)

// machineSlot returns the slot the Machine's status reports.
func (f *fixture) machineSlot(t *testing.T) v1alpha3.Slot {
	t.Helper()
	m, err := f.env.ops.machines.Get(context.Background(), f.machine)
	if err != nil || m.Status.Isolation == nil {
		return ""
	}
	return m.Status.Isolation.Slot
}

// A repave started by hand (systemctl start unbounded-repave.service) holds
// the installation lock and deletes the Node. The running daemon takes
// neither for a reason to stop or to repave: it waits for the unit as for
// one of its own (an operation created meanwhile is started after it), and
// reports the slot the repave switched to once the unit has ended.
func TestRepaveByHandKeepsTheDaemonRunningAndItsSlotIsReported(t *testing.T) {
	for _, c := range []struct{ owner, unit string }{{"repave", "unbounded-repave.service"}, {"isolation", "unbounded-isolation.service"}} {
		t.Run(c.owner, func(t *testing.T) { nodeOperationByHand(t, c.owner, c.unit) })
	}
}

// nodeOperationByHand is the scenario above for the node operation of
// owner, run by unit (an isolation change by hand deletes the Node too).
func nodeOperationByHand(t *testing.T, owner, unit string) {
	f := newFixture(t)
	f.env.createReadyNode(t, f.machine)
	logs := f.recordLogs(t)
	d := startDaemon(t, f.opts)
	eventually(t, opTimeout, "daemon reported its Node and slot kube1", func() bool {
		m, err := f.env.ops.machines.Get(context.Background(), f.machine)
		return err == nil && m.Status.NodeName == f.machine && f.machineSlot(t) == "kube1"
	})

	// The operation by hand: its unit runs and holds the lock.
	f.fake.configure(unit, func(u *fakeUnit) {
		u.st = UnitState{ActiveState: "activating", SubState: "start", InvocationID: "by-hand"}
	})
	lock, err := state.AcquireOwnership(f.opts.Paths, owner, unit)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.env.kube.CoreV1().Nodes().Delete(context.Background(), f.machine, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitLogged(t, logs, 1, "Node deleted while "+unit+" runs; not a loss")
	op := f.env.createOp(t, f.machine, v1alpha3.OperationRestart)
	waitLogged(t, logs, 1, "a node operation runs; waiting for it")
	// Bounded look: nothing is started while the repave runs, and the
	// daemon does not stop.
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-d.done:
			t.Fatalf("daemon stopped while a repave by hand ran: %v", d.err)
		default:
		}
		if st := f.env.getOp(t, op.Name).Status.State; st != "" && st != v1alpha3.OperationPending {
			t.Fatalf("operation %s went %s while the repave by hand ran", op.Name, st)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// The repave switches to kube2: the new record, the old one removed,
	// the lock released, the unit ended.
	writeApplied(t, f.opts.Paths, f.machine, "kube2")
	if err := state.RemoveApplied(f.opts.Paths, "kube1"); err != nil {
		t.Fatal(err)
	}
	if err := lock.Release(); err != nil {
		t.Fatal(err)
	}
	f.fake.configure(unit, func(u *fakeUnit) {
		u.st = UnitState{ActiveState: "inactive", SubState: "dead", Result: "success", InvocationID: "by-hand"}
	})

	if done := f.env.waitOp(t, op.Name, opTimeout); done.Status.State != v1alpha3.OperationComplete {
		t.Fatalf("operation %s ended %s: %s", op.Name, done.Status.State, done.Status.Message)
	}
	eventually(t, opTimeout, "Machine status.isolation.slot kube2", func() bool { return f.machineSlot(t) == "kube2" })
	select {
	case <-d.done:
		t.Fatalf("daemon stopped: %v", d.err)
	default:
	}
	if n := f.fake.startCount(unit); n != 0 {
		t.Fatalf("%s started %d times by the daemon, want 0 (the Node's deletion was the repave's)", unit, n)
	}
}

// A repave the daemon ran switches the slot: the Machine's status names
// the new one without a restart of the daemon.
func TestSlotOfARepaveTheDaemonRanIsReported(t *testing.T) {
	f := newFixture(t)
	f.fake.onStart = func(unit string) {
		if unit != "unbounded-repave.service" {
			return
		}
		writeApplied(t, f.opts.Paths, f.machine, "kube2")
		if err := state.RemoveApplied(f.opts.Paths, "kube1"); err != nil {
			t.Error(err)
		}
	}
	startDaemon(t, f.opts)
	eventually(t, opTimeout, "Machine status.isolation.slot kube1", func() bool { return f.machineSlot(t) == "kube1" })
	op := f.env.createOp(t, f.machine, v1alpha3.OperationRepave)
	if done := f.env.waitOp(t, op.Name, opTimeout); done.Status.State != v1alpha3.OperationComplete {
		t.Fatalf("operation %s ended %s: %s", op.Name, done.Status.State, done.Status.Message)
	}
	eventually(t, opTimeout, "Machine status.isolation.slot kube2", func() bool { return f.machineSlot(t) == "kube2" })
}
