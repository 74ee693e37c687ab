package kube_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"unbounded-cloud.io/agent/lib/kube"
	"unbounded-cloud.io/agent/lib/kube/clustertest"
)

// firstComeback waits for the replacement of the pod.
func firstComeback(t *testing.T, back <-chan clustertest.Comeback) clustertest.Comeback {
	t.Helper()
	select {
	case c, ok := <-back:
		if !ok {
			t.Fatal("the pod was not created again (see the errors above)")
		}
		return c
	case <-time.After(15 * time.Second):
		t.Fatal("the pod was not deleted and created again within 15s")
	}
	panic("unreachable")
}

// TestDrainEvictsAReplacementCreatedAfterTheNodeLooksEmpty: the race of
// issue 41, made deterministic. The pod's controller binds its
// replacement to the same Node itself, under the same name (as a
// StatefulSet's pod pinned to the node is); the replacement comes 1 s
// after the evicted pod is gone, well after the drain's first look at
// the empty Node (its Poll is 200 ms, the replacement's delay five
// times that). The drain must still be there to evict it: it ends only
// once the Node has stayed empty of pods to evict for its settle window
// (3 s here), watching the Node's pods meanwhile. A drain that returned
// at its first empty look left the replacement to the repave, which
// stopped the node under it.
func TestDrainEvictsAReplacementCreatedAfterTheNodeLooksEmpty(t *testing.T) {
	f := newDrainFixture(t)
	ctx := context.Background()
	pod := f.env.PinnedPod(t, f.ns, f.node, "db")
	back := f.env.ComesBack(t, pod, time.Second, 1)
	calls := &apiCalls{}
	d := f.drainer(calls)
	d.Timeout, d.Settle = 30*time.Second, 3*time.Second
	if err := d.SetUnschedulable(ctx, true); err != nil {
		t.Fatalf("cordon: %v", err)
	}

	start := time.Now()
	err := d.Drain(ctx)
	returned := time.Now()
	if err != nil {
		t.Fatalf("drain of a pod whose replacement comes after 1s: %v", err)
	}
	c := firstComeback(t, back)
	t.Logf("pod gone %s into the drain, its replacement created %s later, the drain returned %s after that",
		c.Gone.Sub(start).Round(time.Millisecond), c.At.Sub(c.Gone).Round(time.Millisecond), returned.Sub(c.At).Round(time.Millisecond))
	if returned.Before(c.At) {
		t.Fatalf("the drain returned %s after the pod was gone, %s before its replacement was created on the Node: it ended at a look at an empty Node and left the replacement to the repave",
			returned.Sub(c.Gone).Round(time.Millisecond), c.At.Sub(returned).Round(time.Millisecond))
	}
	if f.exists(pod.Name) {
		t.Errorf("the replacement %s/%s (UID %s) is still on the Node after the drain", f.ns, pod.Name, c.Pod.UID)
	}
	if n := calls.count("evict " + pod.Name); n != 2 {
		t.Errorf("%d eviction(s) of %s, want 2: the pod, then its replacement", n, pod.Name)
	}
	if gap := returned.Sub(c.At); gap < d.Settle {
		t.Errorf("the drain returned %s after the replacement was created, sooner than its settle window (%s) after it was gone", gap.Round(time.Millisecond), d.Settle)
	}
}

// TestDrainOfAPodThatKeepsComingBackFailsAtItsTimeout: a pod created
// again on the Node 100 ms after each eviction (the delay seen in issue
// 41) never leaves the Node empty for the settle window: the drain evicts
// each one and fails at its timeout, not sooner and not much later, with
// ErrDrainTimeout naming the pod and saying it came back. The Node stays
// cordoned for the caller, which uncordons it (lib/repave's kube test of
// this drives a whole repave).
func TestDrainOfAPodThatKeepsComingBackFailsAtItsTimeout(t *testing.T) {
	f := newDrainFixture(t)
	ctx := context.Background()
	pod := f.env.PinnedPod(t, f.ns, f.node, "db")
	back := f.env.ComesBack(t, pod, 100*time.Millisecond, 0)
	calls := &apiCalls{}
	d := f.drainer(calls)
	d.Timeout = 4 * time.Second // settle window 1s
	if err := d.SetUnschedulable(ctx, true); err != nil {
		t.Fatalf("cordon: %v", err)
	}

	start := time.Now()
	err := d.Drain(ctx)
	took := time.Since(start)
	if !errors.Is(err, kube.ErrDrainTimeout) {
		t.Fatalf("drain of a pod that keeps coming back: %v, want ErrDrainTimeout", err)
	}
	t.Logf("after %s: %v", took.Round(time.Millisecond), err)
	for _, words := range []string{f.ns + "/" + pod.Name, "came back"} {
		if !strings.Contains(err.Error(), words) {
			t.Errorf("the drain's error does not say %q: %v", words, err)
		}
	}
	if took < d.Timeout || took > d.Timeout+3*time.Second {
		t.Errorf("the drain ended after %s, want at its timeout (%s)", took.Round(time.Millisecond), d.Timeout)
	}
	// Each replacement the drain had time to see (created a settle
	// window before its end, however slow the machine) was evicted too;
	// the first came back at least once. Counted on the pods the
	// controller made, not on a rate: a loaded CI machine makes fewer.
	end := start.Add(took)
	seen := 0
	for c := range drainComebacks(back) {
		if c.At.Before(end.Add(-d.Settle)) {
			seen++
		}
	}
	if n := calls.count("evict " + pod.Name); n < 2 || n < 1+seen {
		t.Errorf("%d eviction(s) of %s, which came back %d times before the drain's last settle window: want the pod and each of those evicted", n, pod.Name, seen)
	}
	if n, err := d.GetNode(ctx); err != nil || n == nil || !n.Spec.Unschedulable {
		t.Errorf("the Node after the failed drain: %v, unschedulable %v; want it left cordoned for the caller", err, n != nil && n.Spec.Unschedulable)
	}
}

// drainComebacks drains the comebacks ComesBack has sent so far.
func drainComebacks(back <-chan clustertest.Comeback) <-chan clustertest.Comeback {
	out := make(chan clustertest.Comeback, len(back))
	for range len(back) {
		out <- <-back
	}
	close(out)
	return out
}
