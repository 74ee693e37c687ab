package system_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/fleet"
	"unbounded-cloud.io/agent/lib/kube"
	"unbounded-cloud.io/agent/tests/kubeenv"
	"unbounded-cloud.io/agent/tests/system/nodestack"
	"unbounded-cloud.io/agent/tests/tiers"
)

// TestControllerInItsPodsApprovesTwoHostsAndRollsRepavesThatStopAndResume:
// the cluster side as a fleet runs it (unbounded-controller, issue 38),
// over real first-booted nspawn hosts, in a cluster of the test's own
// (the controller in it acts on every host and CSR of its cluster). Two
// hosts, not three: each is a booted systemd with its node machine and
// kubelet, and two prove both "one at a time" and "the rest untouched" at
// two thirds of the time of three.
//
// (0) The cluster side as a fleet runs it, with nobody approving anything
// by hand (the environment's own approver of kubelet serving certificates
// off): the first host boots; unbounded-controller is deployed from its
// own image by the shipped manifests (deployController) and runs on it;
// it approves the first host's pending CSRs (its daemon's client
// certificate, its kubelet's serving certificate); the second host joins
// and the controller approves its CSRs as they come; a pod runs on each
// host and so does a replica of the controller.
//
// (1) Both hosts' configs name a new node image; a MachineRollout (what
// `kubectl unbounded repave` creates, here with machines named, one at a
// time, a 5 s health gate) is carried out by the controller, whose own
// pods the repaves evict: each Node went away and came back, never both
// at once (sampled every 200 ms), both end on the new image, the rollout
// is Complete with both hosts done by one operation each, and two
// replicas of the controller run again. (2) The first host's config
// names an image whose node never gets healthy, the second's a good one:
// the next rollout stops at the first host (its repave rolled back by
// itself, its Node Ready on its old slot) and never touches the second
// (no operation, the same Node); (3) with the first host's image fixed
// and the rollout's spec changed, it retries the first host and goes on
// to the second: both end on the fixed image.
//
// The workstation's roll (`kubectl unbounded repave --local`, lib/fleet.Roll)
// is the kube tier's, against the real API server with played hosts
// (TestRollAgainstTheAPIServerStopsAtAFailureAndResumes and lib/fleet's
// unit tests): one host at a time, its stop at a failure and --resume.
func TestControllerInItsPodsApprovesTwoHostsAndRollsRepavesThatStopAndResume(t *testing.T) {
	defer scenario(t)()
	img := nodestack.ControllerImage(t)
	manifests := os.Getenv("UNBOUNDED_TEST_MANIFESTS")
	if manifests == "" {
		tiers.Skip(t, tiers.System, "UNBOUNDED_TEST_MANIFESTS is not set: bin/unbounded manifests > FILE; export UNBOUNDED_TEST_MANIFESTS=FILE")
	}
	env := kubeEnvOf(t, kubeenv.Private{Manifests: []string{manifests}, NoServingApprover: true}.Start(t))
	hosts := []*firstBoot{newFirstBoot(t, firstBootOptions{prepared: true, env: env}), newFirstBoot(t, firstBootOptions{prepared: true, env: env})}
	// -l takes the Machines in name order.
	slices.SortFunc(hosts, func(a, b *firstBoot) int { return strings.Compare(a.name, b.name) })
	first, second := hosts[0], hosts[1]
	ctx := context.Background()

	// (0) The first host, then the controller on it, which approves what
	// the first host asked for meanwhile; then the second host.
	first.boot(t)
	waitUntil(t, 2*time.Minute, "the first host's Node Ready", first.nodeReady)
	routeKubernetesService(t, first)
	deployController(t, first, img)
	waitControllerAvailable(t, env, 1, 3*time.Minute)
	for _, f := range hosts {
		if f == second {
			f.boot(t)
			routeKubernetesService(t, f)
		}
		f.waitAgentCertificateStored(t, 3*time.Minute, nil)
		sctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
		_, err := nodestack.ServingCert(sctx, env.kube, f.name, time.Time{})
		cancel()
		if err != nil {
			t.Fatalf("%v; the controller's pods: %s", err, controllerPods(env))
		}
		wantApprovedByController(t, f)
		f.runPod(t)
	}
	waitControllerAvailable(t, env, 2, 3*time.Minute)
	if t.Failed() {
		return
	}
	api, err := kube.NewMachines(env.admin)
	if err != nil {
		t.Fatal(err)
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

	// follow follows the MachineRollout name until it ends (15 min at
	// most), and returns what it printed and how it ended.
	dyn := dynamic.NewForConfigOrDie(env.admin)
	follow := func(name string, out *bytes.Buffer) error {
		t.Helper()
		begin := time.Now()
		fctx, cancel := context.WithTimeout(ctx, 15*time.Minute)
		defer cancel()
		err := fleet.FollowRollout(fctx, dyn, name, out)
		t.Logf("MachineRollout %s: %v (%v)\n%s", name, err, time.Since(begin).Round(time.Millisecond), out.String())
		if fctx.Err() != nil {
			t.Fatalf("MachineRollout %s did not end within 15m; the controller's pods: %s", name, controllerPods(env))
		}
		return err
	}
	// operations lists the operations of selector as machine=state.
	operations := func(selector string) []string {
		t.Helper()
		ops, err := api.ListOperations(ctx, selector)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, op := range ops.Items {
			got = append(got, op.Spec.MachineRef.Name+"="+string(op.Status.State))
		}
		slices.Sort(got)
		return got
	}
	machines := []string{first.name, second.name}

	// (1) Both onto a new image, one at a time, by a MachineRollout.
	var refs []string
	for _, f := range hosts {
		refs = append(refs, f.setNodeImage(t, "roll-2"))
	}
	ro, err := fleet.NewRollout(fleet.RollOptions{Operation: v1alpha3.OperationRepave, Machines: machines, MaxUnavailable: 1, ID: "first"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	ro.Spec.ReadySeconds = 5
	var out bytes.Buffer
	if err := fleet.CreateRollout(ctx, dyn, ro, false, &out); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	each, both := down(stop)
	begin := time.Now()
	err = follow(ro.Name, &out)
	close(stop)
	if err != nil {
		t.Fatalf("MachineRollout %s: %v; the controller's pods: %s", ro.Name, err, controllerPods(env))
	}
	t.Logf("rolling repave of %d hosts by the controller: %v; samples with a Node not Ready: %d and %d, with both at once: %d",
		len(hosts), time.Since(begin).Round(time.Millisecond), each[0].Load(), each[1].Load(), both.Load())
	var done v1alpha3.MachineRollout
	if err := env.api.Get().Resource(v1alpha3.ResourceMachineRollouts).Name(ro.Name).Do(ctx).Into(&done); err != nil {
		t.Fatal(err)
	}
	if done.Status.Phase != v1alpha3.RolloutComplete || done.Status.Done != 2 || done.Status.Failed != 0 {
		t.Errorf("MachineRollout %s: phase %s, %d done, %d failed; want Complete, 2 done, 0 failed", ro.Name, done.Status.Phase, done.Status.Done, done.Status.Failed)
	}
	if got, want := operations(v1alpha3.RolloutLabel+"="+ro.Name), []string{first.name + "=" + string(v1alpha3.OperationComplete), second.name + "=" + string(v1alpha3.OperationComplete)}; !slices.Equal(got, want) {
		t.Errorf("the rollout's operations %v, want %v", got, want)
	}
	for i, f := range hosts {
		f.wantSlot(t, "kube2", refs[i])
		if each[i].Load() == 0 {
			t.Errorf("Node %s was never seen not Ready: was it repaved (registered afresh)?", f.name)
		}
	}
	if both.Load() != 0 {
		t.Errorf("both Nodes were not Ready at once in %d samples (every 200 ms), with maxUnavailable 1", both.Load())
	}
	waitControllerAvailable(t, env, 2, 3*time.Minute)
	if t.Failed() {
		return
	}

	// (2) The first host onto a node that never gets healthy: the
	// rollout stops there, the second host is not touched.
	first.repaveFlags(t, "--ready-timeout="+neverHealthyReadyTimeout)
	first.setImageRef(t, first.reg.Push(t, "unbounded/node:never-healthy", nodestack.NeverHealthyNodeImage(t, first.stage.NodeImage(t))))
	good := second.setNodeImage(t, "roll-3")
	secondUID := second.nodeObject(t).UID
	ro, err = fleet.NewRollout(fleet.RollOptions{Operation: v1alpha3.OperationRepave, Machines: machines, MaxUnavailable: 1, ID: "second"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	ro.Spec.ReadySeconds = 5
	out.Reset()
	if err := fleet.CreateRollout(ctx, dyn, ro, false, &out); err != nil {
		t.Fatal(err)
	}
	if err := follow(ro.Name, &out); !errors.Is(err, fleet.ErrRolloutStopped) || !strings.Contains(err.Error()+out.String(), first.name) {
		t.Fatalf("MachineRollout %s onto a never-healthy image: %v, want it stopped at %s", ro.Name, err, first.name)
	}
	if got, want := operations(v1alpha3.RolloutLabel+"="+ro.Name), []string{first.name + "=" + string(v1alpha3.OperationFailed)}; !slices.Equal(got, want) {
		t.Errorf("the stopped rollout's operations %v, want %v (the second host untouched)", got, want)
	}
	first.wantSlot(t, "kube2", refs[0])
	waitUntil(t, 3*time.Minute, "the first host's Node Ready again after its rollback", first.nodeReady)
	second.wantSlot(t, "kube2", refs[1])
	if uid := second.nodeObject(t).UID; uid != secondUID {
		t.Errorf("the second host's Node was registered afresh (%s -> %s): the stopped rollout touched it", secondUID, uid)
	}
	if t.Failed() {
		return
	}

	// (3) The image fixed, and the rollout's spec changed (any change, a
	// new generation: here its health gate): it retries the first host
	// and goes on to the second.
	fixed := first.setNodeImage(t, "roll-3")
	patch := []byte(`{"spec":{"readySeconds":6}}`)
	var changed v1alpha3.MachineRollout
	if err := env.api.Patch(types.MergePatchType).Resource(v1alpha3.ResourceMachineRollouts).Name(ro.Name).Body(patch).Do(ctx).Into(&changed); err != nil {
		t.Fatal(err)
	}
	// Followed once the controller acted on the new generation (before,
	// its status still says Stopped).
	waitUntil(t, 2*time.Minute, "the rollout's new spec seen by the controller", func(ctx context.Context) (bool, error) {
		var now v1alpha3.MachineRollout
		err := env.api.Get().Resource(v1alpha3.ResourceMachineRollouts).Name(ro.Name).Do(ctx).Into(&now)
		return err == nil && now.Status.ObservedGeneration >= changed.Generation, nil
	})
	out.Reset()
	if err := follow(ro.Name, &out); err != nil {
		t.Fatalf("MachineRollout %s after its spec changed: %v, want it Complete", ro.Name, err)
	}
	first.wantSlot(t, "kube1", fixed)
	second.wantSlot(t, "kube1", good)
	for _, f := range hosts {
		if ok, _ := f.nodeReady(ctx); !ok {
			t.Errorf("Node %s not Ready after the resumed rollout", f.name)
		}
	}
}
