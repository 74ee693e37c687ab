package system_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"unbounded-cloud.io/agent/tests/system/nodestack"
)

// repaveFlags gives unbounded-repave.service's command line flags through
// a drop-in, as an operator would (empty: the shipped command line).
// runBarePod runs a pod without a controller on the node (in ns, whose
// sleeper the budget holds) and waits until it runs.
func (f *firstBoot) runBarePod(t *testing.T, ns, name string) *corev1.Pod {
	t.Helper()
	return f.startPod(t, nodestack.BarePod(ns, name, f.name, f.app))
}

// startPod creates pod and waits until it runs.
func (f *firstBoot) startPod(t *testing.T, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	ns, name := pod.Namespace, pod.Name
	if _, err := f.env.kube.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 2*time.Minute, "pod "+name+" Running", func(ctx context.Context) (bool, error) {
		p, err := f.env.kube.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		pod = p
		return p.Status.Phase == corev1.PodRunning, nil
	})
	return pod
}

// repaveFlags runs the repave unit with flags from now on (none: as
// shipped), through a drop-in.
func (f *firstBoot) repaveFlags(t *testing.T, flags ...string) {
	t.Helper()
	dropin := "/etc/systemd/system/" + repaveService + ".d/flags.conf"
	if len(flags) == 0 {
		os.Remove(f.m.Root() + dropin)
	} else {
		f.m.WriteFile(dropin, []byte("[Service]\nExecStart=\nExecStart=/usr/libexec/unbounded/repave "+strings.Join(flags, " ")+"\n"), 0o644)
	}
	if f.m.Leader() == 0 {
		return // powered off: the next boot reads it
	}
	if out, err := f.m.Systemctl("daemon-reload"); err != nil {
		t.Fatalf("daemon-reload: %v\n%s", err, out)
	}
}

// repave starts the unit and waits until its run ended.
func (f *firstBoot) repave(t *testing.T, timeout time.Duration) (map[string]string, time.Duration) {
	t.Helper()
	f.m.Systemctl("reset-failed", repaveService)
	cursor := journalCursor(t, f)
	begin := time.Now()
	if out, err := f.m.Systemctl("start", "--no-block", repaveService); err != nil {
		t.Fatalf("start %s: %v\n%s", repaveService, err, out)
	}
	p := waitUnitDone(t, f, repaveService, cursor, timeout)
	return p, time.Since(begin)
}

// lastRunJournal is the repave unit's journal since cursor-less: its last
// invocation's lines.
func (f *firstBoot) lastRunJournal(t *testing.T, p map[string]string) string {
	t.Helper()
	f.m.SyncJournal()
	// By its invocation, or by its main process: journald gives a line it
	// reads after the process is gone no unit fields (wantCrashedAt).
	args := []string{"journalctl", "-q", "--no-pager", "-o", "cat", "-b", "_SYSTEMD_INVOCATION_ID=" + p["InvocationID"]}
	if pid := p["ExecMainPID"]; pid != "" && pid != "0" {
		args = append(args, "+", "_PID="+pid)
	}
	out, _ := f.m.Run(args...)
	return out
}

// wantRecoveryReport waits until the recovery that the repave's failure
// started (OnFailure=) has run (another invocation than before) and
// checks its report on the Machine: the Recovered condition (written with
// the daemon's certificate) and a Warning Event naming the unit and
// saying words, from the unit's last lines.
func (f *firstBoot) wantRecoveryReport(t *testing.T, before string, words ...string) {
	t.Helper()
	rec := recoverOf(repaveService)
	begin := time.Now()
	var p map[string]string
	waitUntil(t, 2*time.Minute, "recovery of "+repaveService+" finished", func(context.Context) (bool, error) {
		p = showProps(t, f.m, rec, "InvocationID", "ActiveState", "Result", "ExecMainStatus")
		return p["InvocationID"] != "" && p["InvocationID"] != before && (p["ActiveState"] == "inactive" || p["ActiveState"] == "failed"), nil
	})
	t.Logf("recovery of %s ran (%v after the repave ended): %v", repaveService, time.Since(begin).Round(time.Millisecond), p)
	if p["Result"] != "success" {
		t.Errorf("recovery of %s: %v\n%s", repaveService, p, f.m.Journal(rec))
	}
	var c *metav1.Condition
	waitUntil(t, time.Minute, "the Recovered condition names "+repaveService, func(context.Context) (bool, error) {
		c = recovered(t, f)
		return c != nil && strings.Contains(c.Message, repaveService+" failed"), nil
	})
	if c.Status != metav1.ConditionTrue || c.Reason != "UnitFailed" {
		t.Errorf("Machine condition Recovered = %s %s, want True UnitFailed: %s", c.Status, c.Reason, c.Message)
	}
	wantSays(t, "the Recovered condition", c.Message, append([]string{"exit status 1"}, words...)...)
	ev := recoveryEvents(t, f, repaveService)
	if len(ev) == 0 {
		t.Fatalf("no Event of recovery about %s on Machine %s", repaveService, f.name)
	}
	var msgs []string
	for _, e := range ev {
		ok := e.Type == corev1.EventTypeWarning && e.Reason == "UnitFailed"
		for _, w := range append([]string{"exit status 1"}, words...) {
			ok = ok && strings.Contains(e.Message, w)
		}
		if ok {
			t.Logf("recovery's Event: %s %s: %s", e.Type, e.Reason, e.Message)
			return
		}
		msgs = append(msgs, e.Type+" "+e.Reason+": "+e.Message)
	}
	t.Errorf("no Warning UnitFailed Event of recovery about %s saying %q; its Events:\n%s", repaveService, words, strings.Join(msgs, "\n---\n"))
}

// blockingBudget puts a PodDisruptionBudget "sleeper" on the sleeper pod
// in ns that allows no disruption, and waits until the API server says
// so: a drain of its node cannot evict the pod.
func (f *firstBoot) blockingBudget(t *testing.T, ns string) {
	t.Helper()
	ctx := context.Background()
	min1 := intstr.FromInt32(1)
	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "sleeper", Namespace: ns},
		Spec:       policyv1.PodDisruptionBudgetSpec{MinAvailable: &min1, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "sleeper"}}},
	}
	if _, err := f.env.kube.PolicyV1().PodDisruptionBudgets(ns).Create(ctx, pdb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, time.Minute, "the budget allows no disruption", func(ctx context.Context) (bool, error) {
		p, err := f.env.kube.PolicyV1().PodDisruptionBudgets(ns).Get(ctx, "sleeper", metav1.GetOptions{})
		return err == nil && p.Status.ObservedGeneration == p.Generation && p.Status.CurrentHealthy == 1 && p.Status.DisruptionsAllowed == 0, nil
	})
}

// TestRepaveFailuresLeaveTheNodeAsItWas: on one host, (1) a
// PodDisruptionBudget that forbids the eviction: the repave fails after
// its drain timeout, the Node is uncordoned and unchanged (same UID, same
// slot, the pod untouched); (2) forced, onto a node image whose kubelet
// never runs: the new slot never becomes healthy, the repave rolls back
// to kube1 (the Node Ready again, the pod Running) and the unit fails
// with a message saying so; (3) forced onto a good image: it proceeds
// past the budget and the node comes up in kube2; (4) a pod already
// terminating is waited for, not evicted again, and the repave goes on
// once it is gone.
func TestRepaveFailuresLeaveTheNodeAsItWas(t *testing.T) {
	defer scenario(t)()
	f := newFirstBoot(t, firstBootOptions{prepared: true})
	ns := f.bootNode(t)
	ctx := context.Background()
	before := f.nodeObject(t)
	podBefore := f.waitPodRunning(t, ns, time.Minute)

	f.blockingBudget(t, ns)

	// (0) A pod without a controller on the node: the drain refuses it at
	// once, names it and the parameter that would evict it; nothing is
	// evicted, the Node is uncordoned, the node left as it was.
	bare := f.runBarePod(t, ns, "bare")
	good := f.setNodeImage(t, "bookworm-2")
	f.repaveFlags(t, "--drain-timeout=15s")
	p, took := f.repave(t, 5*time.Minute)
	j := f.lastRunJournal(t, p)
	if p["ExecMainStatus"] != "1" || p["ActiveState"] != "failed" {
		t.Fatalf("repave with a pod without a controller: %v, want exit 1\n%s", p, j)
	}
	t.Logf("repave with a pod without a controller refused after %v", took.Round(time.Millisecond))
	for _, words := range []string{"without a controller", ns + "/" + bare.Name, "deleteUnmanaged", "uncordoned"} {
		if !strings.Contains(j, words) {
			t.Errorf("the repave's journal does not say %q:\n%s", words, j)
		}
	}
	if n := f.nodeObject(t); n.UID != before.UID || n.Spec.Unschedulable {
		t.Errorf("after the refused drain the Node is UID %s (was %s), unschedulable=%v: want it unchanged and uncordoned", n.UID, before.UID, n.Spec.Unschedulable)
	}
	f.wantSlot(t, "kube1", "")
	for _, name := range []string{bare.Name, podBefore.Name} {
		if pod, err := f.env.kube.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{}); err != nil || pod.DeletionTimestamp != nil {
			t.Errorf("pod %s after the refused drain: %v (deletion %v), want it left alone", name, err, pod.GetDeletionTimestamp())
		}
	}
	if t.Failed() {
		return
	}

	// (1) The budget holds: fail after the timeout, nothing changed. (The
	// bare pod stays: the budget fails the drain whatever else it does.)
	// Once the drain has cordoned the Node the API server is cut off for
	// ten seconds, half the drain's timeout: the drain goes on through
	// the outage (its pod lists and evictions are tried again) rather
	// than ending at the first refused connection with the Node left
	// cordoned, and ends as it would without the outage: at its timeout,
	// uncordoned, the budget respected.
	f.repaveFlags(t, "--drain-timeout=20s", "--delete-unmanaged")
	outage := make(chan time.Duration, 1)
	go func() {
		// Not waitUntil: this is not the test's goroutine.
		cordoned := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
			n, err := f.env.kube.CoreV1().Nodes().Get(ctx, f.name, metav1.GetOptions{})
			return err == nil && n.Spec.Unschedulable, nil
		})
		if cordoned != nil {
			outage <- 0
			return
		}
		f.fwd.SetFault(f.env.Host(), nodestack.ForwardFault{Down: true})
		cut := time.Now()
		time.Sleep(10 * time.Second) // the outage's length, not a wait for a state
		f.fwd.SetFault(f.env.Host(), nodestack.ForwardFault{})
		outage <- time.Since(cut)
	}()
	p, took = f.repave(t, 5*time.Minute)
	if cut := <-outage; cut == 0 {
		t.Errorf("the repave never cordoned the Node: no outage during its drain")
	} else {
		t.Logf("API server cut off for %v during the drain", cut.Round(time.Millisecond))
	}
	j = f.lastRunJournal(t, p)
	if p["ExecMainStatus"] != "1" || p["ActiveState"] != "failed" {
		t.Fatalf("repave against the budget: %v, want exit 1\n%s", p, j)
	}
	t.Logf("repave against the budget failed after %v", took.Round(time.Millisecond))
	for _, words := range []string{"drain did not finish", podBefore.Name, "429", "uncordoned"} {
		if !strings.Contains(j, words) {
			t.Errorf("the repave's journal does not say %q:\n%s", words, j)
		}
	}
	n := f.nodeObject(t)
	if n.UID != before.UID || n.Spec.Unschedulable {
		t.Errorf("after the failed drain the Node is UID %s (was %s), unschedulable=%v: want it unchanged and uncordoned", n.UID, before.UID, n.Spec.Unschedulable)
	}
	f.wantSlot(t, "kube1", "")
	if pod := f.waitPodRunning(t, ns, time.Minute); pod.UID != podBefore.UID {
		t.Errorf("the pod was replaced (%s -> %s) although the budget forbade it", podBefore.Name, pod.Name)
	}
	// --delete-unmanaged: the bare pod was evicted (no budget covers it).
	waitUntil(t, time.Minute, "the pod without a controller evicted", func(ctx context.Context) (bool, error) {
		p, err := f.env.kube.CoreV1().Pods(ns).Get(ctx, bare.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err) || (err == nil && p.DeletionTimestamp != nil), nil
	})
	if t.Failed() {
		return
	}

	// (2) Forced onto a node that never gets healthy: rollback.
	bad := f.reg.Push(t, "unbounded/node:never-healthy", nodestack.NeverHealthyNodeImage(t, f.stage.NodeImage(t)))
	f.setImageRef(t, bad)
	f.repaveFlags(t, "--force", "--delete-unmanaged", "--drain-timeout=15s", "--ready-timeout="+neverHealthyReadyTimeout)
	recBefore := showProps(t, f.m, recoverOf(repaveService), "InvocationID")["InvocationID"]
	p, took = f.repave(t, 10*time.Minute)
	j = f.lastRunJournal(t, p)
	if p["ExecMainStatus"] != "1" || p["ActiveState"] != "failed" {
		t.Fatalf("repave onto a node that never gets healthy: %v, want exit 1\n%s", p, j)
	}
	t.Logf("repave onto a node that never gets healthy rolled back and failed after %v", took.Round(time.Millisecond))
	for _, words := range []string{"did not become healthy", "rolled back", "stopped and removed", "kube1 started again"} {
		if !strings.Contains(j, words) {
			t.Errorf("the repave's journal does not say %q:\n%s", words, j)
		}
	}
	f.wantSlot(t, "kube1", "")
	waitUntil(t, 3*time.Minute, "Node Ready again after the rollback", f.nodeReady)
	f.waitPodRunning(t, ns, 3*time.Minute)
	f.wantRecoveryReport(t, recBefore, "rolled back")
	if t.Failed() {
		return
	}

	// (3) Forced onto the good image: past the budget, into kube2.
	f.setImageRef(t, good)
	p, took = f.repave(t, 10*time.Minute)
	if p["ExecMainStatus"] != "0" {
		t.Fatalf("forced repave: %v\n%s", p, f.lastRunJournal(t, p))
	}
	t.Logf("forced repave past the budget: %v", took.Round(time.Millisecond))
	f.wantSlot(t, "kube2", good)
	waitUntil(t, 3*time.Minute, "Node Ready", f.nodeReady)
	f.waitPodRunning(t, ns, 3*time.Minute)
	if t.Failed() {
		return
	}

	// (4) A pod already terminating when the drain begins: deleted with
	// a grace period of two minutes, which its container, a PID 1 without
	// a handler, sits out (SIGTERM does not reach it). The drain neither
	// evicts it again nor refuses it for having no controller; it names
	// the deletion's grace (not the spec's 1 s) and waits. Once the drain
	// is seen waiting, the test ends the deletion as an operator would
	// (grace 0: the API server removes the pod at once; a shorter grace
	// does not cut the runtime's stop already under way) and the repave
	// goes on once the pod is gone. The budget goes first: the
	// Deployment's pod is evicted as usual.
	if err := f.env.kube.PolicyV1().PodDisruptionBudgets(ns).Delete(ctx, "sleeper", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	held := f.runBarePod(t, ns, "held")
	deletePod := func(grace int64) {
		t.Helper()
		if err := f.env.kube.CoreV1().Pods(ns).Delete(ctx, held.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(grace)}); err != nil {
			t.Fatalf("delete pod %s with grace %ds: %v", held.Name, grace, err)
		}
	}
	deletePod(120)
	f.setNodeImage(t, "bookworm-3")
	f.repaveFlags(t, "--drain-timeout=3m")
	f.m.Systemctl("reset-failed", repaveService)
	cursor := journalCursor(t, f)
	if out, err := f.m.Systemctl("start", "--no-block", repaveService); err != nil {
		t.Fatalf("start %s: %v\n%s", repaveService, err, out)
	}
	sinceCursor := func() string {
		out, _ := f.m.Run("journalctl", "-q", "--no-pager", "-o", "cat", "-u", repaveService, "--after-cursor", cursor)
		return out
	}
	waitUntil(t, 3*time.Minute, "the drain waiting for the terminating pod", func(context.Context) (bool, error) {
		return strings.Contains(sinceCursor(), "pod terminating already: waiting for it, not evicting it pod="+ns+"/"+held.Name), nil
	})
	if p := showProps(t, f.m, repaveService, "ActiveState"); p["ActiveState"] != "activating" {
		t.Errorf("the repave did not wait for the terminating pod: %v\n%s", p, sinceCursor())
	}
	released := time.Now()
	deletePod(0)
	p = waitUnitDone(t, f, repaveService, cursor, 5*time.Minute)
	j = sinceCursor()
	if p["ExecMainStatus"] != "0" {
		t.Fatalf("repave with a terminating pod on the node: %v\n%s", p, j)
	}
	t.Logf("repave with a terminating pod ended %v after the pod was removed", time.Since(released).Round(time.Millisecond))
	if strings.Contains(j, "pod evicted pod="+ns+"/"+held.Name) {
		t.Errorf("the terminating pod was evicted again:\n%s", j)
	}
	if !strings.Contains(j, "deletion grace period 120s") {
		t.Errorf("the drain does not name the deletion's grace period (120s):\n%s", j)
	}
	f.wantSlot(t, "kube1", "")
	waitUntil(t, 3*time.Minute, "Node Ready", f.nodeReady)
	f.repaveFlags(t)
}
