package fleet

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"unbounded-cloud.io/agent/lib/api/identity"
	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/kube"
	"unbounded-cloud.io/agent/tests/kubeenv"
)

// Against the real API server with the agent's manifests: join's token
// authenticates in the machine's bootstrap group until it is revoked;
// the fleet table and describe show what the API server holds.
func TestJoinGetAndDescribeAgainstTheAPIServer(t *testing.T) {
	env := kubeenv.Get(t)
	ctx := context.Background()
	c := env.Client()
	if err := CheckInstalled(ctx, c.Discovery(), c); err != nil {
		t.Fatalf("the test cluster has the manifests: %v", err)
	}
	name := kubeenv.UniqueName(t, "join")
	o := JoinOptions{Machine: name, TTL: time.Hour, Mode: "none", APIServer: env.Host(), KubernetesVersion: "1.36.3", CA: env.CAPEM(t)}
	j, err := Join(ctx, c, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Revoke(context.Background(), c, name) })
	var ok bool
	var groups []string
	for range 40 { // the authenticator's Secret informer catches up
		if ok, _, groups, err = env.TokenAuthenticated(ctx, j.Token); ok {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	if !ok || !slices.Contains(groups, identity.BootstrapGroup(name)) || !slices.Contains(groups, identity.BootstrapAgentsGroup) {
		t.Fatalf("join's token: authenticated %v (%v), groups %v", ok, err, groups)
	}
	if n, err := Revoke(ctx, c, name); err != nil || n != 1 {
		t.Fatalf("revoke: %d %v", n, err)
	}
	for range 40 {
		if ok, _, _, _ = env.TokenAuthenticated(ctx, j.Token); !ok {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	if ok {
		t.Error("a revoked token still authenticates")
	}

	// The fleet: a Machine with status, its Node Ready, an operation.
	m, err := kube.NewMachines(env.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	mc, err := m.Create(ctx, &v1alpha3.Machine{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1alpha3.MachineSpec{Kubernetes: v1alpha3.KubernetesSpec{Version: "1.36.3"}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		env.Dynamic().Resource(v1alpha3.SchemeGroupVersion.WithResource(v1alpha3.ResourceMachines)).Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	mc.Status.Phase = v1alpha3.MachineReady
	mc.Status.Isolation = &v1alpha3.IsolationStatus{Mode: "nspawn", Slot: "kube2"}
	mc.Status.Agent = &v1alpha3.AgentStatus{Version: "0.1.0"}
	mc.Status.NodeName = name
	mc.Status.Conditions = []metav1.Condition{{Type: "Bootstrapped", Status: metav1.ConditionTrue, Reason: "Succeeded", Message: "node up", LastTransitionTime: metav1.Now()}}
	if _, err := m.UpdateStatus(ctx, mc); err != nil {
		t.Fatal(err)
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if _, err = c.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
	// The control plane's node controllers write a new Node too (taints,
	// its lease's owner): the status goes on the latest version.
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		node, err := c.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		node.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
		_, err = c.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	op := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha3.SchemeGroupVersion.String(), "kind": "MachineOperation",
		"metadata": map[string]any{"name": name + "-repave", "labels": map[string]any{v1alpha3.MachineLabel: name}},
		"spec":     map[string]any{"machineRef": map[string]any{"name": name}, "operation": string(v1alpha3.OperationRepave)},
	}}
	opsRes := env.Dynamic().Resource(v1alpha3.SchemeGroupVersion.WithResource(v1alpha3.ResourceMachineOperations))
	if _, err := opsRes.Create(ctx, op, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { opsRes.Delete(context.Background(), name+"-repave", metav1.DeleteOptions{}) })

	rows, err := Rows(ctx, m, c)
	if err != nil {
		t.Fatal(err)
	}
	var row *Row
	for i := range rows {
		if rows[i].Machine == name {
			row = &rows[i]
		}
	}
	want := Row{Machine: name, Phase: "Ready", Mode: "nspawn", Slot: "kube2", Kubernetes: "1.36.3", Agent: "0.1.0", NodeReady: "True", LastOp: "Repave", LastResult: "Pending"}
	if row == nil {
		t.Fatalf("%s not in the table: %+v", name, rows)
	}
	got := *row
	got.Created = time.Time{}
	if got != want {
		t.Errorf("row:\n %+v\nwant\n %+v", got, want)
	}
	var out bytes.Buffer
	if err := PrintRows(&out, rows, true, time.Now()); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out.String(), "MACHINE ") || !strings.Contains(out.String(), name) || !strings.Contains(out.String(), "REASON") {
		t.Errorf("table:\n%s", out.String())
	}
	if b, err := json.Marshal(rows); err != nil || !json.Valid(b) {
		t.Errorf("json: %v", err)
	}
	out.Reset()
	if err := Describe(ctx, &out, m, c, name, time.Now()); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"Phase:", "Ready", "Bootstrapped", "node up", name + "-repave", "Repave", "Events:"} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("describe lacks %q:\n%s", s, out.String())
		}
	}
	if err := Describe(ctx, &out, m, c, name+"-missing", time.Now()); err == nil {
		t.Error("describe of a missing machine")
	}
}

// Against the real API server with the agent's manifests (its CRD schema
// and admission policies judge the operations): a roll of three hosts,
// at most two at once, stops at the host whose operation fails, naming
// it; --resume skips the two that completed and retries it. The test
// plays the hosts' daemons and kubelets: each operation goes InProgress,
// then Complete with its Node written Ready afresh, or Failed. The roll
// waits on watches: its requests stay a handful per host.
func TestRollAgainstTheAPIServerStopsAtAFailureAndResumes(t *testing.T) {
	env := kubeenv.Get(t)
	ctx := context.Background()
	var counter RequestCounter
	cfg := env.RESTConfig()
	counter.Wrap(cfg)
	m, err := kube.NewMachines(cfg)
	if err != nil {
		t.Fatal(err)
	}
	admin, err := kube.NewMachines(env.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	pool, names, id := rollFixture(t, env, admin, 3)
	hosts := playDaemons(t, env, admin, id, func(op *v1alpha3.MachineOperation) string {
		if op.Name == names[2]+"-"+id {
			return "unbounded-repave.service: exit-code 1: the new slot never became healthy"
		}
		return ""
	})

	// Bounded: a roll whose hosts never answer waits for them.
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	o := RollOptions{Operation: v1alpha3.OperationRepave, Selector: "pool=" + pool, MaxUnavailable: 2, ID: id, Out: &out, Requests: counter.Count}
	err = Roll(ctx, m, kubernetes.NewForConfigOrDie(cfg), o)
	if !errors.Is(err, ErrRollFailed) || !strings.Contains(err.Error(), names[2]) || !strings.Contains(err.Error(), "UnitFailed") {
		t.Fatalf("error %v, want the roll stopped at %s\n%s", err, names[2], out.String())
	}
	if got := hosts.maxInFlight(); got > 2 {
		t.Errorf("%d hosts had an operation in flight at once", got)
	}
	if !strings.Contains(out.String(), "2 done, 1 failed") || !strings.Contains(out.String(), "--roll "+id+" --resume") {
		t.Errorf("output:\n%s", out.String())
	}
	// Requests: a list of the Machines and of the roll's operations, and
	// per host two watches and a create.
	if n := counter.Count(); n > 2+4*3 {
		t.Errorf("%d requests for 3 hosts: the roll polls\n%s", n, out.String())
	}

	out.Reset()
	o.Resume = true
	if err := Roll(ctx, m, kubernetes.NewForConfigOrDie(cfg), o); err != nil {
		t.Fatalf("resume: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "1 done, 0 failed, 2 skipped") || !strings.Contains(out.String(), "requests: ") {
		t.Errorf("resume output:\n%s", out.String())
	}
	l, err := admin.ListOperations(ctx, RollLabel+"="+id)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, op := range l.Items {
		got = append(got, op.Name+"="+string(op.Status.State))
	}
	slices.Sort(got)
	want := []string{names[0] + "-" + id + "=Complete", names[1] + "-" + id + "=Complete", names[2] + "-" + id + "-2=Complete", names[2] + "-" + id + "=Failed"}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("the roll's operations:\n %v\nwant\n %v", got, want)
	}
}

// A join's token expires: the cluster's token cleaner (run by the test
// control plane's kube-controller-manager) deletes its Secret, and it no
// longer authenticates. Joined as if 57 s ago with the shortest TTL
// (1 min): it expires 3 s into the test.
func TestAJoinsTokenExpiresAndTheClustersTokenCleanerDeletesIt(t *testing.T) {
	env := kubeenv.Get(t)
	ctx := context.Background()
	c := env.Client()
	name := kubeenv.UniqueName(t, "expire")
	j, err := Join(ctx, c, JoinOptions{Machine: name, TTL: time.Minute, Mode: "none", APIServer: env.Host(), KubernetesVersion: "1.36.3", CA: env.CAPEM(t),
		Now: func() time.Time { return time.Now().Add(-57 * time.Second) }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Revoke(context.Background(), c, name) })
	if until := time.Until(j.Expires); until > 5*time.Second {
		t.Fatalf("the token expires in %v: the test's clock is not in use", until)
	}
	secret := "bootstrap-token-" + j.TokenID
	begin := time.Now()
	gone := false
	for range 120 { // the cleaner deletes it at its expiry
		if _, err := c.CoreV1().Secrets(metav1.NamespaceSystem).Get(ctx, secret, metav1.GetOptions{}); apierrors.IsNotFound(err) {
			gone = true
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	if !gone {
		t.Fatalf("Secret %s still there %v after the token expired (%s)", secret, time.Since(j.Expires).Round(time.Second), j.Expires)
	}
	t.Logf("the token cleaner deleted %s %v after the test began (expiry %s)", secret, time.Since(begin).Round(100*time.Millisecond), j.Expires.Format(time.RFC3339))
	if ok, _, _, err := env.TokenAuthenticated(ctx, j.Token); ok || err != nil {
		t.Errorf("the expired token: authenticated %v (%v)", ok, err)
	}
	if l, err := ListJoins(ctx, c); err != nil {
		t.Fatal(err)
	} else {
		for _, e := range l {
			if e.Machine == name {
				t.Errorf("join --list still shows the expired token: %+v", e)
			}
		}
	}
}

// rollFixture makes n Machines labelled pool=POOL, each with a Ready
// Node, named in the order -l takes them, and a roll ID whose operations
// go when the test ends.
func rollFixture(t testing.TB, env *kubeenv.Env, admin *kube.Machines, n int) (pool string, names []string, id string) {
	ctx := context.Background()
	c := env.Client()
	pool = kubeenv.UniqueName(t, "pool")
	base := kubeenv.UniqueName(t, "roll")
	for i := range n {
		name := fmt.Sprintf("%s-%02d", base, i+1) // -l takes them in name order
		names = append(names, name)
		if _, err := admin.Create(ctx, &v1alpha3.Machine{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"pool": pool}},
			Spec: v1alpha3.MachineSpec{Kubernetes: v1alpha3.KubernetesSpec{Version: "1.36.3"}}}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			env.Dynamic().Resource(v1alpha3.SchemeGroupVersion.WithResource(v1alpha3.ResourceMachines)).Delete(context.Background(), name, metav1.DeleteOptions{})
		})
		if _, err := c.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
		env.WriteNodeReady(t, name)
	}
	id = kubeenv.UniqueName(t, "id")
	opsRes := env.Dynamic().Resource(v1alpha3.SchemeGroupVersion.WithResource(v1alpha3.ResourceMachineOperations))
	t.Cleanup(func() {
		opsRes.DeleteCollection(context.Background(), metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: RollLabel + "=" + id})
	})
	return pool, names, id
}

// daemons are the hosts' side of the kube-tier roll.
type daemons struct {
	mu            sync.Mutex
	inFlight, max int
	// seen: when each operation was seen (the watch's event); ready:
	// when each host's Node was written Ready after its operation.
	seen, ready []time.Time
}

func (d *daemons) maxInFlight() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.max
}

// playDaemons plays every host's daemon for the roll id until the test
// ends: a new operation goes InProgress, then Failed with the message
// fail returns, or Complete followed by a fresh Ready on its Node.
func playDaemons(t testing.TB, env *kubeenv.Env, m *kube.Machines, id string, fail func(*v1alpha3.MachineOperation) string) *daemons {
	ctx, cancel := context.WithCancel(context.Background())
	w, err := m.WatchOperations(ctx, RollLabel+"="+id, "")
	if err != nil {
		t.Fatal(err)
	}
	d := &daemons{}
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); w.Stop(); wg.Wait() })
	seen := map[string]bool{}
	wg.Go(func() {
		for e := range w.ResultChan() {
			op, ok := e.Object.(*v1alpha3.MachineOperation)
			if !ok || e.Type == watch.Bookmark || seen[op.Name] || op.Status.State.Finished() {
				continue
			}
			seen[op.Name] = true
			d.mu.Lock()
			d.seen = append(d.seen, time.Now())
			d.inFlight++
			d.max = max(d.max, d.inFlight)
			d.mu.Unlock()
			wg.Go(func() { d.run(ctx, t, env, op.DeepCopy(), fail(op)) })
		}
	})
	return d
}

func (d *daemons) run(ctx context.Context, t testing.TB, env *kubeenv.Env, op *v1alpha3.MachineOperation, fail string) {
	res := env.Dynamic().Resource(v1alpha3.SchemeGroupVersion.WithResource(v1alpha3.ResourceMachineOperations))
	write := func(state v1alpha3.OperationState, reason, msg string) bool {
		now := metav1.Now()
		op.Status.State, op.Status.Reason, op.Status.Message = state, reason, msg
		if op.Status.StartTime == nil {
			op.Status.StartTime = &now
		}
		if state.Finished() {
			op.Status.CompletionTime = &now
		}
		op.APIVersion, op.Kind = v1alpha3.SchemeGroupVersion.String(), "MachineOperation" // a watch's objects come without
		u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(op)
		if err != nil {
			t.Error(err)
			return false
		}
		out, err := res.UpdateStatus(ctx, &unstructured.Unstructured{Object: u}, metav1.UpdateOptions{})
		if err != nil {
			if ctx.Err() == nil {
				t.Errorf("host double: status of %s: %v", op.Name, err)
			}
			return false
		}
		op.ResourceVersion = out.GetResourceVersion()
		return true
	}
	time.Sleep(200 * time.Millisecond)
	if !write(v1alpha3.OperationInProgress, "Dispatched", "started unbounded-repave.service") {
		return
	}
	time.Sleep(1100 * time.Millisecond) // a heartbeat in a later second than the start
	d.mu.Lock()
	d.inFlight-- // before the roll can see the host done
	d.mu.Unlock()
	if fail != "" {
		write(v1alpha3.OperationFailed, "UnitFailed", fail)
		return
	}
	if write(v1alpha3.OperationComplete, "Succeeded", "unbounded-repave.service succeeded") {
		env.WriteNodeReady(t, op.Spec.MachineRef.Name)
		d.mu.Lock()
		d.ready = append(d.ready, time.Now())
		d.mu.Unlock()
	}
}

// BenchmarkRoll: a rolling repave of 8 hosts, at most 2 at once, against
// the real API server, the hosts played as in the kube test (each
// operation about 1.3 s from its creation to its Node Ready). Reported:
// the plugin's API requests per host (a list of the Machines and of the
// roll's operations, a create and two watches per host: watches, not
// polls), the same per host per minute of the roll, and the time from a
// host's Node Ready to the next host's operation seen by the hosts'
// watch (the roll's reaction; median and worst).
func BenchmarkRoll(b *testing.B) {
	env := kubeenv.Get(b)
	admin, err := kube.NewMachines(env.RESTConfig())
	if err != nil {
		b.Fatal(err)
	}
	const n, at = 8, 2
	for b.Loop() {
		var counter RequestCounter
		cfg := env.RESTConfig()
		counter.Wrap(cfg)
		m, err := kube.NewMachines(cfg)
		if err != nil {
			b.Fatal(err)
		}
		pool, _, id := rollFixture(b, env, admin, n)
		hosts := playDaemons(b, env, admin, id, func(*v1alpha3.MachineOperation) string { return "" })
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		var out bytes.Buffer
		begin := time.Now()
		err = Roll(ctx, m, kubernetes.NewForConfigOrDie(cfg), RollOptions{Operation: v1alpha3.OperationRepave, Selector: "pool=" + pool, MaxUnavailable: at, ID: id, Out: &out})
		took := time.Since(begin)
		cancel()
		if err != nil {
			b.Fatalf("roll: %v\n%s", err, out.String())
		}
		hosts.mu.Lock()
		seen, ready := slices.Clone(hosts.seen), slices.Clone(hosts.ready)
		hosts.mu.Unlock()
		// The operations after the first `at` each wait for a host to be
		// done: the gap from the latest Ready before it.
		var gaps []time.Duration
		for _, s := range seen[min(at, len(seen)):] {
			var last time.Time
			for _, r := range ready {
				if r.Before(s) && r.After(last) {
					last = r
				}
			}
			if !last.IsZero() {
				gaps = append(gaps, s.Sub(last))
			}
		}
		if len(gaps) == 0 {
			b.Fatalf("no gap measured: operations seen %d, Nodes Ready %d\n%s", len(seen), len(ready), out.String())
		}
		slices.Sort(gaps)
		reqs := float64(counter.Count())
		b.ReportMetric(reqs/n, "requests/host")
		b.ReportMetric(reqs/n/took.Minutes(), "requests/host/min")
		b.ReportMetric(float64(gaps[len(gaps)/2].Milliseconds()), "ready-to-next-ms")
		b.ReportMetric(float64(gaps[len(gaps)-1].Milliseconds()), "ready-to-next-max-ms")
		b.ReportMetric(took.Seconds(), "roll-s")
	}
}
