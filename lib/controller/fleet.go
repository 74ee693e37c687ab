package controller

import (
	"cmp"
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
)

// FleetCollector exports the fleet as the cluster shows it, counted at
// each scrape from the manager's cache (no request to the API server):
// Machines by phase, isolation mode, agent version and Kubernetes version,
// MachineOperations by type and state (with the failures' reasons), and
// each MachineRollout's hosts by state (Rollouts keeps those).
type FleetCollector struct {
	Reader client.Reader
}

var (
	fleetMachines = prometheus.NewDesc("unbounded_machines",
		"Machines by phase, isolation mode, agent version (as the agent reports it) and Kubernetes version (the spec's).",
		[]string{"phase", "mode", "agent_version", "kubernetes_version"}, nil)
	fleetOperations = prometheus.NewDesc("unbounded_machine_operations",
		"MachineOperations by operation, state (Pending before a host picks one up) and reason.",
		[]string{"operation", "state", "reason"}, nil)
	fleetScrapeErrors = prometheus.NewDesc("unbounded_fleet_scrape_errors",
		"1 when the last count of the fleet failed (its cache not synced yet, or a read refused).",
		nil, nil)
)

// Describe implements prometheus.Collector.
func (f *FleetCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- fleetMachines
	ch <- fleetOperations
	ch <- fleetScrapeErrors
}

// Collect implements prometheus.Collector.
func (f *FleetCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	failed := 0.0
	var ms v1alpha3.MachineList
	if err := f.Reader.List(ctx, &ms); err != nil {
		failed = 1
	} else {
		type key struct{ phase, mode, agent, kube string }
		n := map[key]float64{}
		for _, m := range ms.Items {
			k := key{phase: cmp.Or(string(m.Status.Phase), "Unknown"), kube: m.Spec.Kubernetes.Version}
			if m.Status.Isolation != nil {
				k.mode = string(m.Status.Isolation.Mode)
			}
			if m.Status.Agent != nil {
				k.agent = m.Status.Agent.Version
			}
			n[k]++
		}
		for k, v := range n {
			ch <- prometheus.MustNewConstMetric(fleetMachines, prometheus.GaugeValue, v, k.phase, k.mode, k.agent, k.kube)
		}
	}
	var ops v1alpha3.MachineOperationList
	if err := f.Reader.List(ctx, &ops); err != nil {
		failed = 1
	} else {
		type key struct{ op, state, reason string }
		n := map[key]float64{}
		for _, o := range ops.Items {
			k := key{op: string(o.Spec.Operation), state: cmp.Or(string(o.Status.State), string(v1alpha3.OperationPending))}
			if o.Status.State.Finished() {
				k.reason = o.Status.Reason
			}
			n[k]++
		}
		for k, v := range n {
			ch <- prometheus.MustNewConstMetric(fleetOperations, prometheus.GaugeValue, v, k.op, k.state, k.reason)
		}
	}
	ch <- prometheus.MustNewConstMetric(fleetScrapeErrors, prometheus.GaugeValue, failed)
}
