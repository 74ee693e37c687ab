package nodestack

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
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

// ServingCert waits, bounded by ctx, until the kubelet of node has a
// serving certificate from the cluster (node.serving-cert = "cluster": a
// kubernetes.io/kubelet-serving CSR of system:node:NODE created at or
// after since, approved and signed) and returns it. A denied CSR is an
// error naming its reason. Until it is issued the kubelet's port answers
// no TLS handshake: logs, exec and its metrics through the API server
// wait for it.
func ServingCert(ctx context.Context, c kubernetes.Interface, node string, since time.Time) (*x509.Certificate, error) {
	var cert *x509.Certificate
	err := wait.PollUntilContextCancel(ctx, 500*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		csrs, err := c.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		for _, csr := range csrs.Items {
			if csr.Spec.SignerName != certificatesv1.KubeletServingSignerName || csr.Spec.Username != "system:node:"+node ||
				csr.CreationTimestamp.Time.Before(since.Truncate(time.Second)) {
				continue
			}
			for _, cond := range csr.Status.Conditions {
				if cond.Type == certificatesv1.CertificateDenied {
					return false, fmt.Errorf("CSR %s denied: %s", csr.Name, cond.Message)
				}
			}
			if b, _ := pem.Decode(csr.Status.Certificate); b != nil {
				cert, err = x509.ParseCertificate(b.Bytes)
				return err == nil, err
			}
		}
		return false, nil
	})
	if err != nil && cert == nil {
		return nil, fmt.Errorf("the kubelet serving certificate of %s: %w", node, err)
	}
	return cert, err
}
