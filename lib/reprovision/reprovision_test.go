package reprovision_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"unbounded-cloud.io/agent/lib/config"
	"unbounded-cloud.io/agent/lib/exitcode"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/reprovision"
	"unbounded-cloud.io/agent/lib/state"
	"unbounded-cloud.io/agent/lib/steps"
	"unbounded-cloud.io/agent/lib/testhost"
)

// fixture is a host with agent.toml and a staged handoff nspawn -> none,
// begun at t0 with a deadline 90 minutes later; clock is its time.
type fixture struct {
	p      hostpaths.Paths
	clock  time.Time
	calls  []string
	slept  []time.Duration
	resetE error
	bootE  error
}

var t0 = time.Date(2026, 12, 4, 10, 0, 0, 0, time.UTC)

func newFixture(t *testing.T) *fixture {
	t.Helper()
	w, err := testhost.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{p: w.P, clock: t0}
	exe := filepath.Join(t.TempDir(), "unbounded-agent")
	if err := os.WriteFile(exe, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	j := reprovision.Journal{FromMode: "nspawn", ToMode: "none", Machine: testhost.Machine, StartedAt: t0, Deadline: t0.Add(reprovision.DefaultGiveUpAfter)}
	if err := reprovision.Stage(f.p, j, []byte(`{"mode":"none"}`), exe); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *fixture) run() error {
	r := &reprovision.Reprovision{
		Host:  steps.Host{Paths: f.p, Notify: func(string) {}, Now: func() time.Time { return f.clock }},
		Reset: func(context.Context) error { f.calls = append(f.calls, "reset"); return f.resetE },
		Bootstrap: func(_ context.Context, cfg *config.Config) error {
			f.calls = append(f.calls, "bootstrap "+cfg.Mode)
			return f.bootE
		},
		Sleep: func(_ context.Context, d time.Duration) error {
			f.slept = append(f.slept, d)
			f.clock = f.clock.Add(d)
			return nil
		},
	}
	return r.Run(context.Background())
}

func (f *fixture) journal(t *testing.T) *reprovision.Journal {
	t.Helper()
	j, err := reprovision.ReadJournal(f.p)
	if err != nil {
		t.Fatal(err)
	}
	return j
}

func (f *fixture) wantStagedGone(t *testing.T) {
	t.Helper()
	for _, n := range []string{reprovision.ConfigFile, reprovision.Executable} {
		if _, err := os.Stat(filepath.Join(reprovision.Dir(f.p), n)); !os.IsNotExist(err) {
			t.Errorf("%s is left in the handoff (%v)", n, err)
		}
	}
}

func TestStageWritesTheHandoffPrivatelyAndOnlyOnce(t *testing.T) {
	f := newFixture(t)
	for n, want := range map[string]os.FileMode{reprovision.ConfigFile: 0o600, reprovision.Executable: 0o700, reprovision.JournalFile: 0o600} {
		fi, err := os.Stat(filepath.Join(reprovision.Dir(f.p), n))
		if err != nil || fi.Mode().Perm() != want {
			t.Errorf("%s: %v, mode %v; want %v", n, err, fi.Mode().Perm(), want)
		}
	}
	if fi, err := os.Stat(reprovision.Dir(f.p)); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("handoff directory: %v %v, want 0700", err, fi.Mode().Perm())
	}
	if j := f.journal(t); !j.Live() || j.ToMode != "none" {
		t.Errorf("journal %+v", j)
	}
	if err := reprovision.Stage(f.p, reprovision.Journal{}, []byte(`{}`), filepath.Join(reprovision.Dir(f.p), reprovision.Executable)); err == nil {
		t.Error("a second handoff was staged over the first")
	}
}

func TestRunResetsThenBootstrapsTheTargetModeAndRemovesTheStagedFiles(t *testing.T) {
	f := newFixture(t)
	if live, err := state.HandoffLive(f.p); !live || err != nil {
		t.Errorf("staged handoff: live %v (%v), want live for the generator", live, err)
	}
	if err := f.run(); err != nil {
		t.Fatal(err)
	}
	if strings.Join(f.calls, ",") != "reset,bootstrap none" {
		t.Errorf("calls %q", f.calls)
	}
	j := f.journal(t)
	if j.State != reprovision.StateSucceeded || j.Attempts != 1 || !strings.Contains(j.Message, "nspawn to none") {
		t.Errorf("journal %+v", j)
	}
	f.wantStagedGone(t)
	if live, err := state.HandoffLive(f.p); live || err != nil {
		t.Errorf("ended handoff: live %v (%v)", live, err)
	}
	if err := f.run(); !errors.Is(err, reprovision.ErrNoHandoff) {
		t.Errorf("a run after the end: %v, want ErrNoHandoff", err)
	}
	// Reported by the daemon, the handoff goes.
	if err := reprovision.Remove(f.p); err != nil {
		t.Fatal(err)
	}
	if _, err := reprovision.ReadJournal(f.p); !os.IsNotExist(err) {
		t.Errorf("the journal after Remove: %v", err)
	}
	if err := reprovision.Remove(f.p); err != nil {
		t.Errorf("Remove again: %v", err)
	}
}

// A failed attempt is temporary (75), the next waits a growing delay,
// and a reset done is not done again.
func TestAFailedAttemptRetriesAfterAGrowingDelayFromWhereItGot(t *testing.T) {
	f := newFixture(t)
	f.bootE = errors.New("API server unreachable")
	for i := 0; i < 3; i++ {
		if err := f.run(); !errors.Is(err, exitcode.ErrTemporary) || exitcode.For(err) != exitcode.TempFail {
			t.Fatalf("attempt %d: %v, want a temporary failure (75)", i+1, err)
		}
	}
	if got := strings.Join(f.calls, ","); got != "reset,bootstrap none,bootstrap none,bootstrap none" {
		t.Errorf("calls %q: the reset runs once", got)
	}
	if len(f.slept) != 2 || f.slept[0] != 30*time.Second || f.slept[1] != 60*time.Second {
		t.Errorf("waits %v, want 30s then 60s", f.slept)
	}
	j := f.journal(t)
	if j.Attempts != 3 || !strings.Contains(j.LastError, "unreachable") || !j.NextAttempt.Equal(f.clock.Add(2*time.Minute)) {
		t.Errorf("journal %+v", j)
	}
	f.bootE = nil
	if err := f.run(); err != nil {
		t.Fatal(err)
	}
	if j := f.journal(t); j.State != reprovision.StateSucceeded || j.Attempts != 4 {
		t.Errorf("journal %+v", j)
	}
}

// Past the deadline the handoff gives up: Failed with the last error,
// the staged executable and configuration gone, nothing else run.
func TestPastItsDeadlineTheHandoffGivesUp(t *testing.T) {
	f := newFixture(t)
	f.resetE = errors.New("image missing")
	if err := f.run(); !errors.Is(err, exitcode.ErrTemporary) {
		t.Fatal(err)
	}
	f.clock = t0.Add(reprovision.DefaultGiveUpAfter + time.Second)
	f.calls = nil
	if err := f.run(); err != nil {
		t.Fatalf("give up: %v, want nil (the unit ends)", err)
	}
	if len(f.calls) != 0 {
		t.Errorf("ran %q past the deadline", f.calls)
	}
	j := f.journal(t)
	if j.State != reprovision.StateFailed || !strings.Contains(j.Message, "image missing") || j.Live() {
		t.Errorf("journal %+v", j)
	}
	f.wantStagedGone(t)
	// A wait that would end past the deadline ends at it, and gives up.
	f = newFixture(t)
	f.resetE = errors.New("image missing")
	f.clock = t0.Add(reprovision.DefaultGiveUpAfter - 20*time.Second)
	f.run()
	if err := f.run(); err != nil {
		t.Fatal(err)
	}
	if len(f.slept) != 1 || f.slept[0] != 20*time.Second || f.journal(t).State != reprovision.StateFailed {
		t.Errorf("waits %v, journal %+v", f.slept, f.journal(t))
	}
}

func TestNoHandoffIsNothingToDo(t *testing.T) {
	w, err := testhost.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	r := &reprovision.Reprovision{Host: steps.Host{Paths: w.P}}
	if err := r.Run(context.Background()); !errors.Is(err, reprovision.ErrNoHandoff) {
		t.Errorf("%v, want ErrNoHandoff", err)
	}
}
