package state

import (
	"errors"
	"os"
	"testing"

	"unbounded-cloud.io/agent/lib/hostpaths"
)

type testJournal struct {
	Step string   `json:"step"`
	Done []string `json:"done"`
}

func TestJournalRoundTripsAndIsGoneAfterRemove(t *testing.T) {
	p := hostpaths.New(t.TempDir())
	var j testJournal
	if ok, err := ReadJournal(p, "op", &j); ok || err != nil {
		t.Fatalf("no journal yet: %v %v", ok, err)
	}
	// A host root without a journal directory (found by the system
	// tier: a bootstrapped host whose bootstrap never journaled).
	if err := RemoveJournal(p, "op"); err != nil {
		t.Fatalf("remove without a journal directory: %v", err)
	}
	want := testJournal{Step: "slot", Done: []string{"hostprep", "artifacts"}}
	if err := WriteJournal(p, "op", want); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(p.Journal("op")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("journal file: %v %v, want mode 0600", fi, err)
	}
	if ok, err := ReadJournal(p, "op", &j); !ok || err != nil || j.Step != want.Step || len(j.Done) != 2 {
		t.Fatalf("read back %+v %v %v", j, ok, err)
	}
	if err := RemoveJournal(p, "op"); err != nil {
		t.Fatal(err)
	}
	if ok, err := ReadJournal(p, "op", &j); ok || err != nil {
		t.Errorf("after remove: %v %v", ok, err)
	}
}

// An operation never resumes from a journal it cannot trust: a tampered
// file (sidecar mismatch) and one of another shape are both corrupt.
func TestJournalThatDoesNotVerifyOrDecodeIsCorrupt(t *testing.T) {
	p := hostpaths.New(t.TempDir())
	if err := WriteJournal(p, "op", testJournal{Step: "a"}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p.Journal("op"), []byte(`{"step":"b","done":[]}`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var j testJournal
	if _, err := ReadJournal(p, "op", &j); !errors.Is(err, ErrCorrupt) {
		t.Errorf("tampered journal: %v, want ErrCorrupt", err)
	}
	if err := WriteJournal(p, "op", map[string]any{"unknown": 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadJournal(p, "op", &j); !errors.Is(err, ErrCorrupt) {
		t.Errorf("journal of another shape: %v, want ErrCorrupt", err)
	}
}
