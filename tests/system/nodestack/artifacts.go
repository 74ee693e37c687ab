package nodestack

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"
)

// Fault is how the artifact server misbehaves, for every request until
// changed. The zero Fault serves the files.
type Fault struct {
	// Status answers every request with this HTTP status and a short body.
	Status int
	// Garbage serves this many bytes of garbage (with status 200 and a
	// matching Content-Length) in place of any file.
	Garbage int
	// CutAfter sends the headers and this many bytes of the file, then
	// closes the connection (a download cut in the middle).
	CutAfter int64
	// Delay holds every request this long before answering (a slow mirror);
	// the hold ends early when the client goes away or the server closes.
	Delay time.Duration
}

// ArtifactServer serves a mirror directory over HTTP on 127.0.0.1, with
// Range support (resumed downloads), and misbehaves on demand.
type ArtifactServer struct {
	// URL is the mirror's base URL (http://127.0.0.1:PORT), for
	// [artifacts] base-url.
	URL string

	dir  string
	addr string

	mu       sync.Mutex
	fault    Fault
	srv      *http.Server
	requests []Request
	closing  chan struct{}
}

// Request is one request the server saw.
type Request struct {
	Path  string
	Range string // the Range header, "" without one
}

// ServeArtifacts starts a server for dir; it stops when the test ends.
func ServeArtifacts(t testing.TB, dir string) *ArtifactServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("nodestack: artifact server: %v", err)
	}
	a := &ArtifactServer{dir: dir, addr: ln.Addr().String()}
	a.URL = "http://" + a.addr
	a.serve(ln)
	t.Cleanup(a.Close)
	return a
}

// SetFault changes how the server answers from the next request on.
func (a *ArtifactServer) SetFault(f Fault) {
	a.mu.Lock()
	a.fault = f
	a.mu.Unlock()
}

// Close stops the server: open connections are cut and the port refuses
// connections (a mirror that is down).
func (a *ArtifactServer) Close() {
	a.mu.Lock()
	srv := a.srv
	a.srv = nil
	if srv != nil {
		close(a.closing)
	}
	a.mu.Unlock()
	if srv != nil {
		srv.Close()
	}
}

// Reopen serves again on the same port after Close (the mirror is back).
func (a *ArtifactServer) Reopen(t testing.TB) {
	t.Helper()
	var ln net.Listener
	var err error
	// The port was ours a moment ago; another process can take it in
	// between only in theory, and a retry covers a slow release.
	for range 50 {
		if ln, err = net.Listen("tcp", a.addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("nodestack: reopen artifact server on %s: %v", a.addr, err)
	}
	a.serve(ln)
}

// Requests returns the requests served so far.
func (a *ArtifactServer) Requests() []Request {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]Request(nil), a.requests...)
}

func (a *ArtifactServer) serve(ln net.Listener) {
	files := http.FileServer(http.Dir(a.dir))
	closing := make(chan struct{})
	srv := &http.Server{
		Handler:           http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { a.handle(w, r, files, closing) }),
		ReadHeaderTimeout: 10 * time.Second,
	}
	a.mu.Lock()
	a.srv, a.closing = srv, closing
	a.mu.Unlock()
	go srv.Serve(ln)
}

func (a *ArtifactServer) handle(w http.ResponseWriter, r *http.Request, files http.Handler, closing <-chan struct{}) {
	a.mu.Lock()
	f := a.fault
	a.requests = append(a.requests, Request{Path: r.URL.Path, Range: r.Header.Get("Range")})
	a.mu.Unlock()

	if f.Delay > 0 {
		select {
		case <-time.After(f.Delay):
		case <-r.Context().Done():
			return
		case <-closing:
			return
		}
	}
	switch {
	case f.Status != 0:
		http.Error(w, fmt.Sprintf("nodestack: fault: status %d", f.Status), f.Status)
	case f.Garbage > 0:
		w.Header().Set("Content-Length", strconv.Itoa(f.Garbage))
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Write(bytes.Repeat([]byte("garbage!"), f.Garbage/8+1)[:f.Garbage])
	case f.CutAfter > 0:
		files.ServeHTTP(&cutWriter{ResponseWriter: w, left: f.CutAfter}, r)
	default:
		files.ServeHTTP(w, r)
	}
}

// cutWriter passes n bytes of the body, then hijacks and closes the
// connection, so the client sees a short body under a full Content-Length.
type cutWriter struct {
	http.ResponseWriter
	left int64
	cut  bool
}

func (c *cutWriter) Write(p []byte) (int, error) {
	if c.cut {
		return 0, http.ErrHandlerTimeout
	}
	if int64(len(p)) <= c.left {
		c.left -= int64(len(p))
		return c.ResponseWriter.Write(p)
	}
	n, _ := c.ResponseWriter.Write(p[:c.left])
	c.left = 0
	c.cut = true
	if fl, ok := c.ResponseWriter.(http.Flusher); ok {
		fl.Flush()
	}
	if hj, ok := c.ResponseWriter.(http.Hijacker); ok {
		if conn, _, err := hj.Hijack(); err == nil {
			conn.Close()
		}
	}
	return n, http.ErrHandlerTimeout
}
