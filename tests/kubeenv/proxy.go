package kubeenv

import (
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/rest"
)

// Proxy is a loopback TCP proxy in front of the API server. TLS passes
// through untouched (the serving certificate names 127.0.0.1), so a client
// pointed at the proxy sees the real server, only slower or gone.
type Proxy struct {
	ln       net.Listener
	upstream string

	mu     sync.Mutex
	delay  time.Duration
	conns  map[net.Conn]struct{}
	closed bool
	// done is closed by Close, ending every hold at once.
	done chan struct{}
	wg   sync.WaitGroup
}

// ProxyFront starts a proxy in front of the API server; it is closed when
// the test ends.
func (e *Env) ProxyFront(t testing.TB) *Proxy {
	t.Helper()
	u, err := url.Parse(e.admin.Host)
	if err != nil {
		t.Fatalf("kubeenv: API server host %q: %v", e.admin.Host, err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("kubeenv: proxy: %v", err)
	}
	p := &Proxy{ln: ln, upstream: u.Host, conns: map[net.Conn]struct{}{}, done: make(chan struct{})}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(p.Close)
	return p
}

// Host is the proxy's URL, to use in place of Env.Host.
func (p *Proxy) Host() string { return "https://" + p.ln.Addr().String() }

// Config returns a copy of cfg that goes through the proxy.
func (p *Proxy) Config(cfg *rest.Config) *rest.Config {
	c := rest.CopyConfig(cfg)
	c.Host = p.Host()
	return c
}

// SetDelay holds every chunk of bytes a client sends for d before it goes
// on to the API server: a new connection's handshake and every request on
// an open one are answered at least d late, as by a slow or overloaded
// server. Zero removes the delay.
func (p *Proxy) SetDelay(d time.Duration) {
	p.mu.Lock()
	p.delay = d
	p.mu.Unlock()
}

func (p *Proxy) currentDelay() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.delay
}

// hold waits the current delay; false if the proxy closed meanwhile.
func (p *Proxy) hold() bool {
	d := p.currentDelay()
	if d <= 0 {
		return true
	}
	select {
	case <-time.After(d):
		return true
	case <-p.done:
		return false
	}
}

// Close makes the API server unreachable through the proxy: open
// connections are cut and new ones are refused (the port is closed).
func (p *Proxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	close(p.done)
	p.ln.Close()
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	c.Close()
}

func (p *Proxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			return
		}
		p.wg.Add(1)
		go p.handle(c)
	}
}

func (p *Proxy) handle(client net.Conn) {
	defer p.wg.Done()
	defer p.untrack(client)
	server, err := net.DialTimeout("tcp", p.upstream, 5*time.Second)
	if err != nil {
		return
	}
	if !p.track(server) {
		return
	}
	defer p.untrack(server)
	done := make(chan struct{}, 2)
	go func() {
		p.forward(server, client)
		done <- struct{}{}
	}()
	go func() {
		io.Copy(client, server)
		done <- struct{}{}
	}()
	<-done // either side gone: cut both
}

// forward copies client bytes to the server, each chunk held for the delay
// in force when it arrived.
func (p *Proxy) forward(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.hold() {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
