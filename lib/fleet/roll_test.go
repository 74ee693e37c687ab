package fleet

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
)

var opsGVR = v1alpha3.SchemeGroupVersion.WithResource(v1alpha3.ResourceMachineOperations)

// fleetDouble is the cluster of a roll's unit tests: Machines, Nodes in
// client-go's fake clientset, and MachineOperations in an object tracker
// of the agent's types (the store the fake clientset is built on, with
// its watch semantics). It records every operation created and how many
// hosts had one in flight at that moment.
type fleetDouble struct {
	machines []v1alpha3.Machine
	ops      k8stesting.ObjectTracker
	core     *fake.Clientset

	mu          sync.Mutex
	created     []v1alpha3.MachineOperation
	settled     map[string]bool // operations the host double is done with
	maxInFlight int
	onCreate    func(op *v1alpha3.MachineOperation)
}

// newFleet has machines site-w1..site-wN (label pool=edge, site-w2 also
// gpu=yes), each with a Node Ready since an hour ago.
func newFleet(t *testing.T, n int) *fleetDouble {
	s := runtime.NewScheme()
	if err := v1alpha3.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	f := &fleetDouble{ops: k8stesting.NewObjectTracker(s, serializer.NewCodecFactory(s).UniversalDecoder()), settled: map[string]bool{}}
	var nodes []runtime.Object
	old := metav1.NewTime(time.Now().Add(-time.Hour))
	for i := 1; i <= n; i++ {
		name := fmt.Sprintf("site-w%d", i)
		l := map[string]string{"pool": "edge"}
		if i == 2 {
			l["gpu"] = "yes"
		}
		f.machines = append(f.machines, v1alpha3.Machine{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: l}})
		nodes = append(nodes, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{
			{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: old, LastTransitionTime: old}}}})
	}
	f.core = fake.NewClientset(nodes...)
	return f
}

func (f *fleetDouble) List(context.Context) (*v1alpha3.MachineList, error) {
	return &v1alpha3.MachineList{Items: slices.Clone(f.machines)}, nil
}

func (f *fleetDouble) ListOperations(_ context.Context, selector string) (*v1alpha3.MachineOperationList, error) {
	sel, err := labels.Parse(selector)
	if err != nil {
		return nil, err
	}
	obj, err := f.ops.List(opsGVR, v1alpha3.SchemeGroupVersion.WithKind("MachineOperation"), "")
	if err != nil {
		return nil, err
	}
	out := &v1alpha3.MachineOperationList{}
	for _, op := range obj.(*v1alpha3.MachineOperationList).Items {
		if sel.Matches(labels.Set(op.Labels)) {
			out.Items = append(out.Items, op)
		}
	}
	return out, nil
}

func (f *fleetDouble) WatchOperations(_ context.Context, selector, rv string) (watch.Interface, error) {
	sel, err := labels.Parse(selector)
	if err != nil {
		return nil, err
	}
	w, err := f.ops.Watch(opsGVR, "", metav1.ListOptions{ResourceVersion: rv})
	if err != nil {
		return nil, err
	}
	return watch.Filter(w, func(e watch.Event) (watch.Event, bool) {
		op, ok := e.Object.(*v1alpha3.MachineOperation)
		return e, ok && sel.Matches(labels.Set(op.Labels))
	}), nil
}

func (f *fleetDouble) CreateOperation(_ context.Context, op *v1alpha3.MachineOperation) (*v1alpha3.MachineOperation, error) {
	f.mu.Lock()
	inFlight := 1
	for _, c := range f.created {
		if !f.settled[c.Name] {
			inFlight++
		}
	}
	f.maxInFlight = max(f.maxInFlight, inFlight)
	f.created = append(f.created, *op.DeepCopy())
	onCreate := f.onCreate
	f.mu.Unlock()
	if err := f.ops.Create(opsGVR, op.DeepCopy(), ""); err != nil {
		return nil, err
	}
	if onCreate != nil {
		onCreate(op)
	}
	return op, nil
}

// createdFor is the machines of the operations created, in order.
func (f *fleetDouble) createdFor() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, op := range f.created {
		out = append(out, op.Spec.MachineRef.Name)
	}
	return out
}

// play is what the host double does with one operation.
type play struct {
	fail      string // the Failed message; "" completes
	keepNode  bool   // leave the Node as it was (no fresh Ready)
	inProcess bool   // take it InProgress and leave it there
}

// playHosts runs the hosts' side until the test ends: each operation that
// is not final goes InProgress, then Complete with its Node written Ready
// afresh, or Failed, as decide says.
func (f *fleetDouble) playHosts(t *testing.T, decide func(op *v1alpha3.MachineOperation) play) {
	ctx, cancel := context.WithCancel(context.Background())
	w, err := f.ops.Watch(opsGVR, "", metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); w.Stop(); wg.Wait() })
	seen := map[string]bool{}
	wg.Go(func() {
		for e := range w.ResultChan() {
			op, ok := e.Object.(*v1alpha3.MachineOperation)
			if !ok || seen[op.Name] || op.Status.State.Finished() {
				continue
			}
			seen[op.Name] = true
			op = op.DeepCopy()
			wg.Go(func() { f.host(ctx, t, op, decide(op)) })
		}
	})
}

func (f *fleetDouble) host(ctx context.Context, t *testing.T, op *v1alpha3.MachineOperation, p play) {
	pause := func() bool {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(20 * time.Millisecond):
			return true
		}
	}
	if !pause() {
		return
	}
	start := metav1.Now()
	if op.Status.StartTime == nil {
		op.Status.StartTime = &start
	}
	op.Status.State, op.Status.Reason, op.Status.Message = v1alpha3.OperationInProgress, "Dispatched", "started unbounded-repave.service"
	f.ops.Update(opsGVR, op.DeepCopy(), "")
	if p.inProcess || !pause() {
		return
	}
	f.mu.Lock()
	f.settled[op.Name] = true // before the roll can see it final
	f.mu.Unlock()
	done := metav1.Now()
	op.Status.CompletionTime = &done
	if p.fail != "" {
		op.Status.State, op.Status.Reason, op.Status.Message = v1alpha3.OperationFailed, "UnitFailed", p.fail
		f.ops.Update(opsGVR, op.DeepCopy(), "")
		return
	}
	op.Status.State, op.Status.Reason, op.Status.Message = v1alpha3.OperationComplete, "Succeeded", "unbounded-repave.service succeeded"
	f.ops.Update(opsGVR, op.DeepCopy(), "")
	if p.keepNode || !pause() {
		return
	}
	n, err := f.core.CoreV1().Nodes().Get(ctx, op.Spec.MachineRef.Name, metav1.GetOptions{})
	if err != nil {
		t.Errorf("host double: %v", err)
		return
	}
	now := metav1.Now()
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: now, LastTransitionTime: now}}
	if _, err := f.core.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil && ctx.Err() == nil {
		t.Errorf("host double: %v", err)
	}
}

func succeed(*v1alpha3.MachineOperation) play { return play{} }

func roll(ctx context.Context, f *fleetDouble, o RollOptions) (string, error) {
	var out bytes.Buffer
	o.Out = &out
	if o.MaxUnavailable == 0 {
		o.MaxUnavailable = 1
	}
	if o.Now == nil { // elapsed times of +0s in the output, whatever the load
		at := time.Date(2026, 12, 3, 8, 0, 0, 0, time.UTC)
		o.Now = func() time.Time { return at }
	}
	err := Roll(ctx, f, kubernetes.Interface(f.core), o)
	return out.String(), err
}

func machines(n int) []string {
	var out []string
	for i := 1; i <= n; i++ {
		out = append(out, fmt.Sprintf("site-w%d", i))
	}
	return out
}

func TestRollKeepsAtMostMaxUnavailableHostsInFlightInOrder(t *testing.T) {
	for _, n := range []int{1, 2} {
		f := newFleet(t, 5)
		f.playHosts(t, succeed)
		out, err := roll(context.Background(), f, RollOptions{Operation: v1alpha3.OperationRestart, Selector: "pool=edge", MaxUnavailable: n, ID: "r1"})
		if err != nil {
			t.Fatalf("max %d: %v\n%s", n, err, out)
		}
		if got := f.createdFor(); !slices.Equal(got, machines(5)) {
			t.Errorf("max %d: operations for %v, want %v in that order", n, got, machines(5))
		}
		if f.maxInFlight > n {
			t.Errorf("max %d: %d hosts had an operation in flight at once\n%s", n, f.maxInFlight, out)
		}
		for _, want := range []string{"[1/5] site-w1 +0s: created operation site-w1-r1", "[5/5] site-w5 +0s: done", "roll r1: 5 done, 0 failed"} {
			if !strings.Contains(out, want) {
				t.Errorf("max %d: output lacks %q:\n%s", n, want, out)
			}
		}
		for _, op := range f.created {
			if op.Labels[v1alpha3.MachineLabel] != op.Spec.MachineRef.Name || op.Labels[RollLabel] != "r1" || op.Spec.Operation != v1alpha3.OperationRestart {
				t.Errorf("operation %+v", op)
			}
		}
	}
}

// A failure stops the roll at that host: the rest get no operation; the
// error names the host and the operation's reason and message, and the
// output says how to resume. --resume then skips the host that
// completed, retries the failed one under a new name, and goes on.
func TestRollStopsAtTheFirstFailureAndResumeSkipsTheCompletedHosts(t *testing.T) {
	f := newFleet(t, 4)
	fail := true
	var mu sync.Mutex
	f.playHosts(t, func(op *v1alpha3.MachineOperation) play {
		mu.Lock()
		defer mu.Unlock()
		if op.Spec.MachineRef.Name == "site-w2" && fail {
			return play{fail: "unbounded-repave.service: exit-code 1: the new slot never became healthy"}
		}
		return play{}
	})
	o := RollOptions{Operation: v1alpha3.OperationRepave, Machines: machines(4), ID: "r2"}
	out, err := roll(context.Background(), f, o)
	if !errors.Is(err, ErrRollFailed) || !strings.Contains(err.Error(), "site-w2") || !strings.Contains(err.Error(), "UnitFailed") ||
		!strings.Contains(err.Error(), "never became healthy") {
		t.Fatalf("error %v, want the roll stopped at site-w2 with the reason and message\n%s", err, out)
	}
	if got := f.createdFor(); !slices.Equal(got, []string{"site-w1", "site-w2"}) {
		t.Errorf("operations for %v: the hosts after the failure must be untouched", got)
	}
	if want := "kubectl unbounded repave --roll r2 --resume site-w1 site-w2 site-w3 site-w4"; !strings.Contains(out, want) {
		t.Errorf("output lacks the resume command %q:\n%s", want, out)
	}
	if !strings.Contains(out, "1 done, 1 failed, 0 skipped (done earlier), 2 not started") {
		t.Errorf("summary:\n%s", out)
	}

	mu.Lock()
	fail = false
	mu.Unlock()
	if _, err := roll(context.Background(), f, o); err == nil || !strings.Contains(err.Error(), "--resume") {
		t.Errorf("the same --roll without --resume: %v", err)
	}
	o.Resume = true
	out, err = roll(context.Background(), f, o)
	if err != nil {
		t.Fatalf("resume: %v\n%s", err, out)
	}
	if got := f.createdFor(); !slices.Equal(got, []string{"site-w1", "site-w2", "site-w2", "site-w3", "site-w4"}) {
		t.Errorf("operations for %v: resume must skip site-w1 and retry site-w2", got)
	}
	if f.created[2].Name != "site-w2-r2-2" {
		t.Errorf("the retry is %s, want site-w2-r2-2", f.created[2].Name)
	}
	if !strings.Contains(out, "skipped (Repave completed in this roll): site-w1") || !strings.Contains(out, "3 done, 0 failed, 1 skipped") {
		t.Errorf("resume output:\n%s", out)
	}
}

// Ctrl-C (the context ends) starts no new operation, leaves the running
// one alone and names it; --resume waits for that one instead of
// creating another.
func TestInterruptStartsNoNewOperationAndResumeWaitsForTheRunningOne(t *testing.T) {
	f := newFleet(t, 3)
	ctx, cancel := context.WithCancel(context.Background())
	f.onCreate = func(*v1alpha3.MachineOperation) { cancel() }
	f.playHosts(t, func(op *v1alpha3.MachineOperation) play {
		return play{inProcess: op.Name == "site-w1-r3" && op.Status.State == ""}
	})
	o := RollOptions{Operation: v1alpha3.OperationReboot, Machines: machines(3), ID: "r3"}
	out, err := roll(ctx, f, o)
	if !errors.Is(err, ErrInterrupted) {
		t.Fatalf("error %v, want interrupted\n%s", err, out)
	}
	time.Sleep(100 * time.Millisecond) // a late start would show now
	if got := f.createdFor(); !slices.Equal(got, []string{"site-w1"}) {
		t.Errorf("operations for %v after the interrupt, want site-w1's only", got)
	}
	if !strings.Contains(out, "still running (not deleted): site-w1 (operation site-w1-r3") || !strings.Contains(out, "--roll r3 --resume") {
		t.Errorf("output:\n%s", out)
	}
	if l, _ := f.ListOperations(context.Background(), ""); len(l.Items) != 1 {
		t.Errorf("the running operation was deleted: %+v", l.Items)
	}

	f.onCreate = nil
	f.playHosts(t, succeed) // the host finishes site-w1-r3 and the rest
	o.Resume = true
	out, err = roll(context.Background(), f, o)
	if err != nil {
		t.Fatalf("resume: %v\n%s", err, out)
	}
	if got := f.createdFor(); !slices.Equal(got, []string{"site-w1", "site-w2", "site-w3"}) {
		t.Errorf("operations for %v: resume must wait for site-w1-r3, not create another", got)
	}
	if !strings.Contains(out, "site-w1 +0s: waiting for its operation site-w1-r3") {
		t.Errorf("resume output:\n%s", out)
	}
}

func TestDryRunPrintsThePlanAndCreatesNothing(t *testing.T) {
	f := newFleet(t, 5)
	out, err := roll(context.Background(), f, RollOptions{Operation: v1alpha3.OperationRepave, Selector: "pool=edge", MaxUnavailable: 2, DryRun: true, ID: "r4"})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"roll r4: Repave of 5 machine(s), at most 2 at a time", "batch 1: site-w1, site-w2", "batch 3: site-w5", "nothing created"} {
		if !strings.Contains(out, want) {
			t.Errorf("plan lacks %q:\n%s", want, out)
		}
	}
	if len(f.createdFor()) != 0 {
		t.Errorf("dry run created %v", f.createdFor())
	}
}

// Bad input is refused before anything is created.
func TestRollRefusesBadInputAndCreatesNothing(t *testing.T) {
	sha := strings.Repeat("ab", 32)
	upgrade := func(v, u, s string) RollOptions {
		return RollOptions{Operation: v1alpha3.OperationAgentUpgrade, Machines: []string{"site-w1"}, Version: v, URL: u, SHA256: s}
	}
	for name, c := range map[string]struct {
		o    RollOptions
		want string
	}{
		"an unknown machine":      {RollOptions{Operation: v1alpha3.OperationRepave, Machines: []string{"site-w1", "site-w9"}}, "no such Machine: site-w9"},
		"an empty selection":      {RollOptions{Operation: v1alpha3.OperationRepave, Selector: "pool=core"}, "no Machine matches"},
		"a bad selector":          {RollOptions{Operation: v1alpha3.OperationRepave, Selector: "pool=="}, "-l"},
		"no machines":             {RollOptions{Operation: v1alpha3.OperationRepave}, "name the machines"},
		"names and a selector":    {RollOptions{Operation: v1alpha3.OperationRepave, Machines: []string{"site-w1"}, Selector: "pool=edge"}, "not both"},
		"max-unavailable 0":       {RollOptions{Operation: v1alpha3.OperationRepave, Machines: []string{"site-w1"}, MaxUnavailable: -1}, "--max-unavailable"},
		"upgrade without version": {upgrade("", "https://x.example/a.deb", sha), "--version"},
		"upgrade without url":     {upgrade("0.2.0", "", sha), "--url"},
		"upgrade without sha256":  {upgrade("0.2.0", "https://x.example/a.deb", ""), "--sha256"},
		"a short sha256":          {upgrade("0.2.0", "https://x.example/a.deb", "abc"), "64 hex"},
		"a sha256 not hex":        {upgrade("0.2.0", "https://x.example/a.deb", strings.Repeat("zz", 32)), "64 hex"},
		"an http url":             {upgrade("0.2.0", "http://x.example/a.deb", sha), "https://"},
		"a url with a password":   {upgrade("0.2.0", "https://u:p@x.example/a.deb", sha), "password"},
		"resume without --roll":   {RollOptions{Operation: v1alpha3.OperationRepave, Machines: []string{"site-w1"}, Resume: true}, "--roll"},
		"a bad roll id":           {RollOptions{Operation: v1alpha3.OperationRepave, Machines: []string{"site-w1"}, ID: "Roll_1"}, "--roll"},
		"an unknown operation":    {RollOptions{Operation: "Reprovision", Machines: []string{"site-w1"}}, "Reprovision"},
	} {
		f := newFleet(t, 2)
		if c.o.MaxUnavailable == -1 {
			c.o.MaxUnavailable = 0
		} else {
			c.o.MaxUnavailable = 1
		}
		var out bytes.Buffer
		c.o.Out = &out
		err := Roll(context.Background(), f, f.core, c.o)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one naming %q", name, err, c.want)
		}
		if len(f.createdFor()) != 0 {
			t.Errorf("%s: created %v", name, f.createdFor())
		}
	}
}

// An upgrade carries the package's version, URL and SHA-256 as the
// host's upgrade reads them, and is done on Ready=True alone: it leaves
// the node (and its Node's last write) alone.
func TestUpgradeCarriesItsParametersAndNeedsNoFreshNode(t *testing.T) {
	f := newFleet(t, 2)
	f.playHosts(t, func(*v1alpha3.MachineOperation) play { return play{keepNode: true} })
	sha := strings.Repeat("AB", 32)
	out, err := roll(context.Background(), f, RollOptions{Operation: v1alpha3.OperationAgentUpgrade, Selector: "gpu=yes",
		Version: "0.2.0~rc.1", URL: "file:///var/tmp/unbounded-agent.deb", SHA256: sha})
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if len(f.created) != 1 || f.created[0].Spec.MachineRef.Name != "site-w2" {
		t.Fatalf("created %v, want site-w2 only", f.createdFor())
	}
	want := map[string]string{"version": "0.2.0~rc.1", "url": "file:///var/tmp/unbounded-agent.deb", "sha256": strings.ToLower(sha)}
	if got := f.created[0].Spec.Parameters; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("parameters %v, want %v", got, want)
	}
	if !strings.HasPrefix(f.created[0].Name, "site-w2-upgrade-") {
		t.Errorf("name %s: a new roll's id is the verb and the time", f.created[0].Name)
	}
}

// A reboot's operation completes when the next boot's daemon starts,
// while the cluster may still show the Node Ready from before: that is
// not Ready again, and a Node that never reports stops the roll.
func TestANodeReadyFromBeforeTheOperationDoesNotCount(t *testing.T) {
	f := newFleet(t, 2)
	f.playHosts(t, func(*v1alpha3.MachineOperation) play { return play{keepNode: true} })
	out, err := roll(context.Background(), f, RollOptions{Operation: v1alpha3.OperationReboot, Machines: machines(2), ID: "r5", ReadyTimeout: 300 * time.Millisecond})
	if !errors.Is(err, ErrRollFailed) || !strings.Contains(err.Error(), "site-w1") || !strings.Contains(err.Error(), "not Ready again") {
		t.Fatalf("error %v\n%s", err, out)
	}
	if !strings.Contains(out, "Node Ready from before the operation started") {
		t.Errorf("output:\n%s", out)
	}
	if got := f.createdFor(); !slices.Equal(got, []string{"site-w1"}) {
		t.Errorf("operations for %v", got)
	}
}

func TestRequestCounterCountsEveryRequestOfTheClients(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"kind":"NodeList","apiVersion":"v1","items":[]}`)
	}))
	defer srv.Close()
	var c RequestCounter
	cfg := &rest.Config{Host: srv.URL}
	c.Wrap(cfg)
	k, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := k.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if c.Count() != 3 {
		t.Errorf("counted %d requests, want 3", c.Count())
	}
}
