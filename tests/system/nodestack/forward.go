package nodestack

import (
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"unbounded-cloud.io/agent/tests/system/harness"
)

// forwardDir is where a machine sees the host's sockets.
const forwardDir = "/run/unbounded-test-forward"

// Forwarder carries TCP connections from a machine's own loopback to
// services on the host's loopback, for machines booted with a private
// network (so that their kubelet, CNI bridge and iptables rules stay in
// their own network namespace, and two of them never collide).
//
// Why not a veth pair: the services listen on 127.0.0.1 (the API server's
// certificate names it), and a route from a container to the host's
// loopback does not exist. Here every byte stays on loopback interfaces
// and in unix sockets: for each address the host listens on a unix socket
// in a directory bind-mounted into the machine, and inside the machine a
// socket unit on the same 127.0.0.1:PORT hands connections to
// systemd-socket-proxyd, which connects to that unix socket.
type Forwarder struct {
	dir   string
	addrs []string
	lns   []net.Listener
	wg    sync.WaitGroup

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

// Forward starts the host side for each address ("127.0.0.1:PORT", or a URL
// whose host is one); it stops when the test ends. Pass NspawnArgs and
// Files to the machine.
func Forward(t testing.TB, addrs ...string) *Forwarder {
	t.Helper()
	// A short path: unix socket paths are limited to 107 bytes.
	dir, err := os.MkdirTemp("", "ubt-fwd-")
	if err != nil {
		t.Fatal(err)
	}
	f := &Forwarder{dir: dir}
	t.Cleanup(func() {
		for _, ln := range f.lns {
			ln.Close()
		}
		f.wg.Wait()
		os.RemoveAll(dir)
	})
	for _, a := range addrs {
		a = hostPort(a)
		host, port, err := net.SplitHostPort(a)
		if err != nil || host != "127.0.0.1" {
			t.Fatalf("nodestack: forward %q: want 127.0.0.1:PORT", a)
		}
		ln, err := net.Listen("unix", filepath.Join(dir, port+".sock"))
		if err != nil {
			t.Fatalf("nodestack: forward %s: %v", a, err)
		}
		f.addrs = append(f.addrs, a)
		f.lns = append(f.lns, ln)
		f.wg.Add(1)
		go f.serve(ln, a)
	}
	return f
}

func hostPort(a string) string {
	for _, p := range []string{"https://", "http://"} {
		a = strings.TrimPrefix(a, p)
	}
	host, _, _ := strings.Cut(a, "/")
	return host
}

func (f *Forwarder) serve(ln net.Listener, target string) {
	defer f.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
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

// NspawnArgs bind the socket directory into the machine.
func (f *Forwarder) NspawnArgs() []string {
	return []string{"--bind-ro=" + f.dir + ":" + forwardDir}
}

// Files are the socket and service units that listen on the machine's
// loopback, pulled in by sockets.target at boot.
func (f *Forwarder) Files() []harness.File {
	var files []harness.File
	var wants []string
	for _, a := range f.addrs {
		_, port, _ := net.SplitHostPort(a)
		unit := "unbounded-test-forward-" + port
		wants = append(wants, unit+".socket")
		files = append(files,
			harness.File{Path: "/etc/systemd/system/" + unit + ".socket", Mode: 0o644, Data: fmt.Appendf(nil,
				"# Written by tests/system/nodestack: %s on this machine's loopback is the host's.\n[Socket]\nListenStream=%s\n", a, a)},
			harness.File{Path: "/etc/systemd/system/" + unit + ".service", Mode: 0o644, Data: fmt.Appendf(nil,
				"[Unit]\nRequires=%s.socket\nAfter=%s.socket\n[Service]\nExecStart=/lib/systemd/systemd-socket-proxyd %s/%s.sock\n",
				unit, unit, forwardDir, port)},
		)
	}
	files = append(files, harness.File{Path: "/etc/systemd/system/sockets.target.d/unbounded-test-forward.conf", Mode: 0o644,
		Data: []byte("[Unit]\nWants=" + strings.Join(wants, " ") + "\n")})
	return files
}
