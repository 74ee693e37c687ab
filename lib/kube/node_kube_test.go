package kube_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/kube"
	"unbounded-cloud.io/agent/lib/modes"
	"unbounded-cloud.io/agent/tests/kubeenv"
)

// kubeletPair writes a kubelet client certificate for node into the nspawn
// slot kube1 under root the way the kubelet's TLS bootstrap leaves it: a
// dated PEM (certificate and key) and the "current" link naming it by its
// absolute path inside the machine.
func kubeletPair(t *testing.T, env *kubeenv.Env, p hostpaths.Paths, node string) {
	t.Helper()
	cert, key := env.MintClientCert(t, "system:node:"+node, "system:nodes")
	dir := filepath.Join(p.MachineDir("kube1"), "var/lib/kubelet/pki")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "kubelet-client-2026-12-01-05-00-00.pem"), append(cert, key...), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/var/lib/kubelet/pki/kubelet-client-2026-12-01-05-00-00.pem", filepath.Join(dir, "kubelet-client-current.pem")); err != nil {
		t.Fatal(err)
	}
}

// Bootstrap and repave read the Node with the kubelet's own certificate: the API
// server's Node authorizer decides what that identity may read, so this
// runs against the real one.
func TestNodeReaderSeesItsNodeRegisteredThenReadyWithTheKubeletsCertificate(t *testing.T) {
	env := kubeenv.Get(t)
	ctx := context.Background()
	p := hostpaths.New(t.TempDir())
	node := kubeenv.UniqueName(t, "node")
	caFile := filepath.Join(p.Root, "ca.crt")
	if err := os.WriteFile(caFile, env.CAPEM(t), 0o644); err != nil {
		t.Fatal(err)
	}
	r := &kube.NodeReader{
		Name: node, Server: env.Host(), CAFile: caFile,
		CertFile: filepath.Join(p.MachineDir("kube1"), modes.KubeletClientCert),
		Root:     p.MachineDir("kube1"),
	}

	if _, err := r.Read(ctx); !errors.Is(err, kube.ErrNoKubeletCertificate) {
		t.Fatalf("before TLS bootstrap: %v, want ErrNoKubeletCertificate", err)
	}
	kubeletPair(t, env, p, node)
	if st, err := r.Read(ctx); err != nil || !st.Known || st.Present {
		t.Fatalf("before the kubelet registered: %+v %v", st, err)
	}

	nodes := env.Client().CoreV1().Nodes()
	if _, err := nodes.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nodes.Delete(context.Background(), node, metav1.DeleteOptions{}) })
	// The test control plane's node lifecycle controller writes new Nodes
	// too: read, change, write, again on a conflict, as a kubelet does.
	setReady := func(status corev1.ConditionStatus, reason, msg string) {
		t.Helper()
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			n, err := nodes.Get(ctx, node, metav1.GetOptions{})
			if err != nil {
				return err
			}
			n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: status,
				Reason: reason, Message: msg, LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
			_, err = nodes.UpdateStatus(ctx, n, metav1.UpdateOptions{})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	setReady(corev1.ConditionFalse, "KubeletNotReady", "container runtime network not ready")
	st, err := r.Read(ctx)
	if err != nil || !st.Present || st.Ready || st.Reason != "KubeletNotReady" || st.Heartbeat.IsZero() {
		t.Fatalf("registered, not ready: %+v %v", st, err)
	}
	setReady(corev1.ConditionTrue, "KubeletReady", "kubelet is posting ready status")
	if st, err := r.Read(ctx); err != nil || !st.Ready || time.Since(st.Heartbeat) > time.Minute {
		t.Fatalf("ready: %+v %v", st, err)
	}

	// Another node's certificate reads nothing of this Node: the reader
	// proves this kubelet's identity, not just any node's.
	other := hostpaths.New(t.TempDir())
	kubeletPair(t, env, other, kubeenv.UniqueName(t, "other"))
	r.CertFile, r.Root = filepath.Join(other.MachineDir("kube1"), modes.KubeletClientCert), other.MachineDir("kube1")
	if _, err := r.Read(ctx); err == nil || !strings.Contains(err.Error(), "HTTP 403") {
		t.Errorf("another node's certificate: %v, want HTTP 403", err)
	}
}
