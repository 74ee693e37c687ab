package status

import (
	"strings"
	"testing"
	"time"

	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/regfile/regfiletest"
)

// hangDetector bounds Gather in the test below: it detects a status that
// blocks, not a slow one.
const hangDetector = 2 * time.Second

// TestGatherReturnsWhenStateFilesAreFIFOsOrDevices: an operator runs
// status when things are broken; a FIFO or /dev/zero among the state files
// must be reported, not wait for a writer or read forever.
func TestGatherReturnsWhenStateFilesAreFIFOsOrDevices(t *testing.T) {
	for _, k := range regfiletest.Kinds {
		t.Run(k.String(), func(t *testing.T) {
			p := hostpaths.New(t.TempDir())
			for _, f := range []string{p.AppliedConfig("kube1"), hostpaths.Checksum(p.AppliedConfig("kube2")), p.Ownership(), p.Journal("repave"), p.Adopted()} {
				regfiletest.Make(t, f, k)
			}
			done := make(chan Report, 1)
			go func() { done <- Gather(p) }()
			var r Report
			select {
			case r = <-done:
			case <-time.After(hangDetector):
				t.Fatalf("Gather did not return within %v", hangDetector)
			}
			if r.State != Corrupt || !strings.Contains(r.Message, k.Describes()) {
				t.Errorf("state %q, message %q, want corrupt saying it %s", r.State, r.Message, k.Describes())
			}
			if r.Ownership == nil || r.Ownership.Owner != "unknown" || !strings.Contains(r.Ownership.Error, k.Describes()) {
				t.Errorf("ownership %+v", r.Ownership)
			}
			if len(r.Journals) != 1 || !strings.Contains(r.Journals[0].Error, k.Describes()) {
				t.Errorf("journals %+v", r.Journals)
			}
			if !strings.Contains(r.Legacy.AdoptedError, k.Describes()) {
				t.Errorf("adoption record: %+v", r.Legacy)
			}
		})
	}
}
