package daemon

import (
	"log/slog"
	"strings"
	"sync"
	"testing"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
)

// Positive signals for tests that must know the daemon has seen something
// or decided something, in place of a fixed sleep that only hopes it has
// (and that a loaded 2-core CI machine outlasts).

// logLines keeps every line the daemon logs, at every level: what it says
// it saw is the signal, as its journal is on a host.
type logLines struct {
	mu    sync.Mutex
	lines []string
	t     testing.TB
}

func (l *logLines) Write(p []byte) (int, error) {
	s := strings.TrimRight(string(p), "\n")
	l.mu.Lock()
	l.lines = append(l.lines, s)
	l.mu.Unlock()
	if testing.Verbose() {
		l.t.Log(s)
	}
	return len(p), nil
}

// count is how many logged lines contain every one of parts.
func (l *logLines) count(parts ...string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
next:
	for _, line := range l.lines {
		for _, p := range parts {
			if !strings.Contains(line, p) {
				continue next
			}
		}
		n++
	}
	return n
}

// recordLogs makes the daemons this fixture starts log into the returned
// lines, at debug level.
func (f *fixture) recordLogs(t testing.TB) *logLines {
	l := &logLines{t: t}
	f.opts.Log = slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug}))
	return l
}

// waitLogged waits until the daemon has logged n lines containing every
// one of parts.
func waitLogged(t testing.TB, l *logLines, n int, parts ...string) {
	t.Helper()
	eventually(t, opTimeout, "the daemon logged "+strings.Join(parts, " ... "), func() bool { return l.count(parts...) >= n })
}

// settled creates a restart operation and waits for it to complete. The
// daemon runs one job at a time, and starts an operation left InProgress
// and a vanished Node's repave before any Pending operation (step): once
// this one is done, whatever the daemon was going to start from what it
// had seen before has been started, and a test can count the starts.
func (f *fixture) settled(t *testing.T) {
	t.Helper()
	op := f.env.createOp(t, f.machine, v1alpha3.OperationRestart)
	if done := f.env.waitOp(t, op.Name, opTimeout); done.Status.State != v1alpha3.OperationComplete {
		t.Fatalf("marker operation %s ended %s: %s", op.Name, done.Status.State, done.Status.Message)
	}
}
