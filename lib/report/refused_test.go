package report

import (
	"context"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
)

// A refusal the fence recorded (AllocationLaunchRefused=True, phase
// Refused) stays on the Machine whatever the bootstrap reports: only a
// fence check that read the allocation on the Machine clears it, since an
// allow that never saw the allocation proves nothing against a refusal.
func TestReporterLeavesARecordedRefusalAndItsPhaseAlone(t *testing.T) {
	f := newFixture(t, true)
	ms := f.env.Machines(t)
	m := &v1alpha3.Machine{}
	m.Name = f.r.Machine
	m.Spec.Allocation = &v1alpha3.AllocationRef{Name: "a", UID: "u", Fenced: true}
	if _, err := ms.Create(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	_, err := ms.MutateStatus(context.Background(), m.Name, func(m *v1alpha3.Machine) bool {
		meta.SetStatusCondition(&m.Status.Conditions, metav1.Condition{Type: v1alpha3.ConditionAllocationLaunchRefused,
			Status: metav1.ConditionTrue, Reason: v1alpha3.ReasonAllocationFenced, Message: "fenced"})
		m.Status.Phase = v1alpha3.MachineRefused
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, report := range []func(context.Context) error{f.r.Running, f.r.Succeeded} {
		if err := report(context.Background()); err != nil {
			t.Fatal(err)
		}
		got := f.machine(t)
		if got.Status.Phase != v1alpha3.MachineRefused {
			t.Errorf("phase %q after a bootstrap report (%v), want Refused kept", got.Status.Phase, got.Status.Bootstrap)
		}
		if !meta.IsStatusConditionTrue(got.Status.Conditions, v1alpha3.ConditionAllocationLaunchRefused) {
			t.Errorf("AllocationLaunchRefused no longer True: %+v", got.Status.Conditions)
		}
		if got.Status.Bootstrap == nil {
			t.Error("the bootstrap state was not recorded")
		}
	}
	t.Log(f.log.String())
}
