package repave_test

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"unbounded-cloud.io/agent/lib/api/identity"
	"unbounded-cloud.io/agent/lib/config"
	"unbounded-cloud.io/agent/lib/exitcode"
	"unbounded-cloud.io/agent/lib/kube"
	"unbounded-cloud.io/agent/lib/kube/clustertest"
	"unbounded-cloud.io/agent/lib/repave"
)

// TestDrainOfAPodThatKeepsComingBackFailsTheRepaveAndUncordons: the
// repave of the fake host with the real drain, against the test API
// server's Node of its own and the daemon's certificate. A pod that its
// controller creates again on the Node 100 ms after each eviction (issue
// 41) never leaves the Node empty for the settle window: the repave
// fails at the drain's timeout (exit 1), the Node uncordoned and not
// deleted, the old node left running.
func TestDrainOfAPodThatKeepsComingBackFailsTheRepaveAndUncordons(t *testing.T) {
	env := clustertest.Get(t)
	admin := env.Client(t)
	ctx := context.Background()
	node, ns := clustertest.UniqueName("repave"), clustertest.UniqueName("repave-ns")
	if _, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.CoreV1().Nodes().Delete(context.Background(), node, metav1.DeleteOptions{}) })
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })
	pod := env.PinnedPod(t, ns, node, "db")
	back := env.ComesBack(t, pod, 100*time.Millisecond, 0)

	cert, key := env.MintClientCert(t, identity.AgentUserName(node), []string{identity.AgentGroup}, time.Now().Add(-time.Minute), time.Now().Add(time.Hour))
	d, err := kube.NewDrainer(env.CertConfig(cert, key), node)
	if err != nil {
		t.Fatal(err)
	}
	d.Timeout, d.Settle, d.Poll, d.Log = 4*time.Second, time.Second, 200*time.Millisecond, slog.New(slog.NewTextHandler(tWriter{t}, nil))

	w := bootstrapped(t)
	changeImage(t, w)
	start := time.Now()
	err = run(t, w, func(r *repave.Repave) {
		r.Cluster = func(*config.Config, repave.Options) (repave.Cluster, error) { return d, nil }
	})
	took := time.Since(start)
	if !errors.Is(err, kube.ErrDrainTimeout) || exitcode.For(err) != exitcode.Failed {
		t.Fatalf("repave of a Node with a pod that keeps coming back: %v (exit %d), want ErrDrainTimeout (exit 1)", err, exitcode.For(err))
	}
	t.Logf("the repave failed after %s, the pod having come back %d times: %v", took.Round(time.Millisecond), len(back), err)
	for _, words := range []string{ns + "/" + pod.Name, "came back", "uncordoned"} {
		if !strings.Contains(err.Error(), words) {
			t.Errorf("the repave's error does not say %q: %v", words, err)
		}
	}
	if took < d.Timeout {
		t.Errorf("the repave failed after %s, before the drain's timeout (%s)", took.Round(time.Millisecond), d.Timeout)
	}
	n, err := admin.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil || n.Spec.Unschedulable {
		t.Errorf("the Node after the failed repave: %v, unschedulable %v; want it there and uncordoned", err, n != nil && n.Spec.Unschedulable)
	}
	wantActive(t, w, "kube1")
	if slices.Contains(w.Calls(), "stop systemd-nspawn@kube1.service") {
		t.Errorf("the old node was stopped although the drain failed")
	}
}
