package state

import (
	"os"
	"strings"
	"testing"

	"unbounded-cloud.io/agent/lib/hostpaths"
)

func TestRunRecordRoundTripAbsentAndCorrupt(t *testing.T) {
	p := hostpaths.New(t.TempDir())
	type rec struct{ A string }
	if err := WriteRunRecord(p, "x.json", rec{"a"}); err == nil || !strings.Contains(err.Error(), "runtime directory") {
		t.Fatalf("without /run/unbounded: %v, want the runtime directory named", err)
	}
	if err := os.MkdirAll(p.RunDir(), 0o755); err != nil {
		t.Fatal(err)
	}
	var r rec
	if ok, err := ReadRunRecord(p, "x.json", &r); ok || err != nil {
		t.Fatalf("absent: (%v, %v), want (false, nil)", ok, err)
	}
	if err := WriteRunRecord(p, "x.json", rec{"a"}); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(RunRecordFile(p, "x.json")); err != nil || fi.Mode().Perm() != 0o644 {
		t.Fatalf("record file: %v, %v; want mode 0644", fi, err)
	}
	if ok, err := ReadRunRecord(p, "x.json", &r); !ok || err != nil || r.A != "a" {
		t.Fatalf("read: (%v, %v, %+v), want (true, nil, {a})", ok, err, r)
	}
	if err := os.WriteFile(RunRecordFile(p, "x.json"), []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	if ok, err := ReadRunRecord(p, "x.json", &r); ok || err == nil || !strings.Contains(err.Error(), RunRecordFile(p, "x.json")) {
		t.Fatalf("corrupt: (%v, %v), want an error naming the file", ok, err)
	}
}
