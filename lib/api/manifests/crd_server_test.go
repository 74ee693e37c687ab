package manifests_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	api "unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/tests/kubeenv"
)

// TestServerEnforcesTheCRDSchemas sends invalid objects to the real API
// server: the schemas, not client code, must refuse them.
func TestServerEnforcesTheCRDSchemas(t *testing.T) {
	env := kubeenv.Get(t)
	admin := newCaller(t, "admin", env.RESTConfig())
	ctx := context.Background()
	post := func(resource, body string) error {
		return admin.api.Post().Resource(resource).Body([]byte(body)).SetHeader("Content-Type", "application/json").Do(ctx).Error()
	}
	for _, c := range []struct {
		what, resource, body, wantInMessage string
	}{
		{"a Machine name with a dot", "machines", `{"apiVersion":"unbounded-cloud.io/v1alpha3","kind":"Machine","metadata":{"name":"a.b"}}`, "RFC 1123 label"},
		{"an unknown isolation mode", "machines", `{"apiVersion":"unbounded-cloud.io/v1alpha3","kind":"Machine","metadata":{"name":"` + kubeenv.UniqueName(t, "m") + `"},"spec":{"isolation":{"mode":"vm"}}}`, "spec.isolation.mode"},
		{"an unknown isolation method", "machines", `{"apiVersion":"unbounded-cloud.io/v1alpha3","kind":"Machine","metadata":{"name":"` + kubeenv.UniqueName(t, "m") + `"},"spec":{"isolation":{"mode":"none","method":"Teleport"}}}`, "spec.isolation.method"},
		{"a malformed agent sha256", "machines", `{"apiVersion":"unbounded-cloud.io/v1alpha3","kind":"Machine","metadata":{"name":"` + kubeenv.UniqueName(t, "m") + `"},"spec":{"agent":{"version":"1","sha256":"xyz"}}}`, "spec.agent.sha256"},
		{"an agent URL carrying credentials", "machines", `{"apiVersion":"unbounded-cloud.io/v1alpha3","kind":"Machine","metadata":{"name":"` + kubeenv.UniqueName(t, "m") + `"},"spec":{"agent":{"version":"1","url":"https://user:pass@artifacts.example/a.deb"}}}`, "must not carry credentials"},
		// The upgrade fetches https only (lib/upgrade's fetch): an http
		// URL would be refused on every host, after the Machine took it.
		{"an http agent URL", "machines", `{"apiVersion":"unbounded-cloud.io/v1alpha3","kind":"Machine","metadata":{"name":"` + kubeenv.UniqueName(t, "m") + `"},"spec":{"agent":{"version":"1","url":"http://artifacts.example/a.deb"}}}`, "must be https://"},
		{"an agent URL without a host", "machines", `{"apiVersion":"unbounded-cloud.io/v1alpha3","kind":"Machine","metadata":{"name":"` + kubeenv.UniqueName(t, "m") + `"},"spec":{"agent":{"version":"1","url":"https:///a.deb"}}}`, "must be https://"},
		{"an agent URL of a file", "machines", `{"apiVersion":"unbounded-cloud.io/v1alpha3","kind":"Machine","metadata":{"name":"` + kubeenv.UniqueName(t, "m") + `"},"spec":{"agent":{"version":"1","url":"file:///srv/a.deb"}}}`, "must be https://"},
		{"an allocation without a name", "machines", `{"apiVersion":"unbounded-cloud.io/v1alpha3","kind":"Machine","metadata":{"name":"` + kubeenv.UniqueName(t, "m") + `"},"spec":{"allocation":{"uid":"1"}}}`, "spec.allocation.name"},
		{"an unknown operation", "machineoperations", `{"apiVersion":"unbounded-cloud.io/v1alpha3","kind":"MachineOperation","metadata":{"generateName":"x-","labels":{"unbounded-cloud.io/machine":"a"}},"spec":{"machineRef":{"name":"a"},"operation":"Explode"}}`, "spec.operation"},
		{"an operation without machineRef", "machineoperations", `{"apiVersion":"unbounded-cloud.io/v1alpha3","kind":"MachineOperation","metadata":{"generateName":"x-","labels":{"unbounded-cloud.io/machine":"a"}},"spec":{"operation":"Repave"}}`, "spec.machineRef"},
		{"an operation whose label names another machine", "machineoperations", `{"apiVersion":"unbounded-cloud.io/v1alpha3","kind":"MachineOperation","metadata":{"generateName":"x-","labels":{"unbounded-cloud.io/machine":"b"}},"spec":{"machineRef":{"name":"a"},"operation":"Repave"}}`, "unbounded-cloud.io/machine"},
	} {
		err := post(c.resource, c.body)
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), c.wantInMessage) {
			t.Errorf("%s: want 422 Invalid mentioning %q, got %v", c.what, c.wantInMessage, err)
		}
	}

	// What the daemon acts on is kept as sent (not refused, not pruned).
	for _, c := range []struct {
		what string
		spec api.MachineSpec
	}{
		{"an isolation change by reprovision", api.MachineSpec{Isolation: api.IsolationSpec{Mode: api.IsolationNone, Method: api.IsolationChangeReprovision}}},
		{"an isolation change in place", api.MachineSpec{Isolation: api.IsolationSpec{Mode: api.IsolationContainer, Method: api.IsolationChangeInPlace}}},
		{"an https agent URL", api.MachineSpec{Isolation: api.IsolationSpec{Mode: api.IsolationNspawn},
			Agent: &api.AgentSpec{Version: "1", URL: "https://artifacts.example:8443/a.deb?v=1", SHA256: strings.Repeat("a", 64)}}},
		{"an agent URL whose scheme is in capitals (url.Parse's https)", api.MachineSpec{Isolation: api.IsolationSpec{Mode: api.IsolationNspawn},
			Agent: &api.AgentSpec{Version: "1", URL: "HTTPS://artifacts.example/a.deb", SHA256: strings.Repeat("a", 64)}}},
	} {
		name := kubeenv.UniqueName(t, "m")
		got := &api.Machine{}
		err := admin.api.Post().Resource(api.ResourceMachines).Body(&api.Machine{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: c.spec}).Do(ctx).Into(got)
		if err != nil {
			t.Errorf("%s: %v", c.what, err)
			continue
		}
		t.Cleanup(func() {
			_ = admin.api.Delete().Resource(api.ResourceMachines).Name(name).Do(context.Background()).Error()
		})
		if got.Spec.Isolation != c.spec.Isolation || (c.spec.Agent != nil && (got.Spec.Agent == nil || *got.Spec.Agent != *c.spec.Agent)) {
			t.Errorf("%s: stored spec %+v, want %+v", c.what, got.Spec, c.spec)
		}
	}
}

// TestServerRefusesPhasesNothingSets: the phase enum has only the phases
// the agent sets (Repaving and Upgrading were declared once and never
// set); a status with another is refused.
func TestServerRefusesPhasesNothingSets(t *testing.T) {
	env := kubeenv.Get(t)
	admin := newCaller(t, "admin", env.RESTConfig())
	ctx := context.Background()
	name := kubeenv.UniqueName(t, "m")
	if err := admin.api.Post().Resource(api.ResourceMachines).Body(&api.Machine{ObjectMeta: metav1.ObjectMeta{Name: name}}).Do(ctx).Error(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = admin.api.Delete().Resource(api.ResourceMachines).Name(name).Do(context.Background()).Error()
	})
	phase := func(p string) error {
		return admin.api.Patch(types.MergePatchType).Resource(api.ResourceMachines).Name(name).SubResource("status").
			Body([]byte(`{"status":{"phase":"` + p + `"}}`)).Do(ctx).Error()
	}
	for _, p := range []string{"Repaving", "Upgrading"} {
		if err := phase(p); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "status.phase") {
			t.Errorf("phase %s: want 422 Invalid mentioning status.phase, got %v", p, err)
		}
	}
	for _, p := range []api.MachinePhase{api.MachinePending, api.MachineBootstrapping, api.MachineReady, api.MachineChangingIsolation, api.MachineRefused, api.MachineFailed} {
		if err := phase(string(p)); err != nil {
			t.Errorf("phase %s, which the agent sets: %v", p, err)
		}
	}
}

// TestKubectlGetShowsTheStatusColumns asks the server for the Table that
// `kubectl get machines` prints, after the status was set through the status
// subresource (which must leave the generation alone).
func TestKubectlGetShowsTheStatusColumns(t *testing.T) {
	env := kubeenv.Get(t)
	admin := newCaller(t, "admin", env.RESTConfig())
	ctx := context.Background()
	name := kubeenv.UniqueName(t, "m")
	m := &api.Machine{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       api.MachineSpec{Kubernetes: api.KubernetesSpec{Version: "1.36.3"}},
		// Dropped on create: status is written through its subresource only.
		Status: api.MachineStatus{Phase: api.MachineFailed},
	}
	created := &api.Machine{}
	if err := admin.api.Post().Resource(api.ResourceMachines).Body(m).Do(ctx).Into(created); err != nil {
		t.Fatal(err)
	}
	m = created
	t.Cleanup(func() {
		_ = admin.api.Delete().Resource(api.ResourceMachines).Name(name).Do(context.Background()).Error()
	})
	if m.Status.Phase != "" {
		t.Errorf("status set on create: %+v", m.Status)
	}
	if m.Spec.Isolation.Mode != api.IsolationNspawn {
		t.Errorf("spec.isolation.mode defaulted to %q, want nspawn", m.Spec.Isolation.Mode)
	}
	gen := m.Generation
	created = &api.Machine{}
	status := `{"status":{"phase":"Ready","agent":{"version":"0.4.1"},"isolation":{"mode":"nspawn","slot":"kube2"},"nodeName":"` + name + `"}}`
	if err := admin.api.Patch(types.MergePatchType).Resource(api.ResourceMachines).Name(name).SubResource("status").Body([]byte(status)).Do(ctx).Into(created); err != nil {
		t.Fatal(err)
	}
	if created.Generation != gen {
		t.Errorf("a status write changed the generation %d -> %d", gen, created.Generation)
	}

	table := &metav1.Table{}
	err := admin.api.Get().Resource(api.ResourceMachines).Name(name).
		SetHeader("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io").Do(ctx).Into(table)
	if err != nil {
		t.Fatal(err)
	}
	var cols []string
	for _, c := range table.ColumnDefinitions {
		if c.Priority == 0 {
			cols = append(cols, c.Name)
		}
	}
	if want := []string{"Name", "MODE", "SLOT", "PHASE", "AGENT", "AGE"}; !slices.Equal(cols, want) {
		t.Fatalf("kubectl get machines columns %v, want %v", cols, want)
	}
	if len(table.Rows) != 1 {
		t.Fatalf("%d rows", len(table.Rows))
	}
	cells := table.Rows[0].Cells
	if got := []any{cells[0], cells[1], cells[2], cells[3], cells[4]}; !slices.Equal(got, []any{name, "nspawn", "kube2", "Ready", "0.4.1"}) {
		t.Errorf("row %v", got)
	}
}
