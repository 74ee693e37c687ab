package daemon

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/owed"
	"unbounded-cloud.io/agent/lib/unitnames"
)

// A repave that failed with the API server down owed its uncordon
// (lib/owed): the daemon makes it once the cluster answers, not while
// another repave runs, and settles the record.
func TestDaemonMakesAnOwedUncordonOnceTheClusterAnswers(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	f.env.createReadyNode(t, f.machine)
	if _, err := f.env.kube.CoreV1().Nodes().Patch(ctx, f.machine, types.MergePatchType, []byte(`{"spec":{"unschedulable":true}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := owed.Owe(f.opts.Paths, owed.Write{Kind: owed.Uncordon, Node: f.machine, By: "repave", Why: "test", Since: time.Now()}); err != nil {
		t.Fatal(err)
	}
	unschedulable := func() bool {
		n, err := f.env.kube.CoreV1().Nodes().Get(ctx, f.machine, metav1.GetOptions{})
		return err != nil || n.Spec.Unschedulable
	}
	// While a repave runs, it decides: the daemon waits.
	f.fake.configure(unitnames.Repave, func(u *fakeUnit) { u.st.ActiveState, u.st.SubState = "activating", "start" })
	d := startDaemon(t, f.opts)
	time.Sleep(2 * time.Second)
	if !unschedulable() {
		t.Fatal("the daemon uncordoned the Node while a repave ran")
	}
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
	f.fake.configure(unitnames.Repave, func(u *fakeUnit) { u.st.ActiveState, u.st.SubState = "inactive", "dead" })
	startDaemon(t, f.opts)
	eventually(t, 20*time.Second, "the owed uncordon made and settled", func() bool {
		ws, _ := owed.List(f.opts.Paths)
		return !unschedulable() && len(ws) == 0
	})
	if _, err := os.Stat(f.opts.Paths.OwedDir() + "/uncordon.json"); !os.IsNotExist(err) {
		t.Errorf("the owed record is left: %v", err)
	}
}

// flakyStatus answers the first writes of an operation's final status
// (Complete) with a 503, as a load balancer before a restarting API
// server does.
type flakyStatus struct {
	next http.RoundTripper
	mu   sync.Mutex
	left int
	hits int
}

func (f *flakyStatus) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method == http.MethodPut && strings.Contains(r.URL.Path, "/machineoperations/") && strings.HasSuffix(r.URL.Path, "/status") && r.Body != nil {
		body, err := io.ReadAll(r.Body)
		r.Body.Close()
		if err != nil {
			return nil, err
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		f.mu.Lock()
		fail := f.left > 0 && bytes.Contains(body, []byte(`"state":"Complete"`))
		if fail {
			f.left--
			f.hits++
		}
		f.mu.Unlock()
		if fail {
			if r.Body != nil {
				r.Body.Close()
			}
			return &http.Response{StatusCode: http.StatusServiceUnavailable, Status: "503 Service Unavailable", Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
				Header: http.Header{"Content-Type": {"text/plain"}}, Body: io.NopCloser(strings.NewReader("upstream connect error")), Request: r}, nil
		}
	}
	return f.next.RoundTrip(r)
}

// An operation's status write that gets no answer is tried again (the
// rule of every cluster write, kube.Retry): the operation still ends
// Complete, and the daemon keeps running.
func TestOperationStatusWritesRideOutAnAPIServerThatDoesNotAnswer(t *testing.T) {
	f := newFixture(t)
	flaky := &flakyStatus{left: 3}
	f.opts.REST.Wrap(func(rt http.RoundTripper) http.RoundTripper { flaky.next = rt; return flaky })
	d := startDaemon(t, f.opts)
	op := f.env.createOp(t, f.machine, v1alpha3.OperationRestart)
	done := f.env.waitOp(t, op.Name, opTimeout)
	if done.Status.State != v1alpha3.OperationComplete {
		t.Fatalf("operation ended %s/%s (%s), want Complete", done.Status.State, done.Status.Reason, done.Status.Message)
	}
	flaky.mu.Lock()
	hits := flaky.hits
	flaky.mu.Unlock()
	if hits != 3 {
		t.Errorf("%d final status writes answered 503, want 3", hits)
	}
	select {
	case <-d.done:
		t.Fatalf("the daemon stopped: %v", d.err)
	default:
	}
}

// refusedStatus refuses every write of an operation's final status with
// a 422 (as an admission policy would): an answer, so not retried, and
// the write stays owed.
type refusedStatus struct {
	next http.RoundTripper
	mu   sync.Mutex
	hits int
}

func (f *refusedStatus) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.hits
}

func (f *refusedStatus) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method == http.MethodPut && strings.Contains(r.URL.Path, "/machineoperations/") && strings.HasSuffix(r.URL.Path, "/status") && r.Body != nil {
		body, err := io.ReadAll(r.Body)
		r.Body.Close()
		if err != nil {
			return nil, err
		}
		if bytes.Contains(body, []byte(`"state":"Complete"`)) || bytes.Contains(body, []byte(`"state":"Failed"`)) {
			f.mu.Lock()
			f.hits++
			f.mu.Unlock()
			return &http.Response{StatusCode: http.StatusUnprocessableEntity, Status: "422 Unprocessable Entity", Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
				Header: http.Header{"Content-Type": {"text/plain"}}, Body: io.NopCloser(strings.NewReader("refused by a test")), Request: r}, nil
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
	}
	return f.next.RoundTrip(r)
}

// A final status the cluster does not take is owed on the host (lib/owed)
// and written by the next daemon as it was decided, even when the unit's
// state has changed since (a run by hand that failed, a reboot that
// unloaded it): the decision is not made again. The record goes once the
// status is written, and `unbounded status` would list it until then.
func TestFinalStatusTheClusterDidNotTakeIsWrittenByTheNextDaemonAsDecided(t *testing.T) {
	f := newFixture(t)
	refused := &refusedStatus{}
	opts := f.opts
	opts.REST = rest.CopyConfig(f.opts.REST)
	opts.REST.Wrap(func(rt http.RoundTripper) http.RoundTripper { refused.next = rt; return refused })
	d := startDaemon(t, opts)
	op := f.env.createOp(t, f.machine, v1alpha3.OperationRestart)
	id := owed.Write{Kind: owed.OperationStatus, UID: string(op.UID)}.ID()
	var w *owed.Write
	// The record is written before the status is sent: wait for the
	// refusal too, or the daemon may be stopped before it sends it.
	eventually(t, opTimeout, "the final status refused and owed on the host", func() bool {
		w, _ = owed.Find(f.opts.Paths, id)
		return w != nil && refused.count() > 0
	})
	if err := d.stop(t); err != nil {
		t.Fatalf("daemon: %v", err)
	}
	if w.State != string(v1alpha3.OperationComplete) || w.Reason != ReasonUnitSucceeded || w.Operation != op.Name {
		t.Fatalf("owed status %+v, want Complete %s of %s", w, ReasonUnitSucceeded, op.Name)
	}
	if got := f.env.getOp(t, op.Name); got.Status.State != v1alpha3.OperationInProgress {
		t.Fatalf("operation %s/%s while its final status was refused, want InProgress", got.Status.State, got.Status.Reason)
	}
	// Since then the unit ran again and failed.
	f.fake.configure("unbounded-restart.service", func(u *fakeUnit) {
		u.st = UnitState{ActiveState: "failed", SubState: "failed", Result: "exit-code", ExecMainStatus: 1, InvocationID: "fedcba9876543210fedcba9876543210"}
	})

	startDaemon(t, f.opts)
	done := f.env.waitOp(t, op.Name, opTimeout)
	if done.Status.State != v1alpha3.OperationComplete || done.Status.Reason != ReasonUnitSucceeded {
		t.Fatalf("operation ended %s/%s (%s), want the owed Complete/%s", done.Status.State, done.Status.Reason, done.Status.Message, ReasonUnitSucceeded)
	}
	if n := f.fake.startCount("unbounded-restart.service"); n != 1 {
		t.Errorf("unbounded-restart.service started %d times, want 1", n)
	}
	if c := done.Status.CompletionTime; c == nil || !c.Time.Equal(w.Since.Truncate(time.Second)) {
		t.Errorf("completion time %v, want the time the operation ended, %v", c, w.Since)
	}
	eventually(t, opTimeout, "one OperationComplete Event", func() bool {
		return slices.Index(f.machineEvents(t), "OperationComplete") >= 0
	})
	if n := countOf(f.machineEvents(t), "OperationComplete"); n != 1 {
		t.Errorf("%d OperationComplete Events, want 1 (none for a refused write)", n)
	}
	eventually(t, opTimeout, "the owed record settled", func() bool {
		w, err := owed.Find(f.opts.Paths, id)
		return err == nil && w == nil
	})
}

func countOf(list []string, s string) int {
	n := 0
	for _, e := range list {
		if e == s {
			n++
		}
	}
	return n
}
