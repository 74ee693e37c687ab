package isolation_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"unbounded-cloud.io/agent/lib/config"
	"unbounded-cloud.io/agent/lib/crashpoint"
	"unbounded-cloud.io/agent/lib/exitcode"
	"unbounded-cloud.io/agent/lib/isolation"
	"unbounded-cloud.io/agent/lib/modes"
	"unbounded-cloud.io/agent/lib/modes/facts"
	"unbounded-cloud.io/agent/lib/outcome"
	"unbounded-cloud.io/agent/lib/repave"
	"unbounded-cloud.io/agent/lib/repave/repavetest"
	"unbounded-cloud.io/agent/lib/reprovision"
	"unbounded-cloud.io/agent/lib/request"
	"unbounded-cloud.io/agent/lib/state"
	"unbounded-cloud.io/agent/lib/testhost"
	"unbounded-cloud.io/agent/lib/unitnames"
)

// childEnv makes the test binary run one isolation change on the world
// whose root it names and exit with its code: a crash point then kills a
// real process.
const childEnv = "ISOLATION_TEST_CHILD_ROOT"

func TestMain(m *testing.M) {
	if root := os.Getenv(childEnv); root != "" {
		w := &testhost.World{Root: root}
		w.P.Root = root
		err := newChange(w, slog.New(slog.NewTextHandler(os.Stderr, nil))).Run(context.Background())
		if errors.Is(err, repave.ErrNothingToDo) {
			os.Exit(0)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "isolation:", err)
		}
		os.Exit(exitcode.For(err))
	}
	os.Exit(m.Run())
}

// newChange is an isolation change on w's fakes (lib/repave/repavetest)
// whose bootstrap token the fake API server accepts unless
// fake/token-rejected exists.
func newChange(w *testhost.World, log *slog.Logger) *isolation.Change {
	return &isolation.Change{Repave: *repavetest.New(w, log), ReviewToken: func(context.Context, *config.Config) error {
		if exists(fake(w, "token-rejected")) {
			return isolation.ErrTokenRejected
		}
		return nil
	}}
}

func run(t *testing.T, w *testhost.World, tweak ...func(*isolation.Change)) error {
	t.Helper()
	c := newChange(w, slog.New(slog.NewTextHandler(tWriter{t}, nil)))
	c.CrashPoint = func(string) {}
	for _, f := range tweak {
		f(c)
	}
	return c.Run(context.Background())
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func fake(w *testhost.World, name string) string { return repavetest.Fake(w, name) }

func exists(p string) bool { _, err := os.Stat(p); return err == nil }

// toNone makes agent.toml's mode none: an isolation change's input.
func toNone(t *testing.T, w *testhost.World) {
	t.Helper()
	if err := w.Write("/etc/unbounded/agent.toml", strings.Replace(testhost.Config, `mode = "nspawn"`, `mode = "none"`, 1)); err != nil {
		t.Fatal(err)
	}
}

// wantMode asserts one record, of mode in slot, no journal and no lock,
// and the node's units of that mode only.
func wantMode(t *testing.T, w *testhost.World, mode, slot string) {
	t.Helper()
	a, err := state.ReadActive(w.P)
	if err != nil || a == nil || a.Slot != slot || a.Mode != mode {
		t.Fatalf("active applied config %+v (%v), want mode %s in slot %s", a, err, mode, slot)
	}
	if exists(w.P.AppliedConfig(otherSlot(slot))) || exists(w.P.MachineDir(otherSlot(slot))) {
		t.Errorf("slot %s is left (record or files)", otherSlot(slot))
	}
	for _, p := range []string{w.P.Journal(isolation.Operation), w.P.Ownership()} {
		if exists(p) {
			t.Errorf("%s left behind", w.P.Rel(p))
		}
	}
	running := facts.Supervising(mode, slot)
	for _, m := range []string{"nspawn", "none"} {
		for _, s := range []string{"kube1", "kube2"} {
			for _, u := range facts.Supervising(m, s) {
				if want := slices.Contains(running, u); (w.UnitState(u) == "active") != want {
					t.Errorf("%s is %s; want running=%v", u, w.UnitState(u), want)
				}
			}
		}
	}
}

func otherSlot(s string) string {
	if s == "kube1" {
		return "kube2"
	}
	return "kube1"
}

func TestIsolationChangeBuildsTheNewModeBesideDrainsSwitchesAndRetiresTheOldMode(t *testing.T) {
	w := repavetest.Bootstrapped(t)
	toNone(t, w)
	if err := run(t, w); err != nil {
		t.Fatalf("isolation change: %v", err)
	}
	repavetest.Order(t, w.Calls(), "prepare kube2", "cluster unschedulable=true", "cluster drain", "stop kube1",
		"cluster delete-node", "start "+unitnames.Containerd+"(owned)", "start "+unitnames.Kubelet+"(owned)",
		"destroy kube1", "start "+unitnames.NodeTarget, "enqueue "+unitnames.Daemon)
	wantMode(t, w, "none", "kube2")
	wantOutcome(t, w, "Succeeded", "nspawn", "none")
	// Asked again: the desired mode runs, nothing to do.
	w.ClearCalls()
	if err := run(t, w); !errors.Is(err, repave.ErrNothingToDo) {
		t.Fatalf("second change: %v, want nothing to do", err)
	}
	if slices.ContainsFunc(w.Calls(), func(c string) bool { return strings.HasPrefix(c, "cluster") || strings.HasPrefix(c, "prepare") }) {
		t.Errorf("nothing to do, but: %q", w.Calls())
	}
	// And back to nspawn, into slot kube1.
	if err := w.Write("/etc/unbounded/agent.toml", testhost.Config); err != nil {
		t.Fatal(err)
	}
	if err := run(t, w); err != nil {
		t.Fatalf("isolation change back: %v", err)
	}
	wantMode(t, w, "nspawn", "kube1")
}

// The daemon's request carries the Machine's spec: its isolation.mode is
// the desired mode, whatever agent.toml says.
func TestIsolationChangeFollowsTheMachinesSpecInTheDaemonsRequest(t *testing.T) {
	w := repavetest.Bootstrapped(t)
	if err := request.Write(w.P, isolation.Concern, &request.Request{UID: "isolation:none:2", Type: "IsolationChange",
		Machine: testhost.Machine, Desired: []byte(`{"isolation":{"mode":"none"}}`)}); err != nil {
		t.Fatal(err)
	}
	if err := run(t, w); err != nil {
		t.Fatalf("isolation change: %v", err)
	}
	wantMode(t, w, "none", "kube2")
	if !request.Taken(w.P, isolation.Concern, "isolation:none:2") {
		t.Error("the request is not marked carried out")
	}
}

// A bootstrap token the API server refuses stops the change before
// anything is touched: the new mode's kubelet could not join.
func TestIsolationChangeWithARejectedTokenTouchesNothing(t *testing.T) {
	w := repavetest.Bootstrapped(t)
	toNone(t, w)
	if err := os.WriteFile(fake(w, "token-rejected"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	err := run(t, w)
	if !errors.Is(err, isolation.ErrTokenRejected) || exitcode.For(err) != exitcode.Failed {
		t.Fatalf("isolation change with a rejected token: %v (exit %d), want ErrTokenRejected, exit 1", err, exitcode.For(err))
	}
	if slices.ContainsFunc(w.Calls(), func(c string) bool {
		return strings.HasPrefix(c, "cluster") || strings.HasPrefix(c, "prepare") || strings.HasPrefix(c, "stop")
	}) {
		t.Errorf("a refused change touched the node: %q", w.Calls())
	}
	wantMode(t, w, "nspawn", "kube1")
	wantOutcome(t, w, "Failed", "nspawn", "none", "bootstrap token")
}

// A new mode whose node never gets healthy is rolled back: the old
// mode's node runs again, the new slot is gone, the Node uncordoned.
func TestIsolationChangeRollsBackToTheOldModeWhenTheNewNodeIsNotHealthy(t *testing.T) {
	w := repavetest.Bootstrapped(t)
	toNone(t, w)
	if err := os.WriteFile(fake(w, "unhealthy-kube2"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	err := run(t, w)
	if !errors.Is(err, modes.ErrRolledBack) {
		t.Fatalf("isolation change to a node never healthy: %v, want ErrRolledBack", err)
	}
	wantMode(t, w, "nspawn", "kube1")
	if exists(fake(w, "unschedulable")) {
		t.Error("the Node is left cordoned")
	}
	wantOutcome(t, w, "Failed", "nspawn", "none", "rolled back")
}

// A reprovision (forced by the request's method parameter) stages the
// handoff and starts its unit: the node is not touched by the isolation
// unit, the lock is released, the request taken; a second start finds the
// live handoff and only starts its unit again.
func TestIsolationChangeByReprovisionStagesTheHandoffAndStartsItsUnit(t *testing.T) {
	w := repavetest.Bootstrapped(t)
	if err := request.Write(w.P, isolation.Concern, &request.Request{UID: "isolation:none:3", Type: "IsolationChange",
		Machine: testhost.Machine, Desired: []byte(`{"isolation":{"mode":"none"}}`), Parameters: map[string]string{isolation.ParamMethod: modes.MethodReprovision}}); err != nil {
		t.Fatal(err)
	}
	self := filepath.Join(t.TempDir(), "unbounded-agent")
	os.WriteFile(self, []byte("#!/bin/sh\n"), 0o755)
	withSelf := func(c *isolation.Change) { c.Self = self }
	if err := run(t, w, withSelf); !errors.Is(err, isolation.ErrHandedOff) {
		t.Fatalf("a forced reprovision: %v, want ErrHandedOff", err)
	}
	if slices.ContainsFunc(w.Calls(), func(c string) bool {
		return strings.HasPrefix(c, "cluster") || strings.HasPrefix(c, "prepare") || strings.HasPrefix(c, "stop")
	}) {
		t.Errorf("the isolation unit touched the node: %q", w.Calls())
	}
	if !slices.Contains(w.Calls(), "enqueue "+unitnames.Reprovision) {
		t.Errorf("%s not started: %q", unitnames.Reprovision, w.Calls())
	}
	if o, err := outcome.Read(w.P, outcome.Isolation); o != nil || err != nil {
		t.Errorf("a handoff recorded an outcome %+v (%v): the reprovision reports itself", o, err)
	}
	h, err := reprovision.ReadJournal(w.P)
	if err != nil || !h.Live() || h.FromMode != "nspawn" || h.ToMode != "none" || h.Request != "isolation:none:3" ||
		h.Deadline.Sub(h.StartedAt) != reprovision.DefaultGiveUpAfter {
		t.Fatalf("handoff journal %+v (%v)", h, err)
	}
	if exists(w.P.Ownership()) || !request.Taken(w.P, isolation.Concern, "isolation:none:3") {
		t.Error("the lock is held or the request not taken after the handoff")
	}
	cfg, err := os.ReadFile(filepath.Join(reprovision.Dir(w.P), reprovision.ConfigFile))
	if err != nil || !strings.Contains(string(cfg), `"none"`) {
		t.Errorf("the staged target config: %v\n%s", err, cfg)
	}
	w.ClearCalls()
	if err := run(t, w, withSelf); !errors.Is(err, isolation.ErrHandedOff) || !slices.Contains(w.Calls(), "enqueue "+unitnames.Reprovision) {
		t.Errorf("a second start with the handoff live: %v, calls %q", err, w.Calls())
	}
}

// The daemon's request asking for a reprovision (the Machine's
// spec.isolation.method) gets the bootstrap token checked first, as an
// in-place change does: a token the API server refuses stages no
// handoff and starts no reset; and a method the build does not know is
// refused before the token is asked about, the node left as it is.
func TestIsolationChangeByReprovisionChecksTheTokenFirst(t *testing.T) {
	for _, c := range []struct {
		name, method string
		want         error
		wantIn       string
	}{
		{"a rejected token", modes.MethodReprovision, isolation.ErrTokenRejected, "bootstrap token"},
		{"an unknown method", "Teleport", nil, `method "Teleport"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := repavetest.Bootstrapped(t)
			if err := request.Write(w.P, isolation.Concern, &request.Request{UID: "isolation:none:4", Type: "IsolationChange",
				Machine: testhost.Machine, Desired: []byte(`{"isolation":{"mode":"none"}}`), Parameters: map[string]string{isolation.ParamMethod: c.method}}); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(fake(w, "token-rejected"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
			reviewed := false
			err := run(t, w, func(r *isolation.Change) {
				r.Self = filepath.Join(t.TempDir(), "unbounded-agent")
				review := r.ReviewToken
				r.ReviewToken = func(ctx context.Context, cfg *config.Config) error { reviewed = true; return review(ctx, cfg) }
			})
			if err == nil || (c.want != nil && !errors.Is(err, c.want)) || !strings.Contains(err.Error(), c.wantIn) {
				t.Fatalf("%v, want %v mentioning %q", err, c.want, c.wantIn)
			}
			if reviewed != (c.want != nil) {
				t.Errorf("token reviewed: %v", reviewed)
			}
			if _, err := reprovision.ReadJournal(w.P); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("a handoff was staged (%v)", err)
			}
			if slices.ContainsFunc(w.Calls(), func(c string) bool {
				return strings.HasPrefix(c, "cluster") || strings.HasPrefix(c, "prepare") || strings.HasPrefix(c, "stop") || c == "enqueue "+unitnames.Reprovision
			}) {
				t.Errorf("a refused change touched the node: %q", w.Calls())
			}
			wantMode(t, w, "nspawn", "kube1")
		})
	}
}

// isolationCrashPoints are the points an isolation change of the fake
// modes passes.
func isolationCrashPoints() []string { return isolation.CrashPoints }

func TestIsolationChangeCrashAtEveryPointThenRerunConverges(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a child process per crash point; skipped with -short")
	}
	for _, point := range isolationCrashPoints() {
		t.Run(strings.ReplaceAll(point, "/", "_"), func(t *testing.T) {
			w := repavetest.Bootstrapped(t)
			toNone(t, w)
			code, out := testhost.RunChild(t, childEnv+"="+w.Root, crashpoint.Env+"="+point)
			if code != crashpoint.ExitCode || !strings.Contains(out, "crash point "+point) {
				t.Fatalf("crash at %s: exit %d, want %d there\n%s", point, code, crashpoint.ExitCode, out)
			}
			if code, out := testhost.RunChild(t, childEnv+"="+w.Root, crashpoint.Env+"="); code != 0 {
				t.Fatalf("rerun after the crash at %s: exit %d\n%s", point, code, out)
			}
			wantMode(t, w, "none", "kube2")
			if !exists(fake(w, "node")) || exists(fake(w, "unschedulable")) {
				t.Errorf("the Node is not back schedulable")
			}
		})
	}
}

// wantOutcome asserts the outcome the change left for the daemon.
func wantOutcome(t *testing.T, w *testhost.World, st, from, to string, words ...string) {
	t.Helper()
	o, err := outcome.Read(w.P, outcome.Isolation)
	if err != nil || o == nil || string(o.State) != st || o.From != from || o.To != to || o.Method != modes.MethodInPlace || o.Time.IsZero() {
		t.Fatalf("isolation outcome %+v (%v), want %s %s -> %s in place", o, err, st, from, to)
	}
	for _, word := range words {
		if !strings.Contains(o.Message, word) {
			t.Errorf("the outcome's message does not say %q: %s", word, o.Message)
		}
	}
}
