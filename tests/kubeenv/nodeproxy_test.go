package kubeenv

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
)

// The API server's node proxy (/api/v1/nodes/NAME/proxy/..., how the
// kubelet's metrics are read) reaches a test node by its name: the API
// server looks the Node's Hostname address up first, and the control
// plane answers that itself (tests/kube/testenv/dns.go). Asked of the
// machine's resolver, a test node's name was "no such host" (a 400, the
// kubelet never dialled) or waited out a server outside every network the
// test made.
func TestNodeProxyReachesTheNodeByItsNameWithoutTheMachinesResolver(t *testing.T) {
	t.Parallel()
	env := Get(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := env.Client()

	node := UniqueName(t, "proxied")
	if _, err := c.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.CoreV1().Nodes().Delete(context.Background(), node, metav1.DeleteOptions{}) })
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := c.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		n.Status.Addresses = []corev1.NodeAddress{
			{Type: corev1.NodeHostName, Address: node},
			{Type: corev1.NodeInternalIP, Address: "192.0.2.10"},
		}
		n.Status.DaemonEndpoints.KubeletEndpoint.Port = 10250
		_, err = c.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}

	// The node's kubelet port: a socket that only counts the API server's
	// connections (a short path: unix socket names are bounded).
	dir, err := os.MkdirTemp("", "np")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	ln, err := net.Listen("unix", filepath.Join(dir, "10250.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	env.PublishKubelet(t, node, filepath.Join(dir, "10250.sock"))
	dialled := make(chan struct{}, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		conn.Close()
		dialled <- struct{}{}
	}()

	answered := make(chan error, 1)
	go func() {
		answered <- c.CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes", node, "proxy", "metrics").Do(ctx).Error()
	}()
	select {
	case <-dialled:
	case err := <-answered:
		select {
		case <-dialled:
		case <-time.After(time.Second):
			t.Fatalf("the API server answered the node proxy without dialling the node: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the API server dialled no node within 10s of a node proxy request: the name lookup waited")
	}
}
