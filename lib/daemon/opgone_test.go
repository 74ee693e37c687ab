package daemon

import (
	"context"
	"testing"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
)

// An operation deleted while its unit runs can no longer take a status.
// The daemon must drop it, not retry it forever: a retried job is resumed
// before anything else, so every later operation would wait behind it.
func TestOperationDeletedWhileItsUnitRunsDoesNotBlockLaterOperations(t *testing.T) {
	f := newFixture(t)
	hold := make(chan struct{})
	f.fake.configure("unbounded-restart.service", func(u *fakeUnit) { u.hold = hold })
	logs := f.recordLogs(t)
	startDaemon(t, f.opts)

	first := f.env.createOp(t, f.machine, v1alpha3.OperationRestart)
	eventually(t, opTimeout, "restart unit started", func() bool { return f.fake.startCount("unbounded-restart.service") == 1 })
	err := f.env.ops.ops.Delete().Resource(v1alpha3.ResourceMachineOperations).Name(first.Name).Do(context.Background()).Error()
	if err != nil {
		t.Fatal(err)
	}
	// The daemon's own view loses the operation before its unit ends.
	waitLogged(t, logs, 1, "operation deleted from the cluster", "name="+first.Name)
	close(hold)

	second := f.env.createOp(t, f.machine, v1alpha3.OperationRepave)
	done := f.env.waitOp(t, second.Name, opTimeout)
	if done.Status.State != v1alpha3.OperationComplete {
		t.Fatalf("second operation ended %s: %s", done.Status.State, done.Status.Message)
	}
	if n := f.fake.startCount("unbounded-restart.service"); n != 1 {
		t.Fatalf("unbounded-restart.service started %d times, want 1", n)
	}
}
