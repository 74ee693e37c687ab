package readiness

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/textproto"
	"strings"
	"time"
)

// KubeletHealthzAddr is where lib/modes/nodestack configures the kubelet's
// healthz (healthzBindAddress 127.0.0.1, port 10248). Both modes run the
// node stack in the host's network namespace, so the host reaches it.
const KubeletHealthzAddr = "127.0.0.1:10248"

// probeTimeout bounds one probe.
const probeTimeout = 5 * time.Second

// Healthz asks the kubelet's healthz at addr (host:port) and returns nil
// when it answers 200 "ok".
//
// It speaks HTTP/1.0 over a plain TCP connection rather than through
// net/http: the endpoint is plain HTTP on loopback and answers one short
// line, and net/http (with its HTTP/2 client) would add about 3 MB to
// unbounded-health and unbounded-restart, which must stay under 5 MB
// (ARCHITECTURE section 3).
func Healthz(ctx context.Context, addr string) error {
	return probe(ctx, addr, "/healthz", "ok")
}

// probe GETs path at addr over HTTP/1.0 and returns nil when the answer is
// 200 with want as its whole body (spaces around it aside).
func probe(ctx context.Context, addr, path, want string) error {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	if _, err := fmt.Fprintf(conn, "GET %s HTTP/1.0\r\nHost: %s\r\nUser-Agent: unbounded-health\r\n\r\n", path, addr); err != nil {
		return err
	}
	r := textproto.NewReader(bufio.NewReader(io.LimitReader(conn, 64<<10)))
	status, err := r.ReadLine()
	if err != nil {
		return fmt.Errorf("reading the status line: %w", err)
	}
	proto, rest, _ := strings.Cut(status, " ")
	code, _, _ := strings.Cut(rest, " ")
	if !strings.HasPrefix(proto, "HTTP/1.") {
		return fmt.Errorf("not an HTTP answer: %q", truncate(status, 80))
	}
	if _, err := r.ReadMIMEHeader(); err != nil {
		return fmt.Errorf("reading the headers: %w", err)
	}
	body, _ := io.ReadAll(r.R)
	text := strings.TrimSpace(string(body))
	if code != "200" || text != want {
		return fmt.Errorf("HTTP %s %q", code, truncate(text, 200))
	}
	return nil
}
