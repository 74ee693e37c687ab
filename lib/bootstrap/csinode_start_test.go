package bootstrap_test

import (
	"testing"
	"time"
)

// TestCSINodeRestartWithoutGraceOnceTheEarlyTriesAreOver: a caller that
// started the kubelet right before the wait (a repave) sets
// CSINodeAfterStart; a Node still waiting for its CSINode after it is
// restarted at once, however long CSINodeGrace is (here longer than the
// whole wait: without the rule the wait times out).
func TestCSINodeRestartWithoutGraceOnceTheEarlyTriesAreOver(t *testing.T) {
	w := newWorld(t)
	w.SetCSINodePending(false)
	b := w.Bootstrap(nil)
	b.CSINodeGrace = time.Hour
	b.CSINodeAfterStart = 300 * time.Millisecond
	if err := b.Run(t.Context()); err != nil {
		t.Fatalf("bootstrap with a Node waiting for its CSINode: %v", err)
	}
	n := 0
	for _, c := range w.Calls() {
		if c == "restart kube1" {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%d restarts of the node stack, want 1: %q", n, w.Calls())
	}
}
