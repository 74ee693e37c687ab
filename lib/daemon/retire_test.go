package daemon

// Bootstrap registers the Machine; the cluster side deletes it to retire
// the host. The daemon never creates it, and acts on the host only while
// it lives (see followMachine), against the real API server.

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
)

// quietPeriod is how long a test watches for something that must not
// happen and has no signal of its own (an operation not dispatched, a
// request not sent). A dispatch on loopback takes a few tens of
// milliseconds; 2 s leaves room for a loaded 2-core machine.
const quietPeriod = 2 * time.Second

// recorder keeps the daemon's log and its sd_notify messages.
type recorder struct {
	mu     sync.Mutex
	log    bytes.Buffer
	status []string
}

func (r *recorder) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.log.Write(p)
}

func (r *recorder) notify(s string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.status = append(r.status, s)
	return nil
}

func (r *recorder) logged(s string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Count(r.log.String(), s)
}

func (r *recorder) lastStatus() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := len(r.status) - 1; i >= 0; i-- {
		if strings.HasPrefix(r.status[i], "STATUS=") {
			return r.status[i]
		}
	}
	return ""
}

func record(t *testing.T, f *fixture) *recorder {
	r := &recorder{}
	f.opts.Log = slog.New(slog.NewTextHandler(r, &slog.HandlerOptions{Level: slog.LevelInfo}))
	f.opts.Host.Notify = r.notify
	t.Cleanup(func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		t.Logf("daemon log:\n%s", r.log.String())
	})
	return r
}

// logSoon waits up to opTimeout for the daemon to log s, and reports it
// as an error (not fatal: the checks of what the daemon did still run).
func logSoon(t *testing.T, rec *recorder, s string) {
	t.Helper()
	deadline := time.Now().Add(opTimeout)
	for rec.logged(s) == 0 {
		if time.Now().After(deadline) {
			t.Errorf("the daemon did not log %q within %s", s, opTimeout)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (f *fixture) machineGone(t *testing.T) bool {
	t.Helper()
	_, err := f.env.ops.machines.Get(context.Background(), f.machine)
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	return apierrors.IsNotFound(err)
}

// A daemon that starts before its Machine is registered waits for it:
// it does not create it, does not carry out the operations already
// waiting, says so once, and follows the Machine once bootstrap registers
// it.
func TestDaemonWaitsForItsMachineWithoutCreatingIt(t *testing.T) {
	env := getEnv(t)
	f := newFixture(t)
	f.machine = env.newUnregisteredMachine(t)
	f.opts.Machine = f.machine
	f.opts.Paths = newRoot(t, f.machine)
	f.opts.REST = env.agentConfig(t, f.machine)
	rec := record(t, f)
	op := env.createOp(t, f.machine, v1alpha3.OperationRestart)
	startDaemon(t, f.opts)

	logSoon(t, rec, "Machine does not exist")
	if !f.machineGone(t) {
		t.Fatal("the daemon created its Machine; only bootstrap registers it")
	}
	if got := env.getOp(t, op.Name).Status.State; got != "" {
		t.Fatalf("operation %s is %q without a Machine, want untouched", op.Name, got)
	}
	if s := rec.lastStatus(); !strings.Contains(s, "waiting for Machine") {
		t.Errorf("sd_notify status %q, want it to say the daemon waits for its Machine", s)
	}

	// Bootstrap registers it: the daemon follows it and carries the
	// waiting operation out, once.
	env.registerMachine(t, f.machine)
	done := env.waitOp(t, op.Name, opTimeout)
	if done.Status.State != v1alpha3.OperationComplete {
		t.Fatalf("operation ended %s: %s", done.Status.State, done.Status.Message)
	}
	if n := f.fake.startCount("unbounded-restart.service"); n != 1 {
		t.Errorf("unbounded-restart.service started %d times, want 1", n)
	}
	if n := rec.logged("Machine does not exist"); n != 1 {
		t.Errorf("the wait was logged %d times, want once", n)
	}
}

// A Machine the cluster side deletes means the host is being retired:
// from its deletion timestamp on the daemon starts nothing and writes
// nothing, and once it is gone the daemon does not recreate it. It logs
// each step once and stays up, idle, with only its Machine watched.
func TestDaemonStopsActingOnARetiredMachineAndNeverRecreatesIt(t *testing.T) {
	env := getEnv(t)
	f := newFixture(t)
	// newFixture registered the Machine; hold its deletion with a
	// finalizer, as a cluster-side controller that drains the host would.
	cur, err := env.ops.machines.Get(context.Background(), f.machine)
	if err != nil {
		t.Fatal(err)
	}
	cur.Finalizers = []string{"unbounded-cloud.io/test-retire"}
	if _, err := env.ops.machines.Update(context.Background(), cur); err != nil {
		t.Fatal(err)
	}
	var ct *countingTransport
	f.opts.REST, ct = countRequests(f.opts.REST)
	rec := record(t, f)
	run := startDaemon(t, f.opts)
	eventually(t, opTimeout, "the daemon reported itself on its Machine", func() bool {
		m, err := env.ops.machines.Get(context.Background(), f.machine)
		return err == nil && m.Status.Agent != nil
	})

	if err := env.deleteMachine(f.machine); err != nil {
		t.Fatal(err)
	}
	logSoon(t, rec, "Machine is being deleted")
	mark := ct.count()
	op := env.createOp(t, f.machine, v1alpha3.OperationRepave)
	time.Sleep(quietPeriod)
	if got := env.getOp(t, op.Name).Status.State; got != "" {
		t.Errorf("operation for a deleting Machine is %q, want untouched", got)
	}
	if n := f.fake.startCount("unbounded-repave.service"); n != 0 {
		t.Errorf("unbounded-repave.service started %d times for a deleting Machine", n)
	}
	if extra := ct.since(mark); len(extra) > 0 {
		t.Errorf("requests to the cluster while the Machine is being deleted: %v", extra)
	}

	// The finalizer goes: the Machine is gone. The old daemon recreated
	// it at once from the DELETED event.
	cur, err = env.ops.machines.Get(context.Background(), f.machine)
	if err != nil {
		t.Fatal(err)
	}
	cur.Finalizers = nil
	if _, err := env.ops.machines.Update(context.Background(), cur); err != nil {
		t.Fatal(err)
	}
	logSoon(t, rec, "Machine was deleted")
	if !f.machineGone(t) {
		t.Fatal("the daemon recreated its deleted Machine")
	}
	if s := rec.lastStatus(); !strings.Contains(s, "deleted (host retiring)") {
		t.Errorf("sd_notify status %q, want it to say the host is retiring", s)
	}
	if extra := ct.since(mark); len(extra) > 0 {
		t.Errorf("requests to the cluster after the retirement began: %v", extra)
	}
	select {
	case <-run.done:
		t.Fatalf("the daemon exited (%v); it stays up, idle", run.err)
	default:
	}
	for _, s := range []string{"Machine is being deleted", "Machine was deleted"} {
		if n := rec.logged(s); n != 1 {
			t.Errorf("%q logged %d times, want once", s, n)
		}
	}
}

// A daemon on its bootstrap token requests its client certificate in the
// background, but only while its Machine lives: a host not registered yet,
// or being retired, mints itself no new credential.
func TestDaemonRequestsNoCertificateWithoutALiveMachine(t *testing.T) {
	env := getEnv(t)
	machine := env.newUnregisteredMachine(t)
	p := tokenHost(t, env, machine)
	csrs := func() []string {
		list, err := env.kube.CertificatesV1().CertificateSigningRequests().List(context.Background(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, c := range list.Items {
			if strings.HasPrefix(c.Name, "unbounded-agent-"+machine+"-") {
				names = append(names, c.Name)
			}
		}
		return names
	}
	t.Cleanup(func() {
		for _, n := range csrs() {
			_ = env.kube.CertificatesV1().CertificateSigningRequests().Delete(context.Background(), n, metav1.DeleteOptions{})
		}
	})
	f := &fixture{env: env, machine: machine, fake: newFakeSystemd()}
	f.opts = Options{Paths: p, Host: f.fake.host(), PollInterval: 20 * time.Millisecond}
	rec := record(t, f)
	startDaemon(t, f.opts)

	logSoon(t, rec, "Machine does not exist")
	time.Sleep(quietPeriod) // a request has no signal of its own
	if n := csrs(); len(n) > 0 {
		t.Fatalf("CSRs %v requested while the Machine does not exist", n)
	}
	env.registerMachine(t, machine)
	eventually(t, opTimeout, "a CSR once the Machine is registered", func() bool { return len(csrs()) > 0 })
}
