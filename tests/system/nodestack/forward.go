package nodestack

import (
	"crypto/tls"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"unbounded-cloud.io/agent/tests/system/harness"
)

// Forwarder carries TCP connections from a machine's own loopback to
// services on the host's loopback, for machines booted in a network
// namespace of their own (so that their kubelet, CNI bridge and iptables
// rules stay in it, and two of them never collide).
//
// Why not a veth pair: the services listen on 127.0.0.1 (the API server's
// certificate names it), and a route from a container to the host's
// loopback does not exist. Here every byte stays on loopback interfaces:
// at every boot the machine gets a fresh network namespace
// (harness.Options.Network: Listen), in which the forwarder listens on
// each 127.0.0.1:PORT before the machine's PID 1 starts, and each
// connection it accepts there it joins to the same address on the
// host's loopback. No process in the machine carries the bytes (an
// earlier systemd-socket-proxyd per address through a unix socket cost
// about a seventh of the system tier's CPU, moving node images and
// artifacts).
type Forwarder struct {
	addrs []string

	mu     sync.Mutex
	faults map[string]ForwardFault // by "127.0.0.1:PORT"
	// open are the connections being forwarded, by target: a fault
	// that takes the service down ends them too.
	open map[string]map[net.Conn]struct{}
}

// ForwardFault is what a forwarded address does instead of forwarding.
type ForwardFault struct {
	// Down: every connection is closed at once, the ones being forwarded
	// when the fault is set as well as every new one, as a host whose
	// API server is unreachable sees it (connection reset, EOF): a
	// client's kept-alive connection does not outlive the outage.
	Down bool
	// TLS: the connection is answered by a TLS server presenting this
	// certificate instead of the service's (for example one valid only
	// from next year, signed by the cluster CA: what a host whose clock is
	// a year behind sees of the real one), and closed after the
	// handshake.
	TLS *tls.Certificate
}

// SetFault makes addr (as given to Forward) fail as f says, from the next
// connection on (Down: the open ones too); the zero ForwardFault forwards
// again.
func (f *Forwarder) SetFault(addr string, fault ForwardFault) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.faults == nil {
		f.faults = map[string]ForwardFault{}
	}
	a := hostPort(addr)
	f.faults[a] = fault
	if fault.Down {
		for c := range f.open[a] {
			c.Close()
		}
	}
}

// track adds c to the connections forwarded to target (on false) or
// removes it (on true). It says no to a new connection while target is
// down: the fault was set between its accept and now.
func (f *Forwarder) track(target string, c net.Conn, done bool) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if done {
		delete(f.open[target], c)
		return true
	}
	if f.faults[target].Down {
		return false
	}
	if f.open == nil {
		f.open = map[string]map[net.Conn]struct{}{}
	}
	if f.open[target] == nil {
		f.open[target] = map[net.Conn]struct{}{}
	}
	f.open[target][c] = struct{}{}
	return true
}

func (f *Forwarder) fault(addr string) ForwardFault {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.faults[addr]
}

// Forward makes the forwarder of each address ("127.0.0.1:PORT", or a URL
// whose host is one). Pass Listen as the machine's harness.Options.Network.
func Forward(t testing.TB, addrs ...string) *Forwarder {
	t.Helper()
	f := &Forwarder{}
	for _, a := range addrs {
		a = hostPort(a)
		host, _, err := net.SplitHostPort(a)
		if err != nil || host != "127.0.0.1" {
			t.Fatalf("nodestack: forward %q: want 127.0.0.1:PORT", a)
		}
		f.addrs = append(f.addrs, a)
	}
	return f
}

// Listen forwards every address from the loopback of the network
// namespace netns (one boot's of a machine: harness.Options.Network)
// until the function it returns is called, which also ends the
// connections accepted there.
func (f *Forwarder) Listen(netns string) (func(), error) {
	lns, err := harness.ListenIn(netns, f.addrs...)
	if err != nil {
		return nil, err
	}
	b := &boot{conns: map[net.Conn]struct{}{}}
	for i, ln := range lns {
		b.wg.Add(1)
		go f.serve(b, ln, f.addrs[i])
	}
	return func() {
		for _, ln := range lns {
			ln.Close()
		}
		b.mu.Lock()
		b.closed = true
		for c := range b.conns {
			c.Close()
		}
		b.mu.Unlock()
		b.wg.Wait()
	}, nil
}

// boot is what one Listen serves: its connections, all closed when the
// machine's boot has ended (the namespace goes only once they are).
type boot struct {
	wg     sync.WaitGroup
	mu     sync.Mutex
	closed bool
	conns  map[net.Conn]struct{}
}

// add takes c into the boot's connections; false once the boot ended.
func (b *boot) add(c net.Conn) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return false
	}
	b.conns[c] = struct{}{}
	return true
}

func (b *boot) remove(c net.Conn) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.conns, c)
}

func hostPort(a string) string {
	for _, p := range []string{"https://", "http://"} {
		a = strings.TrimPrefix(a, p)
	}
	host, _, _ := strings.Cut(a, "/")
	return host
}

func (f *Forwarder) serve(b *boot, ln net.Listener, target string) {
	defer b.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		if !b.add(c) {
			c.Close()
			return
		}
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			defer b.remove(c)
			defer c.Close()
			switch fault := f.fault(target); {
			case fault.Down:
				return
			case fault.TLS != nil:
				tc := tls.Server(c, &tls.Config{Certificates: []tls.Certificate{*fault.TLS}})
				_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
				_ = tc.Handshake()
				return
			}
			if !f.track(target, c, false) {
				return
			}
			defer f.track(target, c, true)
			up, err := net.DialTimeout("tcp", target, 5*time.Second)
			if err != nil {
				return
			}
			defer up.Close()
			done := make(chan struct{}, 2)
			go func() { io.Copy(up, c); done <- struct{}{} }()
			go func() { io.Copy(c, up); done <- struct{}{} }()
			<-done
		}()
	}
}
