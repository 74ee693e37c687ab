package testenv

import (
	"context"
	"encoding/binary"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"golang.org/x/net/dns/dnsmessage"
)

// The control plane's name lookups are answered in this process, never by
// the machine's resolver. The API server looks a Node's Hostname address
// up before it proxies to the node (/api/v1/nodes/NAME/proxy/..., the
// kubelet's metrics: pkg/registry/core/node isProxyableHostname, through
// net.DefaultResolver). Test Nodes are named after test machines that no
// DNS server knows, and the build machine's resolv.conf names a server
// outside every network a test creates: a lookup there is a packet to an
// address the test does not own, and it waits out the resolver's timeout
// or ends in "no such host" (a 400 for every metrics read).
//
// nodeResolver answers A and AAAA questions for a Node's name with the
// Node's InternalIP addresses, and every other name with NXDOMAIN. Go's
// resolver still reads /etc/hosts first; only what it would have sent to a
// server reaches serve, over an in-memory connection.
type nodeResolver struct {
	client kubernetes.Interface
	log    *slog.Logger
}

// installNodeResolver makes net.DefaultResolver, which every in-process
// component uses, the in-process one.
func installNodeResolver(client kubernetes.Interface, log *slog.Logger) {
	r := &nodeResolver{client: client, log: log}
	net.DefaultResolver = &net.Resolver{PreferGo: true, Dial: r.dial}
}

// dial ignores the server address of resolv.conf: the answer comes from
// serve. A net.Pipe is no PacketConn, so the resolver frames its messages
// as over TCP (a two-byte length before each).
func (r *nodeResolver) dial(ctx context.Context, _, _ string) (net.Conn, error) {
	client, server := net.Pipe()
	go r.serve(server)
	return client, nil
}

func (r *nodeResolver) serve(c net.Conn) {
	defer c.Close()
	for {
		c.SetDeadline(time.Now().Add(10 * time.Second))
		var n [2]byte
		if _, err := io.ReadFull(c, n[:]); err != nil {
			return
		}
		q := make([]byte, binary.BigEndian.Uint16(n[:]))
		if _, err := io.ReadFull(c, q); err != nil {
			return
		}
		resp, err := r.answer(q)
		if err != nil {
			r.log.Warn("in-process resolver: unreadable query", "error", err)
			return
		}
		out := binary.BigEndian.AppendUint16(nil, uint16(len(resp)))
		if _, err := c.Write(append(out, resp...)); err != nil {
			return
		}
	}
}

// answer builds the reply to one query message.
func (r *nodeResolver) answer(query []byte) ([]byte, error) {
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil {
		return nil, err
	}
	q, err := p.Question()
	if err != nil {
		return nil, err
	}
	// Authoritative and recursion available: Go's resolver takes a reply
	// without either for a lame referral.
	rh := dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RecursionDesired: h.RecursionDesired, RecursionAvailable: true}
	addrs, known := r.lookup(strings.TrimSuffix(q.Name.String(), "."))
	if !known {
		rh.RCode = dnsmessage.RCodeNameError
	}
	b := dnsmessage.NewBuilder(nil, rh)
	b.EnableCompression()
	if err := b.StartQuestions(); err != nil {
		return nil, err
	}
	if err := b.Question(q); err != nil {
		return nil, err
	}
	if err := b.StartAnswers(); err != nil {
		return nil, err
	}
	rr := dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 0}
	for _, a := range addrs {
		switch {
		case q.Type == dnsmessage.TypeA && a.Is4():
			err = b.AResource(rr, dnsmessage.AResource{A: a.As4()})
		case q.Type == dnsmessage.TypeAAAA && a.Is6() && !a.Is4In6():
			err = b.AAAAResource(rr, dnsmessage.AAAAResource{AAAA: a.As16()})
		}
		if err != nil {
			return nil, err
		}
	}
	return b.Finish()
}

// lookup returns the InternalIP addresses of the Node called name, and
// whether there is such a Node.
func (r *nodeResolver) lookup(name string) ([]netip.Addr, bool) {
	// A Node name is a DNS subdomain; the search domains' variants and
	// anything else are no Node.
	if name == "" || len(name) > 253 {
		return nil, false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	n, err := r.client.CoreV1().Nodes().Get(ctx, strings.ToLower(name), metav1.GetOptions{})
	if err != nil {
		return nil, false
	}
	var addrs []netip.Addr
	for _, a := range n.Status.Addresses {
		if a.Type != corev1.NodeInternalIP {
			continue
		}
		if ip, err := netip.ParseAddr(a.Address); err == nil {
			addrs = append(addrs, ip.Unmap())
		}
	}
	return addrs, true
}
