package kube_test

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/kube"
	"unbounded-cloud.io/agent/lib/kube/clustertest"
	"unbounded-cloud.io/agent/tests/kubeenv"
)

// The Machine status writes and the Events of the host's operations
// (bootstrap's report, the fence's, recovery's) follow the drain's rule
// (kube.Retry): a request that gets no answer is tried again within the
// caller's deadline; an answer that is not transient ends it at once.
func TestMachineStatusAndEventWritesRideOutAnAPIServerThatDoesNotAnswer(t *testing.T) {
	env := clustertest.Get(t)
	name := kubeenv.UniqueName(t, "wr")
	m := &v1alpha3.Machine{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if _, err := env.Machines(t).Create(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { env.DeleteMachine(name) })
	status := "/apis/" + v1alpha3.SchemeGroupVersion.Group + "/" + v1alpha3.SchemeGroupVersion.Version + "/machines/" + name
	calls := &apiCalls{plan: map[string][]fault{
		"GET " + status:                          {refused, unavailable},
		"PUT " + status + "/status":              {refused, throttled},
		"POST /api/v1/namespaces/default/events": {refused, unavailable},
	}}
	cfg := env.Env.RESTConfig()
	cfg.Wrap(calls.wrap)
	ms, err := kube.NewMachines(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := ms.MutateStatus(ctx, name, func(m *v1alpha3.Machine) bool {
		m.Status.Phase = v1alpha3.MachineReady
		return true
	})
	if err != nil || out.Status.Phase != v1alpha3.MachineReady {
		t.Fatalf("MutateStatus through refused, 503 and 429 answers: %v", err)
	}
	if n := calls.count("PUT " + status + "/status"); n != 3 {
		t.Errorf("%d status writes, want 3 (two without an answer, then the write)", n)
	}
	ev := kube.MachineEvent(name, out.UID, "unbounded-test", corev1.EventTypeNormal, "Tested", "retried", time.Now())
	if err := kube.PostEvent(ctx, cfg, ev); err != nil {
		t.Fatalf("PostEvent through refused and 503 answers: %v", err)
	}

	// An answer (403) is final: one request, at once.
	calls.plan = map[string][]fault{"GET " + status: {forbidden}}
	before := calls.count("GET " + status)
	if _, err := ms.MutateStatus(ctx, name, func(*v1alpha3.Machine) bool { return true }); err == nil {
		t.Fatal("MutateStatus after a 403: no error")
	}
	if n := calls.count("GET "+status) - before; n != 1 {
		t.Errorf("%d reads after a 403, want 1", n)
	}

	// No answer at all: it ends at the caller's deadline.
	calls.down = true
	short, cancel2 := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel2()
	begin := time.Now()
	if _, err := ms.MutateStatus(short, name, func(*v1alpha3.Machine) bool { return true }); err == nil || !kube.NoAnswer(err) {
		t.Fatalf("MutateStatus with the API server down: %v, want no answer", err)
	}
	if took := time.Since(begin); took > 6*time.Second {
		t.Errorf("the retries took %v past a 3 s deadline", took)
	}
}
