package generator

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"unbounded-cloud.io/agent/lib/regfile/regfiletest"
	"unbounded-cloud.io/agent/lib/state"
)

// TestWriteReplacesAFIFOLeftInTheOutputDirectoryWithoutBlocking: Write
// reads a drop-in already there to skip rewriting it; a FIFO in its place
// (left by a manual run in a directory systemd did not empty) is replaced,
// not waited on.
func TestWriteReplacesAFIFOLeftInTheOutputDirectoryWithoutBlocking(t *testing.T) {
	plan := Decide(Input{Active: &state.AppliedConfig{Slot: "kube1", Mode: "nspawn"}, FenceUnit: fence, NodeUnits: installed("nspawn")})
	if len(plan.Files) == 0 {
		t.Fatalf("plan without a drop-in: %+v", plan)
	}
	out := t.TempDir()
	regfiletest.Make(t, filepath.Join(out, plan.Files[0].Path), regfiletest.FIFO)
	done := make(chan error, 1)
	go func() { done <- Write(out, plan) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(hangBudget):
		t.Fatalf("Write did not return within %v", hangBudget)
	}
	if got, want := tree(t, out), planTree(plan); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("written %q, planned %q", got, want)
	}
}
