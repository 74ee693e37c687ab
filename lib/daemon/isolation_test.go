package daemon

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/reprovision"
	"unbounded-cloud.io/agent/lib/state"
)

func isolationDaemon(t *testing.T, mode v1alpha3.IsolationMode, conds ...metav1.Condition) *daemon {
	t.Helper()
	m := &v1alpha3.Machine{ObjectMeta: metav1.ObjectMeta{Name: "m", Generation: 7}}
	m.Spec.Isolation.Mode = mode
	m.Status.Conditions = conds
	return &daemon{p: hostpaths.New(t.TempDir()), machineObj: m, handled: map[string]bool{}, log: slog.New(slog.DiscardHandler),
		active: &state.AppliedConfig{Slot: "kube1", Mode: "nspawn"}}
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
	if err := state.WriteIsolationOutcome(d.p, state.IsolationOutcome{From: "nspawn", To: "none", State: "Failed"}); err != nil {
		t.Fatal(err)
	}
	if j := d.isolationJob(); j != nil {
		t.Errorf("with an unreported outcome: %+v", j)
	}
	failed := metav1.Condition{Type: v1alpha3.ConditionIsolationChanged, Status: metav1.ConditionFalse, Reason: "Failed", ObservedGeneration: 7}
	if j := isolationDaemon(t, "none", failed).isolationJob(); j != nil {
		t.Errorf("after a failed change of this generation: %+v", j)
	}
	failed.ObservedGeneration = 6
	if j := isolationDaemon(t, "none", failed).isolationJob(); j == nil {
		t.Error("after a failed change of an earlier generation: no job")
	}
	byHand := metav1.Condition{Type: v1alpha3.ConditionIsolationChanged, Status: metav1.ConditionTrue, Reason: "Succeeded", ObservedGeneration: 7}
	if j := isolationDaemon(t, "none", byHand).isolationJob(); j != nil {
		t.Errorf("after a change reported at this generation (made by hand, the spec unchanged since): %+v", j)
	}

	d = isolationDaemon(t, "container")
	if j := d.isolationJob(); j != nil || !d.handled["isolation:container:7"] {
		t.Fatalf("a pair this build does not change between: %+v, handled %v", j, d.handled)
	}
	o, err := state.ReadIsolationOutcome(d.p)
	if err != nil || o == nil || o.State != "Failed" || !strings.Contains(o.Message, "not carried out by this build") {
		t.Errorf("its outcome %+v (%v), want Failed saying why", o, err)
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
	if err := state.WriteIsolationOutcome(d.p, state.IsolationOutcome{From: "nspawn", To: "none", Method: "InPlace", State: "Failed", Message: "rolled back: kubelet never Ready"}); err != nil {
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
	if o, _ := state.ReadIsolationOutcome(d.p); o != nil {
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
