package health

import (
	"context"
	"strings"
	"testing"
	"time"

	"unbounded-cloud.io/agent/lib/noderecord"
	"unbounded-cloud.io/agent/lib/unitnames"
)

// NodeReady counts a Node the cluster reports not Ready only when the
// daemon's watch is live (a record exists and the daemon runs); unknown
// counts as nothing.
func TestNodeReadyCountsOnlyWhatTheDaemonsLiveWatchSays(t *testing.T) {
	h := newHost(t)
	ctx := context.Background()
	write := func(r noderecord.Record) {
		t.Helper()
		if err := noderecord.Write(h.p, r); err != nil {
			t.Fatal(err)
		}
	}
	notReady := noderecord.Record{Node: "w1", Present: true, Status: "False", Reason: "KubeletNotReady",
		Message: "container runtime network not ready", Transition: time.Unix(3000, 0), Since: time.Unix(3001, 0)}

	h.units.states[unitnames.Daemon] = "active"
	if err := NodeReady(ctx, h.p, h.units); err != nil {
		t.Fatalf("no record (watch not live): %v", err)
	}
	write(noderecord.Record{Node: "w1", Present: true, Ready: true, Status: "True", Reason: "KubeletReady"})
	if err := NodeReady(ctx, h.p, h.units); err != nil {
		t.Fatalf("Ready: %v", err)
	}
	write(notReady)
	err := NodeReady(ctx, h.p, h.units)
	if err == nil || !strings.Contains(err.Error(), "Node w1 is not Ready") || !strings.Contains(err.Error(), "KubeletNotReady") ||
		!strings.Contains(err.Error(), "container runtime network not ready") {
		t.Fatalf("NotReady: %v", err)
	}
	h.units.states[unitnames.Daemon] = "activating"
	if err := NodeReady(ctx, h.p, h.units); err != nil {
		t.Fatalf("daemon not running (its record is not current): %v", err)
	}
	h.units.states[unitnames.Daemon] = "active"
	write(noderecord.Record{Node: "w1", Present: false})
	if err := NodeReady(ctx, h.p, h.units); err != nil {
		t.Fatalf("no Node (registration is the kubelet's, a vanished one the daemon's): %v", err)
	}
}

// A Node the cluster reports NotReady while the kubelet's healthz answers
// ok and its units run is an unhealthy check like a failed healthz: K of
// them start a restart, and the problem names the Ready condition's reason.
func TestHealthCountsANodeReportedNotReady(t *testing.T) {
	h := newHost(t)
	if err := h.run(t); err != nil { // the boot's first check: healthy
		t.Fatal(err)
	}
	h.units.states[unitnames.Daemon] = "active"
	if err := noderecord.Write(h.p, noderecord.Record{Node: "w1", Present: true, Status: "Unknown", Reason: "NodeStatusUnknown",
		Message: "Kubelet stopped posting node status."}); err != nil {
		t.Fatal(err)
	}
	probs := Problems(context.Background(), h.units, func(context.Context) error { return nil },
		func(ctx context.Context) error { return NodeReady(ctx, h.p, h.units) }, "none", "kube1")
	if len(probs) != 1 || !strings.Contains(probs[0], "Ready Unknown, reason NodeStatusUnknown") {
		t.Fatalf("problems: %q", probs)
	}
	for i := 1; i <= 2; i++ { // Failures is 2 in these tests
		if err := h.run(t); err != nil {
			t.Fatalf("check %d: %v", i, err)
		}
	}
	if len(h.units.started) != 1 || h.units.started[0] != unitnames.Restart {
		t.Fatalf("after 2 checks of a NotReady Node: started %v, want one %s", h.units.started, unitnames.Restart)
	}
	// The daemon's watch goes down (record removed): unknown, not counted,
	// and the node counts as healthy again.
	if err := noderecord.Remove(h.p); err != nil {
		t.Fatal(err)
	}
	if err := h.run(t); err != nil {
		t.Fatal(err)
	}
	st, err := loadState(h.p)
	if err != nil {
		t.Fatal(err)
	}
	if st.Failures != 0 || st.Restarts != 0 {
		t.Fatalf("unknown Node state counted: %+v", st)
	}
}
