package fleet

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/tests/kubeenv"
)

// `kubectl unbounded get rollouts` against the real API server (the
// agent's CRDs): a rollout and the status its controller wrote, as rows
// and as the table.
func TestGetRolloutsShowsTheirProgress(t *testing.T) {
	env := kubeenv.Get(t)
	ctx := context.Background()
	name := kubeenv.UniqueName(t, "ro")
	res := env.Dynamic().Resource(v1alpha3.SchemeGroupVersion.WithResource(v1alpha3.ResourceMachineRollouts))
	ro := &v1alpha3.MachineRollout{TypeMeta: metav1.TypeMeta{APIVersion: v1alpha3.SchemeGroupVersion.String(), Kind: "MachineRollout"},
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       v1alpha3.MachineRolloutSpec{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"pool": name}}, Operation: v1alpha3.OperationRepave}}
	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(ro)
	if err != nil {
		t.Fatal(err)
	}
	created, err := res.Create(ctx, &unstructured.Unstructured{Object: u}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { res.Delete(context.Background(), name, metav1.DeleteOptions{}) })
	next := time.Now().Add(90 * time.Second).Truncate(time.Second)
	unstructured.SetNestedMap(created.Object, map[string]any{
		"phase": "Progressing", "total": int64(3), "done": int64(1), "unavailable": int64(1), "failed": int64(0),
		"message": "1 done, 1 unavailable, 0 failed, 1 waiting", "nextActionTime": next.UTC().Format(time.RFC3339),
	}, "status")
	if _, err := res.UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	rows, err := RolloutRows(ctx, env.Dynamic())
	if err != nil {
		t.Fatal(err)
	}
	var got *RolloutRow
	for i := range rows {
		if rows[i].Rollout == name {
			got = &rows[i]
		}
	}
	if got == nil || got.Operation != "Repave" || got.Phase != "Progressing" || got.Done != 1 || got.Total != 3 || got.Unavailable != 1 || !got.Next.Equal(next) {
		t.Fatalf("rows %+v", rows)
	}
	var out bytes.Buffer
	if err := PrintRolloutRows(&out, []RolloutRow{*got}, true, next.Add(-60*time.Second)); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "ROLLOUT") || !strings.Contains(lines[1], name) ||
		!strings.Contains(lines[1], "1/3") || !strings.Contains(lines[1], "in 60s") || !strings.Contains(lines[1], "1 waiting") {
		t.Errorf("table:\n%s", out.String())
	}
}
