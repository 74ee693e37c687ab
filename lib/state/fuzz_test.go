package state

import (
	"errors"
	"testing"

	"unbounded-cloud.io/agent/lib/modes/facts"
)

// FuzzDecodeApplied: any bytes either decode into a valid record or give
// ErrCorrupt; never a panic, never a record with an invalid slot or mode.
func FuzzDecodeApplied(f *testing.F) {
	f.Add([]byte(`{"slot":"kube1","mode":"nspawn"}`))
	f.Add([]byte(`{"slot":"kube2","mode":"none","config":{"machine":"x"}}`))
	f.Add([]byte(`{"slot":"kube1","mode":"container","applied-at":"2026-01-01T00:00:00Z"}`))
	f.Add([]byte(``))
	f.Add([]byte(`null`))
	f.Add([]byte("\xff\xfe"))
	f.Fuzz(func(t *testing.T, data []byte) {
		a, err := decodeApplied("f", "kube1", data)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error not ErrCorrupt: %v", err)
			}
			return
		}
		if a.Slot != "kube1" || !facts.Valid(a.Mode) {
			t.Fatalf("accepted invalid record %+v", a)
		}
	})
}
