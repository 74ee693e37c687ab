package kubeenv

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
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

	node := testNode(t, env, "proxied", func(n *corev1.Node) { n.Status.DaemonEndpoints.KubeletEndpoint.Port = 10250 })

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
