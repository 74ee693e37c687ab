package cli

import (
	"strings"
	"testing"
	"time"

	"unbounded-cloud.io/agent/lib/regfile/regfiletest"
)

// configCheckBudget bounds `unbounded config check` in the test below. It
// detects a check that blocks (before lib/regfile, a FIFO among the
// drop-ins blocked it until a writer came), not a slow one.
const configCheckBudget = 2 * time.Second

func TestConfigCheckWithAFIFODropInExits78NamingItAtOnce(t *testing.T) {
	root, p := newRoot(t)
	fifo := p.Join("/etc/unbounded/agent.toml.d/50-site.toml")
	regfiletest.Make(t, fifo, regfiletest.FIFO)
	done := make(chan result, 1)
	// run only reports through t.Errorf, which is safe from a goroutine.
	go func() { done <- run(t, Env{}, "config", "check", "--root", root) }()
	var r result
	select {
	case r = <-done:
	case <-time.After(configCheckBudget):
		t.Fatalf("config check did not return within %v: it blocks on the FIFO", configCheckBudget)
	}
	if r.code != 78 || !strings.Contains(r.stderr, fifo+": cannot read: not a regular file: is a named pipe (FIFO)") {
		t.Errorf("exit %d, want 78 naming %s; stderr:\n%s", r.code, fifo, r.stderr)
	}
}
