package repave_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/crashpoint"
	"unbounded-cloud.io/agent/lib/exitcode"
	"unbounded-cloud.io/agent/lib/kube"
	"unbounded-cloud.io/agent/lib/modes"
	"unbounded-cloud.io/agent/lib/owed"
	"unbounded-cloud.io/agent/lib/repave"
	"unbounded-cloud.io/agent/lib/repave/repavetest"
	"unbounded-cloud.io/agent/lib/request"
	"unbounded-cloud.io/agent/lib/state"
	"unbounded-cloud.io/agent/lib/testhost"
	"unbounded-cloud.io/agent/lib/unitnames"
)

// childEnv makes the test binary run one repave on the world whose root
// it names and exit with its code: a crash point then kills a real
// process.
const childEnv = "REPAVE_TEST_CHILD_ROOT"

func TestMain(m *testing.M) {
	if root := os.Getenv(childEnv); root != "" {
		w := &testhost.World{Root: root}
		w.P.Root = root
		r := newRepave(w, slog.New(slog.NewTextHandler(os.Stderr, nil)))
		err := r.Run(context.Background())
		if errors.Is(err, repave.ErrNothingToDo) {
			os.Exit(0)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "repave:", err)
		}
		os.Exit(exitcode.For(err))
	}
	os.Exit(m.Run())
}

func fake(w *testhost.World, name string) string { return repavetest.Fake(w, name) }

func exists(p string) bool { _, err := os.Stat(p); return err == nil }

func newRepave(w *testhost.World, log *slog.Logger) *repave.Repave { return repavetest.New(w, log) }

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func bootstrapped(t *testing.T) *testhost.World { return repavetest.Bootstrapped(t) }

// changeImage gives agent.toml another node image: a new desired config.
func changeImage(t *testing.T, w *testhost.World) {
	t.Helper()
	if err := w.Write("/etc/unbounded/agent.toml", strings.Replace(testhost.Config, "node:1.36.3", "node:1.36.3-2", 1)); err != nil {
		t.Fatal(err)
	}
}

func run(t *testing.T, w *testhost.World, tweak ...func(*repave.Repave)) error {
	t.Helper()
	r := newRepave(w, slog.New(slog.NewTextHandler(tWriter{t}, nil)))
	r.CrashPoint = func(string) {}
	for _, f := range tweak {
		f(r)
	}
	return r.Run(context.Background())
}

func order(t *testing.T, calls []string, want ...string) {
	t.Helper()
	repavetest.Order(t, calls, want...)
}

// wantActive asserts exactly slot's record, slot's machine directory only,
// no journal, no lock.
func wantActive(t *testing.T, w *testhost.World, slot string) *state.AppliedConfig {
	t.Helper()
	a, err := state.ReadActive(w.P)
	if err != nil || a == nil || a.Slot != slot {
		t.Fatalf("active applied config %+v (%v), want slot %s", a, err, slot)
	}
	for _, s := range []string{"kube1", "kube2"} {
		_, errA := os.Stat(w.P.AppliedConfig(s))
		_, errM := os.Stat(w.P.MachineDir(s))
		if (errA == nil) != (s == slot) || (errM == nil) != (s == slot) {
			t.Errorf("slot %s: record %v, machine %v; want present=%v", s, errA, errM, s == slot)
		}
	}
	for _, p := range []string{w.P.Journal(repave.Operation), w.P.Ownership()} {
		if exists(p) {
			t.Errorf("%s left behind", w.P.Rel(p))
		}
	}
	return a
}

func TestUnchangedConfigIsNothingToDo(t *testing.T) {
	w := bootstrapped(t)
	if err := run(t, w); !errors.Is(err, repave.ErrNothingToDo) {
		t.Fatalf("repave of an unchanged config: %v, want ErrNothingToDo", err)
	}
	for _, c := range w.Calls() {
		if strings.HasPrefix(c, "prepare") || strings.HasPrefix(c, "cluster") || strings.HasPrefix(c, "stop") {
			t.Errorf("an unchanged config made call %q", c)
		}
	}
	wantActive(t, w, "kube1")
}

func TestBlueGreenBuildsBesideDrainsSwitchesAndRetiresTheOldSlot(t *testing.T) {
	w := bootstrapped(t)
	changeImage(t, w)
	if err := run(t, w); err != nil {
		t.Fatalf("repave: %v", err)
	}
	calls := w.Calls()
	order(t, calls, "prepare kube2", "cluster unschedulable=true", "cluster drain", "stop systemd-nspawn@kube1.service",
		"cluster delete-node", "start systemd-nspawn@kube2.service(owned)",
		"destroy kube1", "start "+unitnames.NodeTarget, "enqueue "+unitnames.Daemon)
	// The fence is asked while the drain runs, and answers before the
	// new node starts.
	order(t, calls, "cluster unschedulable=true", "start "+unitnames.Fence+"(owned)", "start systemd-nspawn@kube2.service(owned)")
	a := wantActive(t, w, "kube2")
	if !strings.Contains(string(a.Config), "node:1.36.3-2") {
		t.Errorf("kube2's record does not hold the desired config:\n%s", a.Config)
	}
	if w.UnitState("systemd-nspawn@kube2.service") != "active" || w.UnitState("systemd-nspawn@kube1.service") == "active" {
		t.Errorf("after the repave kube2 is %s, kube1 %s", w.UnitState("systemd-nspawn@kube2.service"), w.UnitState("systemd-nspawn@kube1.service"))
	}
	// A second repave of the same config is nothing to do; forced, it
	// goes back to kube1.
	if err := run(t, w); !errors.Is(err, repave.ErrNothingToDo) {
		t.Fatalf("second repave: %v, want nothing to do", err)
	}
	if err := run(t, w, func(r *repave.Repave) { r.Force = true }); err != nil {
		t.Fatalf("forced repave: %v", err)
	}
	wantActive(t, w, "kube1")
}

func TestModeChangeIsRefusedAsAnIsolationChange(t *testing.T) {
	w := bootstrapped(t)
	if err := w.Write("/etc/unbounded/agent.toml", strings.Replace(testhost.Config, `mode = "nspawn"`, `mode = "none"`, 1)); err != nil {
		t.Fatal(err)
	}
	err := run(t, w)
	if !errors.Is(err, repave.ErrModeChange) || exitcode.For(err) != exitcode.Failed {
		t.Fatalf("mode change: %v (exit %d), want ErrModeChange, exit 1", err, exitcode.For(err))
	}
	for _, word := range []string{"nspawn", "none", "isolation"} {
		if !strings.Contains(err.Error(), word) {
			t.Errorf("the refusal does not say %q: %v", word, err)
		}
	}
	if slices.ContainsFunc(w.Calls(), func(c string) bool { return strings.HasPrefix(c, "cluster") || strings.HasPrefix(c, "prepare") }) {
		t.Errorf("a refused repave touched the node: %q", w.Calls())
	}
	wantActive(t, w, "kube1")
}

func TestRepaveRollsBackWhenNewSlotNeverHealthy(t *testing.T) {
	w := bootstrapped(t)
	changeImage(t, w)
	if err := os.WriteFile(fake(w, "unhealthy-kube2"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	err := run(t, w)
	if !errors.Is(err, modes.ErrRolledBack) || exitcode.For(err) != exitcode.Failed {
		t.Fatalf("repave with a new slot never healthy: %v, want ErrRolledBack (exit 1)", err)
	}
	a := wantActive(t, w, "kube1")
	if strings.Contains(string(a.Config), "node:1.36.3-2") {
		t.Errorf("kube1's record was replaced by the desired config")
	}
	if w.UnitState("systemd-nspawn@kube1.service") != "active" {
		t.Errorf("kube1 is %s after the rollback", w.UnitState("systemd-nspawn@kube1.service"))
	}
	if exists(fake(w, "unschedulable")) {
		t.Errorf("the Node is still cordoned after the rollback")
	}
	order(t, w.Calls(), "cluster unschedulable=true", "destroy kube2", "start systemd-nspawn@kube1.service(owned)", "cluster unschedulable=false", "start "+unitnames.NodeTarget)
}

func TestDrainTimeoutUncordonsAndLeavesTheNodeUnlessForced(t *testing.T) {
	w := bootstrapped(t)
	changeImage(t, w)
	if err := os.WriteFile(fake(w, "drain-stuck"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	err := run(t, w)
	if !errors.Is(err, kube.ErrDrainTimeout) || exitcode.For(err) != exitcode.Failed {
		t.Fatalf("repave with a drain that times out: %v, want ErrDrainTimeout (exit 1)", err)
	}
	if !strings.Contains(err.Error(), "uncordoned") {
		t.Errorf("the error does not say the Node is uncordoned: %v", err)
	}
	wantActive(t, w, "kube1")
	if exists(fake(w, "unschedulable")) {
		t.Errorf("the Node is still cordoned")
	}
	if w.UnitState("systemd-nspawn@kube1.service") != "active" {
		t.Errorf("kube1 is %s", w.UnitState("systemd-nspawn@kube1.service"))
	}
	if slices.Contains(w.Calls(), "stop systemd-nspawn@kube1.service") {
		t.Errorf("the old node was stopped although the drain failed")
	}
	// Forced through the daemon's request: it proceeds.
	if err := request.Write(w.P, repave.Concern, &request.Request{UID: "op-1", Type: string(v1alpha3.OperationRepave),
		Machine: testhost.Machine, Parameters: map[string]string{repave.ParamForce: "true"}}); err != nil {
		t.Fatal(err)
	}
	if err := run(t, w); err != nil {
		t.Fatalf("forced repave: %v", err)
	}
	wantActive(t, w, "kube2")
	// The request stays (the daemon reads it again after a restart), but
	// a later start by hand does not take it as its input: the config on
	// disk is applied already, so there is nothing to do.
	if err := run(t, w); !errors.Is(err, repave.ErrNothingToDo) {
		t.Fatalf("a start by hand after the daemon's forced request: %v, want nothing to do", err)
	}
}

// The drain fails and the API server is down at the moment of the
// uncordon: the uncordon is owed (lib/owed) for the daemon, and a later
// repave that cordons the Node takes it over.
func TestAFailedUncordonIsOwedAndALaterRepaveTakesTheNodeOver(t *testing.T) {
	w := bootstrapped(t)
	changeImage(t, w)
	for _, f := range []string{"drain-stuck", "api-down-at-uncordon"} {
		if err := os.WriteFile(fake(w, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := run(t, w); !errors.Is(err, kube.ErrDrainTimeout) {
		t.Fatalf("repave with a drain that times out: %v", err)
	}
	ws, err := owed.List(w.P)
	if err != nil || len(ws) != 1 || ws[0].Kind != owed.Uncordon || ws[0].Node != testhost.Machine || ws[0].By != repave.Operation {
		t.Fatalf("owed writes after an uncordon that failed: %+v (%v), want the Node's uncordon", ws, err)
	}
	// The API answers again; a repave cordons, and decides from there.
	os.Remove(fake(w, "api-down-at-uncordon"))
	os.Remove(fake(w, "drain-stuck"))
	if err := run(t, w); err != nil {
		t.Fatalf("repave: %v", err)
	}
	if ws, _ := owed.List(w.P); len(ws) != 0 {
		t.Errorf("owed writes after a repave that took the Node over: %+v", ws)
	}
}

func TestPodsWithoutAControllerFailTheRepaveEvenForcedUnlessDeleteUnmanaged(t *testing.T) {
	w := bootstrapped(t)
	changeImage(t, w)
	if err := os.WriteFile(fake(w, "bare-pod"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	asBefore := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, kube.ErrUnmanagedPods) || exitcode.For(err) != exitcode.Failed {
			t.Fatalf("%s: %v (exit %d), want ErrUnmanagedPods (exit 1)", what, err, exitcode.For(err))
		}
		for _, words := range []string{"ns/bare", repave.ParamDeleteUnmanaged + "=true", "--delete-unmanaged", "uncordoned"} {
			if !strings.Contains(err.Error(), words) {
				t.Errorf("%s: the error does not say %q: %v", what, words, err)
			}
		}
		wantActive(t, w, "kube1")
		if exists(fake(w, "unschedulable")) {
			t.Errorf("%s: the Node is still cordoned", what)
		}
		if slices.Contains(w.Calls(), "stop systemd-nspawn@kube1.service") {
			t.Errorf("%s: the old node was stopped although the drain refused", what)
		}
	}
	asBefore("repave with a pod without a controller", run(t, w))
	// Force goes on past a drain that timed out, not past pods that an
	// eviction would lose.
	asBefore("forced repave with a pod without a controller", run(t, w, func(r *repave.Repave) { r.Force = true }))

	if err := request.Write(w.P, repave.Concern, &request.Request{UID: "op-1", Type: string(v1alpha3.OperationRepave),
		Machine: testhost.Machine, Parameters: map[string]string{repave.ParamDeleteUnmanaged: "yes"}}); err != nil {
		t.Fatal(err)
	}
	if err := run(t, w); err == nil || !strings.Contains(err.Error(), repave.ParamDeleteUnmanaged) {
		t.Fatalf("bad %s: %v, want an error naming it", repave.ParamDeleteUnmanaged, err)
	}
	wantActive(t, w, "kube1")

	if err := request.Write(w.P, repave.Concern, &request.Request{UID: "op-2", Type: string(v1alpha3.OperationRepave),
		Machine: testhost.Machine, Parameters: map[string]string{repave.ParamDeleteUnmanaged: "true"}}); err != nil {
		t.Fatal(err)
	}
	w.ClearCalls()
	if err := run(t, w); err != nil {
		t.Fatalf("repave with %s=true: %v", repave.ParamDeleteUnmanaged, err)
	}
	order(t, w.Calls(), "cluster drain", "cluster evict ns/bare", "stop systemd-nspawn@kube1.service")
	wantActive(t, w, "kube2")

	// The flag does the same as the parameter.
	if err := run(t, w, func(r *repave.Repave) { r.Force, r.DeleteUnmanaged = true, true }); err != nil {
		t.Fatalf("forced repave with DeleteUnmanaged: %v", err)
	}
	wantActive(t, w, "kube1")
}

func TestAResumedRepaveDrainsAsTheRequestSaid(t *testing.T) {
	w := bootstrapped(t)
	changeImage(t, w)
	if err := os.WriteFile(fake(w, "bare-pod"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := request.Write(w.P, repave.Concern, &request.Request{UID: "op-1", Type: string(v1alpha3.OperationRepave),
		Machine: testhost.Machine, Parameters: map[string]string{repave.ParamDeleteUnmanaged: "true", repave.ParamDrainTimeout: "90s"}}); err != nil {
		t.Fatal(err)
	}
	point := "repave/after-" + repave.StepCordon
	if code, out := child(t, w, point); code != crashpoint.ExitCode {
		t.Fatalf("crash at %s: exit %d, want %d\n%s", point, code, crashpoint.ExitCode, out)
	}
	var j repave.Journal
	if ok, err := state.ReadJournal(w.P, repave.Operation, &j); !ok || err != nil {
		t.Fatalf("journal after the crash: found %v, %v", ok, err)
	}
	if !j.DeleteUnmanaged || j.DrainTimeout != 90*time.Second {
		t.Fatalf("journal after the crash: delete-unmanaged %v, drain timeout %s; want true, 90s", j.DeleteUnmanaged, j.DrainTimeout)
	}
	// The rerun takes its options from the journal only (the child's
	// flags say nothing of them).
	if code, out := child(t, w, ""); code != 0 {
		t.Fatalf("resumed repave: exit %d\n%s", code, out)
	}
	wantActive(t, w, "kube2")
	if !slices.Contains(w.Calls(), "cluster evict ns/bare") {
		t.Errorf("the resumed drain did not evict the pod without a controller: %q", w.Calls())
	}
}

// notImplemented is a mode whose Repave this release does not carry.
type notImplemented struct{ modes.Mode }

func (notImplemented) Repave(context.Context, string, modes.Slot, modes.RepaveHooks) error {
	return modes.ErrNotImplemented
}

func TestAModeThatDoesNotRepaveLeavesTheNodeAsItWas(t *testing.T) {
	w := bootstrapped(t)
	changeImage(t, w)
	err := run(t, w, func(r *repave.Repave) {
		r.Mode = func(name string) (modes.Mode, error) {
			m, err := w.Mode(name)
			return notImplemented{m}, err
		}
	})
	if !errors.Is(err, modes.ErrNotImplemented) {
		t.Fatalf("repave with a mode that does not repave: %v", err)
	}
	wantActive(t, w, "kube1")
	if exists(fake(w, "unschedulable")) {
		t.Errorf("the Node is left cordoned")
	}
}

func TestRequestWithABadParameterChangesNothing(t *testing.T) {
	w := bootstrapped(t)
	changeImage(t, w)
	if err := request.Write(w.P, repave.Concern, &request.Request{UID: "op-1", Type: "Repave", Machine: testhost.Machine,
		Parameters: map[string]string{repave.ParamDrainTimeout: "soon"}}); err != nil {
		t.Fatal(err)
	}
	err := run(t, w)
	if err == nil || !strings.Contains(err.Error(), repave.ParamDrainTimeout) {
		t.Fatalf("bad drainTimeout: %v, want an error naming it", err)
	}
	wantActive(t, w, "kube1")
}

// crashPoints are the points a repave of the fake mode passes.
func crashPoints() []string {
	var out []string
	for _, p := range repave.CrashPoints {
		out = append(out, p)
		if p == "repave/after-"+repave.StepDrain {
			out = append(out, "repave/after-new-built", "repave/after-old-stopped", "repave/after-node-deleted", "repave/after-new-started")
		}
	}
	return out
}

func child(t *testing.T, w *testhost.World, point string) (int, string) {
	t.Helper()
	return testhost.RunChild(t, childEnv+"="+w.Root, crashpoint.Env+"="+point)
}

func TestCrashAtEveryPointThenRerunConverges(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a child process per crash point; skipped with -short")
	}
	for _, point := range crashPoints() {
		t.Run(strings.ReplaceAll(point, "/", "_"), func(t *testing.T) {
			w := bootstrapped(t)
			changeImage(t, w)
			code, out := child(t, w, point)
			if code != crashpoint.ExitCode || !strings.Contains(out, "crash point "+point) {
				t.Fatalf("crash at %s: exit %d, want %d there\n%s", point, code, crashpoint.ExitCode, out)
			}
			if code, out := child(t, w, ""); code != 0 {
				t.Fatalf("rerun after the crash at %s: exit %d\n%s", point, code, out)
			}
			a := wantActive(t, w, "kube2")
			if !strings.Contains(string(a.Config), "node:1.36.3-2") {
				t.Errorf("kube2's record does not hold the desired config")
			}
			if w.UnitState("systemd-nspawn@kube2.service") != "active" || w.UnitState("systemd-nspawn@kube1.service") == "active" {
				t.Errorf("kube2 %s, kube1 %s", w.UnitState("systemd-nspawn@kube2.service"), w.UnitState("systemd-nspawn@kube1.service"))
			}
			if !exists(fake(w, "node")) || exists(fake(w, "unschedulable")) {
				t.Errorf("the Node is not back schedulable")
			}
			if !slices.Contains(w.Calls(), "enqueue "+unitnames.Daemon) {
				t.Errorf("daemon never started: %q", w.Calls())
			}
		})
	}
}

// The daemon's repave of a Machine whose Node vanished carries no config
// change: it repaves anyway (the new node registers the Node afresh).
func TestRepaveOfAVanishedNodeRepavesAnUnchangedConfig(t *testing.T) {
	w := bootstrapped(t)
	if err := request.Write(w.P, repave.Concern, &request.Request{UID: "node:0f1e", Type: "Repave", Machine: testhost.Machine}); err != nil {
		t.Fatal(err)
	}
	if err := run(t, w); err != nil {
		t.Fatalf("repave of a vanished Node: %v", err)
	}
	wantActive(t, w, "kube2")
	// A later start by hand of the same config: nothing to do.
	if err := run(t, w); !errors.Is(err, repave.ErrNothingToDo) {
		t.Fatalf("repave by hand after it: %v, want nothing to do", err)
	}
}

// previousJournal is the repave journal as the build before lib/steps
// declared it, field for field: a host upgraded mid-repave resumes what
// that build wrote.
type previousJournal struct {
	From   string          `json:"from"`
	To     string          `json:"to"`
	Mode   string          `json:"mode"`
	Config json.RawMessage `json:"config"`
	repave.Options
	Request   string    `json:"request,omitempty"`
	Done      []string  `json:"done"`
	Cordoned  bool      `json:"cordoned,omitempty"`
	Step      string    `json:"step,omitempty"`
	StartedAt time.Time `json:"started-at,omitzero"`
}

func TestAJournalOfThePreviousBuildResumesWithoutRedoingItsSteps(t *testing.T) {
	w := bootstrapped(t)
	changeImage(t, w)
	point := "repave/after-" + repave.StepCordon
	if code, out := child(t, w, point); code != crashpoint.ExitCode {
		t.Fatalf("crash at %s: exit %d\n%s", point, code, out)
	}
	var j repave.Journal
	if ok, err := state.ReadJournal(w.P, repave.Operation, &j); !ok || err != nil {
		t.Fatalf("journal after the crash: %v %v", ok, err)
	}
	old := previousJournal{From: j.From, To: j.To, Mode: j.Mode, Config: j.Config, Options: j.Options, Request: j.Request,
		Done: []string{repave.StepPlan, repave.StepArtifacts, repave.StepBuild, repave.StepCordon}, Cordoned: true,
		Step: repave.StepCordon, StartedAt: j.StartedAt}
	if err := state.WriteJournal(w.P, repave.Operation, old); err != nil {
		t.Fatal(err)
	}
	w.ClearCalls()
	if code, out := child(t, w, ""); code != 0 {
		t.Fatalf("resumed repave: exit %d\n%s", code, out)
	}
	wantActive(t, w, "kube2")
	for _, c := range []string{"prepare kube2", "cluster unschedulable=true"} {
		if slices.Contains(w.Calls(), c) {
			t.Errorf("%q again although the journal says its step is done: %q", c, w.Calls())
		}
	}
	order(t, w.Calls(), "cluster drain", "stop systemd-nspawn@kube1.service", "destroy kube1")
}
