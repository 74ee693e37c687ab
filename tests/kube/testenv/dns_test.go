package testenv

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// A Node's name resolves to its InternalIP addresses, in this process;
// any other name is "no such host" at once. No server is asked: the
// resolver's dial is the only way out, and it never leaves the process.
func TestNodeNamesResolveInProcessAndOtherNamesAreNoSuchHost(t *testing.T) {
	client := fake.NewClientset(&corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "node-a"},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeHostName, Address: "node-a"},
			{Type: corev1.NodeInternalIP, Address: "192.0.2.10"},
			{Type: corev1.NodeInternalIP, Address: "2001:db8::10"},
			{Type: corev1.NodeExternalIP, Address: "198.51.100.7"},
		}},
	}, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-b"}})
	r := &nodeResolver{client: client, log: slog.New(slog.DiscardHandler)}
	var dials int
	res := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, address string) (net.Conn, error) {
		dials++
		return r.dial(ctx, network, address)
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	got, err := res.LookupIPAddr(ctx, "node-a")
	if err != nil {
		t.Fatalf("node-a: %v", err)
	}
	var ips []string
	for _, a := range got {
		ips = append(ips, a.IP.String())
	}
	slices.Sort(ips)
	if !slices.Equal(ips, []string{"192.0.2.10", "2001:db8::10"}) {
		t.Errorf("node-a resolves to %v, want its InternalIPs 192.0.2.10 and 2001:db8::10", ips)
	}
	if dials == 0 {
		t.Error("the lookup never reached the in-process resolver (it was answered elsewhere)")
	}

	for _, name := range []string{"unknown-node", "node-b"} {
		start := time.Now()
		_, err = res.LookupIPAddr(ctx, name)
		var dnsErr *net.DNSError
		if name == "unknown-node" && (!errors.As(err, &dnsErr) || !dnsErr.IsNotFound) {
			t.Errorf("%s: %v, want no such host", name, err)
		}
		if name == "node-b" && err == nil {
			t.Errorf("%s, a Node without addresses, resolved", name)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("%s took %v: the answer waited on something", name, d)
		}
	}
}
