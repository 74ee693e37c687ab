package daemon

import (
	"context"
	"io"
	"log/slog"
	"os"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	fencerecord "unbounded-cloud.io/agent/lib/fence/record"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/state"
	"unbounded-cloud.io/agent/lib/unitnames"
)

// The daemon starts the node once the Machine no longer refuses what the
// fence refused explicitly: once per Machine generation, never after a
// refusal for lack of an answer (health's to retry), never while the
// Machine still refuses.
func TestUnfenceStartsTheNodeOncePerMachineChangeThatLiftsAnExplicitRefusal(t *testing.T) {
	p := hostpaths.New(t.TempDir())
	if err := os.MkdirAll(p.RunDir(), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := state.WriteApplied(p, &state.AppliedConfig{Slot: "kube1", Mode: "nspawn", Machine: "w1"}); err != nil {
		t.Fatal(err)
	}
	sd := newFakeSystemd()
	d := &daemon{p: p, sd: fakeConn{sd}, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	machine := func(gen int64, fenced bool) *v1alpha3.Machine {
		return &v1alpha3.Machine{ObjectMeta: metav1.ObjectMeta{Name: "w1", UID: "m-uid", Generation: gen},
			Spec: v1alpha3.MachineSpec{Allocation: &v1alpha3.AllocationRef{UID: "a-uid", Fenced: fenced}}}
	}
	write := func(o fencerecord.Outcome) {
		if err := fencerecord.Write(p, fencerecord.Record{Outcome: o, Reason: "AllocationFenced", AllocationUID: "a-uid", At: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	step := func(m *v1alpha3.Machine) int {
		d.machineObj = m
		d.unfence(context.Background())
		deadline := time.Now().Add(5 * time.Second)
		for d.unfenceState.starting.Load() && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		return sd.startCount(unitnames.NodeTarget)
	}

	write(fencerecord.Refused)
	if n := step(machine(1, true)); n != 0 {
		t.Fatalf("fenced Machine: %d node starts", n)
	}
	if n := step(machine(2, false)); n != 1 {
		t.Fatalf("unfenced Machine: %d node starts, want 1", n)
	}
	if n := step(machine(2, false)); n != 1 {
		t.Fatalf("same generation again (a status write): %d node starts, want still 1", n)
	}
	if n := step(machine(3, false)); n != 2 {
		t.Fatalf("a new generation while the refusal is still recorded: %d node starts, want 2", n)
	}
	write(fencerecord.NoAnswer)
	if n := step(machine(4, false)); n != 2 {
		t.Fatalf("refusal for lack of an answer: %d node starts, want none more", n)
	}
	write(fencerecord.Refused)
	del := machine(5, false)
	now := metav1.Now()
	del.DeletionTimestamp = &now
	if n := step(del); n != 2 {
		t.Fatalf("deleting Machine: %d node starts, want none more", n)
	}
}
