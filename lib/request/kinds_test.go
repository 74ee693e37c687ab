package request

import (
	"errors"
	"strings"
	"testing"
	"time"

	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/regfile/regfiletest"
	"unbounded-cloud.io/agent/lib/state"
)

// hangDetector bounds one Read in the test below: it detects a read that
// blocks, not a slow one.
const hangDetector = 2 * time.Second

// TestReadOfARequestThatIsNotARegularFileIsCorruptAtOnce: the daemon and
// the one-shot both read the request; a FIFO or /dev/zero there must be a
// corrupt request naming the file, not a hang.
func TestReadOfARequestThatIsNotARegularFileIsCorruptAtOnce(t *testing.T) {
	p := hostpaths.New(t.TempDir())
	file := p.Request("repave")
	makers := map[string]func(){"oversized file": func() { regfiletest.Sparse(t, file, state.MaxRecordSize+1) }}
	for _, k := range regfiletest.Kinds {
		makers[k.String()] = func() { regfiletest.Make(t, file, k) }
	}
	for name, mk := range makers {
		mk()
		done := make(chan error, 1)
		go func() { _, err := Read(p, "repave"); done <- err }()
		select {
		case err := <-done:
			if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), file) {
				t.Errorf("request is a %s: %v, want ErrCorrupt naming %s", name, err, file)
			}
		case <-time.After(hangDetector):
			t.Fatalf("request is a %s: Read did not return within %v", name, hangDetector)
		}
	}
}

func TestWriteRefusesARequestNoReaderAccepts(t *testing.T) {
	p := hostpaths.New(t.TempDir())
	r := &Request{UID: "u", Desired: []byte(`"` + strings.Repeat("x", state.MaxRecordSize) + `"`)}
	if err := Write(p, "repave", r); err == nil || !strings.Contains(err.Error(), "more than") {
		t.Fatalf("Write of a request over the limit: %v", err)
	}
}
