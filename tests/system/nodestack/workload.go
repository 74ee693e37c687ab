package nodestack

import (
	"context"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// SleeperDeployment is the test workload: one replica of image (the
// busybox image, which sleeps) named "sleeper" in namespace ns, its pod
// pinned to node by the node's hostname label and given a second to stop.
func SleeperDeployment(ns, node, image string) *appsv1.Deployment {
	labels := map[string]string{"app": "sleeper"}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "sleeper", Namespace: ns},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					NodeSelector:                  map[string]string{corev1.LabelHostname: node},
					TerminationGracePeriodSeconds: ptr.To[int64](1),
					Containers:                    []corev1.Container{{Name: "sleep", Image: image}},
				},
			},
		},
	}
}

// NodeReady says whether Node name is Ready; a Node not there (yet) is
// not, and neither is an error reading it (for polls).
func NodeReady(ctx context.Context, c kubernetes.Interface, name string) (bool, error) {
	n, err := c.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	return err == nil && IsReady(n), nil
}

// IsReady says whether n's Ready condition is True.
func IsReady(n *corev1.Node) bool {
	for _, cond := range n.Status.Conditions {
		if cond.Type == corev1.NodeReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

// BarePod is a sleeper pod bound to node without a controller: nothing
// creates it again once it is gone, so a drain refuses it.
func BarePod(ns, name, node, image string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": name}},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			Containers:                    []corev1.Container{{Name: "sleep", Image: image}},
		},
	}
}
