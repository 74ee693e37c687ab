package health

import (
	"context"
	"strings"
	"testing"

	"unbounded-cloud.io/agent/lib/noderecord"
	"unbounded-cloud.io/agent/lib/state"
	"unbounded-cloud.io/agent/lib/unitnames"
)

// A Node the cluster reports NotReady while the kubelet's healthz answers
// ok and its units run is an unhealthy check like a failed healthz: K of
// them start a restart, and the problem names the Ready condition's reason.
func TestHealthCountsANodeReportedNotReady(t *testing.T) {
	h := newHost(t)
	if err := h.run(t); err != nil { // the boot's first check: healthy
		t.Fatal(err)
	}
	h.units.Set(unitnames.Daemon, "active")
	if err := noderecord.Write(h.p, noderecord.Record{Node: "w1", Present: true, Status: "Unknown", Reason: "NodeStatusUnknown",
		Message: "Kubelet stopped posting node status."}); err != nil {
		t.Fatal(err)
	}
	probs := h.check().readiness(&state.AppliedConfig{Mode: "none", Slot: "kube1", Machine: "w1"}).Look(context.Background()).Problems
	if len(probs) != 1 || !strings.Contains(probs[0], "Ready Unknown, reason NodeStatusUnknown") {
		t.Fatalf("problems: %q", probs)
	}
	for i := 1; i <= 2; i++ { // Failures is 2 in these tests
		if err := h.run(t); err != nil {
			t.Fatalf("check %d: %v", i, err)
		}
	}
	if len(h.started()) != 1 || h.started()[0] != unitnames.Restart {
		t.Fatalf("after 2 checks of a NotReady Node: started %v, want one %s", h.started(), unitnames.Restart)
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
