package fleet

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/util/retry"

	"unbounded-cloud.io/agent/lib/api/identity"
	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/kube"
	"unbounded-cloud.io/agent/tests/kubeenv"
)

// Against the real API server with the agent's manifests: join's token
// authenticates in the machine's bootstrap group until it is revoked;
// the fleet table and describe show what the API server holds.
func TestJoinGetAndDescribeAgainstTheAPIServer(t *testing.T) {
	env := kubeenv.Get(t)
	ctx := context.Background()
	c := env.Client()
	if err := CheckInstalled(ctx, c.Discovery(), c); err != nil {
		t.Fatalf("the test cluster has the manifests: %v", err)
	}
	name := kubeenv.UniqueName(t, "join")
	o := JoinOptions{Machine: name, TTL: time.Hour, Mode: "none", APIServer: env.Host(), KubernetesVersion: "1.36.3", CA: env.CAPEM(t)}
	j, err := Join(ctx, c, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Revoke(context.Background(), c, name) })
	var ok bool
	var groups []string
	for range 40 { // the authenticator's Secret informer catches up
		if ok, _, groups, err = env.TokenAuthenticated(ctx, j.Token); ok {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	if !ok || !slices.Contains(groups, identity.BootstrapGroup(name)) || !slices.Contains(groups, identity.BootstrapAgentsGroup) {
		t.Fatalf("join's token: authenticated %v (%v), groups %v", ok, err, groups)
	}
	if n, err := Revoke(ctx, c, name); err != nil || n != 1 {
		t.Fatalf("revoke: %d %v", n, err)
	}
	for range 40 {
		if ok, _, _, _ = env.TokenAuthenticated(ctx, j.Token); !ok {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	if ok {
		t.Error("a revoked token still authenticates")
	}

	// The fleet: a Machine with status, its Node Ready, an operation.
	m, err := kube.NewMachines(env.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	mc, err := m.Create(ctx, &v1alpha3.Machine{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1alpha3.MachineSpec{Kubernetes: v1alpha3.KubernetesSpec{Version: "1.36.3"}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		env.Dynamic().Resource(v1alpha3.SchemeGroupVersion.WithResource(v1alpha3.ResourceMachines)).Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	mc.Status.Phase = v1alpha3.MachineReady
	mc.Status.Isolation = &v1alpha3.IsolationStatus{Mode: "nspawn", Slot: "kube2"}
	mc.Status.Agent = &v1alpha3.AgentStatus{Version: "0.1.0"}
	mc.Status.NodeName = name
	mc.Status.Conditions = []metav1.Condition{{Type: "Bootstrapped", Status: metav1.ConditionTrue, Reason: "Succeeded", Message: "node up", LastTransitionTime: metav1.Now()}}
	if _, err := m.UpdateStatus(ctx, mc); err != nil {
		t.Fatal(err)
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if _, err = c.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
	// The control plane's node controllers write a new Node too (taints,
	// its lease's owner): the status goes on the latest version.
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		node, err := c.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		node.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
		_, err = c.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	op := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha3.SchemeGroupVersion.String(), "kind": "MachineOperation",
		"metadata": map[string]any{"name": name + "-repave", "labels": map[string]any{v1alpha3.MachineLabel: name}},
		"spec":     map[string]any{"machineRef": map[string]any{"name": name}, "operation": string(v1alpha3.OperationRepave)},
	}}
	opsRes := env.Dynamic().Resource(v1alpha3.SchemeGroupVersion.WithResource(v1alpha3.ResourceMachineOperations))
	if _, err := opsRes.Create(ctx, op, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { opsRes.Delete(context.Background(), name+"-repave", metav1.DeleteOptions{}) })

	rows, err := Rows(ctx, m, c)
	if err != nil {
		t.Fatal(err)
	}
	var row *Row
	for i := range rows {
		if rows[i].Machine == name {
			row = &rows[i]
		}
	}
	want := Row{Machine: name, Phase: "Ready", Mode: "nspawn", Slot: "kube2", Kubernetes: "1.36.3", Agent: "0.1.0", NodeReady: "True", LastOp: "Repave", LastResult: "Pending"}
	if row == nil {
		t.Fatalf("%s not in the table: %+v", name, rows)
	}
	got := *row
	got.Created = time.Time{}
	if got != want {
		t.Errorf("row:\n %+v\nwant\n %+v", got, want)
	}
	var out bytes.Buffer
	if err := PrintRows(&out, rows, true, time.Now()); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out.String(), "MACHINE ") || !strings.Contains(out.String(), name) || !strings.Contains(out.String(), "REASON") {
		t.Errorf("table:\n%s", out.String())
	}
	if b, err := json.Marshal(rows); err != nil || !json.Valid(b) {
		t.Errorf("json: %v", err)
	}
	out.Reset()
	if err := Describe(ctx, &out, m, c, name, time.Now()); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"Phase:", "Ready", "Bootstrapped", "node up", name + "-repave", "Repave", "Events:"} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("describe lacks %q:\n%s", s, out.String())
		}
	}
	if err := Describe(ctx, &out, m, c, name+"-missing", time.Now()); err == nil {
		t.Error("describe of a missing machine")
	}
}
