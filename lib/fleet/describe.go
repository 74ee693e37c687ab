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
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/client-go/kubernetes"

	"unbounded-cloud.io/agent/lib/kube"
)

// Recent bounds describe's lists of operations and Events.
const Recent = 10

// Describe writes what an operator asks about one machine: its state, its
// conditions (the recovery reports among them), its recent operations and
// the Events about it.
func Describe(ctx context.Context, w io.Writer, machines *kube.Machines, core kubernetes.Interface, name string, now time.Time) error {
	m, err := machines.Get(ctx, name)
	if err != nil {
		return fmt.Errorf("read the Machine %s: %w", name, err)
	}
	or := func(s string) string {
		if s == "" {
			return "<none>"
		}
		return s
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(k, v string) { fmt.Fprintf(tw, "%s:\t%s\n", k, v) }
	row("Name", m.Name)
	row("Phase", or(string(m.Status.Phase)))
	mode, slot := "", ""
	if m.Status.Isolation != nil {
		mode, slot = string(m.Status.Isolation.Mode), string(m.Status.Isolation.Slot)
	}
	row("Mode", or(mode))
	row("Slot", or(slot))
	row("Kubernetes", or(m.Spec.Kubernetes.Version))
	agent := ""
	if m.Status.Agent != nil {
		agent = m.Status.Agent.Version
	}
	row("Agent", or(agent))
	row("Node", or(m.Status.NodeName))
	if a := m.Spec.Allocation; a != nil {
		row("Allocation", fmt.Sprintf("%s (uid %s, fenced %v)", or(a.Name), or(a.UID), a.Fenced))
	}
	row("Age", duration.HumanDuration(now.Sub(m.CreationTimestamp.Time)))
	tw.Flush()

	fmt.Fprintln(w, "\nConditions:")
	if len(m.Status.Conditions) == 0 {
		fmt.Fprintln(w, "  <none>")
	} else {
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  TYPE\tSTATUS\tREASON\tAGE\tMESSAGE")
		for _, c := range m.Status.Conditions {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", c.Type, c.Status, or(c.Reason), duration.HumanDuration(now.Sub(c.LastTransitionTime.Time)), oneLine(c.Message))
		}
		tw.Flush()
	}

	ops, err := machines.Operations(ctx, name)
	if err != nil {
		return fmt.Errorf("MachineOperations of %s: %w", name, err)
	}
	items := ops.Items
	sort.Slice(items, func(i, j int) bool { return items[j].CreationTimestamp.Before(&items[i].CreationTimestamp) })
	fmt.Fprintln(w, "\nRecent operations:")
	if len(items) == 0 {
		fmt.Fprintln(w, "  <none>")
	} else {
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  NAME\tOPERATION\tSTATE\tREASON\tAGE\tMESSAGE")
		for _, op := range items[:min(len(items), Recent)] {
			st := string(op.Status.State)
			if st == "" {
				st = "Pending"
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\n", op.Name, op.Spec.Operation, st, or(op.Status.Reason), duration.HumanDuration(now.Sub(op.CreationTimestamp.Time)), oneLine(op.Status.Message))
		}
		tw.Flush()
	}

	evs, err := core.CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{
		FieldSelector: fields.AndSelectors(fields.OneTermEqualSelector("involvedObject.kind", "Machine"), fields.OneTermEqualSelector("involvedObject.name", name)).String(),
	})
	if err != nil {
		return fmt.Errorf("list the Events of %s: %w", name, err)
	}
	ev := evs.Items
	sort.Slice(ev, func(i, j int) bool { return ev[j].LastTimestamp.Before(&ev[i].LastTimestamp) })
	fmt.Fprintln(w, "\nEvents:")
	if len(ev) == 0 {
		fmt.Fprintln(w, "  <none>")
		return nil
	}
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  TYPE\tREASON\tAGE\tFROM\tMESSAGE")
	for _, e := range ev[:min(len(ev), Recent)] {
		at := e.LastTimestamp.Time
		if at.IsZero() {
			at = e.EventTime.Time
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", e.Type, e.Reason, duration.HumanDuration(now.Sub(at)), or(e.Source.Component), oneLine(e.Message))
	}
	return tw.Flush()
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
