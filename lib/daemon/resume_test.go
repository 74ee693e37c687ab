package daemon

import (
	"testing"
	"time"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/request"
)

// A daemon stopped between "InProgress" and StartUnit leaves a unit whose
// InvocationID is still the one recorded in the request. That alone says
// the unit has not run for the operation, whatever the journal holds for
// the unit around the request's time (the journal is matched by time: the
// last lines of the run before, by hand or for the previous operation, can
// fall after RequestedAt).
func TestInProgressOperationWhoseUnitKeptItsPreviousInvocationIsStarted(t *testing.T) {
	f := newFixture(t)
	requestedAt := time.Now().UTC()
	f.fake.configure("unbounded-restart.service", func(u *fakeUnit) {
		u.st = UnitState{ActiveState: "inactive", SubState: "dead", Result: "success", InvocationID: "0123456789abcdef0123456789abcdef"}
		u.ranAt = requestedAt.Add(10 * time.Millisecond)
	})
	f.fake.journal["unbounded-restart.service"] = []string{"Finished unbounded-restart.service."}
	op := f.leftInProgress(t, v1alpha3.OperationRestart, "restart", &request.Request{
		Type: "Restart", Machine: f.machine,
		Unit: "unbounded-restart.service", RequestedAt: requestedAt, BootID: "boot-1",
		PreviousInvocation: "0123456789abcdef0123456789abcdef",
	})

	startDaemon(t, f.opts)
	done := f.env.waitOp(t, op.Name, opTimeout)
	if done.Status.State != v1alpha3.OperationComplete {
		t.Fatalf("operation ended %s: %s", done.Status.State, done.Status.Message)
	}
	if n := f.fake.startCount("unbounded-restart.service"); n != 1 {
		t.Fatalf("unbounded-restart.service started %d times, want 1 (reported %q without running it)", n, done.Status.Message)
	}
}

// A request from an earlier boot (requests live under /var, lib/request)
// whose unit has not run in this boot: the run was cut by the reboot, or
// never began. The journal still holds that boot's lines about the unit,
// which in the same boot would mean "ran and was unloaded"; across a
// reboot they say nothing of an end, so the unit runs again, once.
func TestInProgressOperationWhoseRequestIsFromAnEarlierBootRunsAgainOnce(t *testing.T) {
	f := newFixture(t)
	requestedAt := time.Now().UTC().Add(-time.Minute)
	f.fake.journal["unbounded-restart.service"] = []string{"Starting unbounded-restart.service..."}
	op := f.leftInProgress(t, v1alpha3.OperationRestart, "restart", &request.Request{
		Type: "Restart", Machine: f.machine,
		Unit: "unbounded-restart.service", RequestedAt: requestedAt, BootID: "boot-0",
		PreviousInvocation: "0123456789abcdef0123456789abcdef",
	})

	startDaemon(t, f.opts)
	done := f.env.waitOp(t, op.Name, opTimeout)
	if done.Status.State != v1alpha3.OperationComplete {
		t.Fatalf("operation ended %s: %s", done.Status.State, done.Status.Message)
	}
	if n := f.fake.startCount("unbounded-restart.service"); n != 1 {
		t.Fatalf("unbounded-restart.service started %d times, want 1 (reported %q)", n, done.Status.Message)
	}
}
