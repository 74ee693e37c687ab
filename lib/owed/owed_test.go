package owed

import (
	"strings"
	"testing"
	"time"

	"unbounded-cloud.io/agent/lib/hostpaths"
)

// Two operations' final statuses are two records, each found, listed and
// settled by its ID; an uncordon is one record of its kind.
func TestRecordsAreKeptByIDAndSettledOneByOne(t *testing.T) {
	p := hostpaths.New(t.TempDir())
	a := Write{Kind: OperationStatus, Operation: "op-a", UID: "1111-aaaa", State: "Complete", Reason: "UnitSucceeded", Since: time.Now()}
	b := Write{Kind: OperationStatus, Operation: "op-b", UID: "2222-bbbb", State: "Failed", Reason: "UnitFailed", Message: "exit status 1", Since: time.Now()}
	u := Write{Kind: Uncordon, Node: "w1", By: "repave", Since: time.Now()}
	for _, w := range []Write{a, b, u} {
		if err := Owe(p, w); err != nil {
			t.Fatalf("owe %s: %v", w.ID(), err)
		}
	}
	if ws, err := List(p); err != nil || len(ws) != 3 {
		t.Fatalf("List = %d records, %v; want 3", len(ws), err)
	}
	got, err := Find(p, b.ID())
	if err != nil || got == nil || got.Operation != "op-b" || got.State != "Failed" || got.Message != "exit status 1" {
		t.Fatalf("Find(%s) = %+v, %v", b.ID(), got, err)
	}
	if !strings.Contains(got.String(), "MachineOperation op-b: Failed UnitFailed") {
		t.Errorf("String() = %q, want it to name the operation and its status", got.String())
	}
	if err := Settle(p, a.ID()); err != nil {
		t.Fatal(err)
	}
	if got, err := Find(p, a.ID()); err != nil || got != nil {
		t.Fatalf("Find after Settle = %+v, %v; want none", got, err)
	}
	if got, err := Find(p, b.ID()); err != nil || got == nil {
		t.Fatalf("the other operation's record: %+v, %v; want it kept", got, err)
	}
	if err := Settle(p, a.ID()); err != nil {
		t.Errorf("Settle of a settled record: %v, want nil", err)
	}
}

// An ID is one file name: a UID that would leave the directory is refused,
// and nothing is written.
func TestAnIDThatIsNotOneFileNameIsRefused(t *testing.T) {
	p := hostpaths.New(t.TempDir())
	for _, uid := range []string{"../../etc/x", "a/b", "a.json"} {
		if err := Owe(p, Write{Kind: OperationStatus, UID: uid}); err == nil {
			t.Errorf("Owe with UID %q: nil error", uid)
		}
		if _, err := Find(p, OperationStatus+"-"+uid); err == nil {
			t.Errorf("Find of %q: nil error", uid)
		}
	}
	if ws, err := List(p); err != nil || len(ws) != 0 {
		t.Errorf("List = %v, %v; want nothing written", ws, err)
	}
}
