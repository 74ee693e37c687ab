package fleet

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/tests/fixtures"
	"unbounded-cloud.io/agent/tests/kubeenv"
)

// `kubectl unbounded repave M1 M2` without --local against the real API
// server: the MachineRollout it creates names the hosts in their order,
// a dry run creates nothing, and the follower prints each host's move and
// ends with the rollout (Complete: nil; Stopped: ErrRolloutStopped). The
// test writes the status as unbounded-controller would.
func TestRepaveCreatesAMachineRolloutAndFollowsItToItsEnd(t *testing.T) {
	env := kubeenv.Get(t)
	ctx := context.Background()
	id := kubeenv.UniqueName(t, "rs")
	res := env.Dynamic().Resource(rollouts)
	o := RollOptions{Operation: v1alpha3.OperationRepave, Machines: []string{id + "-b", id + "-a"}, MaxUnavailable: 1, ID: id}

	ro, err := NewRollout(o, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	var out fixtures.Buffer
	if err := CreateRollout(ctx, env.Dynamic(), ro, true, &out); err != nil {
		t.Fatal(err)
	}
	if _, err := res.Get(ctx, ro.Name, metav1.GetOptions{}); err == nil {
		t.Fatalf("a dry run created MachineRollout %s", ro.Name)
	}
	if err := CreateRollout(ctx, env.Dynamic(), ro, false, &out); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { res.Delete(context.Background(), ro.Name, metav1.DeleteOptions{}) })
	got, err := res.Get(ctx, ro.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	machines, _, _ := unstructured.NestedStringSlice(got.Object, "spec", "machines")
	if ro.Name != "repave-"+id || strings.Join(machines, ",") != id+"-b,"+id+"-a" {
		t.Fatalf("created %s with machines %v", got.GetName(), machines)
	}

	// The controller's part, played: the first host moves, then both are
	// done.
	setStatus := func(status map[string]any) {
		t.Helper()
		u, err := res.Get(ctx, ro.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		unstructured.SetNestedField(u.Object, status, "status")
		if _, err := res.UpdateStatus(ctx, u, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	host := func(name, state string) map[string]any {
		return map[string]any{"name": name, "state": state, "operation": name + "-" + ro.Name}
	}
	done := make(chan error, 1)
	go func() { done <- FollowRollout(ctx, env.Dynamic(), ro.Name, &out) }()
	waitOutput(t, &out, ro.Name+": not started")
	setStatus(map[string]any{"phase": "Progressing", "total": int64(2), "done": int64(0), "failed": int64(0),
		"hosts": []any{host(id+"-b", "InProgress"), map[string]any{"name": id + "-a", "state": "Pending"}}})
	waitOutput(t, &out, id+"-b: InProgress")
	setStatus(map[string]any{"phase": "Complete", "total": int64(2), "done": int64(2), "failed": int64(0), "message": "2 done",
		"hosts": []any{host(id+"-b", "Done"), host(id+"-a", "Done")}})
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("follow of a complete rollout: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatalf("the follower did not end with the rollout:\n%s", out.String())
	}
	text := out.String()
	for _, want := range []string{"MachineRollout " + ro.Name + " created", id + "-b: Done", id + "-a: Done", "Complete, 2/2 done"} {
		if !strings.Contains(text, want) {
			t.Errorf("output lacks %q:\n%s", want, text)
		}
	}
	if strings.Index(text, id+"-b: InProgress") > strings.Index(text, id+"-b: Done") {
		t.Errorf("the hosts' moves out of order:\n%s", text)
	}

	// A stopped rollout ends the follower with ErrRolloutStopped.
	setStatus(map[string]any{"phase": "Stopped", "total": int64(2), "done": int64(1), "failed": int64(1), "message": "1 failed: failureThreshold 1 reached",
		"hosts": []any{host(id+"-b", "Done"), host(id+"-a", "Failed")}})
	if err := FollowRollout(ctx, env.Dynamic(), ro.Name, &out); !errors.Is(err, ErrRolloutStopped) || !strings.Contains(err.Error(), "failureThreshold") {
		t.Errorf("follow of a stopped rollout: %v, want ErrRolloutStopped with its message", err)
	}
}

func waitOutput(t *testing.T, out *fixtures.Buffer, want string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(out.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("no %q in the follower's output within 30s:\n%s", want, out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// What the cluster's rollout cannot do is refused before any request,
// saying what to do instead; the selector and the budget are carried.
func TestNewRolloutCarriesTheRollAndRefusesWhatOnlyALocalRollHas(t *testing.T) {
	ro, err := NewRollout(RollOptions{Operation: v1alpha3.OperationRestart, Selector: "pool=edge,zone!=b", MaxUnavailable: 3}, time.Date(2026, 12, 7, 10, 4, 5, 0, time.UTC))
	if err != nil {
		t.Fatal(err)
	}
	if ro.Name != "restart-20261207-100405" || ro.Spec.MaxUnavailable.IntValue() != 3 || ro.Spec.Machines != nil ||
		metav1.FormatLabelSelector(ro.Spec.Selector) != "pool=edge,zone notin (b)" {
		t.Errorf("rollout %s: %+v", ro.Name, ro.Spec)
	}
	up, err := NewRollout(RollOptions{Operation: v1alpha3.OperationAgentUpgrade, Machines: []string{"w1"}, MaxUnavailable: 1,
		Version: "0.2.0", URL: "https://a.example.internal/p.deb", SHA256: strings.Repeat("AB", 32)}, time.Now())
	if err != nil || up.Spec.Parameters["sha256"] != strings.Repeat("ab", 32) || up.Spec.Parameters["version"] != "0.2.0" {
		t.Errorf("upgrade rollout: %v %+v", err, up)
	}
	for what, o := range map[string]RollOptions{
		"--resume":        {Operation: v1alpha3.OperationRepave, Machines: []string{"w1"}, MaxUnavailable: 1, ID: "r1", Resume: true},
		"--ready-timeout": {Operation: v1alpha3.OperationRepave, Machines: []string{"w1"}, MaxUnavailable: 1, ReadyTimeout: time.Minute},
		"both ways":       {Operation: v1alpha3.OperationRepave, Machines: []string{"w1"}, Selector: "a=b", MaxUnavailable: 1},
		"-l a>1":          {Operation: v1alpha3.OperationRepave, Selector: "a>1", MaxUnavailable: 1},
	} {
		if _, err := NewRollout(o, time.Now()); err == nil {
			t.Errorf("%s: a rollout made, want refused", what)
		}
	}
}
