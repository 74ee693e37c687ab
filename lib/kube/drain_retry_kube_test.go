package kube_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"unbounded-cloud.io/agent/lib/kube"
)

// fault is what a request gets instead of the API server's answer.
type fault string

const (
	refused     fault = "connection refused" // the API server is down
	unavailable fault = "503"                // a load balancer before a restarting API server
	throttled   fault = "429"                // the API server's flow control
	forbidden   fault = "403"                // an answer: no retry
)

// apiCalls sits between a client and the API server: it counts requests
// by kind (requestKind) and answers the first ones of a kind with the
// faults its plan lists for it, or every one while down, passing the
// rest through.
type apiCalls struct {
	next http.RoundTripper

	mu   sync.Mutex
	n    map[string]int
	plan map[string][]fault
	down bool
}

func (c *apiCalls) wrap(rt http.RoundTripper) http.RoundTripper {
	c.next = rt
	return c
}

// requestKind: "list pods", "evict <pod>", "get node", "patch node",
// "delete node", else method and path.
func requestKind(r *http.Request) string {
	p := r.URL.Path
	parts := strings.Split(strings.Trim(p, "/"), "/")
	switch {
	case strings.HasSuffix(p, "/eviction") && len(parts) >= 2:
		return "evict " + parts[len(parts)-2]
	case r.Method == http.MethodGet && p == "/api/v1/pods":
		return "list pods"
	case strings.HasPrefix(p, "/api/v1/nodes/"):
		return strings.ToLower(r.Method) + " node"
	}
	return r.Method + " " + p
}

func (c *apiCalls) RoundTrip(r *http.Request) (*http.Response, error) {
	kind := requestKind(r)
	c.mu.Lock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[kind]++
	var f fault
	if c.down {
		f = refused
	} else if plan := c.plan[kind]; len(plan) > 0 {
		f, c.plan[kind] = plan[0], plan[1:]
	}
	c.mu.Unlock()
	if f == "" {
		return c.next.RoundTrip(r)
	}
	if r.Body != nil {
		r.Body.Close()
	}
	switch f {
	case refused:
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	case unavailable:
		return response(r, http.StatusServiceUnavailable, "text/plain", []byte("upstream connect error")), nil
	case throttled:
		return statusResponse(r, http.StatusTooManyRequests, metav1.StatusReasonTooManyRequests, "too many requests, please try again later"), nil
	case forbidden:
		return statusResponse(r, http.StatusForbidden, metav1.StatusReasonForbidden, "forbidden by the test"), nil
	}
	panic("unknown fault " + f)
}

func response(r *http.Request, code int, contentType string, body []byte) *http.Response {
	return &http.Response{
		StatusCode: code, Status: fmt.Sprintf("%d %s", code, http.StatusText(code)),
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{"Content-Type": {contentType}}, Body: io.NopCloser(bytes.NewReader(body)),
		ContentLength: int64(len(body)), Request: r,
	}
}

func statusResponse(r *http.Request, code int, reason metav1.StatusReason, msg string) *http.Response {
	body, _ := json.Marshal(&metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status: metav1.StatusFailure, Code: int32(code), Reason: reason, Message: msg})
	return response(r, code, "application/json", body)
}

// count is the number of requests whose kind starts with prefix.
func (c *apiCalls) count(prefix string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for k, v := range c.n {
		if strings.HasPrefix(k, prefix) {
			n += v
		}
	}
	return n
}

// TestDrainAndCordonRideOutAnAPIServerThatDoesNotAnswer: every request of
// the repave's cluster calls that gets no answer (connection refused, a
// 503, the flow control's 429) is tried again, and the cordon, the drain
// and the deletion finish, the drain within its timeout.
func TestDrainAndCordonRideOutAnAPIServerThatDoesNotAnswer(t *testing.T) {
	f := newDrainFixture(t)
	owner := f.replicaSet("web")
	f.pod("web", func(p *corev1.Pod) { p.OwnerReferences = []metav1.OwnerReference{owner} })
	calls := &apiCalls{plan: map[string][]fault{
		"get node":    {refused, throttled},
		"patch node":  {refused, unavailable},
		"list pods":   {refused, unavailable, throttled},
		"evict web":   {unavailable, refused},
		"delete node": {refused},
	}}
	d := f.drainer(calls)
	d.Timeout = 30 * time.Second
	ctx := context.Background()

	if n, err := d.GetNode(ctx); err != nil || n == nil {
		t.Fatalf("get node through faults: %+v, %v", n, err)
	}
	if err := d.SetUnschedulable(ctx, true); err != nil {
		t.Fatalf("cordon through faults: %v", err)
	}
	if n, err := f.admin.CoreV1().Nodes().Get(ctx, f.node, metav1.GetOptions{}); err != nil || !n.Spec.Unschedulable {
		t.Fatalf("the Node after the cordon: %v, unschedulable %v", err, n != nil && n.Spec.Unschedulable)
	}
	start := time.Now()
	if err := d.Drain(ctx); err != nil {
		t.Fatalf("drain through faults: %v", err)
	}
	if took := time.Since(start); took > d.Timeout {
		t.Errorf("the drain took %s, more than its timeout %s", took, d.Timeout)
	}
	if f.exists("web") {
		t.Errorf("pod web is still there after the drain")
	}
	if err := d.DeleteNode(ctx); err != nil {
		t.Fatalf("delete node through faults: %v", err)
	}
	if _, err := f.admin.CoreV1().Nodes().Get(ctx, f.node, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the Node after the deletion: %v, want not found", err)
	}
	// Each fault was met, and each kind passed once after its faults
	// (the drain lists its pods again to see the evicted one gone).
	for kind, want := range map[string]int{"get node": 3, "patch node": 3, "evict web": 3, "delete node": 2} {
		if got := calls.count(kind); got != want {
			t.Errorf("%d %s request(s), want %d", got, kind, want)
		}
	}
	if got := calls.count("list pods"); got < 5 {
		t.Errorf("%d pod list(s), want at least 5 (3 faults, the one that found the pod, one that found it gone)", got)
	}
}

// TestDrainAndCordonFailAtOnceOnAnAnswerThatIsNotTransient: a 403 is the
// API server's answer, not its absence: neither the drain nor the cordon
// tries again.
func TestDrainAndCordonFailAtOnceOnAnAnswerThatIsNotTransient(t *testing.T) {
	f := newDrainFixture(t)
	calls := &apiCalls{plan: map[string][]fault{"list pods": {forbidden}, "patch node": {forbidden}}}
	d := f.drainer(calls)
	d.Timeout = 30 * time.Second
	ctx := context.Background()

	start := time.Now()
	err := d.Drain(ctx)
	if err == nil || errors.Is(err, kube.ErrDrainTimeout) || !apierrors.IsForbidden(err) {
		t.Fatalf("drain whose pod list is forbidden: %v, want the 403", err)
	}
	if took, n := time.Since(start), calls.count("list pods"); took > 400*time.Millisecond || n != 1 {
		t.Errorf("drain whose pod list is forbidden: %d list(s) in %s, want 1 at once", n, took)
	}
	start = time.Now()
	err = d.SetUnschedulable(ctx, true)
	if !apierrors.IsForbidden(err) {
		t.Fatalf("cordon forbidden: %v, want the 403", err)
	}
	if took, n := time.Since(start), calls.count("patch node"); took > 400*time.Millisecond || n != 1 {
		t.Errorf("cordon forbidden: %d patch(es) in %s, want 1 at once", n, took)
	}
}

// TestDrainerRetriesEndAtTheirBound: with an API server that never
// answers, the retries end at RetryFor, at the context's sooner deadline,
// and at the drain's timeout, each with the last failure.
func TestDrainerRetriesEndAtTheirBound(t *testing.T) {
	f := newDrainFixture(t)
	calls := &apiCalls{down: true}
	d := f.drainer(calls)
	d.RetryFor, d.Timeout = 1500*time.Millisecond, 1500*time.Millisecond
	ctx := context.Background()

	check := func(what string, err error, took, max time.Duration) {
		t.Helper()
		if err == nil || !kube.NoAnswer(err) || !strings.Contains(err.Error(), "connection refused") {
			t.Errorf("%s with no API server: %v, want the connection refused", what, err)
		}
		if took < time.Second || took > max {
			t.Errorf("%s with no API server ended after %s, want within [1s, %s]", what, took, max)
		}
	}
	start := time.Now()
	err := d.SetUnschedulable(ctx, true)
	check("cordon", err, time.Since(start), 4*time.Second)

	short, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	d.RetryFor = 0 // the default minute: the context's deadline is sooner
	start = time.Now()
	_, err = d.GetNode(short)
	check("get node with a deadline of 1s", err, time.Since(start), 3*time.Second)

	start = time.Now()
	err = d.Drain(ctx)
	check("drain", err, time.Since(start), 4*time.Second)
	if !errors.Is(err, kube.ErrDrainTimeout) {
		t.Errorf("drain with no API server: %v, want ErrDrainTimeout", err)
	}
	if n := calls.count("list pods"); n < 2 {
		t.Errorf("drain with no API server: %d list(s), want them tried again", n)
	}
}
