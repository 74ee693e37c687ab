package daemon

import (
	"context"
	"errors"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/rest"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/request"
	"unbounded-cloud.io/agent/lib/state"
	"unbounded-cloud.io/agent/lib/version"
)

const opTimeout = 20 * time.Second

type fixture struct {
	env     *testEnv
	machine string
	opts    Options
	fake    *fakeSystemd
}

func newFixture(t *testing.T) *fixture {
	env := getEnv(t)
	machine := env.newMachine(t)
	fake := newFakeSystemd()
	return &fixture{
		env:     env,
		machine: machine,
		fake:    fake,
		opts: Options{
			Paths:        newRoot(t, machine),
			Host:         fake.host(),
			Machine:      machine,
			REST:         env.agentConfig(t, machine),
			PollInterval: 20 * time.Millisecond,
			// Most tests have no Node: not one that vanished.
			NodeGoneGrace: time.Hour,
		},
	}
}

// leftInProgress is what a daemon killed after marking an operation
// InProgress leaves behind: the operation InProgress and, when req is not
// nil, its request file for concern (req's operation name and UID are
// filled in).
func (f *fixture) leftInProgress(t *testing.T, typ v1alpha3.OperationType, concern string, req *request.Request) *v1alpha3.MachineOperation {
	t.Helper()
	op := f.env.createOp(t, f.machine, typ)
	if req != nil {
		req.Operation, req.UID = op.Name, string(op.UID)
		if err := request.Write(f.opts.Paths, concern, req); err != nil {
			t.Fatal(err)
		}
	}
	op.Status.State = v1alpha3.OperationInProgress
	if _, err := f.env.ops.updateOpStatus(context.Background(), op); err != nil {
		t.Fatal(err)
	}
	return op
}

// machineEvents returns the reasons of the Events recorded on the Machine.
func (f *fixture) machineEvents(t *testing.T) []string {
	t.Helper()
	list, err := f.env.kube.CoreV1().Events(metav1.NamespaceDefault).List(context.Background(), metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("involvedObject.name", f.machine).String(),
	})
	if err != nil {
		t.Fatal(err)
	}
	var reasons []string
	for _, e := range list.Items {
		reasons = append(reasons, e.Reason)
	}
	return reasons
}

func TestRepaveOperationWritesRequestThenStartsRepaveUnitAndCompletes(t *testing.T) {
	f := newFixture(t)
	type atStart struct {
		req   *request.Request
		state v1alpha3.OperationState
	}
	seen := make(chan atStart, 4)
	f.fake.onStart = func(unit string) {
		req, err := request.Read(f.opts.Paths, "repave")
		if err != nil {
			t.Errorf("no request file when %s was started: %v", unit, err)
		}
		s := atStart{req: req}
		// The operation by the request's name: the daemon may start the
		// unit before createOp has returned the name to this test (a
		// clean-clone run saw it).
		if req != nil && req.Operation != "" {
			s.state = f.env.getOp(t, req.Operation).Status.State
		}
		seen <- s
	}
	startDaemon(t, f.opts)

	op := f.env.createOp(t, f.machine, v1alpha3.OperationRepave)
	done := f.env.waitOp(t, op.Name, opTimeout)

	if done.Status.State != v1alpha3.OperationComplete || done.Status.Reason != ReasonUnitSucceeded {
		t.Fatalf("operation ended %s/%s (%s), want Complete/%s", done.Status.State, done.Status.Reason, done.Status.Message, ReasonUnitSucceeded)
	}
	if done.Status.StartTime == nil || done.Status.CompletionTime == nil {
		t.Errorf("start or completion time missing: %+v", done.Status)
	}
	if n := f.fake.startCount("unbounded-repave.service"); n != 1 {
		t.Fatalf("unbounded-repave.service started %d times, want 1 (all starts: %v)", n, f.fake.starts)
	}
	s := <-seen
	if s.req == nil || s.req.UID != string(op.UID) || s.req.Operation != op.Name || s.req.Type != "Repave" {
		t.Errorf("request at start = %+v, want operation %s uid %s", s.req, op.Name, op.UID)
	}
	if s.req != nil && len(s.req.Desired) == 0 {
		t.Errorf("repave request carries no desired config")
	}
	if s.state != v1alpha3.OperationInProgress {
		t.Errorf("operation state when the unit started = %q, want InProgress", s.state)
	}
	eventually(t, opTimeout, "events Dispatched and OperationComplete on the Machine", func() bool {
		ev := strings.Join(f.machineEvents(t), ",")
		return strings.Contains(ev, ReasonDispatched) && strings.Contains(ev, "OperationComplete")
	})

	// The daemon reports itself in the status of the Machine bootstrap registered.
	m, err := f.env.ops.machines.Get(context.Background(), f.machine)
	if err != nil {
		t.Fatalf("Machine not registered: %v", err)
	}
	if m.Status.Agent == nil || m.Status.Agent.Version != version.Version ||
		m.Status.Isolation == nil || m.Status.Isolation.Mode != v1alpha3.IsolationNspawn || m.Status.Isolation.Slot != v1alpha3.SlotKube1 {
		t.Errorf("Machine status = %+v %+v, want agent %s, nspawn/kube1", m.Status.Agent, m.Status.Isolation, version.Version)
	}
}

func TestOperationTypesStartTheirUnits(t *testing.T) {
	for typ, unit := range map[v1alpha3.OperationType]string{
		v1alpha3.OperationRestart:      "unbounded-restart.service",
		v1alpha3.OperationAgentUpgrade: "unbounded-upgrade.service",
	} {
		t.Run(string(typ), func(t *testing.T) {
			f := newFixture(t)
			startDaemon(t, f.opts)
			op := f.env.createOp(t, f.machine, typ)
			done := f.env.waitOp(t, op.Name, opTimeout)
			if done.Status.State != v1alpha3.OperationComplete {
				t.Fatalf("operation ended %s: %s", done.Status.State, done.Status.Message)
			}
			if n := f.fake.startCount(unit); n != 1 || len(f.fake.starts) != 1 {
				t.Fatalf("starts = %v, want %s once", f.fake.starts, unit)
			}
		})
	}
}

func TestFailingUnitMarksOperationFailedWithResultAndJournalLines(t *testing.T) {
	f := newFixture(t)
	f.fake.configure("unbounded-repave.service", func(u *fakeUnit) { u.fail = true })
	startDaemon(t, f.opts)

	op := f.env.createOp(t, f.machine, v1alpha3.OperationRepave)
	done := f.env.waitOp(t, op.Name, opTimeout)
	if done.Status.State != v1alpha3.OperationFailed || done.Status.Reason != ReasonUnitFailed {
		t.Fatalf("operation ended %s/%s, want Failed/%s", done.Status.State, done.Status.Reason, ReasonUnitFailed)
	}
	for _, want := range []string{"job failed", "result exit-code", "exit status 1", "step 3: disk full"} {
		if !strings.Contains(done.Status.Message, want) {
			t.Errorf("message lacks %q:\n%s", want, done.Status.Message)
		}
	}
	eventually(t, opTimeout, "event OperationFailed on the Machine", func() bool {
		return strings.Contains(strings.Join(f.machineEvents(t), ","), "OperationFailed")
	})
}

func TestDaemonRestartedMidOperationWaitsForTheUnitAndNeverStartsItAgain(t *testing.T) {
	f := newFixture(t)
	hold := make(chan struct{})
	f.fake.configure("unbounded-repave.service", func(u *fakeUnit) { u.hold = hold })
	first := startDaemon(t, f.opts)

	op := f.env.createOp(t, f.machine, v1alpha3.OperationRepave)
	eventually(t, opTimeout, "unit started", func() bool { return f.fake.startCount("unbounded-repave.service") == 1 })
	if err := first.stop(t); err != nil {
		t.Fatalf("first daemon: %v", err)
	}
	if s := f.env.getOp(t, op.Name).Status.State; s != v1alpha3.OperationInProgress {
		t.Fatalf("after the daemon stopped mid-run the operation is %q, want InProgress", s)
	}

	logs := f.recordLogs(t)
	startDaemon(t, f.opts)
	waitLogged(t, logs, 1, "resuming: unit still runs for this operation", "uid="+string(op.UID))
	if s := f.env.getOp(t, op.Name).Status.State; s != v1alpha3.OperationInProgress {
		t.Fatalf("while the unit still runs the operation is %q, want InProgress", s)
	}
	close(hold)
	done := f.env.waitOp(t, op.Name, opTimeout)
	if done.Status.State != v1alpha3.OperationComplete {
		t.Fatalf("operation ended %s: %s", done.Status.State, done.Status.Message)
	}
	if n := f.fake.startCount("unbounded-repave.service"); n != 1 {
		t.Fatalf("unbounded-repave.service started %d times, want 1", n)
	}
}

func TestUnitThatFinishedWhileDaemonWasDownIsReportedNotStartedAgain(t *testing.T) {
	for _, tc := range []struct {
		name      string
		fail      bool
		collected bool // systemd unloaded the unit after a success
		want      v1alpha3.OperationState
	}{
		{name: "failed", fail: true, want: v1alpha3.OperationFailed},
		{name: "succeeded", want: v1alpha3.OperationComplete},
		{name: "succeeded and garbage-collected", collected: true, want: v1alpha3.OperationComplete},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			hold := make(chan struct{})
			f.fake.configure("unbounded-repave.service", func(u *fakeUnit) { u.hold, u.fail = hold, tc.fail })
			first := startDaemon(t, f.opts)
			op := f.env.createOp(t, f.machine, v1alpha3.OperationRepave)
			eventually(t, opTimeout, "unit started", func() bool { return f.fake.startCount("unbounded-repave.service") == 1 })
			_ = first.stop(t)

			close(hold)
			eventually(t, opTimeout, "unit finished", func() bool {
				st, _ := fakeConn{f.fake}.UnitState(context.Background(), "unbounded-repave.service")
				return !st.Running()
			})
			if tc.collected {
				f.fake.collect("unbounded-repave.service")
			}

			startDaemon(t, f.opts)
			done := f.env.waitOp(t, op.Name, opTimeout)
			if done.Status.State != tc.want {
				t.Fatalf("operation ended %s (%s), want %s", done.Status.State, done.Status.Message, tc.want)
			}
			if tc.fail && !strings.Contains(done.Status.Message, "disk full") {
				t.Errorf("failure message lacks the journal lines:\n%s", done.Status.Message)
			}
			if n := f.fake.startCount("unbounded-repave.service"); n != 1 {
				t.Fatalf("unbounded-repave.service started %d times, want 1", n)
			}
		})
	}
}

func TestOperationInProgressWhoseUnitNeverStartedIsStartedOnce(t *testing.T) {
	f := newFixture(t)
	// What a daemon killed between "InProgress" and StartUnit leaves: the
	// request on disk, the operation InProgress, the unit never run.
	op := f.leftInProgress(t, v1alpha3.OperationRestart, "restart", &request.Request{
		Type: "Restart", Machine: f.machine,
		Unit: "unbounded-restart.service", RequestedAt: time.Now().UTC(), BootID: "boot-1",
	})

	startDaemon(t, f.opts)
	done := f.env.waitOp(t, op.Name, opTimeout)
	if done.Status.State != v1alpha3.OperationComplete {
		t.Fatalf("operation ended %s: %s", done.Status.State, done.Status.Message)
	}
	if n := f.fake.startCount("unbounded-restart.service"); n != 1 {
		t.Fatalf("unbounded-restart.service started %d times, want 1", n)
	}
}

func TestOperationInProgressWithoutItsRequestIsFailedAsInterrupted(t *testing.T) {
	f := newFixture(t)
	// After a reboot /run is empty: the request of an operation that was
	// running is gone, and so is the unit's state.
	op := f.leftInProgress(t, v1alpha3.OperationRepave, "", nil)
	startDaemon(t, f.opts)
	done := f.env.waitOp(t, op.Name, opTimeout)
	if done.Status.State != v1alpha3.OperationFailed || done.Status.Reason != ReasonInterrupted {
		t.Fatalf("operation ended %s/%s, want Failed/%s", done.Status.State, done.Status.Reason, ReasonInterrupted)
	}
	if n := len(f.fake.starts); n != 0 {
		t.Fatalf("units started: %v, want none", f.fake.starts)
	}
}

func TestRebootIsRequestedAfterInProgressAndCompletedByTheNextBoot(t *testing.T) {
	f := newFixture(t)
	var stateAtReboot atomic.Value
	first := startDaemon(t, f.opts)
	op := f.env.createOp(t, f.machine, v1alpha3.OperationReboot)
	eventually(t, opTimeout, "reboot requested", func() bool {
		if f.fake.rebootCount() == 1 {
			stateAtReboot.Store(f.env.getOp(t, op.Name).Status.State)
			return true
		}
		return false
	})
	if s := stateAtReboot.Load(); s != v1alpha3.OperationInProgress {
		t.Fatalf("operation state after the reboot request = %v, want InProgress", s)
	}
	_ = first.stop(t)

	// The next boot: another boot ID, and /run is empty.
	opts := f.opts
	opts.Paths = newRoot(t, f.machine)
	opts.Host.BootID = func() (string, error) { return "boot-2", nil }
	startDaemon(t, opts)
	done := f.env.waitOp(t, op.Name, opTimeout)
	if done.Status.State != v1alpha3.OperationComplete || done.Status.Reason != ReasonRebooted {
		t.Fatalf("operation ended %s/%s, want Complete/%s", done.Status.State, done.Status.Reason, ReasonRebooted)
	}
	if n := f.fake.rebootCount(); n != 1 {
		t.Fatalf("reboot requested %d times, want 1", n)
	}
}

func TestNodeThatWasReadyAndIsGoneIsRepavedOnce(t *testing.T) {
	f := newFixture(t)
	f.env.createReadyNode(t, f.machine)
	first := startDaemon(t, f.opts)
	eventually(t, opTimeout, "daemon saw its Node (Machine status.nodeName)", func() bool {
		m, err := f.env.ops.machines.Get(context.Background(), f.machine)
		return err == nil && m.Status.NodeName == f.machine
	})
	if err := f.env.kube.CoreV1().Nodes().Delete(context.Background(), f.machine, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, opTimeout, "repave started", func() bool { return f.fake.startCount("unbounded-repave.service") == 1 })
	req, err := request.Read(f.opts.Paths, "repave")
	if err != nil || !strings.HasPrefix(req.UID, "node:") || req.Operation != "" {
		t.Fatalf("repave request = %+v, %v; want a node: uid and no operation", req, err)
	}
	eventually(t, opTimeout, "events NodeGone and OperationComplete on the Machine", func() bool {
		ev := strings.Join(f.machineEvents(t), ",")
		return strings.Contains(ev, ReasonNodeGone) && strings.Contains(ev, "OperationComplete")
	})
	_ = first.stop(t)
	startDaemon(t, f.opts)
	f.settled(t)
	if n := f.fake.startCount("unbounded-repave.service"); n != 1 {
		t.Fatalf("unbounded-repave.service started %d times, want 1", n)
	}
}

func TestNodeDeletedByARunningRepaveIsNotRepavedAgain(t *testing.T) {
	f := newFixture(t)
	f.env.createReadyNode(t, f.machine)
	hold := make(chan struct{})
	f.fake.configure("unbounded-repave.service", func(u *fakeUnit) { u.hold = hold })
	logs := f.recordLogs(t)
	startDaemon(t, f.opts)
	eventually(t, opTimeout, "daemon saw its Node", func() bool {
		m, err := f.env.ops.machines.Get(context.Background(), f.machine)
		return err == nil && m.Status.NodeName == f.machine
	})
	op := f.env.createOp(t, f.machine, v1alpha3.OperationRepave)
	eventually(t, opTimeout, "repave started", func() bool { return f.fake.startCount("unbounded-repave.service") == 1 })
	// The repave drains and deletes the Node before it builds the new one.
	if err := f.env.kube.CoreV1().Nodes().Delete(context.Background(), f.machine, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitLogged(t, logs, 1, "Node deleted while a unit runs; not a loss")
	close(hold)
	f.env.waitOp(t, op.Name, opTimeout)
	f.settled(t)
	if n := f.fake.startCount("unbounded-repave.service"); n != 1 {
		t.Fatalf("unbounded-repave.service started %d times, want 1", n)
	}
}

func TestInstallationOwningTheHostStopsTheDaemonWithErrOwned(t *testing.T) {
	f := newFixture(t)
	lock, err := state.AcquireOwnership(f.opts.Paths, "reprovision", "unbounded-reprovision.service")
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Release()
	d := startDaemon(t, f.opts)
	select {
	case <-d.done:
		if !errors.Is(d.err, state.ErrOwned) {
			t.Fatalf("Run = %v, want ErrOwned", d.err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("daemon kept running while an installation owns the host")
	}
	if len(f.fake.starts) != 0 {
		t.Fatalf("units started: %v", f.fake.starts)
	}
}

// The older agent's node, not adopted yet (unbounded-lifecycle.service
// adopts it, or refused to and said why): the daemon defers, as to an
// installation, and the older agent keeps its node.
func TestAnOlderAgentsNodeNotAdoptedStopsTheDaemonWithErrOwned(t *testing.T) {
	f := newFixture(t)
	p := f.opts.Paths
	os.MkdirAll(p.LegacyStateDir(), 0o755)
	if err := os.WriteFile(p.LegacyAppliedConfig("kube1"), []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, f.opts)
	select {
	case <-d.done:
		if !errors.Is(d.err, state.ErrNotAdopted) {
			t.Fatalf("Run = %v, want ErrNotAdopted", d.err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("daemon kept running beside the older agent's node")
	}
	if len(f.fake.starts) != 0 {
		t.Fatalf("units started: %v", f.fake.starts)
	}
}

// countingTransport counts the requests a client sends, by verb and path.
type countingTransport struct {
	mu   sync.Mutex
	reqs []string
}

type countingRoundTripper struct {
	next http.RoundTripper
	c    *countingTransport
}

func (r countingRoundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	r.c.mu.Lock()
	r.c.reqs = append(r.c.reqs, req.Method+" "+req.URL.Path+"?"+req.URL.RawQuery)
	r.c.mu.Unlock()
	return r.next.RoundTrip(req)
}

func (c *countingTransport) since(n int) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.reqs[n:]...)
}

func (c *countingTransport) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.reqs)
}

// countRequests wraps every transport built from cfg (one per client the
// daemon makes) so that all of them count into one countingTransport.
func countRequests(cfg *rest.Config) (*rest.Config, *countingTransport) {
	ct := &countingTransport{}
	cfg = rest.CopyConfig(cfg)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return countingRoundTripper{next: rt, c: ct}
	}
	return cfg, ct
}

// Idleness can only be shown by a quiet period: no event marks "the
// daemon did not send a request".
const (
	// idleSettle lets the daemon's own status write come back to it
	// through the Machine watch: one round trip to a loopback API server,
	// with room for a loaded 2-core CI machine.
	idleSettle = time.Second
	// idleWindow is many times the shortest period the daemon polls at
	// (PollInterval, 20 ms in these tests) and longer than a scheduling
	// stall on a loaded 2-core machine. (The Machine status is retried
	// after 30 s, but only after a failed write.)
	idleWindow = 3 * time.Second
)

func TestIdleDaemonSendsNoRequestsBeyondItsThreeWatches(t *testing.T) {
	f := newFixture(t)
	f.env.createReadyNode(t, f.machine)
	var ct *countingTransport
	f.opts.REST, ct = countRequests(f.opts.REST)
	startDaemon(t, f.opts)
	eventually(t, opTimeout, "Machine registered and reported", func() bool {
		m, err := f.env.ops.machines.Get(context.Background(), f.machine)
		return err == nil && m.Status.NodeName == f.machine && m.Status.Agent != nil
	})
	time.Sleep(idleSettle)
	n := ct.count()
	time.Sleep(idleWindow)
	if extra := ct.since(n); len(extra) > 0 {
		t.Fatalf("idle daemon sent %d requests: %v", len(extra), extra)
	}
	var watches int
	for _, r := range ct.since(0) {
		if strings.Contains(r, "watch=true") {
			watches++
		}
	}
	if watches != 3 {
		t.Errorf("daemon opened %d watches, want 3 (Machine, Node, operations); all requests: %v", watches, ct.since(0))
	}
}

// A Machine the allocation fence left Pending when it allowed a node it
// had refused (the fence cannot tell when the node is up) is Ready once
// its Node is: nothing else sets the phase back.
func TestPendingMachineIsReadyOnceItsNodeIs(t *testing.T) {
	f := newFixture(t)
	_, err := f.env.ops.machines.MutateStatus(context.Background(), f.machine, func(m *v1alpha3.Machine) bool {
		// Bootstrapped long ago; the fence refused a later boot, then
		// allowed it.
		m.Status.Bootstrap = &v1alpha3.BootstrapStatus{State: v1alpha3.BootstrapSucceeded}
		m.Status.Phase = v1alpha3.MachinePending
		meta.SetStatusCondition(&m.Status.Conditions, metav1.Condition{Type: v1alpha3.ConditionAllocationLaunchRefused,
			Status: metav1.ConditionFalse, Reason: v1alpha3.ReasonAllowed, Message: "the allocation fence allowed the node start"})
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	startDaemon(t, f.opts)
	f.settled(t)
	if m, err := f.env.ops.machines.Get(context.Background(), f.machine); err != nil || m.Status.Phase != v1alpha3.MachinePending {
		t.Fatalf("phase %v (%v) before the Node is Ready, want Pending", m.Status.Phase, err)
	}
	f.env.createReadyNode(t, f.machine)
	eventually(t, opTimeout, "phase Ready once the Node is", func() bool {
		m, err := f.env.ops.machines.Get(context.Background(), f.machine)
		return err == nil && m.Status.Phase == v1alpha3.MachineReady
	})
}
