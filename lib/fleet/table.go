package fleet

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/client-go/kubernetes"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/kube"
)

// Row is one machine of the fleet table.
type Row struct {
	Machine    string    `json:"machine"`
	Phase      string    `json:"phase"`
	Mode       string    `json:"mode"`
	Slot       string    `json:"slot"`
	Kubernetes string    `json:"kubernetes"`
	Agent      string    `json:"agent"`
	NodeReady  string    `json:"nodeReady"`
	LastOp     string    `json:"lastOperation"`
	LastResult string    `json:"lastResult"`
	LastReason string    `json:"lastReason,omitempty"`
	Created    time.Time `json:"created"`
}

// Rows reads the fleet: every Machine, its Node's Ready condition and its
// latest MachineOperation, sorted by name.
func Rows(ctx context.Context, machines *kube.Machines, core kubernetes.Interface) ([]Row, error) {
	ml, err := machines.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("list Machines: %w", err)
	}
	ops, err := machines.Operations(ctx, "")
	if err != nil {
		return nil, fmt.Errorf("list MachineOperations: %w", err)
	}
	latest := map[string]*v1alpha3.MachineOperation{}
	for i := range ops.Items {
		op := &ops.Items[i]
		m := op.Spec.MachineRef.Name
		if cur := latest[m]; cur == nil || cur.CreationTimestamp.Before(&op.CreationTimestamp) {
			latest[m] = op
		}
	}
	nodes, err := core.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list Nodes: %w", err)
	}
	ready := map[string]string{}
	for _, n := range nodes.Items {
		ready[n.Name] = "Unknown"
		if st := kube.Readiness(&n).Status; st != "" {
			ready[n.Name] = st
		}
	}
	var rows []Row
	for _, m := range ml.Items {
		r := Row{Machine: m.Name, Phase: string(m.Status.Phase), Kubernetes: m.Spec.Kubernetes.Version, Created: m.CreationTimestamp.Time, NodeReady: "<none>"}
		if m.Status.Isolation != nil {
			r.Mode, r.Slot = string(m.Status.Isolation.Mode), string(m.Status.Isolation.Slot)
		}
		if m.Status.Agent != nil {
			r.Agent = m.Status.Agent.Version
		}
		node := m.Status.NodeName
		if node == "" {
			node = m.Name
		}
		if st, ok := ready[node]; ok {
			r.NodeReady = st
		}
		if op := latest[m.Name]; op != nil {
			r.LastOp, r.LastResult, r.LastReason = string(op.Spec.Operation), string(op.Status.State), op.Status.Reason
			if r.LastResult == "" {
				r.LastResult = "Pending"
			}
		}
		rows = append(rows, r)
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].Machine < rows[j].Machine })
	return rows, nil
}

// PrintRows writes rows as kubectl prints a table: upper-case headers,
// "<none>" for what is unknown; wide adds the last operation's reason.
func PrintRows(w io.Writer, rows []Row, wide bool, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
	head := []string{"MACHINE", "PHASE", "MODE", "SLOT", "KUBERNETES", "AGENT", "NODE READY", "LAST OPERATION", "RESULT", "AGE"}
	if wide {
		head = append(head, "REASON")
	}
	fmt.Fprintln(tw, strings.Join(head, "\t"))
	or := func(s string) string {
		if s == "" {
			return "<none>"
		}
		return s
	}
	for _, r := range rows {
		cols := []string{r.Machine, or(r.Phase), or(r.Mode), or(r.Slot), or(r.Kubernetes), or(r.Agent), r.NodeReady, or(r.LastOp), or(r.LastResult),
			duration.HumanDuration(now.Sub(r.Created))}
		if wide {
			cols = append(cols, or(r.LastReason))
		}
		fmt.Fprintln(tw, strings.Join(cols, "\t"))
	}
	return tw.Flush()
}
