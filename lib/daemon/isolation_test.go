package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/modes"
	"unbounded-cloud.io/agent/lib/outcome"
	"unbounded-cloud.io/agent/lib/reprovision"
	"unbounded-cloud.io/agent/lib/request"
	"unbounded-cloud.io/agent/lib/state"
)

func isolationDaemon(t *testing.T, mode v1alpha3.IsolationMode, conds ...metav1.Condition) *daemon {
	t.Helper()
	m := &v1alpha3.Machine{ObjectMeta: metav1.ObjectMeta{Name: "m", Generation: 7}}
	m.Spec.Isolation.Mode = mode
	m.Status.Conditions = conds
	p := hostpaths.New(t.TempDir())
	// The daemon saw the Machine's spec in step with the running mode
	// before (see TestSpecIsolationThatDiffersAtTheFirstLookIsNotActedOn).
	if err := state.WriteIsolationSpecSeen(p, "nspawn"); err != nil {
		t.Fatal(err)
	}
	return &daemon{p: p, machineObj: m, handled: map[string]bool{}, log: slog.New(slog.DiscardHandler),
		active: &state.AppliedConfig{Slot: "kube1", Mode: "nspawn"}}
}

// A spec that differs from the running mode when the daemon first looks
// is not acted on: the CRD defaults an unset mode to nspawn, so a Machine
// created without one (by an allocation controller) names nspawn for a
// host of mode none. A later change of the spec is acted on, and a spec
// equal to the running mode is recorded as seen.
func TestSpecIsolationThatDiffersAtTheFirstLookIsNotActedOn(t *testing.T) {
	d := isolationDaemon(t, "none")
	if err := os.Remove(state.IsolationSpecFile(d.p)); err != nil {
		t.Fatal(err)
	}
	if j := d.isolationJob(); j != nil {
		t.Fatalf("a spec that differed at the first look: %+v", j)
	}
	if seen, ok, _ := state.ReadIsolationSpecSeen(d.p); !ok || seen != "none" {
		t.Errorf("seen %q %v, want none recorded", seen, ok)
	}
	d.machineObj.Generation++ // another spec field changed: not the mode
	if j := d.isolationJob(); j != nil {
		t.Fatalf("the same spec mode at a later generation: %+v", j)
	}
	d.machineObj.Spec.Isolation.Mode = "nspawn" // in step: seen
	d.isolationJob()
	d.machineObj.Spec.Isolation.Mode = "none"
	d.machineObj.Generation++
	if j := d.isolationJob(); j == nil || j.params["to"] != "none" {
		t.Fatalf("a change of the spec: %+v", j)
	}
}

// spec.isolation.mode asks for one change per generation of the Machine:
// not for the running mode, not with the bootstrap token only, not while
// a change runs (its journal, a live handoff) or its outcome is still to
// be reported, not again after one for this generation failed; a pair of
// modes this build does not change between is reported Failed, no unit.
func TestSpecIsolationAsksForOneChangePerGeneration(t *testing.T) {
	if j := isolationDaemon(t, "").isolationJob(); j != nil {
		t.Errorf("no spec.isolation.mode: %+v", j)
	}
	if j := isolationDaemon(t, "nspawn").isolationJob(); j != nil {
		t.Errorf("the running mode: %+v", j)
	}
	d := isolationDaemon(t, "none")
	d.tokenOnly = true
	if j := d.isolationJob(); j != nil {
		t.Errorf("with the bootstrap token only: %+v", j)
	}
	j := isolationDaemon(t, "none").isolationJob()
	if j == nil || j.typ != OperationIsolationChange || j.uid != "isolation:none:7" || j.params["from"] != "nspawn" || j.params["to"] != "none" {
		t.Fatalf("another mode: %+v", j)
	}
	if tg := targets[OperationIsolationChange]; tg.unit != "unbounded-isolation.service" || tg.concern != "isolation" {
		t.Errorf("target %+v", tg)
	}

	d = isolationDaemon(t, "none")
	writeFile(t, d.p.Journal("isolation"), "{}")
	if j := d.isolationJob(); j != nil {
		t.Errorf("while a change's journal exists: %+v", j)
	}
	d = isolationDaemon(t, "none")
	if err := outcome.Write(d.p, outcome.Record{Concern: outcome.Isolation, From: "nspawn", To: "none", State: "Failed"}); err != nil {
		t.Fatal(err)
	}
	if j := d.isolationJob(); j != nil {
		t.Errorf("with an unreported outcome: %+v", j)
	}
	// askedFor is a daemon that asked for mode none already (its
	// dispatch records the spec as seen).
	askedFor := func(conds ...metav1.Condition) *daemon {
		d := isolationDaemon(t, "none", conds...)
		if err := state.WriteIsolationSpecSeen(d.p, "none"); err != nil {
			t.Fatal(err)
		}
		return d
	}
	failed := metav1.Condition{Type: v1alpha3.ConditionIsolationChanged, Status: metav1.ConditionFalse, Reason: "Failed", ObservedGeneration: 7}
	if j := askedFor(failed).isolationJob(); j != nil {
		t.Errorf("after a failed change of this generation: %+v", j)
	}
	// A change made by hand that failed, reported once the spec had
	// changed (at the new generation): the new spec is still asked for.
	if j := isolationDaemon(t, "none", failed).isolationJob(); j == nil {
		t.Error("a spec never asked for, after a change by hand reported at its generation: no job")
	}
	failed.ObservedGeneration = 6
	if j := askedFor(failed).isolationJob(); j == nil {
		t.Error("after a failed change of an earlier generation: no job")
	}
	byHand := metav1.Condition{Type: v1alpha3.ConditionIsolationChanged, Status: metav1.ConditionTrue, Reason: "Succeeded", ObservedGeneration: 7}
	if j := askedFor(byHand).isolationJob(); j != nil {
		t.Errorf("after a change reported at this generation (made by hand, the spec unchanged since): %+v", j)
	}

	d = isolationDaemon(t, "container")
	d.host.ChangeMethod = withoutContainer
	if j := d.isolationJob(); j != nil || !d.handled["isolation:container:7"] {
		t.Fatalf("a pair this build does not change between: %+v, handled %v", j, d.handled)
	}
	o, err := outcome.Read(d.p, outcome.Isolation)
	if err != nil || o == nil || o.State != "Failed" || !strings.Contains(o.Message, "not carried out by this build") {
		t.Errorf("its outcome %+v (%v), want Failed saying why", o, err)
	}
}

// spec.isolation.method goes into the job's request as its method
// parameter (absent when the spec names none: the build's method); a
// method this build does not carry out for the pair is reported Failed,
// no unit, as a pair it does not change between is.
func TestSpecIsolationMethodIsTheRequestsMethod(t *testing.T) {
	if j := isolationDaemon(t, "none").isolationJob(); j == nil {
		t.Fatal("no job")
	} else if _, ok := j.params["method"]; ok {
		t.Errorf("no spec.isolation.method: params %v, want no method", j.params)
	}
	for _, m := range []v1alpha3.IsolationChangeMethod{v1alpha3.IsolationChangeReprovision, v1alpha3.IsolationChangeInPlace} {
		d := isolationDaemon(t, "none")
		d.machineObj.Spec.Isolation.Method = m
		if j := d.isolationJob(); j == nil || j.params["method"] != string(m) || j.params["from"] != "nspawn" || j.params["to"] != "none" {
			t.Errorf("spec.isolation.method %s: job %+v", m, j)
		}
	}

	for name, c := range map[string]struct {
		method v1alpha3.IsolationChangeMethod
		table  func(from, to, asked string) (string, error)
	}{
		"a method this build does not carry out for the pair": {v1alpha3.IsolationChangeReprovision, inPlaceOnly},
		"a method this build does not know":                   {"Teleport", nil},
	} {
		d := isolationDaemon(t, "none")
		d.machineObj.Spec.Isolation.Method = c.method
		d.host.ChangeMethod = c.table
		if j := d.isolationJob(); j != nil || !d.handled["isolation:none:7"] {
			t.Errorf("%s: %+v, handled %v", name, j, d.handled)
			continue
		}
		o, err := outcome.Read(d.p, outcome.Isolation)
		if err != nil || o == nil || o.State != "Failed" || !strings.Contains(o.Message, "not carried out by this build") || !strings.Contains(o.Message, string(c.method)) {
			t.Errorf("%s: outcome %+v (%v), want Failed saying why", name, o, err)
		}
	}
}

// The status follows the host: a change's journal is InProgress, its
// outcome Succeeded or Failed with the condition at this generation (the
// outcome removed once reported), a handoff's journal its own state.
func TestIsolationReportFollowsTheHost(t *testing.T) {
	d := isolationDaemon(t, "none")
	want := d.machineObj.DeepCopy()
	if f := d.isolationReport(context.Background(), want); f != nil || want.Status.IsolationChange != nil {
		t.Fatalf("nothing on the host: %+v", want.Status.IsolationChange)
	}
	began := time.Date(2026, 12, 4, 10, 0, 0, 0, time.UTC)
	writeFile(t, d.p.Journal("isolation"), `{"running-slot":"kube1","from-mode":"nspawn","mode":"none","method":"InPlace","started-at":"2026-12-04T10:00:00Z","step":"drain"}`)
	want = d.machineObj.DeepCopy()
	if f := d.isolationReport(context.Background(), want); f == nil {
		t.Fatal("no report of a change in progress")
	}
	ch := want.Status.IsolationChange
	if ch == nil || ch.State != v1alpha3.IsolationChangeInProgress || ch.Method != v1alpha3.IsolationChangeInPlace || ch.From != "nspawn" || ch.To != "none" || !ch.StartTime.Time.Equal(began) {
		t.Errorf("in progress: %+v", ch)
	}

	d = isolationDaemon(t, "none")
	if err := outcome.Write(d.p, outcome.Record{Concern: outcome.Isolation, From: "nspawn", To: "none", Method: "InPlace", State: "Failed", Message: "rolled back: kubelet never Ready"}); err != nil {
		t.Fatal(err)
	}
	want = d.machineObj.DeepCopy()
	d.isolationReport(context.Background(), want)
	c := meta.FindStatusCondition(want.Status.Conditions, v1alpha3.ConditionIsolationChanged)
	if want.Status.IsolationChange.State != v1alpha3.IsolationChangeFailed || c == nil || c.Status != metav1.ConditionFalse || c.ObservedGeneration != 7 || !strings.Contains(c.Message, "rolled back") {
		t.Errorf("failed: %+v, condition %+v", want.Status.IsolationChange, c)
	}
	// Once the Machine holds it (the status write landed), the outcome
	// goes; the same state again is no new Event.
	d.machineObj = want
	again := d.machineObj.DeepCopy()
	d.isolationReport(context.Background(), again)()
	if o, _ := outcome.Read(d.p, outcome.Isolation); o != nil {
		t.Error("the reported outcome was not removed")
	}

	d = isolationDaemon(t, "none")
	exe := t.TempDir() + "/exe"
	writeFile(t, exe, "x")
	if err := reprovision.Stage(d.p, reprovision.Journal{FromMode: "nspawn", ToMode: "none", StartedAt: began, Deadline: began.Add(time.Hour)}, []byte(`{}`), exe); err != nil {
		t.Fatal(err)
	}
	want = d.machineObj.DeepCopy()
	d.isolationReport(context.Background(), want)
	if ch := want.Status.IsolationChange; ch == nil || ch.Method != v1alpha3.IsolationChangeReprovision || ch.State != v1alpha3.IsolationChangeInProgress || !strings.Contains(ch.Message, "gives up at") {
		t.Errorf("a live handoff: %+v", ch)
	}
}

const isolationUnit = "unbounded-isolation.service"

// setIsolationMode sets the Machine's spec.isolation.mode as a fleet
// operator does (mutate may change more of the spec) and returns the
// Machine's new generation.
func (f *fixture) setIsolationMode(t *testing.T, mode v1alpha3.IsolationMode, mutate ...func(*v1alpha3.Machine)) int64 {
	t.Helper()
	var gen int64
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		m, err := f.env.ops.machines.Get(context.Background(), f.machine)
		if err != nil {
			return err
		}
		m.Spec.Isolation.Mode = mode
		for _, fn := range mutate {
			fn(m)
		}
		m, err = f.env.ops.machines.Update(context.Background(), m)
		if err == nil {
			gen = m.Generation
		}
		return err
	})
	if err != nil {
		t.Fatalf("set spec.isolation.mode %s: %v", mode, err)
	}
	return gen
}

// waitIsolationChange waits until the Machine reports an isolation change
// in state s with the IsolationChanged condition observed at gen, and
// returns the Machine.
func (f *fixture) waitIsolationChange(t *testing.T, s v1alpha3.IsolationChangeState, gen int64) *v1alpha3.Machine {
	t.Helper()
	var m *v1alpha3.Machine
	eventually(t, opTimeout, fmt.Sprintf("isolation change %s at generation %d", s, gen), func() bool {
		var err error
		m, err = f.env.ops.machines.Get(context.Background(), f.machine)
		if err != nil || m.Status.IsolationChange == nil || m.Status.IsolationChange.State != s {
			return false
		}
		c := meta.FindStatusCondition(m.Status.Conditions, v1alpha3.ConditionIsolationChanged)
		return c != nil && c.ObservedGeneration == gen
	})
	return m
}

// waitEvents waits until the Machine has an Event of each reason.
func (f *fixture) waitEvents(t *testing.T, reasons ...string) {
	t.Helper()
	eventually(t, opTimeout, "Events "+strings.Join(reasons, ", "), func() bool {
		got := f.machineEvents(t)
		for _, r := range reasons {
			if !slices.Contains(got, r) {
				return false
			}
		}
		return true
	})
}

// changedToNone is the host after an isolation change to mode none: the new
// mode's record in slot kube2, the old one's gone.
func changedToNone(t *testing.T, p hostpaths.Paths, machine string) {
	t.Helper()
	if err := state.WriteApplied(p, &state.AppliedConfig{Slot: "kube2", Mode: "none", Machine: machine}); err != nil {
		t.Fatal(err)
	}
	if err := state.RemoveApplied(p, "kube1"); err != nil {
		t.Fatal(err)
	}
}

// The Machine's spec.isolation.mode, unchanged, asks for nothing; changed,
// its change is shown InProgress (status, phase) before
// unbounded-isolation.service starts with the daemon's request (concern
// isolation, the Machine's spec as the desired config, no operation), and
// its outcome is reported: Succeeded, IsolationChanged at the generation,
// the phase Ready again, the new mode in status.isolation, an Event for
// each state. The change is made once.
func TestIsolationChangeBySpecIsDispatchedAndReported(t *testing.T) {
	f := newFixture(t)
	type atStart struct {
		req *request.Request
		m   *v1alpha3.Machine
	}
	seen := make(chan atStart, 4)
	f.fake.onStart = func(unit string) {
		if unit != isolationUnit {
			return
		}
		req, err := request.Read(f.opts.Paths, "isolation")
		if err != nil {
			t.Errorf("no request when %s was started: %v", unit, err)
		}
		m, err := f.env.ops.machines.Get(context.Background(), f.machine)
		if err != nil {
			t.Error(err)
		}
		seen <- atStart{req, m}
		// The unit's work (lib/repave): the node runs in mode none, its
		// outcome left for the daemon.
		changedToNone(t, f.opts.Paths, f.machine)
		if err := outcome.Write(f.opts.Paths, outcome.Record{Concern: outcome.Isolation, From: "nspawn", To: "none", Method: "InPlace", State: "Succeeded",
			StartedAt: time.Now(), Time: time.Now(), Message: "the node runs in mode none (isolation changed InPlace from nspawn)"}); err != nil {
			t.Error(err)
		}
	}
	startDaemon(t, f.opts)
	eventually(t, opTimeout, "Machine status.isolation nspawn", func() bool { return f.machineSlot(t) == "kube1" })
	f.settled(t)
	if n := f.fake.startCount(isolationUnit); n != 0 {
		t.Fatalf("%s started %d times for the running mode", isolationUnit, n)
	}

	gen := f.setIsolationMode(t, v1alpha3.IsolationNone)
	var s atStart
	select {
	case s = <-seen:
	case <-time.After(opTimeout):
		t.Fatalf("%s not started", isolationUnit)
	}
	var desired v1alpha3.MachineSpec
	if s.req == nil || s.req.UID != fmt.Sprintf("isolation:none:%d", gen) || s.req.Type != "IsolationChange" || s.req.Operation != "" || s.req.Unit != isolationUnit ||
		s.req.Parameters["from"] != "nspawn" || s.req.Parameters["to"] != "none" || json.Unmarshal(s.req.Desired, &desired) != nil || desired.Isolation.Mode != v1alpha3.IsolationNone {
		t.Fatalf("request %+v, desired %s", s.req, s.req.Desired)
	}
	if ch := s.m.Status.IsolationChange; ch == nil || ch.State != v1alpha3.IsolationChangeInProgress || ch.From != "nspawn" || ch.To != "none" ||
		ch.Method != v1alpha3.IsolationChangeInPlace || ch.StartTime == nil || s.m.Status.Phase != v1alpha3.MachineChangingIsolation {
		t.Errorf("at the unit's start: isolationChange %+v, phase %s; want InProgress, ChangingIsolation", ch, s.m.Status.Phase)
	}

	m := f.waitIsolationChange(t, v1alpha3.IsolationChangeSucceeded, gen)
	if c := meta.FindStatusCondition(m.Status.Conditions, v1alpha3.ConditionIsolationChanged); c.Status != metav1.ConditionTrue {
		t.Errorf("IsolationChanged %+v, want True", c)
	}
	eventually(t, opTimeout, "phase Ready, status.isolation none", func() bool {
		m, err := f.env.ops.machines.Get(context.Background(), f.machine)
		return err == nil && m.Status.Phase == v1alpha3.MachineReady && m.Status.Isolation != nil && m.Status.Isolation.Mode == v1alpha3.IsolationNone && m.Status.Isolation.Slot == ""
	})
	f.waitEvents(t, "IsolationChangeInProgress", "IsolationChangeSucceeded")
	eventually(t, opTimeout, "the reported outcome removed from the host", func() bool {
		o, err := outcome.Read(f.opts.Paths, outcome.Isolation)
		return o == nil && err == nil
	})
	if !strings.Contains(m.Status.IsolationChange.Message, "isolation changed InPlace") {
		t.Errorf("isolationChange %+v, want the unit's outcome", m.Status.IsolationChange)
	}
	f.settled(t)
	f.settled(t)
	if n := f.fake.startCount(isolationUnit); n != 1 {
		t.Errorf("%s started %d times, want 1", isolationUnit, n)
	}
}

// The Machine's spec.isolation.method asks the unit for its method: a
// change to mode none by Reprovision (a pair made in place by default)
// is handed to unbounded-isolation.service with the request's method
// Reprovision, and the Machine shows that method from the start
// (InProgress, before the unit runs) to the end, here judged by the host
// (the unit left no outcome of its own).
func TestIsolationChangeBySpecMethodAsksTheUnitForIt(t *testing.T) {
	f := newFixture(t)
	type atStart struct {
		req *request.Request
		m   *v1alpha3.Machine
	}
	seen := make(chan atStart, 4)
	f.fake.onStart = func(unit string) {
		if unit != isolationUnit {
			return
		}
		req, err := request.Read(f.opts.Paths, "isolation")
		if err != nil {
			t.Errorf("no request when %s was started: %v", unit, err)
		}
		m, err := f.env.ops.machines.Get(context.Background(), f.machine)
		if err != nil {
			t.Error(err)
		}
		seen <- atStart{req, m}
		// The reprovision's work: the node bootstrapped in mode none.
		changedToNone(t, f.opts.Paths, f.machine)
	}
	startDaemon(t, f.opts)
	eventually(t, opTimeout, "the daemon saw the spec", func() bool {
		seen, ok, _ := state.ReadIsolationSpecSeen(f.opts.Paths)
		return ok && seen == "nspawn"
	})

	gen := f.setIsolationMode(t, v1alpha3.IsolationNone, func(m *v1alpha3.Machine) {
		m.Spec.Isolation.Method = v1alpha3.IsolationChangeReprovision
	})
	var s atStart
	select {
	case s = <-seen:
	case <-time.After(opTimeout):
		t.Fatalf("%s not started", isolationUnit)
	}
	if s.req == nil || s.req.Parameters["method"] != modes.MethodReprovision || s.req.Parameters["from"] != "nspawn" || s.req.Parameters["to"] != "none" {
		t.Fatalf("request %+v, want method %s", s.req, modes.MethodReprovision)
	}
	if ch := s.m.Status.IsolationChange; ch == nil || ch.State != v1alpha3.IsolationChangeInProgress || ch.Method != v1alpha3.IsolationChangeReprovision {
		t.Errorf("at the unit's start: isolationChange %+v, want InProgress by Reprovision", ch)
	}
	m := f.waitIsolationChange(t, v1alpha3.IsolationChangeSucceeded, gen)
	if ch := m.Status.IsolationChange; ch.Method != v1alpha3.IsolationChangeReprovision || ch.From != "nspawn" || ch.To != "none" {
		t.Errorf("isolationChange %+v, want nspawn -> none by Reprovision", ch)
	}
	f.settled(t)
	if n := f.fake.startCount(isolationUnit); n != 1 {
		t.Errorf("%s started %d times, want 1", isolationUnit, n)
	}
}

// A change that fails is reported Failed with the unit's result and last
// journal lines (after the unit's own why, when it left one), and is not
// tried again at the same generation of the Machine; a new generation
// asks again.
func TestFailedIsolationChangeIsReportedOncePerGeneration(t *testing.T) {
	f := newFixture(t)
	f.fake.configure(isolationUnit, func(u *fakeUnit) { u.fail = true })
	var runs atomic.Int32
	f.fake.onStart = func(unit string) {
		if unit != isolationUnit || runs.Add(1) != 1 {
			return // the second run is killed before it records anything
		}
		if err := outcome.Write(f.opts.Paths, outcome.Record{Concern: outcome.Isolation, From: "nspawn", To: "none", Method: "InPlace", State: "Failed",
			Time: time.Now(), Message: "rolled back to mode nspawn: the Node did not become Ready"}); err != nil {
			t.Error(err)
		}
	}
	startDaemon(t, f.opts)
	// The daemon's first look at the spec, in step with the running
	// mode (a spec that differs then is not acted on).
	eventually(t, opTimeout, "the daemon saw the spec", func() bool {
		seen, ok, _ := state.ReadIsolationSpecSeen(f.opts.Paths)
		return ok && seen == "nspawn"
	})

	gen := f.setIsolationMode(t, v1alpha3.IsolationNone)
	m := f.waitIsolationChange(t, v1alpha3.IsolationChangeFailed, gen)
	c := meta.FindStatusCondition(m.Status.Conditions, v1alpha3.ConditionIsolationChanged)
	for _, want := range []string{"rolled back to mode nspawn", "result exit-code, exit status 1", "step 3: disk full"} {
		if !strings.Contains(m.Status.IsolationChange.Message, want) || !strings.Contains(c.Message, want) {
			t.Errorf("message %q (condition %q) lacks %q", m.Status.IsolationChange.Message, c.Message, want)
		}
	}
	if c.Status != metav1.ConditionFalse || m.Status.Phase != v1alpha3.MachineReady {
		t.Errorf("IsolationChanged %+v, phase %s; want False, Ready", c, m.Status.Phase)
	}
	f.waitEvents(t, "IsolationChangeInProgress", "IsolationChangeFailed")
	f.settled(t)
	f.settled(t)
	if n := f.fake.startCount(isolationUnit); n != 1 {
		t.Fatalf("%s started %d times at generation %d, want 1", isolationUnit, n, gen)
	}

	gen2 := f.setIsolationMode(t, v1alpha3.IsolationNone, func(m *v1alpha3.Machine) {
		m.Spec.Kubernetes.NodeLabels = map[string]string{"example.com/try": "2"}
	})
	m = f.waitIsolationChange(t, v1alpha3.IsolationChangeFailed, gen2)
	for _, want := range []string{"the change ended with the node in mode nspawn", "exit status 1", "step 3: disk full"} {
		if !strings.Contains(m.Status.IsolationChange.Message, want) {
			t.Errorf("message %q lacks %q", m.Status.IsolationChange.Message, want)
		}
	}
	if n := f.fake.startCount(isolationUnit); n != 2 {
		t.Errorf("%s started %d times after generation %d, want 2", isolationUnit, n, gen2)
	}
}

// withoutContainer is the table of a build that does not change to or
// from mode container (today's changes between every pair).
func withoutContainer(from, to, asked string) (string, error) {
	if from == "container" || to == "container" {
		return "", fmt.Errorf("isolation change from %s to %s: not carried out by this build (it changes between nspawn -> none, none -> nspawn)", from, to)
	}
	return modes.ChangeMethodAsked(from, to, asked)
}

// inPlaceOnly is the table of a build that changes every pair in place
// and none by reprovision (today's makes every pair by either method).
func inPlaceOnly(from, to, asked string) (string, error) {
	if asked == modes.MethodReprovision {
		return "", fmt.Errorf("isolation change from %s to %s: method %s: not carried out by this build", from, to, asked)
	}
	return modes.ChangeMethodAsked(from, to, asked)
}

// A pair of modes this build does not change between is reported Failed,
// and no unit starts.
func TestUnsupportedIsolationChangeIsReportedWithoutAUnit(t *testing.T) {
	f := newFixture(t)
	f.opts.Host.ChangeMethod = withoutContainer
	startDaemon(t, f.opts)
	// The daemon's first look at the spec, in step with the running
	// mode (a spec that differs then is not acted on).
	eventually(t, opTimeout, "the daemon saw the spec", func() bool {
		seen, ok, _ := state.ReadIsolationSpecSeen(f.opts.Paths)
		return ok && seen == "nspawn"
	})
	gen := f.setIsolationMode(t, v1alpha3.IsolationContainer)
	m := f.waitIsolationChange(t, v1alpha3.IsolationChangeFailed, gen)
	if ch := m.Status.IsolationChange; !strings.Contains(ch.Message, "not carried out by this build") || ch.To != v1alpha3.IsolationContainer {
		t.Errorf("isolationChange %+v", ch)
	}
	f.waitEvents(t, "IsolationChangeFailed")
	f.settled(t)
	f.settled(t)
	if n := f.fake.startCount(isolationUnit); n != 0 {
		t.Errorf("%s started %d times", isolationUnit, n)
	}
}

// leftChanging is what a daemon stopped in the middle of an isolation
// change to mode none leaves on the Machine: the spec asking for it, the
// status InProgress.
func (f *fixture) leftChanging(t *testing.T) int64 {
	t.Helper()
	gen := f.setIsolationMode(t, v1alpha3.IsolationNone)
	start := metav1.NewTime(time.Now().Add(-time.Minute).Truncate(time.Second))
	_, err := f.env.ops.machines.MutateStatus(context.Background(), f.machine, func(m *v1alpha3.Machine) bool {
		m.Status.IsolationChange = &v1alpha3.IsolationChangeStatus{From: "nspawn", To: "none", Method: v1alpha3.IsolationChangeInPlace,
			State: v1alpha3.IsolationChangeInProgress, StartTime: &start, Message: isolationUnit + " started"}
		m.Status.Phase = v1alpha3.MachineChangingIsolation
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	return gen
}

// A daemon that starts to a change shown InProgress that nothing on the
// host carries on (no unit, no journal, no outcome: killed with the
// daemon or the host) judges it by the host: the node in the new mode is
// Succeeded, in the old one Failed, which is not tried again at this
// generation.
func TestIsolationChangeLeftInProgressIsJudgedByTheHost(t *testing.T) {
	t.Run("in the new mode", func(t *testing.T) {
		f := newFixture(t)
		gen := f.leftChanging(t)
		changedToNone(t, f.opts.Paths, f.machine)
		startDaemon(t, f.opts)
		m := f.waitIsolationChange(t, v1alpha3.IsolationChangeSucceeded, gen)
		if !strings.Contains(m.Status.IsolationChange.Message, "the node runs in mode none") || m.Status.Phase != v1alpha3.MachineReady {
			t.Errorf("isolationChange %+v, phase %s", m.Status.IsolationChange, m.Status.Phase)
		}
		f.waitEvents(t, "IsolationChangeSucceeded")
	})
	t.Run("in the old mode", func(t *testing.T) {
		f := newFixture(t)
		gen := f.leftChanging(t)
		startDaemon(t, f.opts)
		m := f.waitIsolationChange(t, v1alpha3.IsolationChangeFailed, gen)
		if !strings.Contains(m.Status.IsolationChange.Message, "the change ended with the node in mode nspawn") {
			t.Errorf("isolationChange %+v", m.Status.IsolationChange)
		}
		f.waitEvents(t, "IsolationChangeFailed")
		f.settled(t)
		f.settled(t)
		if n := f.fake.startCount(isolationUnit); n != 0 {
			t.Errorf("%s started %d times at the generation of the failed change", isolationUnit, n)
		}
	})
}

// A daemon that starts to a change an earlier process showed InProgress
// and handed to its request, but stopped before it started the unit,
// resumes it: the unit starts once, for that request, and its outcome is
// reported. (Before, the change was judged Failed at once.)
func TestIsolationChangeHandedToItsRequestIsResumed(t *testing.T) {
	f := newFixture(t)
	gen := f.leftChanging(t)
	uid := fmt.Sprintf("isolation:none:%d", gen)
	if err := request.Write(f.opts.Paths, "isolation", &request.Request{UID: uid, Type: string(OperationIsolationChange), Machine: f.machine,
		Unit: isolationUnit, Parameters: map[string]string{"from": "nspawn", "to": "none"}, RequestedAt: time.Now().UTC()}); err != nil {
		t.Fatal(err)
	}
	f.fake.onStart = func(unit string) {
		if unit != isolationUnit {
			return
		}
		if req, err := request.Read(f.opts.Paths, "isolation"); err != nil || req.UID != uid {
			t.Errorf("%s started for request %+v (%v), want %s", unit, req, err, uid)
		}
		changedToNone(t, f.opts.Paths, f.machine)
		if err := outcome.Write(f.opts.Paths, outcome.Record{Concern: outcome.Isolation, From: "nspawn", To: "none", Method: "InPlace", State: "Succeeded",
			StartedAt: time.Now(), Time: time.Now(), Message: "the node runs in mode none (isolation changed InPlace from nspawn)"}); err != nil {
			t.Error(err)
		}
	}
	startDaemon(t, f.opts)
	m := f.waitIsolationChange(t, v1alpha3.IsolationChangeSucceeded, gen)
	if !strings.Contains(m.Status.IsolationChange.Message, "isolation changed InPlace") {
		t.Errorf("isolationChange %+v, want the resumed unit's outcome", m.Status.IsolationChange)
	}
	f.settled(t)
	f.settled(t)
	if n := f.fake.startCount(isolationUnit); n != 1 {
		t.Errorf("%s started %d times, want once for the request", isolationUnit, n)
	}
}

// A daemon that starts while unbounded-isolation.service runs (started by
// the daemon before it, or by hand) waits for it instead of starting
// anything, and reports the outcome it leaves.
func TestIsolationChangeRunningAtStartIsWaitedForAndReported(t *testing.T) {
	f := newFixture(t)
	gen := f.leftChanging(t)
	f.fake.configure(isolationUnit, func(u *fakeUnit) {
		u.st = UnitState{ActiveState: "activating", SubState: "start", InvocationID: "earlier"}
	})
	logs := f.recordLogs(t)
	startDaemon(t, f.opts)
	waitLogged(t, logs, 1, "a node operation runs; waiting for it", isolationUnit)
	if m, err := f.env.ops.machines.Get(context.Background(), f.machine); err != nil || m.Status.IsolationChange.State != v1alpha3.IsolationChangeInProgress {
		t.Fatalf("judged while its unit runs: %+v (%v)", m.Status.IsolationChange, err)
	}

	changedToNone(t, f.opts.Paths, f.machine)
	if err := outcome.Write(f.opts.Paths, outcome.Record{Concern: outcome.Isolation, From: "nspawn", To: "none", Method: "InPlace", State: "Succeeded",
		Time: time.Now(), Message: "the node runs in mode none (isolation changed InPlace from nspawn)"}); err != nil {
		t.Fatal(err)
	}
	f.fake.configure(isolationUnit, func(u *fakeUnit) {
		u.st = UnitState{ActiveState: "inactive", SubState: "dead", Result: "success", InvocationID: "earlier"}
	})
	m := f.waitIsolationChange(t, v1alpha3.IsolationChangeSucceeded, gen)
	if !strings.Contains(m.Status.IsolationChange.Message, "isolation changed InPlace") {
		t.Errorf("isolationChange %+v, want the unit's outcome", m.Status.IsolationChange)
	}
	if n := f.fake.startCount(isolationUnit); n != 0 {
		t.Errorf("%s started %d times by the daemon", isolationUnit, n)
	}
}

// The phase is ChangingIsolation while a change is InProgress and Ready
// once it ended, unless the allocation fence refused the node.
func TestIsolationPhaseFollowsTheChange(t *testing.T) {
	m := &v1alpha3.Machine{Status: v1alpha3.MachineStatus{Phase: v1alpha3.MachineReady}}
	isolationPhase(m, v1alpha3.IsolationChangeInProgress)
	if m.Status.Phase != v1alpha3.MachineChangingIsolation {
		t.Errorf("InProgress: phase %s", m.Status.Phase)
	}
	isolationPhase(m, v1alpha3.IsolationChangeFailed)
	if m.Status.Phase != v1alpha3.MachineReady {
		t.Errorf("ended: phase %s", m.Status.Phase)
	}
	m.Status.Phase = v1alpha3.MachineRefused
	meta.SetStatusCondition(&m.Status.Conditions, metav1.Condition{Type: v1alpha3.ConditionAllocationLaunchRefused, Status: metav1.ConditionTrue, Reason: "Fenced"})
	isolationPhase(m, v1alpha3.IsolationChangeInProgress)
	if m.Status.Phase != v1alpha3.MachineRefused {
		t.Errorf("refused by the fence: phase %s", m.Status.Phase)
	}
}

// A daemon killed in either window of an isolation change's hand-over
// (the change shown InProgress, its request not yet written; the request
// written, the spec not yet recorded as asked for) loses nothing: the
// next daemon carries the change out, once, at the same generation, and
// it is never reported Failed on the way. (Before, the spec was recorded
// as asked for first: a cut before InProgress left the host in the old
// mode for good, and a cut after it got the change judged Failed and not
// retried at that generation.) The first daemon is frozen at the crash
// point, as a killed process is: it writes nothing more.
func TestIsolationChangeCutAtItsHandOverIsCarriedOutOnce(t *testing.T) {
	for _, point := range []string{CrashIsolationInProgress, CrashIsolationRequested} {
		t.Run(point, func(t *testing.T) {
			f := newFixture(t)
			f.fake.onStart = func(unit string) {
				if unit != isolationUnit {
					return
				}
				changedToNone(t, f.opts.Paths, f.machine)
				if err := outcome.Write(f.opts.Paths, outcome.Record{Concern: outcome.Isolation, From: "nspawn", To: "none", Method: "InPlace", State: "Succeeded",
					StartedAt: time.Now(), Time: time.Now(), Message: "the node runs in mode none (isolation changed InPlace from nspawn)"}); err != nil {
					t.Error(err)
				}
			}
			crashed := make(chan struct{})
			opts := f.opts
			opts.Log = testLogger(t)
			opts.Host.CrashPoint = func(name string) {
				if name == point {
					close(crashed)
					select {} // killed: nothing more of this process runs
				}
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go Run(ctx, opts) //nolint:errcheck // frozen at the crash point, never returns
			eventually(t, opTimeout, "the daemon saw the spec", func() bool {
				seen, ok, _ := state.ReadIsolationSpecSeen(f.opts.Paths)
				return ok && seen == "nspawn"
			})
			gen := f.setIsolationMode(t, v1alpha3.IsolationNone)
			select {
			case <-crashed:
			case <-time.After(opTimeout):
				t.Fatalf("crash point %s not reached", point)
			}
			cancel()
			if n := f.fake.startCount(isolationUnit); n != 0 {
				t.Fatalf("%s started %d times before the cut", isolationUnit, n)
			}

			startDaemon(t, f.opts)
			m := f.waitIsolationChange(t, v1alpha3.IsolationChangeSucceeded, gen)
			if !strings.Contains(m.Status.IsolationChange.Message, "isolation changed InPlace") {
				t.Errorf("isolationChange %+v, want the unit's outcome", m.Status.IsolationChange)
			}
			f.settled(t)
			f.settled(t)
			if n := f.fake.startCount(isolationUnit); n != 1 {
				t.Errorf("%s started %d times, want once", isolationUnit, n)
			}
			if ev := f.machineEvents(t); slices.Contains(ev, "IsolationChangeFailed") {
				t.Errorf("the change was reported Failed on the way: Events %v", ev)
			}
		})
	}
}

// A change of spec.isolation.mode made while the daemon's first
// operation runs is a change, acted on once that operation ends: the
// first look is the Machine as the daemon first saw it, not as it is when
// the job sources first get to the isolation mode (CI H1: a marker
// operation ran first and the spec changed under it; the change was
// taken for the spec at the first look and never acted on).
func TestAModeChangedWhileTheFirstOperationRunsIsActedOn(t *testing.T) {
	f := newFixture(t)
	release := make(chan struct{})
	f.fake.configure("unbounded-restart.service", func(u *fakeUnit) { u.hold = release })
	op := f.env.createOp(t, f.machine, v1alpha3.OperationRestart)
	startDaemon(t, f.opts)
	eventually(t, opTimeout, "the operation's unit started", func() bool { return f.fake.startCount("unbounded-restart.service") == 1 })
	f.setIsolationMode(t, v1alpha3.IsolationNone)
	close(release)
	if done := f.env.waitOp(t, op.Name, opTimeout); done.Status.State != v1alpha3.OperationComplete {
		t.Fatalf("operation %s ended %s: %s", op.Name, done.Status.State, done.Status.Message)
	}
	eventually(t, opTimeout, isolationUnit+" started for the changed spec", func() bool { return f.fake.startCount(isolationUnit) == 1 })
}
