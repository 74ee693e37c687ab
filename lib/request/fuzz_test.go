package request

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"unbounded-cloud.io/agent/lib/hostpaths"
)

// FuzzRead: whatever lies in a request file, Read returns a request with a
// UID or an error wrapping ErrCorrupt; it never panics, and a request it
// accepts survives Write and Read unchanged in meaning.
func FuzzRead(f *testing.F) {
	f.Add([]byte(`{"uid":"u1","type":"Repave","operation":"op1"}`))
	f.Add([]byte(`{"uid":"u1","desired":{"machine":"w1"}}`))
	f.Add([]byte(`{"type":"Repave"}`))
	f.Add([]byte(`{"uid":"u","color":"blue"}`))
	f.Add([]byte("{"))
	f.Add([]byte(""))
	dir := f.TempDir()
	p := hostpaths.New(dir)
	f.Fuzz(func(t *testing.T, data []byte) {
		if err := os.MkdirAll(filepath.Dir(p.Request("fuzz")), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p.Request("fuzz"), data, 0o644); err != nil {
			t.Fatal(err)
		}
		r, err := Read(p, "fuzz")
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error does not wrap ErrCorrupt: %v", err)
			}
			return
		}
		if r.UID == "" {
			t.Fatal("accepted a request without uid")
		}
		if err := Write(p, "again", r); err != nil {
			t.Fatal(err)
		}
		back, err := Read(p, "again")
		if err != nil || back.UID != r.UID {
			t.Fatalf("accepted request does not read back: %v %+v", err, back)
		}
	})
}
