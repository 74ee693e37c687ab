package controller

// Rollouts against the real API server of tests/kube (kube tier), with the
// agent's CRDs and admission policies: the test plays the hosts' daemons
// and kubelets (an operation goes InProgress, then Complete with its Node
// written Ready afresh, or Failed), and the controller acts only on this
// test's rollouts (by name).

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/kube/clustertest"
	"unbounded-cloud.io/agent/lib/rollout"
)

// startRollouts runs a manager with the rollout controller, acting only on
// the rollouts whose name contains prefix; the returned stop ends it (also
// at the test's end).
func startRollouts(t *testing.T, cfg *rest.Config, prefix string) (stop func()) {
	t.Helper()
	return startRolloutsLeading(t, cfg, prefix, lease{}, nil)
}

// startRolloutsLeading is startRollouts with leader election as l says;
// elected, when not nil, gets the manager's channel that closes once it
// leads.
func startRolloutsLeading(t *testing.T, cfg *rest.Config, prefix string, l lease, elected *<-chan struct{}) (stop func()) {
	t.Helper()
	return startManager(t, cfg, l, func(mgr ctrl.Manager) error {
		if elected != nil {
			*elected = mgr.Elected()
		}
		r := &Rollouts{Client: mgr.GetClient(), Live: mgr.GetAPIReader(), Events: mgr.GetEventRecorder("unbounded-controller"),
			only: func(name string) bool { return strings.Contains(name, prefix) }}
		return r.SetupWithManager(mgr)
	})
}

// hostsFixture creates n Machines labelled pool=prefix, each with a Ready
// Node of its name.
func hostsFixture(t *testing.T, e *clustertest.Env, prefix string, n int) []string {
	t.Helper()
	ctx := context.Background()
	kc := e.Client(t)
	machines := e.Machines(t)
	var names []string
	for i := range n {
		name := fmt.Sprintf("%s-h%d", prefix, i+1)
		names = append(names, name)
		if _, err := machines.Create(ctx, &v1alpha3.Machine{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"pool": prefix}}}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.DeleteMachine(name) })
		if _, err := kc.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { kc.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
		e.WriteNodeReady(t, name)
	}
	t.Cleanup(func() {
		c := clientFor(t, e)
		l := &v1alpha3.MachineOperationList{}
		c.List(context.Background(), l)
		for _, op := range l.Items {
			if strings.Contains(op.Name, prefix) {
				c.Delete(context.Background(), &op)
			}
		}
	})
	return names
}

func clientFor(t testing.TB, e *clustertest.Env) client.Client {
	t.Helper()
	s, err := Scheme()
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(e.Admin, client.Options{Scheme: s})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// hostsPlay plays the daemons and kubelets of the hosts of pool: every
// new operation of one of them goes InProgress, then Failed when fail
// says so, else Complete with a fresh Ready on its Node. It records the
// most operations unfinished on one host at once, and on all.
type hostsPlay struct {
	mu          sync.Mutex
	running     map[string]int // by machine
	maxPerHost  int
	total, maxN int
	seen        []string
}

func playHosts(t *testing.T, e *clustertest.Env, prefix string, hold time.Duration, fail func(op *v1alpha3.MachineOperation) string) *hostsPlay {
	t.Helper()
	return playHostsWith(t, e, prefix, hold, fail, nil, nil)
}

// playHostsWith is playHosts calling seen when it sees a new operation and
// ready when it wrote a Node Ready (nil: nothing).
func playHostsWith(t testing.TB, e *clustertest.Env, prefix string, hold time.Duration, fail func(op *v1alpha3.MachineOperation) string, seen, ready func()) *hostsPlay {
	t.Helper()
	p := &hostsPlay{running: map[string]int{}}
	c := clientFor(t, e)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	wg.Go(func() {
		seenOp := map[string]bool{}
		for ctx.Err() == nil {
			l := &v1alpha3.MachineOperationList{}
			if err := c.List(ctx, l); err == nil {
				for _, op := range l.Items {
					if seenOp[op.Name] || !strings.HasPrefix(op.Spec.MachineRef.Name, prefix) || op.Status.State.Finished() {
						continue
					}
					seenOp[op.Name] = true
					if seen != nil {
						seen()
					}
					p.mu.Lock()
					p.seen = append(p.seen, op.Name)
					m := op.Spec.MachineRef.Name
					p.running[m]++
					p.total++
					p.maxPerHost = max(p.maxPerHost, p.running[m])
					p.maxN = max(p.maxN, p.total)
					p.mu.Unlock()
					wg.Go(func() { p.run(ctx, t, c, e, op.DeepCopy(), hold, fail(&op), ready) })
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	})
	return p
}

func (p *hostsPlay) run(ctx context.Context, t testing.TB, c client.Client, e *clustertest.Env, op *v1alpha3.MachineOperation, hold time.Duration, fail string, ready func()) {
	write := func(state v1alpha3.OperationState, reason string) bool {
		now := metav1.Now()
		op.Status.State, op.Status.Reason = state, reason
		if op.Status.StartTime == nil {
			op.Status.StartTime = &now
		}
		if state.Finished() {
			op.Status.CompletionTime = &now
		}
		if err := c.Status().Update(ctx, op); err != nil {
			if ctx.Err() == nil {
				t.Errorf("host double: status of %s: %v", op.Name, err)
			}
			return false
		}
		return true
	}
	if !write(v1alpha3.OperationInProgress, "Dispatched") {
		return
	}
	select {
	case <-ctx.Done():
		return
	case <-time.After(hold): // a heartbeat in a later second than the start
	}
	p.mu.Lock()
	p.running[op.Spec.MachineRef.Name]--
	p.total--
	p.mu.Unlock()
	if fail != "" {
		write(v1alpha3.OperationFailed, fail)
		return
	}
	if write(v1alpha3.OperationComplete, "Succeeded") {
		e.WriteNodeReady(t, op.Spec.MachineRef.Name)
		if ready != nil {
			ready()
		}
	}
}

// waitRollout waits until the rollout's status satisfies ok.
func waitRollout(t *testing.T, c client.Client, name string, within time.Duration, what string, ok func(*v1alpha3.MachineRollout) bool) *v1alpha3.MachineRollout {
	t.Helper()
	ro := &v1alpha3.MachineRollout{}
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, within, true, func(ctx context.Context) (bool, error) {
		if err := c.Get(ctx, client.ObjectKey{Name: name}, ro); err != nil {
			return false, nil
		}
		return ok(ro), nil
	})
	if err != nil {
		t.Fatalf("rollout %s: not %s within %v: phase %s, %q, hosts %+v", name, what, within, ro.Status.Phase, ro.Status.Message, ro.Status.Hosts)
	}
	return ro
}

func operations(t *testing.T, c client.Client, prefix string) []string {
	t.Helper()
	l := &v1alpha3.MachineOperationList{}
	if err := c.List(context.Background(), l); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, op := range l.Items {
		if strings.HasPrefix(op.Spec.MachineRef.Name, prefix) {
			got = append(got, op.Name+"="+string(op.Status.State))
		}
	}
	slices.Sort(got)
	return got
}

// One host at a time, each done only after its Node has been Ready for
// the gate; a host whose operation fails stops the rollout with the
// others untouched; a changed spec retries it and the rollout completes.
func TestRolloutOneAtATimeStopsAtAFailureAndResumesWhenTheSpecChanges(t *testing.T) {
	e := clustertest.Get(t)
	prefix := clustertest.UniqueName("ro")
	hosts := hostsFixture(t, e, prefix, 3)
	c := clientFor(t, e)
	play := playHosts(t, e, prefix, 1100*time.Millisecond, func(op *v1alpha3.MachineOperation) string {
		if op.Spec.MachineRef.Name == hosts[1] && op.Spec.Parameters["drainTimeout"] == "" {
			return "UnitFailed"
		}
		return ""
	})
	startRollouts(t, e.Admin, prefix)

	one := intstr.FromInt32(1)
	ro := &v1alpha3.MachineRollout{ObjectMeta: metav1.ObjectMeta{Name: prefix + "-repave"}, Spec: v1alpha3.MachineRolloutSpec{
		Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"pool": prefix}}, Operation: v1alpha3.OperationRepave,
		MaxUnavailable: &one, ReadySeconds: 2, FailureThreshold: 1,
	}}
	if err := c.Create(context.Background(), ro); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Delete(context.Background(), ro) })

	got := waitRollout(t, c, ro.Name, time.Minute, "stopped", func(r *v1alpha3.MachineRollout) bool { return r.Status.Phase == v1alpha3.RolloutStopped })
	states := map[string]v1alpha3.HostState{}
	for _, h := range got.Status.Hosts {
		states[h.Name] = h.State
	}
	if states[hosts[0]] != v1alpha3.HostDone || states[hosts[1]] != v1alpha3.HostFailed || states[hosts[2]] != v1alpha3.HostPending {
		t.Fatalf("stopped with hosts %+v", got.Status.Hosts)
	}
	if ops := operations(t, c, prefix); !slices.Equal(ops, []string{rollout.OperationName(ro.Name, hosts[0], 1) + "=Complete", rollout.OperationName(ro.Name, hosts[1], 1) + "=Failed"}) {
		t.Errorf("operations when stopped: %v (the third host must be untouched)", ops)
	}
	if got.Status.Failed != 1 || got.Status.Done != 1 || got.Status.Total != 3 || !strings.Contains(got.Status.Message, "failureThreshold") {
		t.Errorf("status: %+v", got.Status)
	}

	// The fix: a changed spec (generation 2) retries the failed host.
	got.Spec.Parameters = map[string]string{"drainTimeout": "2m"}
	if err := c.Update(context.Background(), got); err != nil {
		t.Fatal(err)
	}
	waitRollout(t, c, ro.Name, time.Minute, "complete", func(r *v1alpha3.MachineRollout) bool { return r.Status.Phase == v1alpha3.RolloutComplete })
	want := []string{
		rollout.OperationName(ro.Name, hosts[0], 1) + "=Complete",
		rollout.OperationName(ro.Name, hosts[1], 1) + "=Failed",
		rollout.OperationName(ro.Name, hosts[1], 2) + "=Complete",
		rollout.OperationName(ro.Name, hosts[2], 1) + "=Complete",
	}
	slices.Sort(want)
	if ops := operations(t, c, prefix); !slices.Equal(ops, want) {
		t.Errorf("operations:\n %v\nwant\n %v", ops, want)
	}
	play.mu.Lock()
	defer play.mu.Unlock()
	if play.maxN > 1 {
		t.Errorf("%d operations ran at once, maxUnavailable 1", play.maxN)
	}
}

// Two rollouts select one host: it never has two operations at once; both
// complete. The controller is stopped and started again in the middle:
// no operation is created twice, none is lost.
func TestTwoRolloutsOverOneHostAndAControllerRestartNeverDoubleAnOperation(t *testing.T) {
	e := clustertest.Get(t)
	prefix := clustertest.UniqueName("rt")
	hosts := hostsFixture(t, e, prefix, 2)
	c := clientFor(t, e)
	play := playHosts(t, e, prefix, 1500*time.Millisecond, func(*v1alpha3.MachineOperation) string { return "" })
	stop := startRollouts(t, e.Admin, prefix)

	all := intstr.FromString("100%")
	var names []string
	for _, op := range []v1alpha3.OperationType{v1alpha3.OperationRestart, v1alpha3.OperationRepave} {
		ro := &v1alpha3.MachineRollout{ObjectMeta: metav1.ObjectMeta{Name: prefix + "-" + strings.ToLower(string(op))}, Spec: v1alpha3.MachineRolloutSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"pool": prefix}}, Operation: op, MaxUnavailable: &all, ReadySeconds: 1,
		}}
		if err := c.Create(context.Background(), ro); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Delete(context.Background(), ro) })
		names = append(names, ro.Name)
	}
	// Once the first operations run, the controller stops and starts again.
	waitRollout(t, c, names[0], time.Minute, "acting", func(r *v1alpha3.MachineRollout) bool { return r.Status.Unavailable > 0 })
	stop()
	startRollouts(t, e.Admin, prefix)
	for _, n := range names {
		waitRollout(t, c, n, 2*time.Minute, "complete", func(r *v1alpha3.MachineRollout) bool { return r.Status.Phase == v1alpha3.RolloutComplete })
	}
	var want []string
	for _, n := range names {
		for _, h := range hosts {
			want = append(want, rollout.OperationName(n, h, 1)+"=Complete")
		}
	}
	slices.Sort(want)
	if ops := operations(t, c, prefix); !slices.Equal(ops, want) {
		t.Errorf("operations:\n %v\nwant\n %v", ops, want)
	}
	play.mu.Lock()
	defer play.mu.Unlock()
	if play.maxPerHost > 1 {
		t.Errorf("a host had %d operations at once", play.maxPerHost)
	}
}

// A spec the API server takes but the rollout cannot act on (a budget
// that is neither a count nor a percentage) starts nothing and says why
// in its status.
func TestRolloutWithAnInvalidBudgetStartsNothingAndSaysWhy(t *testing.T) {
	e := clustertest.Get(t)
	prefix := clustertest.UniqueName("ri")
	hostsFixture(t, e, prefix, 1)
	c := clientFor(t, e)
	startRollouts(t, e.Admin, prefix)
	many := intstr.FromString("many")
	ro := &v1alpha3.MachineRollout{ObjectMeta: metav1.ObjectMeta{Name: prefix + "-bad"}, Spec: v1alpha3.MachineRolloutSpec{
		Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"pool": prefix}}, Operation: v1alpha3.OperationRestart, MaxUnavailable: &many}}
	if err := c.Create(context.Background(), ro); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Delete(context.Background(), ro) })
	waitRollout(t, c, ro.Name, 30*time.Second, "saying its spec is invalid", func(r *v1alpha3.MachineRollout) bool {
		return strings.Contains(r.Status.Message, "invalid spec: spec.maxUnavailable")
	})
	if ops := operations(t, c, prefix); len(ops) != 0 {
		t.Errorf("operations created: %v", ops)
	}
}

// Two replicas with leader election, the leader killed mid-rollout (it
// stops without giving up its lease, as a killed process does): the other
// leads once the lease has expired and completes the rollout; no host gets
// an operation twice, none is lost, and never two run at once.
func TestRolloutGoesOnUnderTheOtherReplicaWhenTheLeaderIsKilled(t *testing.T) {
	e := clustertest.Get(t)
	prefix := clustertest.UniqueName("rl")
	hosts := hostsFixture(t, e, prefix, 3)
	c := clientFor(t, e)
	play := playHosts(t, e, prefix, 1100*time.Millisecond, func(*v1alpha3.MachineOperation) string { return "" })

	l := lease{namespace: "default", id: prefix + "-lease"}
	var firstLeads, secondLeads <-chan struct{}
	kill := startRolloutsLeading(t, e.Admin, prefix, lease{namespace: l.namespace, id: l.id, keep: true}, &firstLeads)
	select {
	case <-firstLeads:
	case <-time.After(time.Minute):
		t.Fatal("the first replica did not lead within a minute")
	}
	startRolloutsLeading(t, e.Admin, prefix, l, &secondLeads)

	one := intstr.FromInt32(1)
	ro := &v1alpha3.MachineRollout{ObjectMeta: metav1.ObjectMeta{Name: prefix + "-restart"}, Spec: v1alpha3.MachineRolloutSpec{
		Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"pool": prefix}}, Operation: v1alpha3.OperationRestart,
		MaxUnavailable: &one, ReadySeconds: 1,
	}}
	if err := c.Create(context.Background(), ro); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Delete(context.Background(), ro) })
	waitRollout(t, c, ro.Name, time.Minute, "acting", func(r *v1alpha3.MachineRollout) bool { return r.Status.Unavailable > 0 })
	select {
	case <-secondLeads:
		t.Fatal("the second replica leads while the first holds the lease")
	default:
	}
	kill()
	killed := time.Now()
	select {
	case <-secondLeads:
		t.Logf("the second replica leads %v after the leader was killed", time.Since(killed).Round(time.Millisecond))
	case <-time.After(time.Minute):
		t.Fatal("the second replica did not lead within a minute of the leader's kill")
	}
	waitRollout(t, c, ro.Name, 2*time.Minute, "complete", func(r *v1alpha3.MachineRollout) bool { return r.Status.Phase == v1alpha3.RolloutComplete })
	var want []string
	for _, h := range hosts {
		want = append(want, rollout.OperationName(ro.Name, h, 1)+"=Complete")
	}
	slices.Sort(want)
	if ops := operations(t, c, prefix); !slices.Equal(ops, want) {
		t.Errorf("operations:\n %v\nwant\n %v", ops, want)
	}
	play.mu.Lock()
	defer play.mu.Unlock()
	if play.maxN > 1 {
		t.Errorf("%d operations ran at once, maxUnavailable 1", play.maxN)
	}
}

// A rollout of named Machines takes them in its order and no other; one
// naming a Machine that does not exist starts nothing and says which; the
// API server refuses a rollout naming its hosts both ways, or neither.
func TestRolloutOfNamedMachinesTakesThemInOrderAndRefusesAMissingOne(t *testing.T) {
	e := clustertest.Get(t)
	prefix := clustertest.UniqueName("rn")
	hosts := hostsFixture(t, e, prefix, 3)
	c := clientFor(t, e)
	play := playHosts(t, e, prefix, 1100*time.Millisecond, func(*v1alpha3.MachineOperation) string { return "" })
	startRollouts(t, e.Admin, prefix)

	create := func(name string, spec v1alpha3.MachineRolloutSpec, opts ...client.CreateOption) error {
		ro := &v1alpha3.MachineRollout{ObjectMeta: metav1.ObjectMeta{Name: prefix + "-" + name}, Spec: spec}
		err := c.Create(context.Background(), ro, opts...)
		if err == nil {
			t.Cleanup(func() { c.Delete(context.Background(), ro) })
		}
		return err
	}
	dry := &client.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	both := v1alpha3.MachineRolloutSpec{Operation: v1alpha3.OperationRestart, Machines: hosts[:1],
		Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"pool": prefix}}}
	for what, spec := range map[string]v1alpha3.MachineRolloutSpec{
		"both":    both,
		"neither": {Operation: v1alpha3.OperationRestart},
	} {
		if err := create("refused", spec, dry); err == nil || !strings.Contains(err.Error(), "one of the two") {
			t.Errorf("a rollout naming its hosts %s ways: %v, want refused saying why", what, err)
		}
	}

	one := intstr.FromInt32(1)
	if err := create("named", v1alpha3.MachineRolloutSpec{Operation: v1alpha3.OperationRestart, Machines: []string{hosts[2], hosts[0]},
		MaxUnavailable: &one, ReadySeconds: 1}); err != nil {
		t.Fatal(err)
	}
	waitRollout(t, c, prefix+"-named", time.Minute, "complete", func(r *v1alpha3.MachineRollout) bool { return r.Status.Phase == v1alpha3.RolloutComplete })
	play.mu.Lock()
	seen := slices.Clone(play.seen)
	play.mu.Unlock()
	want := []string{rollout.OperationName(prefix+"-named", hosts[2], 1), rollout.OperationName(prefix+"-named", hosts[0], 1)}
	if !slices.Equal(seen, want) {
		t.Errorf("operations in the order %v, want %v (the rollout's order, the third Machine untouched)", seen, want)
	}

	missing := prefix + "-gone"
	if err := create("missing", v1alpha3.MachineRolloutSpec{Operation: v1alpha3.OperationRestart, Machines: []string{hosts[1], missing}}); err != nil {
		t.Fatal(err)
	}
	got := waitRollout(t, c, prefix+"-missing", time.Minute, "invalid", func(r *v1alpha3.MachineRollout) bool { return r.Status.Message != "" })
	if !strings.Contains(got.Status.Message, "invalid spec") || !strings.Contains(got.Status.Message, missing) || got.Status.Phase != "" {
		t.Errorf("a rollout naming a missing Machine: phase %q, %q", got.Status.Phase, got.Status.Message)
	}
	// The status says so from the reconcile that would have started
	// the first operation.
	for _, op := range operations(t, c, prefix) {
		if strings.Contains(op, prefix+"-missing") {
			t.Errorf("an operation of the invalid rollout: %s", op)
		}
	}
}
