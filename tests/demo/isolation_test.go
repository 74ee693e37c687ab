//go:build demo

package demo_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/tests/system/nodestack"
)

// isolationChange is the demo's optional last act
// (UNBOUNDED_DEMO_ISOLATION=MODE): the Machine's spec.isolation.mode is
// changed as a fleet operator does (`kubectl patch machine`); the
// daemon starts unbounded-isolation.service, which moves the node into
// the other mode in place. The demo prints the Machine's
// status.isolationChange as it goes, the change's steps from its journal,
// the downtime as the cluster saw it (Node not Ready or absent -> Ready)
// and the pod Running again.
func (d *repaveDemo) isolationChange(t *testing.T, ctx context.Context, machines dynamic.NamespaceableResourceInterface, from, to string) {
	t.Helper()
	d.o.step("isolation change: $ kubectl patch machine %s --type merge -p '{\"spec\":{\"isolation\":{\"mode\":%q}}}'", d.name, to)
	begin := time.Now()
	patch := fmt.Sprintf(`{"spec":{"isolation":{"mode":%q}}}`, to)
	if _, err := machines.Patch(ctx, d.name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatalf("patch Machine %s: %v", d.name, err)
	}
	// The downtime as the cluster sees it, polled every 100 ms; none
	// when the Node was never seen otherwise than Ready (a kubelet away
	// for less than the node monitor's grace period).
	var down, up time.Time
	var last string
	waitUntil(t, ctx, 15*time.Minute, "the isolation change Succeeded and the Node Ready", func(ctx context.Context) (bool, error) {
		ready, _ := nodestack.NodeReady(ctx, d.kube, d.name)
		if !ready && down.IsZero() {
			down = time.Now()
		} else if ready && !down.IsZero() && up.IsZero() {
			up = time.Now()
		}
		u, err := machines.Get(ctx, d.name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		var m v1alpha3.Machine
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.UnstructuredContent(), &m); err != nil {
			return false, nil
		}
		c := m.Status.IsolationChange
		if c == nil {
			return false, nil
		}
		if now := fmt.Sprintf("%s %s -> %s (%s): %s", c.State, c.From, c.To, c.Method, c.Message); now != last {
			last = now
			d.o.say("Machine status.isolationChange: %s", now)
		}
		if c.State == v1alpha3.IsolationChangeFailed && c.To == v1alpha3.IsolationMode(to) {
			t.Fatalf("the isolation change failed: %s", c.Message)
		}
		return c.State == v1alpha3.IsolationChangeSucceeded && c.To == v1alpha3.IsolationMode(to) && (!up.IsZero() || (down.IsZero() && ready)), nil
	})
	for _, l := range d.journal(t, "unbounded-isolation.service", begin) {
		if l.at.Before(begin) {
			continue
		}
		for _, key := range []string{"step ", "isolation change planned", "new node started", "node stack switched", "slot destroyed", "isolation changed"} {
			if strings.Contains(l.msg, key) {
				d.o.say("  %s  %s", l.at.Format("15:04:05.000"), l.msg)
				break
			}
		}
	}
	d.o.say("isolation change %s -> %s done in %s after the patch; Node not Ready or absent for %s", from, to, took(time.Since(begin)), took(up.Sub(down)))
	pod := d.podBack(t, ctx)
	d.o.say("pod %s Running again on %s with IP %s", pod.Name, d.name, pod.Status.PodIP)
	st, err := d.m.Run("unbounded", "status")
	if err != nil {
		t.Fatalf("unbounded status: %v\n%s", err, st)
	}
	d.o.say("$ unbounded status")
	d.o.block(st)
}
