package kube_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"k8s.io/client-go/kubernetes"

	"unbounded-cloud.io/agent/lib/api/identity"
	"unbounded-cloud.io/agent/lib/kube"
	"unbounded-cloud.io/agent/lib/kube/clustertest"
)

// drainFixture is a Node of its own, bound pods in a namespace of its
// own, and the credential the repave drains with: the daemon's
// certificate (its RBAC and the admission policies of lib/api/manifests).
type drainFixture struct {
	t     *testing.T
	env   *clustertest.Env
	admin kubernetes.Interface
	node  string
	ns    string
}

func newDrainFixture(t *testing.T) *drainFixture {
	t.Helper()
	env := clustertest.Get(t)
	f := &drainFixture{t: t, env: env, admin: env.Client(t), node: clustertest.UniqueName("drain"), ns: clustertest.UniqueName("drain-ns")}
	ctx := context.Background()
	if _, err := f.admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: f.node}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.admin.CoreV1().Nodes().Delete(context.Background(), f.node, metav1.DeleteOptions{}) })
	if _, err := f.admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: f.ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.admin.CoreV1().Namespaces().Delete(context.Background(), f.ns, metav1.DeleteOptions{}) })
	return f
}

// pod creates a pod bound to the Node, labelled app=name, without a
// controller unless mutate gives it one.
func (f *drainFixture) pod(name string, mutate func(*corev1.Pod)) {
	f.t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: f.ns, Labels: map[string]string{"app": name}},
		Spec: corev1.PodSpec{NodeName: f.node, TerminationGracePeriodSeconds: ptr.To[int64](0),
			Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/none:1"}}},
	}
	if mutate != nil {
		mutate(p)
	}
	f.env.RunningPod(f.t, p)
}

// replicaSet creates a ReplicaSet of one pod labelled app=name and
// returns the pod's controller reference to it. The ReplicaSet
// controller runs here: it counts the pod given this reference as its
// one replica (and removes the one it made before, unscheduled), and
// the pods it makes after an eviction select no node, so that they
// never land on another test's Node.
func (f *drainFixture) replicaSet(name string) metav1.OwnerReference {
	f.t.Helper()
	labels := map[string]string{"app": name}
	rs, err := f.admin.AppsV1().ReplicaSets(f.ns).Create(context.Background(), &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: f.ns},
		Spec: appsv1.ReplicaSetSpec{Replicas: ptr.To[int32](1), Selector: &metav1.LabelSelector{MatchLabels: labels}, Template: corev1.PodTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Labels: labels},
			Spec: corev1.PodSpec{NodeSelector: map[string]string{"unbounded-cloud.io/test-no-such-node": "true"},
				Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/none:1"}}},
		}},
	}, metav1.CreateOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	return metav1.OwnerReference{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: rs.Name, UID: rs.UID, Controller: ptr.To(true)}
}

func (f *drainFixture) exists(name string) bool {
	f.t.Helper()
	_, err := f.admin.CoreV1().Pods(f.ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		f.t.Fatal(err)
	}
	return err == nil
}

// drainer is a Drainer with the daemon's certificate, its requests
// through calls when it is not nil.
func (f *drainFixture) drainer(calls *apiCalls) *kube.Drainer {
	f.t.Helper()
	cert, key := f.env.MintClientCert(f.t, identity.AgentUserName(f.node), []string{identity.AgentGroup}, time.Now().Add(-time.Minute), time.Now().Add(time.Hour))
	cfg := f.env.CertConfig(cert, key)
	if calls != nil {
		cfg.Wrap(calls.wrap)
	}
	d, err := kube.NewDrainer(cfg, f.node)
	if err != nil {
		f.t.Fatal(err)
	}
	// A settle window shorter than the default: these API calls take
	// milliseconds, and each successful drain waits it out.
	d.Poll, d.Settle, d.Log = 200*time.Millisecond, time.Second, quiet
	return d
}

// TestDrainEvictsWhatKubectlDrainWouldAndHonoursDisruptionBudgets: the
// daemon's certificate cordons its Node, evicts its pods through the
// eviction API but the DaemonSet's and the mirror pod, is held by a
// PodDisruptionBudget until its timeout (the error names the pod and the
// 429), drains once the budget is gone, and deletes the Node. Its pods
// to evict have no controller: DeleteUnmanaged lets them go, and the
// budget holds them all the same.
func TestDrainEvictsWhatKubectlDrainWouldAndHonoursDisruptionBudgets(t *testing.T) {
	f := newDrainFixture(t)
	admin, ns, pod, exists := f.admin, f.ns, f.pod, f.exists
	ctx := context.Background()
	pod("plain", nil)
	pod("guarded", nil)
	// A DaemonSet that exists (no DaemonSet controller runs here), so
	// that the garbage collector keeps the pod it owns.
	dsLabels := map[string]string{"app": "ds"}
	ds, err := admin.AppsV1().DaemonSets(ns).Create(ctx, &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: "ds", Namespace: ns},
		Spec: appsv1.DaemonSetSpec{Selector: &metav1.LabelSelector{MatchLabels: dsLabels}, Template: corev1.PodTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Labels: dsLabels},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/none:1"}}},
		}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod("daemonset", func(p *corev1.Pod) {
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: ds.Name, UID: ds.UID, Controller: ptr.To(true)}}
	})
	pod("mirror", func(p *corev1.Pod) {
		p.Annotations = map[string]string{corev1.MirrorPodAnnotationKey: "static"}
	})
	min1 := intstr.FromInt32(1)
	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "guarded", Namespace: ns},
		Spec:       policyv1.PodDisruptionBudgetSpec{MinAvailable: &min1, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "guarded"}}},
	}
	if _, err := admin.PolicyV1().PodDisruptionBudgets(ns).Create(ctx, pdb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		p, err := admin.PolicyV1().PodDisruptionBudgets(ns).Get(ctx, "guarded", metav1.GetOptions{})
		if err == nil && p.Status.ObservedGeneration == p.Generation && p.Status.CurrentHealthy == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the disruption controller did not process the budget within 30s: %+v, %v", p.Status, err)
		}
		time.Sleep(100 * time.Millisecond)
	}

	d := f.drainer(nil)
	d.Timeout, d.DeleteUnmanaged = 3*time.Second, true

	if err := d.SetUnschedulable(ctx, true); err != nil {
		t.Fatalf("cordon with the daemon's certificate: %v", err)
	}
	if n, err := d.GetNode(ctx); err != nil || n == nil || !n.Spec.Unschedulable {
		t.Fatalf("after the cordon: %+v, %v", n, err)
	}

	err = d.Drain(ctx)
	if !errors.Is(err, kube.ErrDrainTimeout) {
		t.Fatalf("drain with a budget that forbids the eviction: %v, want ErrDrainTimeout", err)
	}
	for _, words := range []string{ns + "/guarded", "429"} {
		if !strings.Contains(err.Error(), words) {
			t.Errorf("the drain's error does not say %q: %v", words, err)
		}
	}
	for name, want := range map[string]bool{"plain": false, "guarded": true, "daemonset": true, "mirror": true} {
		if got := exists(name); got != want {
			t.Errorf("pod %s exists=%v after the drain, want %v", name, got, want)
		}
	}

	if err := admin.PolicyV1().PodDisruptionBudgets(ns).Delete(ctx, "guarded", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	d.Timeout = 30 * time.Second
	if err := d.Drain(ctx); err != nil {
		t.Fatalf("drain without the budget: %v", err)
	}
	if exists("guarded") || !exists("daemonset") || !exists("mirror") {
		t.Errorf("after the second drain: guarded %v (want gone), daemonset %v and mirror %v (want kept)", exists("guarded"), exists("daemonset"), exists("mirror"))
	}

	if err := d.DeleteNode(ctx); err != nil {
		t.Fatalf("delete the own Node: %v", err)
	}
	if n, err := d.GetNode(ctx); err != nil || n != nil {
		t.Errorf("after the delete: %+v, %v; want no Node", n, err)
	}
	if err := d.SetUnschedulable(ctx, false); err != nil {
		t.Errorf("uncordon of a Node that is gone: %v, want nil (nothing to uncordon)", err)
	}
	if err := d.DeleteNode(ctx); err != nil {
		t.Errorf("delete of a Node that is gone: %v, want nil", err)
	}
}

// TestDrainRefusesPodsWithoutAControllerUnlessDeleteUnmanaged: a pod that
// nothing would create again stops the drain before any eviction, named
// in the error, the pod with a controller beside it left as well; with
// DeleteUnmanaged every pod is evicted.
func TestDrainRefusesPodsWithoutAControllerUnlessDeleteUnmanaged(t *testing.T) {
	f := newDrainFixture(t)
	owner := f.replicaSet("web")
	f.pod("web", func(p *corev1.Pod) { p.OwnerReferences = []metav1.OwnerReference{owner} })
	f.pod("bare-a", nil)
	f.pod("bare-b", nil)
	calls := &apiCalls{}
	d := f.drainer(calls)
	d.Timeout = 30 * time.Second
	ctx := context.Background()

	start := time.Now()
	err := d.Drain(ctx)
	if !errors.Is(err, kube.ErrUnmanagedPods) || errors.Is(err, kube.ErrDrainTimeout) {
		t.Fatalf("drain with pods without a controller: %v, want ErrUnmanagedPods", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("the refusal took %s: it should come with the first list of pods", took)
	}
	for _, words := range []string{f.ns + "/bare-a", f.ns + "/bare-b", "nothing was evicted"} {
		if !strings.Contains(err.Error(), words) {
			t.Errorf("the refusal does not say %q: %v", words, err)
		}
	}
	if strings.Contains(err.Error(), f.ns+"/web") {
		t.Errorf("the refusal names the pod with a controller: %v", err)
	}
	if n := calls.count("evict "); n != 0 {
		t.Errorf("%d eviction(s) asked before the refusal, want none", n)
	}
	for _, name := range []string{"web", "bare-a", "bare-b"} {
		if !f.exists(name) {
			t.Errorf("pod %s is gone after the refused drain", name)
		}
	}

	d.DeleteUnmanaged = true
	if err := d.Drain(ctx); err != nil {
		t.Fatalf("drain with DeleteUnmanaged: %v", err)
	}
	for _, name := range []string{"web", "bare-a", "bare-b"} {
		if f.exists(name) {
			t.Errorf("pod %s is still there after the drain with DeleteUnmanaged", name)
		}
		if n := calls.count("evict " + name); n != 1 {
			t.Errorf("pod %s: %d eviction(s), want 1", name, n)
		}
	}
}

// TestDrainEvictsAPodWithLocalStorage: unlike kubectl drain without
// --delete-emptydir-data, a pod with an emptyDir is evicted (the repave
// deletes the Node and rebuilds the slot, the emptyDir goes anyway).
func TestDrainEvictsAPodWithLocalStorage(t *testing.T) {
	f := newDrainFixture(t)
	owner := f.replicaSet("cache")
	f.pod("cache", func(p *corev1.Pod) {
		p.OwnerReferences = []metav1.OwnerReference{owner}
		p.Spec.Volumes = []corev1.Volume{{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
		p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "scratch", MountPath: "/scratch"}}
	})
	calls := &apiCalls{}
	d := f.drainer(calls)
	d.Timeout = 30 * time.Second
	if err := d.Drain(context.Background()); err != nil {
		t.Fatalf("drain of a pod with an emptyDir: %v", err)
	}
	if f.exists("cache") || calls.count("evict cache") != 1 {
		t.Errorf("pod with an emptyDir: exists %v, %d eviction(s); want gone by one eviction", f.exists("cache"), calls.count("evict cache"))
	}
}

// TestDrainWaitsForATerminatingPodWithoutEvictingItAgain: a pod whose
// deletion runs (no kubelet here confirms it, so it stays until it is
// deleted for good) is not evicted; the drain waits for it within its
// timeout, and the timeout's error names the deletion's grace period
// (7 s), not the spec's (45 s). Without a controller, it does not refuse
// the drain either: its deletion was decided already.
func TestDrainWaitsForATerminatingPodWithoutEvictingItAgain(t *testing.T) {
	f := newDrainFixture(t)
	ctx := context.Background()
	owner := f.replicaSet("leaving")
	long := func(p *corev1.Pod) { p.Spec.TerminationGracePeriodSeconds = ptr.To[int64](45) }
	f.pod("leaving", func(p *corev1.Pod) { long(p); p.OwnerReferences = []metav1.OwnerReference{owner} })
	f.pod("leaving-bare", long)
	for _, name := range []string{"leaving", "leaving-bare"} {
		if err := f.admin.CoreV1().Pods(f.ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](7)}); err != nil {
			t.Fatal(err)
		}
		if !f.exists(name) {
			t.Fatalf("pod %s went at once: it cannot play a terminating pod", name)
		}
	}
	calls := &apiCalls{}
	d := f.drainer(calls)
	d.Timeout = 2 * time.Second

	err := d.Drain(ctx)
	if !errors.Is(err, kube.ErrDrainTimeout) {
		t.Fatalf("drain with terminating pods that never end: %v, want ErrDrainTimeout", err)
	}
	for _, words := range []string{f.ns + "/leaving:", f.ns + "/leaving-bare:", "terminating", "deletion grace period 7s"} {
		if !strings.Contains(err.Error(), words) {
			t.Errorf("the timeout's error does not say %q: %v", words, err)
		}
	}
	if strings.Contains(err.Error(), "45s") {
		t.Errorf("the timeout's error names the spec's grace period: %v", err)
	}
	if n := calls.count("evict "); n != 0 {
		t.Errorf("%d eviction(s) of terminating pods, want none", n)
	}

	// Waited for: the drain ends once they are gone.
	d.Timeout = 30 * time.Second
	done := make(chan error, 1)
	go func() { done <- d.Drain(ctx) }()
	time.Sleep(time.Second)
	select {
	case err := <-done:
		t.Fatalf("the drain ended while the terminating pods were there: %v", err)
	default:
	}
	for _, name := range []string{"leaving", "leaving-bare"} {
		if err := f.admin.CoreV1().Pods(f.ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("drain after the terminating pods ended: %v", err)
		}
	case <-time.After(35 * time.Second):
		t.Fatal("the drain did not end within its timeout after the terminating pods were gone")
	}
	if n := calls.count("evict "); n != 0 {
		t.Errorf("%d eviction(s) of terminating pods, want none", n)
	}
}
