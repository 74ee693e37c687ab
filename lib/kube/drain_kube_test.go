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

	"unbounded-cloud.io/agent/lib/api/identity"
	"unbounded-cloud.io/agent/lib/kube"
	"unbounded-cloud.io/agent/lib/kube/clustertest"
)

// TestDrainEvictsWhatKubectlDrainWouldAndHonoursDisruptionBudgets: the
// daemon's certificate (its RBAC and the admission policies of
// lib/api/manifests) cordons its Node, evicts its pods through the
// eviction API but the DaemonSet's and the mirror pod, is held by a
// PodDisruptionBudget until its timeout (the error names the pod and the
// 429), drains once the budget is gone, and deletes the Node.
func TestDrainEvictsWhatKubectlDrainWouldAndHonoursDisruptionBudgets(t *testing.T) {
	env := clustertest.Get(t)
	admin := env.Client(t)
	ctx := context.Background()
	machine := clustertest.UniqueName("drain")
	if _, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: machine}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.CoreV1().Nodes().Delete(context.Background(), machine, metav1.DeleteOptions{}) })
	ns := clustertest.UniqueName("drain-ns")
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })
	pod := func(name string, mutate func(*corev1.Pod)) {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": name}},
			Spec: corev1.PodSpec{NodeName: machine, TerminationGracePeriodSeconds: ptr.To[int64](0),
				Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/none:1"}}},
		}
		if mutate != nil {
			mutate(p)
		}
		created, err := admin.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create pod %s: %v", name, err)
		}
		// Running and Ready, as its kubelet would report it (there is
		// none here): the eviction API ignores budgets for Pending pods.
		created.Status.Phase = corev1.PodRunning
		created.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()}}
		if _, err := admin.CoreV1().Pods(ns).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("pod %s status: %v", name, err)
		}
	}
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

	cert, key := env.MintClientCert(t, identity.AgentUserName(machine), []string{identity.AgentGroup}, time.Now().Add(-time.Minute), time.Now().Add(time.Hour))
	d, err := kube.NewDrainer(env.CertConfig(cert, key), machine)
	if err != nil {
		t.Fatal(err)
	}
	d.Timeout, d.Poll, d.Log = 3*time.Second, 200*time.Millisecond, quiet

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
	exists := func(name string) bool {
		_, err := admin.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		return err == nil
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
