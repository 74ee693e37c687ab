package clustertest

import (
	"context"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
)

// RunningPod creates pod, bound to its spec.nodeName, and reports it
// Running and Ready as its kubelet would (there is none here): the
// eviction API ignores budgets for Pending pods. It returns the pod as
// last written.
func (e *Env) RunningPod(t testing.TB, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	created, err := e.Client(t).CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod %s: %v", pod.Name, err)
	}
	created.Status.Phase = corev1.PodRunning
	created.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()}}
	out, err := e.Client(t).CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, created, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("pod %s status: %v", pod.Name, err)
	}
	return out
}

// PinnedPod creates a StatefulSet name in namespace ns (no StatefulSet
// controller runs here: it only owns) and its pod name-0 bound to node
// and running, the way a controller that binds its pods to their Node
// itself makes them. The pod's grace period is 0: an eviction deletes it
// at once (no kubelet confirms it here).
func (e *Env) PinnedPod(t testing.TB, ns, node, name string) *corev1.Pod {
	t.Helper()
	labels := map[string]string{"app": name}
	sts, err := e.Client(t).AppsV1().StatefulSets(ns).Create(context.Background(), &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: appsv1.StatefulSetSpec{Replicas: ptr.To[int32](1), Selector: &metav1.LabelSelector{MatchLabels: labels}, Template: corev1.PodTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Labels: labels},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/none:1"}}},
		}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return e.RunningPod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name + "-0", Namespace: ns, Labels: labels,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "StatefulSet", Name: sts.Name, UID: sts.UID, Controller: ptr.To(true)}}},
		Spec: corev1.PodSpec{NodeName: node, TerminationGracePeriodSeconds: ptr.To[int64](0),
			Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/none:1"}}},
	})
}

// Comeback is one pod that ComesBack created again.
type Comeback struct {
	// Gone is when the pod before was seen deleted; At when this one
	// was created.
	Gone, At time.Time
	Pod      *corev1.Pod
}

// ComesBack plays the controller of pod that binds its replacement to
// the same Node itself: each time the pod is deleted (a watch from its
// resourceVersion sees it, so none is missed), it creates it again after
// delay, with the same name, labels, owners and spec (spec.nodeName too),
// running, times times (0: until the test ends). Each replacement is sent
// on the channel returned, which is closed when it stops. It stops at the
// end of the test.
func (e *Env) ComesBack(t testing.TB, pod *corev1.Pod, delay time.Duration, times int) <-chan Comeback {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	out := make(chan Comeback, 1000)
	pods := e.Client(t).CoreV1().Pods(pod.Namespace)
	template := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace, Labels: pod.Labels,
			Annotations: pod.Annotations, OwnerReferences: pod.OwnerReferences},
		Spec: *pod.Spec.DeepCopy(),
	}
	go func() {
		defer close(done)
		defer close(out)
		uid, rv := pod.UID, pod.ResourceVersion
		for n := 0; times == 0 || n < times; {
			w, err := pods.Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", pod.Name).String(), ResourceVersion: rv})
			if err != nil {
				if ctx.Err() == nil {
					t.Errorf("watch pod %s to create it again: %v", pod.Name, err)
				}
				return
			}
			var gone time.Time
			for ev := range w.ResultChan() {
				p, ok := ev.Object.(*corev1.Pod)
				if !ok {
					break // an error: watch again
				}
				rv = p.ResourceVersion
				if ev.Type == watch.Deleted && p.UID == uid {
					gone = time.Now()
					break
				}
			}
			w.Stop()
			if ctx.Err() != nil {
				return
			}
			if gone.IsZero() {
				continue
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(delay):
			}
			created, err := pods.Create(ctx, template.DeepCopy(), metav1.CreateOptions{})
			if err != nil {
				if ctx.Err() == nil {
					t.Errorf("create pod %s again: %v", pod.Name, err)
				}
				return
			}
			at := time.Now()
			created.Status.Phase = corev1.PodRunning
			created.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()}}
			if updated, err := pods.UpdateStatus(ctx, created, metav1.UpdateOptions{}); err == nil {
				created = updated
			}
			// A drain may have evicted it already, before its
			// status: it is the pod all the same.
			uid, rv = created.UID, created.ResourceVersion
			n++
			out <- Comeback{Gone: gone, At: at, Pod: created}
		}
	}()
	return out
}
