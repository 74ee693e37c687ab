package system_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/fleet"
	"unbounded-cloud.io/agent/lib/kube"
	"unbounded-cloud.io/agent/tests/system/nodestack"
)

// TestRollingRepaveOneHostAtATimeStopsAtAFailureAndResumes: the operator's
// rolling repave (`kubectl unbounded repave -l SELECTOR`, lib/fleet.Roll,
// as the plugin runs it) over real first-booted nspawn hosts. Two hosts,
// not three: each is a booted systemd with its node machine and kubelet,
// and two prove both "one at a time" and "the rest untouched" at two
// thirds of the system tier's time for three. (1) Both hosts' configs
// name a new node image; a roll with --max-unavailable 1 repaves both:
// each Node went away and came back, never both at once (sampled every
// 200 ms), both end on the new image. (2) The first host's config names
// an image whose node never gets healthy, the second's a good one: the
// roll stops at the first host (its repave rolled back by itself, its
// Node Ready on its old slot), exits with the reason, and never touches
// the second (no operation, the same Node); (3) with the first host's
// image fixed, --resume retries it and goes on to the second: both end
// on the fixed image.
func TestRollingRepaveOneHostAtATimeStopsAtAFailureAndResumes(t *testing.T) {
	defer scenario(t)()
	hosts := []*firstBoot{newFirstBoot(t, firstBootOptions{prepared: true}), newFirstBoot(t, firstBootOptions{prepared: true})}
	// -l takes the Machines in name order.
	slices.SortFunc(hosts, func(a, b *firstBoot) int { return strings.Compare(a.name, b.name) })
	pool := "roll-" + hosts[0].name
	for _, f := range hosts {
		f.bootNode(t)
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]string{"pool": pool}}})
		if err := f.env.api.Patch(types.MergePatchType).Resource(v1alpha3.ResourceMachines).Name(f.name).Body(patch).Do(context.Background()).Error(); err != nil {
			t.Fatalf("label Machine %s: %v", f.name, err)
		}
	}
	env := hosts[0].env
	// The plugin's client: its requests counted (the roll's summary says
	// them per host per minute).
	var counter fleet.RequestCounter
	cfg := rest.CopyConfig(env.admin)
	counter.Wrap(cfg)
	api, err := kube.NewMachines(cfg)
	if err != nil {
		t.Fatal(err)
	}
	core := kubernetes.NewForConfigOrDie(cfg)
	roll := func(id string, resume bool) (string, error) {
		t.Helper()
		var out bytes.Buffer
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
		defer cancel()
		err := fleet.Roll(ctx, api, core, fleet.RollOptions{Operation: v1alpha3.OperationRepave, Selector: "pool=" + pool,
			MaxUnavailable: 1, ID: id, Resume: resume, Out: &out, Requests: counter.Count})
		t.Logf("roll %s (resume %v): %v\n%s", id, resume, err, out.String())
		return out.String(), err
	}
	// down samples the Nodes every 200 ms until stop: how often each was
	// not Ready (or absent), and how often both were at once.
	down := func(stop <-chan struct{}) (each []*atomic.Int32, both *atomic.Int32) {
		each = []*atomic.Int32{{}, {}}
		both = &atomic.Int32{}
		go func() {
			for {
				select {
				case <-stop:
					return
				case <-time.After(200 * time.Millisecond):
				}
				n := 0
				for i, f := range hosts {
					if ok, _ := f.nodeReady(context.Background()); !ok {
						each[i].Add(1)
						n++
					}
				}
				if n == len(hosts) {
					both.Add(1)
				}
			}
		}()
		return each, both
	}

	// (1) Both onto a new image, one at a time.
	var refs []string
	for _, f := range hosts {
		refs = append(refs, f.setNodeImage(t, "roll-2"))
	}
	stop := make(chan struct{})
	each, both := down(stop)
	begin := time.Now()
	out, err := roll("first", false)
	close(stop)
	if err != nil {
		t.Fatalf("roll onto roll-2: %v", err)
	}
	t.Logf("rolling repave of %d hosts: %v; samples with a Node not Ready: %d and %d, with both at once: %d",
		len(hosts), time.Since(begin).Round(time.Millisecond), each[0].Load(), each[1].Load(), both.Load())
	if !strings.Contains(out, "2 done, 0 failed") {
		t.Errorf("the roll's summary does not say both hosts are done:\n%s", out)
	}
	for i, f := range hosts {
		f.wantSlot(t, "kube2", refs[i])
		if each[i].Load() == 0 {
			t.Errorf("Node %s was never seen not Ready: was it repaved (registered afresh)?", f.name)
		}
	}
	if both.Load() != 0 {
		t.Errorf("both Nodes were not Ready at once in %d samples (every 200 ms), with --max-unavailable 1", both.Load())
	}
	if t.Failed() {
		return
	}

	// (2) The first host onto a node that never gets healthy: the roll
	// stops there, the second host is not touched.
	first, second := hosts[0], hosts[1]
	first.repaveFlags(t, "--ready-timeout="+neverHealthyReadyTimeout)
	first.setImageRef(t, first.reg.Push(t, "unbounded/node:never-healthy", nodestack.NeverHealthyNodeImage(t, first.stage.NodeImage(t))))
	good := second.setNodeImage(t, "roll-3")
	secondUID := second.nodeObject(t).UID
	out, err = roll("second", false)
	if !errors.Is(err, fleet.ErrRollFailed) || !strings.Contains(err.Error(), first.name) {
		t.Fatalf("roll onto a never-healthy image: %v, want the roll stopped at %s\n%s", err, first.name, out)
	}
	if !strings.Contains(out, "--roll second --resume") {
		t.Errorf("the roll does not say how to resume:\n%s", out)
	}
	ops, err := api.ListOperations(context.Background(), fleet.RollLabel+"=second")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, op := range ops.Items {
		got = append(got, op.Spec.MachineRef.Name+"="+string(op.Status.State))
	}
	if want := []string{first.name + "=" + string(v1alpha3.OperationFailed)}; !slices.Equal(got, want) {
		t.Errorf("the stopped roll's operations %v, want %v (the second host untouched)", got, want)
	}
	first.wantSlot(t, "kube2", refs[0])
	waitUntil(t, 3*time.Minute, "the first host's Node Ready again after its rollback", first.nodeReady)
	second.wantSlot(t, "kube2", refs[1])
	if uid := second.nodeObject(t).UID; uid != secondUID {
		t.Errorf("the second host's Node was registered afresh (%s -> %s): the stopped roll touched it", secondUID, uid)
	}
	if t.Failed() {
		return
	}

	// (3) The image fixed: --resume retries the first host and goes on.
	fixed := first.setNodeImage(t, "roll-3")
	out, err = roll("second", true)
	if err != nil {
		t.Fatalf("resume: %v", err)
	}
	if !strings.Contains(out, "2 done, 0 failed") {
		t.Errorf("the resumed roll's summary does not say both hosts are done:\n%s", out)
	}
	first.wantSlot(t, "kube1", fixed)
	second.wantSlot(t, "kube1", good)
	for _, f := range hosts {
		if ok, _ := f.nodeReady(context.Background()); !ok {
			t.Errorf("Node %s not Ready after the resumed roll", f.name)
		}
	}
}
