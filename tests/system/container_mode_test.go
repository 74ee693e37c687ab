package system_test

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/uuid"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/modes/container"
	"unbounded-cloud.io/agent/lib/modes/container/bundle"
	"unbounded-cloud.io/agent/tests/system/nodestack"
)

// TestContainerModeFirstBootRestartRepaveRollbackRebootAndReset: the
// container isolation mode end to end on one test host (real systemd,
// the real kubelet, containerd, runc and CNI in the container, the real
// control plane), each step from the state the last left, as an operator
// meets them:
//
//  1. first boot in mode container, bootstrap killed at each of its crash
//     points in turn (one resumed by a reboot), then converging: a Ready
//     Node running a Deployment's pod, its node stack in the OCI bundle of
//     slot kube1, run by unbounded-container@kube1.service
//     (systemd-nspawn --oci-bundle);
//  2. a restart (unbounded-restart.service) reboots only the container,
//     which gets the device that appeared on the host meanwhile;
//  3. a repave kube1 -> kube2 killed at each of its crash points in turn,
//     then converging, the pod back on the new node;
//  4. a forced repave onto a node image that never gets healthy rolls
//     back to kube2;
//  5. a reboot of the host while the cluster fences the allocation: the
//     fence refuses (77) and no container starts; unfenced, the node
//     comes back behind the fence, no second bootstrap;
//  6. `unbounded reset --yes` leaves the host's root as it was before
//     the first boot.
func TestContainerModeFirstBootRestartRepaveRollbackRebootAndReset(t *testing.T) {
	defer scenario(t)()
	uid := string(uuid.NewUUID())
	f := newFirstBoot(t, firstBootOptions{mode: "container", extra: fmt.Sprintf("\n[allocation]\nuid = %q\n", uid)})
	logJournalsOnFailure(t, f)
	before := rootManifest(t, f.m.Root())
	config, err := f.m.ReadFile("/etc/unbounded/agent.toml")
	if err != nil {
		t.Fatal(err)
	}
	// The cluster's side of the allocation, not fenced yet.
	setAllocationFenced(t, f, uid, false)

	// 1. First boot, killed at every crash point on the way.
	crashBootstrapAtEveryPoint(t, f)
	f.waitAgentCertificate(t)
	ns := f.runPod(t)
	f.wantBootstrapped(t, "container", container.Unit("kube1"))
	wantOneSlot(t, f)
	wantFencedUnit(t, f.m, "unbounded-mode-container.target", container.Unit("kube1"))
	pod := f.waitPodRunning(t, ns, 2*time.Minute)
	if out, err := f.m.Run("unbounded", "supports-isolation", "container"); err != nil {
		t.Errorf("unbounded supports-isolation container: %v\n%s", err, out)
	}
	// The node is the bundle's container: nspawn runs config.json, and the
	// machine registered under the slot's name is the container.
	if out, err := f.m.Run("machinectl", "show", "kube1", "-p", "Unit", "--value"); err != nil || strings.TrimSpace(out) != container.Unit("kube1") {
		t.Errorf("machine kube1's unit: %q (%v), want %s", out, err, container.Unit("kube1"))
	}
	if s := isActive(f.m, "systemd-nspawn@kube1.service"); s == "active" {
		t.Errorf("systemd-nspawn@kube1.service is %s in mode container", s)
	}
	data, err := f.m.ReadFile(f.paths.Rel(filepath.Join(bundle.Dir(f.paths, "kube1"), bundle.ConfigFile)))
	var spec specs.Spec
	if err != nil || json.Unmarshal(data, &spec) != nil || spec.Hostname != f.name {
		t.Errorf("the bundle's config.json (%v): hostname %q, want %s", err, spec.Hostname, f.name)
	}
	if out, err := f.m.Run("systemd-run", "-M", "kube1", "--wait", "--pipe", "-q", "systemctl", "is-active", "containerd.service", "kubelet.service", "node-local-dns.service"); err != nil {
		t.Errorf("the node's units in the container: %v\n%s", err, out)
	}
	if pid := mainPID(t, f.m, container.Unit("kube1")); pid != "0" {
		if rss, err := f.m.Run("ps", "-o", "rss=", "-p", pid); err == nil {
			t.Logf("supervisor (systemd-nspawn --oci-bundle) RSS: %s KiB", strings.TrimSpace(rss))
		}
	}
	if t.Failed() {
		return
	}

	// 2. Restart: the container powers off cleanly and boots again (the
	// unit's stop is the node's poweroff: its units stopped, a clean
	// exit), the host does not.
	// A device appears on the host: the restart gives it to the node
	// (config.json rewritten before the container starts).
	if out, err := f.m.Run("mknod", "-m", "0600", "/dev/vhost-net", "c", "10", "238"); err != nil {
		t.Fatalf("mknod /dev/vhost-net on the test host: %v\n%s", err, out)
	}
	host := hostIdentityOf(t, f.m)
	pid0 := mainPID(t, f.m, container.Unit("kube1"))
	begin := time.Now()
	if out, err := f.m.Systemctl("start", restartUnit); err != nil {
		t.Fatalf("systemctl start %s: %v\n%s\n%s", restartUnit, err, out, f.m.Journal(restartUnit))
	}
	t.Logf("restart (container stop, boot, kubelet healthy): %v", time.Since(begin).Round(time.Millisecond))
	logRestartTimeline(t, f.m, begin, container.Unit("kube1"), "kube1")
	if pid1 := mainPID(t, f.m, container.Unit("kube1")); pid1 == pid0 || pid1 == "0" {
		t.Errorf("%s main pid %s -> %s: want a new, running container", container.Unit("kube1"), pid0, pid1)
	}
	wantSameHost(t, f.m, host)
	if out, err := f.m.Run("systemd-run", "-M", "kube1", "--wait", "--pipe", "-q", "test", "-c", "/dev/vhost-net"); err != nil {
		t.Errorf("/dev/vhost-net, made on the host before the restart, is not in the node after it: %v\n%s", err, out)
	}
	// The restart's stop is the container's poweroff through its logind:
	// the kubelet ended the pod (its PID 1 ignores SIGTERM) in its
	// graceful node shutdown, not the container's final kill.
	wantEndedByShutdown(t, f.env.kube, ns, pod.Name)
	logNodeShutdownEvent(t, f.env.kube, f.name)
	waitUntil(t, 2*time.Minute, "Node Ready after the restart", f.nodeReady)
	f.waitPodRunning(t, ns, 3*time.Minute)
	if t.Failed() {
		return
	}

	// 3. Repave to kube2, killed at every crash point on the way.
	ref := f.setNodeImage(t, "bookworm-2")
	crashRepaveAtEveryPoint(t, f)
	f.wantSlot(t, "kube2", ref)
	waitUntil(t, 3*time.Minute, "Node Ready after the repave", f.nodeReady)
	if again := f.waitPodRunning(t, ns, 3*time.Minute); again.UID == pod.UID {
		t.Errorf("the pod %s was not rescheduled by the repave", pod.Name)
	}
	if t.Failed() {
		return
	}

	// 4. A node image that never gets healthy: rolled back to kube2.
	bad := f.reg.Push(t, "unbounded/node:never-healthy", nodestack.NeverHealthyNodeImage(t, f.stage.NodeImage(t)))
	f.setImageRef(t, bad)
	f.repaveFlags(t, "--force", "--delete-unmanaged", "--drain-timeout=15s", "--ready-timeout="+neverHealthyReadyTimeout)
	p, took := f.repave(t, 10*time.Minute)
	j := f.lastRunJournal(t, p)
	if p["ExecMainStatus"] != "1" {
		t.Fatalf("repave onto a node that never gets healthy: %v, want exit 1\n%s", p, j)
	}
	t.Logf("repave onto a node that never gets healthy rolled back after %v", took.Round(time.Millisecond))
	for _, words := range []string{"did not become healthy", "rolled back", "stopped and removed", "kube2 started again"} {
		if !strings.Contains(j, words) {
			t.Errorf("the repave's journal does not say %q:\n%s", words, j)
		}
	}
	f.setImageRef(t, ref)
	f.repaveFlags(t)
	f.wantSlot(t, "kube2", "")
	waitUntil(t, 3*time.Minute, "Node Ready after the rollback", f.nodeReady)
	pod = f.waitPodRunning(t, ns, 3*time.Minute)
	if t.Failed() {
		return
	}

	// 5. Reboot of the host while the cluster fences the allocation: the
	// fence refuses and the container is not started (no node runs on a
	// fenced allocation). Unfenced, the operator starts the node; it
	// comes back behind the fence, with no second bootstrap.
	setAllocationFenced(t, f, uid, true)
	// The host's poweroff stops the container through its logind: the
	// kubelet ends the pod first, and the poweroff is bounded by the
	// graceful shutdown's period.
	rebooted := time.Now()
	f.powerOffEndsPod(t, ns, pod.Name, f.m.Stop)
	f.m.Start()
	t.Logf("reboot (poweroff with the node running, then boot): %v", time.Since(rebooted).Round(time.Millisecond))
	wantFencedUnit(t, f.m, "unbounded-mode-container.target", container.Unit("kube2"))
	waitUntil(t, 2*time.Minute, fenceUnit+" refused", func(context.Context) (bool, error) {
		p := showProps(t, f.m, fenceUnit, "ActiveState", "ExecMainStatus")
		return p["ActiveState"] == "failed" && p["ExecMainStatus"] == "77", nil
	})
	if s := f.m.UnitState(container.Unit("kube2")); s.ActiveState != "inactive" {
		t.Errorf("%s = %s with the allocation fenced; want never started", container.Unit("kube2"), s)
	}
	wantNodeDown(t, f.m, "unbounded-mode-container.target")
	if cond := machineCondition(t, f.env, f.name); cond == nil || cond.Status != metav1.ConditionTrue || cond.Reason != v1alpha3.ReasonAllocationFenced {
		t.Errorf("AllocationLaunchRefused after the fenced boot = %+v, want True/AllocationFenced", cond)
	}
	setAllocationFenced(t, f, uid, false)
	if out, err := f.m.Systemctl("start", nodeTarget); err != nil {
		t.Fatalf("systemctl start %s after unfencing: %v\n%s\n%s", nodeTarget, err, out, f.m.Journal(fenceUnit))
	}
	if p := showProps(t, f.m, bootstrapUnit, "InvocationID"); p["InvocationID"] != "" {
		t.Errorf("bootstrap ran again at the reboot:\n%s", f.m.Journal(bootstrapUnit))
	}
	for _, u := range []string{nodeTarget, container.Unit("kube2"), daemonUnit} {
		waitUntil(t, 2*time.Minute, u+" active after the reboot", func(context.Context) (bool, error) {
			return isActive(f.m, u) == "active", nil
		})
	}
	waitUntil(t, 3*time.Minute, "Node Ready after the reboot", f.nodeReady)
	f.waitPodRunning(t, ns, 3*time.Minute)
	if t.Failed() {
		return
	}

	// 6. Reset. The test's own changes to agent.toml undone first: reset
	// leaves the operator's configuration as it is.
	f.m.WriteFile("/etc/unbounded/agent.toml", config, 0o644)
	resetAt := time.Now()
	out, err := f.m.Run("unbounded", "reset", "--yes")
	if err != nil {
		t.Fatalf("unbounded reset --yes: %v\n%s", err, out)
	}
	t.Logf("unbounded reset --yes: %v", time.Since(resetAt).Round(time.Millisecond))
	wantNothingOfOursRunning(t, f)
	wantManifest(t, f, before, fmt.Sprintf("after `unbounded reset --yes` in mode %s", f.mode))
}

// setAllocationFenced makes the cluster's side of f's allocation uid:
// the Machine's spec.allocation, fenced or not (the Machine created when
// it is not there yet).
func setAllocationFenced(t *testing.T, f *firstBoot, uid string, fenced bool) {
	t.Helper()
	ctx := context.Background()
	alloc := &v1alpha3.AllocationRef{Name: "alloc-" + f.name, UID: uid, Fenced: fenced}
	cur := &v1alpha3.Machine{}
	err := f.env.api.Get().Resource(v1alpha3.ResourceMachines).Name(f.name).Do(ctx).Into(cur)
	switch {
	case apierrors.IsNotFound(err):
		in := &v1alpha3.Machine{ObjectMeta: metav1.ObjectMeta{Name: f.name}, Spec: v1alpha3.MachineSpec{Allocation: alloc}}
		err = f.env.api.Post().Resource(v1alpha3.ResourceMachines).Body(in).Do(ctx).Error()
	case err == nil:
		cur.Spec.Allocation = alloc
		err = f.env.api.Put().Resource(v1alpha3.ResourceMachines).Name(f.name).Body(cur).Do(ctx).Error()
	}
	if err != nil {
		t.Fatalf("Machine %s's allocation fenced=%t: %v", f.name, fenced, err)
	}
}
