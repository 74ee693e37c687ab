package config

import (
	"errors"
	"strings"
	"testing"
	"time"

	"unbounded-cloud.io/agent/lib/exitcode"
	"unbounded-cloud.io/agent/lib/regfile/regfiletest"
)

// hangDetector bounds one Load in these tests. It detects a loader that
// blocks (a FIFO opened without O_NONBLOCK blocks until a writer comes,
// /dev/zero never ends), not a slow one.
const hangDetector = 2 * time.Second

// loadWithin runs Load and fails the test if it does not return within
// hangDetector (its goroutine is leaked then: it would never end).
func (h *host) loadWithin() error {
	h.t.Helper()
	done := make(chan error, 1)
	go func() { _, err := Load(h.p); done <- err }()
	select {
	case err := <-done:
		return err
	case <-time.After(hangDetector):
		h.t.Fatalf("Load did not return within %v: it blocks", hangDetector)
		return nil
	}
}

// TestLoadRefusesEveryFileThatIsNotARegularFileWithoutBlocking puts each
// kind of non-regular file, and an oversized one, where each file the
// loader reads belongs: a config error (78) naming the file, at once.
func TestLoadRefusesEveryFileThatIsNotARegularFileWithoutBlocking(t *testing.T) {
	type kind struct {
		name string
		make func(t testing.TB, file string)
	}
	var kinds []kind
	for _, k := range regfiletest.Kinds {
		kinds = append(kinds, kind{k.String(), func(t testing.TB, f string) { regfiletest.Make(t, f, k) }})
	}
	kinds = append(kinds, kind{"oversized file", func(t testing.TB, f string) { regfiletest.Sparse(t, f, maxFileSize+1) }})
	for _, file := range []string{
		"/etc/unbounded/agent.toml",
		"/etc/unbounded/agent.toml.d/50-site.toml",
		"/etc/unbounded/bootstrap-token",
		"/etc/unbounded/ca.crt",
	} {
		for _, k := range kinds {
			t.Run(file+" is a "+k.name, func(t *testing.T) {
				h := newHost(t)
				h.write("/etc/unbounded/agent.toml.d/10-other.toml", "mode = \"none\"\n", 0o644)
				k.make(t, h.path(file))
				err := h.loadWithin()
				if !errors.Is(err, exitcode.ErrConfigInvalid) {
					t.Fatalf("error %v, want a config error (78)", err)
				}
				if !strings.Contains(err.Error(), file) {
					t.Errorf("error does not name %s:\n%v", file, err)
				}
			})
		}
	}
}

// TestLoadRefusesADropInDirectoryThatIsAFIFO: os.ReadDir would block on
// opening it.
func TestLoadRefusesADropInDirectoryThatIsAFIFO(t *testing.T) {
	h := newHost(t)
	regfiletest.Make(t, h.path("/etc/unbounded/agent.toml.d"), regfiletest.FIFO)
	err := h.loadWithin()
	if !errors.Is(err, exitcode.ErrConfigInvalid) || !strings.Contains(err.Error(), h.path("/etc/unbounded/agent.toml.d")) {
		t.Fatalf("error %v, want a config error naming the drop-in directory", err)
	}
}
