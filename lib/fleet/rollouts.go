package fleet

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/client-go/dynamic"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
)

// RolloutRow is one MachineRollout as `kubectl unbounded get rollouts`
// shows it.
type RolloutRow struct {
	Rollout     string    `json:"rollout"`
	Operation   string    `json:"operation"`
	Phase       string    `json:"phase"`
	Done        int32     `json:"done"`
	Total       int32     `json:"total"`
	Unavailable int32     `json:"unavailable"`
	Failed      int32     `json:"failed"`
	Next        time.Time `json:"nextActionTime,omitzero"`
	Message     string    `json:"message,omitempty"`
	Created     time.Time `json:"created"`
}

// RolloutRows reads every MachineRollout, by name.
func RolloutRows(ctx context.Context, dyn dynamic.Interface) ([]RolloutRow, error) {
	l, err := dyn.Resource(v1alpha3.SchemeGroupVersion.WithResource(v1alpha3.ResourceMachineRollouts)).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list MachineRollouts: %w", err)
	}
	var rows []RolloutRow
	for _, u := range l.Items {
		var ro v1alpha3.MachineRollout
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &ro); err != nil {
			return nil, fmt.Errorf("MachineRollout %s: %w", u.GetName(), err)
		}
		r := RolloutRow{Rollout: ro.Name, Operation: string(ro.Spec.Operation), Phase: string(ro.Status.Phase),
			Done: ro.Status.Done, Total: ro.Status.Total, Unavailable: ro.Status.Unavailable, Failed: ro.Status.Failed,
			Message: ro.Status.Message, Created: ro.CreationTimestamp.Time}
		if ro.Status.NextActionTime != nil {
			r.Next = ro.Status.NextActionTime.Time
		}
		rows = append(rows, r)
	}
	slices.SortFunc(rows, func(a, b RolloutRow) int { return strings.Compare(a.Rollout, b.Rollout) })
	return rows, nil
}

// PrintRolloutRows prints rows as a table (wide: with the message).
func PrintRolloutRows(w io.Writer, rows []RolloutRow, wide bool, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
	head := []string{"ROLLOUT", "OPERATION", "PHASE", "DONE", "UNAVAILABLE", "FAILED", "NEXT", "AGE"}
	if wide {
		head = append(head, "MESSAGE")
	}
	fmt.Fprintln(tw, strings.Join(head, "\t"))
	for _, r := range rows {
		next := "<none>"
		if !r.Next.IsZero() {
			next = "in " + duration.HumanDuration(r.Next.Sub(now))
		}
		cols := []string{r.Rollout, r.Operation, orNone(r.Phase), fmt.Sprintf("%d/%d", r.Done, r.Total), fmt.Sprint(r.Unavailable), fmt.Sprint(r.Failed),
			next, duration.HumanDuration(now.Sub(r.Created))}
		if wide {
			cols = append(cols, orNone(r.Message))
		}
		fmt.Fprintln(tw, strings.Join(cols, "\t"))
	}
	return tw.Flush()
}
