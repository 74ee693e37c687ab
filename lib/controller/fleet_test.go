package controller

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
)

func TestFleetCollectorCountsMachinesAndOperations(t *testing.T) {
	s, err := Scheme()
	if err != nil {
		t.Fatal(err)
	}
	machine := func(name string, phase v1alpha3.MachinePhase, mode v1alpha3.IsolationMode, agent string) client.Object {
		m := &v1alpha3.Machine{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1alpha3.MachineSpec{Kubernetes: v1alpha3.KubernetesSpec{Version: "1.36.3"}},
			Status: v1alpha3.MachineStatus{Phase: phase}}
		if mode != "" {
			m.Status.Isolation = &v1alpha3.IsolationStatus{Mode: mode}
			m.Status.Agent = &v1alpha3.AgentStatus{Version: agent}
		}
		return m
	}
	op := func(name string, typ v1alpha3.OperationType, state v1alpha3.OperationState, reason string) client.Object {
		return &v1alpha3.MachineOperation{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1alpha3.MachineOperationSpec{MachineRef: v1alpha3.MachineRef{Name: "a"}, Operation: typ},
			Status: v1alpha3.MachineOperationStatus{State: state, Reason: reason}}
	}
	c := fake.NewClientBuilder().WithScheme(s).WithObjects(
		machine("a", v1alpha3.MachineReady, "nspawn", "0.2.0"), machine("b", v1alpha3.MachineReady, "nspawn", "0.2.0"),
		machine("c", v1alpha3.MachineReady, "none", "0.1.0"), machine("d", "", "", ""),
		op("o1", v1alpha3.OperationRepave, v1alpha3.OperationComplete, "Succeeded"), op("o2", v1alpha3.OperationRepave, v1alpha3.OperationFailed, "UnitFailed"),
		op("o3", v1alpha3.OperationRepave, "", ""), op("o4", v1alpha3.OperationRestart, v1alpha3.OperationInProgress, "Dispatched"),
	).Build()
	want := `
# HELP unbounded_machine_operations MachineOperations by operation, state (Pending before a host picks one up) and reason.
# TYPE unbounded_machine_operations gauge
unbounded_machine_operations{operation="Repave",reason="",state="Pending"} 1
unbounded_machine_operations{operation="Repave",reason="Succeeded",state="Complete"} 1
unbounded_machine_operations{operation="Repave",reason="UnitFailed",state="Failed"} 1
unbounded_machine_operations{operation="Restart",reason="",state="InProgress"} 1
# HELP unbounded_machines Machines by phase, isolation mode, agent version (as the agent reports it) and Kubernetes version (the spec's).
# TYPE unbounded_machines gauge
unbounded_machines{agent_version="",kubernetes_version="1.36.3",mode="",phase="Unknown"} 1
unbounded_machines{agent_version="0.1.0",kubernetes_version="1.36.3",mode="none",phase="Ready"} 1
unbounded_machines{agent_version="0.2.0",kubernetes_version="1.36.3",mode="nspawn",phase="Ready"} 2
# HELP unbounded_fleet_scrape_errors 1 when the last count of the fleet failed (its cache not synced yet, or a read refused).
# TYPE unbounded_fleet_scrape_errors gauge
unbounded_fleet_scrape_errors 0
`
	if err := testutil.CollectAndCompare(&FleetCollector{Reader: c}, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
}
