package system_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/owed"
	"unbounded-cloud.io/agent/tests/system/nodestack"
)

// powerCutsOfOperations: on a booted host with a pod in ns, the whole host
// loses power at the moments where an operation's outcome, or a write it
// owes the cluster, could be lost. (1) A repave whose drain a budget
// blocks, with the API server cut off before its uncordon: the uncordon
// is owed on the host, the host is power-cut, and the daemon of the next
// boot uncordons the Node. (2) A Repave MachineOperation cut right after
// its record, the daemon stopped before it (as a power cut stops it): the
// repave resumes at boot and the operation ends Complete. (3) A Restart
// MachineOperation whose final status the cluster refuses: the status is
// owed on the host, the host is power-cut, and the daemon of the next boot
// writes it as decided once the cluster takes it.
func powerCutsOfOperations(t *testing.T, f *firstBoot, ns string) {
	t.Helper()
	ctx := context.Background()

	// (1) The owed uncordon across a power cut.
	f.blockingBudget(t, ns)
	f.setNodeImage(t, "bookworm-2")
	f.repaveFlags(t, "--drain-timeout=15s")
	cut := make(chan bool, 1)
	go func() {
		// Not waitUntil: this is not the test's goroutine. The cut
		// comes 5 s into the 15 s drain and lasts until the test ends
		// it: the drain ends at its timeout, and the uncordon after it
		// finds no API server.
		cordoned := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
			n, err := f.env.kube.CoreV1().Nodes().Get(ctx, f.name, metav1.GetOptions{})
			return err == nil && n.Spec.Unschedulable, nil
		})
		if cordoned == nil {
			time.Sleep(5 * time.Second) // into the drain, not a wait for a state
			f.fwd.SetFault(f.env.Host(), nodestack.ForwardFault{Down: true})
		}
		cut <- cordoned == nil
	}()
	p, took := f.repave(t, 8*time.Minute)
	if !<-cut {
		t.Fatalf("the repave never cordoned the Node:\n%s", f.lastRunJournal(t, p))
	}
	j := f.lastRunJournal(t, p)
	if p["ExecMainStatus"] != "1" {
		f.fwd.SetFault(f.env.Host(), nodestack.ForwardFault{})
		t.Fatalf("repave against the budget with the API server cut off: %v, want exit 1\n%s", p, j)
	}
	t.Logf("repave against the budget failed after %v, the API server cut off", took.Round(time.Millisecond))
	w, err := owed.Find(f.paths, owed.Uncordon)
	if err != nil || w == nil || w.Node != f.name {
		f.fwd.SetFault(f.env.Host(), nodestack.ForwardFault{})
		t.Fatalf("after the failed uncordon the owed record is %+v (%v), want an uncordon of %s\n%s", w, err, f.name, j)
	}
	if n := f.nodeObject(t); !n.Spec.Unschedulable {
		t.Fatalf("the Node is schedulable although the API server was cut off before the uncordon:\n%s", j)
	}
	f.m.PowerCut()
	f.fwd.SetFault(f.env.Host(), nodestack.ForwardFault{})
	f.repaveFlags(t)
	begin := time.Now()
	f.m.Start()
	waitUntil(t, 2*time.Minute, "the daemon of the next boot made the owed uncordon", func(ctx context.Context) (bool, error) {
		n, err := f.env.kube.CoreV1().Nodes().Get(ctx, f.name, metav1.GetOptions{})
		return err == nil && !n.Spec.Unschedulable, nil
	})
	waitUntil(t, time.Minute, "the owed uncordon settled", func(context.Context) (bool, error) {
		w, err := owed.Find(f.paths, owed.Uncordon)
		return err == nil && w == nil, nil
	})
	t.Logf("power cut with the uncordon owed: the Node uncordoned %v after the boot began", time.Since(begin).Round(time.Millisecond))
	f.wantSlot(t, "kube1", "")
	if err := f.env.kube.PolicyV1().PodDisruptionBudgets(ns).Delete(ctx, "sleeper", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 3*time.Minute, "Node Ready after the power cut", f.nodeReady)
	if t.Failed() {
		return
	}

	// (2) A Repave operation cut right after its record, with the daemon
	// stopped before it: nothing reported the crash. The watchdog is
	// off for the stopped daemon (systemd would kill and restart it).
	ref := f.setNodeImage(t, "bookworm-3")
	setCrashPoint(t, f, repaveService, "repave/after-record")
	f.daemonWatchdog(t, false)
	op := f.env.createOp(t, f.name, v1alpha3.OperationRepave)
	waitUntil(t, 2*time.Minute, "the Repave operation InProgress and its unit running", func(ctx context.Context) (bool, error) {
		o := f.op(ctx, op.Name)
		st := showProps(t, f.m, repaveService, "ActiveState")["ActiveState"]
		return o != nil && o.Status.State == v1alpha3.OperationInProgress && (st == "activating" || st == "active"), nil
	})
	if out, err := f.m.Run("sh", "-c", "kill -STOP $(systemctl show -p MainPID --value "+daemonUnit+")"); err != nil {
		t.Fatalf("stop the daemon: %v\n%s", err, out)
	}
	wantCrashedAt(t, f, repaveService, "repave/after-record", waitUnitDone(t, f, repaveService, "", 8*time.Minute))
	if o := f.op(ctx, op.Name); o == nil || o.Status.State != v1alpha3.OperationInProgress {
		t.Fatalf("operation %s after the crash with the daemon stopped: %+v, want InProgress", op.Name, o)
	}
	f.m.PowerCut()
	setCrashPoint(t, f, repaveService, "")
	f.daemonWatchdog(t, true)
	begin = time.Now()
	f.m.Start()
	done := waitOpFinished(t, f, op.Name, 5*time.Minute)
	t.Logf("power cut right after the repave's record: operation %s %s/%s %v after the boot began: %s",
		op.Name, done.Status.State, done.Status.Reason, time.Since(begin).Round(time.Millisecond), done.Status.Message)
	if done.Status.State != v1alpha3.OperationComplete {
		t.Fatalf("operation %s ended %s/%s: %s\ndaemon:\n%s", op.Name, done.Status.State, done.Status.Reason, done.Status.Message, f.m.Journal(daemonUnit))
	}
	f.wantSlot(t, "kube2", ref)
	waitUntil(t, 3*time.Minute, "Node Ready after the resumed repave", f.nodeReady)
	if t.Failed() {
		return
	}

	// (3) A Restart operation whose final status the cluster refuses.
	refused := "refuse-" + f.name
	lift := refuseFinalStatus(t, f, refused)
	restart := &v1alpha3.MachineOperation{
		ObjectMeta: metav1.ObjectMeta{GenerateName: f.name + "-", Labels: map[string]string{v1alpha3.MachineLabel: f.name, refuseLabel: refused}},
		Spec:       v1alpha3.MachineOperationSpec{MachineRef: v1alpha3.MachineRef{Name: f.name}, Operation: v1alpha3.OperationRestart},
	}
	op = &v1alpha3.MachineOperation{}
	if err := f.env.api.Post().Resource(v1alpha3.ResourceMachineOperations).Body(restart).Do(ctx).Into(op); err != nil {
		t.Fatalf("create the Restart operation: %v", err)
	}
	var status *owed.Write
	waitUntil(t, 3*time.Minute, "the Restart operation's final status owed on the host", func(context.Context) (bool, error) {
		status, _ = owed.Find(f.paths, owed.Write{Kind: owed.OperationStatus, UID: string(op.UID)}.ID())
		return status != nil, nil
	})
	if status.State != string(v1alpha3.OperationComplete) || status.Operation != op.Name {
		t.Fatalf("owed status %+v, want Complete of %s", status, op.Name)
	}
	if out, err := f.m.Run("unbounded", "status"); err != nil || !strings.Contains(out, "MachineOperation "+op.Name) {
		t.Errorf("unbounded status does not list the owed status of %s (%v):\n%s", op.Name, err, out)
	}
	f.m.PowerCut()
	lift()
	begin = time.Now()
	f.m.Start()
	done = waitOpFinished(t, f, op.Name, 2*time.Minute)
	t.Logf("power cut with the Restart's final status owed: operation %s %s/%s %v after the boot began",
		op.Name, done.Status.State, done.Status.Reason, time.Since(begin).Round(time.Millisecond))
	if done.Status.State != v1alpha3.OperationComplete || done.Status.Reason != status.Reason {
		t.Fatalf("operation %s ended %s/%s (%s), want the owed Complete/%s\ndaemon:\n%s", op.Name, done.Status.State, done.Status.Reason, done.Status.Message, status.Reason, f.m.Journal(daemonUnit))
	}
	waitUntil(t, time.Minute, "the owed status settled", func(context.Context) (bool, error) {
		ws, err := owed.List(f.paths)
		return err == nil && len(ws) == 0, nil
	})
}

// op reads the operation (nil when it cannot be read).
func (f *firstBoot) op(ctx context.Context, name string) *v1alpha3.MachineOperation {
	o := &v1alpha3.MachineOperation{}
	if err := f.env.api.Get().Resource(v1alpha3.ResourceMachineOperations).Name(name).Do(ctx).Into(o); err != nil {
		return nil
	}
	return o
}

// daemonWatchdog turns the daemon's watchdog off (a drop-in) or back to
// the shipped unit's, and restarts the daemon when it runs so that it
// holds. A test that stops the daemon with SIGSTOP turns it off first.
func (f *firstBoot) daemonWatchdog(t *testing.T, on bool) {
	t.Helper()
	dropin := filepath.Join(f.m.Root(), "etc/systemd/system", daemonUnit+".d", "watchdog.conf")
	if on {
		os.RemoveAll(filepath.Dir(dropin))
	} else {
		f.m.WriteFile(strings.TrimPrefix(dropin, f.m.Root()), []byte("[Service]\nWatchdogSec=0\n"), 0o644)
	}
	if f.m.Leader() == 0 {
		return
	}
	if out, err := f.m.Systemctl("daemon-reload"); err != nil {
		t.Fatalf("daemon-reload: %v\n%s", err, out)
	}
	if out, err := f.m.Systemctl("try-restart", daemonUnit); err != nil {
		t.Fatalf("restart %s: %v\n%s", daemonUnit, err, out)
	}
}

// refuseLabel marks the operations whose final status refuseFinalStatus
// refuses.
const refuseLabel = "test.unbounded-cloud.io/refuse-final-status"

// refuseFinalStatus makes the API server refuse every write of a final
// state (Complete, Failed) into the status of a MachineOperation labelled
// refuseLabel=name, as an admission policy of the cluster would: an
// answer, not an outage. It returns once the refusal is in force (a probe
// operation's final write is refused), with the function that lifts it.
func refuseFinalStatus(t *testing.T, f *firstBoot, name string) (lift func()) {
	t.Helper()
	ctx := context.Background()
	adm := f.env.kube.AdmissionregistrationV1()
	fail := admissionv1.Fail
	policy := &admissionv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: &fail,
			MatchConstraints: &admissionv1.MatchResources{ResourceRules: []admissionv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionv1.RuleWithOperations{
					Operations: []admissionv1.OperationType{admissionv1.Update},
					Rule:       admissionv1.Rule{APIGroups: []string{v1alpha3.GroupName}, APIVersions: []string{"*"}, Resources: []string{"machineoperations/status"}},
				},
			}}},
			Validations: []admissionv1.Validation{{
				Expression: "!has(object.status) || !has(object.status.state) || !(object.status.state in ['Complete', 'Failed'])",
				Message:    "final states refused by the test " + name,
			}},
		},
	}
	if _, err := adm.ValidatingAdmissionPolicies().Create(ctx, policy, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &admissionv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName: name, ValidationActions: []admissionv1.ValidationAction{admissionv1.Deny},
			MatchResources: &admissionv1.MatchResources{ObjectSelector: &metav1.LabelSelector{
				MatchLabels: map[string]string{refuseLabel: name}}},
		},
	}
	if _, err := adm.ValidatingAdmissionPolicyBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	lift = func() {
		adm.ValidatingAdmissionPolicyBindings().Delete(context.Background(), name, metav1.DeleteOptions{})
		adm.ValidatingAdmissionPolicies().Delete(context.Background(), name, metav1.DeleteOptions{})
	}
	t.Cleanup(lift)
	// The probe: an operation of a Machine no host has, with the label
	// the binding selects, written Failed by the test until the API
	// server refuses it (a write taken meanwhile is put back to Pending).
	nobody := "nobody-" + f.name
	probe := &v1alpha3.MachineOperation{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "probe-", Labels: map[string]string{v1alpha3.MachineLabel: nobody, refuseLabel: name}},
		Spec:       v1alpha3.MachineOperationSpec{MachineRef: v1alpha3.MachineRef{Name: nobody}, Operation: v1alpha3.OperationRestart},
	}
	created := &v1alpha3.MachineOperation{}
	if err := f.env.api.Post().Resource(v1alpha3.ResourceMachineOperations).Body(probe).Do(ctx).Into(created); err != nil {
		t.Fatalf("create the probe operation: %v", err)
	}
	defer f.env.api.Delete().Resource(v1alpha3.ResourceMachineOperations).Name(created.Name).Do(context.Background())
	waitUntil(t, time.Minute, "the refusal of final statuses in force", func(ctx context.Context) (bool, error) {
		o := f.op(ctx, created.Name)
		if o == nil {
			return false, nil
		}
		o.Status.State = v1alpha3.OperationFailed
		put := f.env.api.Put().Resource(v1alpha3.ResourceMachineOperations).Name(o.Name).SubResource("status").Body(o).Do(ctx)
		if err := put.Error(); err != nil {
			return strings.Contains(err.Error(), name), nil
		}
		back := &v1alpha3.MachineOperation{}
		if err := put.Into(back); err == nil {
			back.Status.State = v1alpha3.OperationPending
			f.env.api.Put().Resource(v1alpha3.ResourceMachineOperations).Name(o.Name).SubResource("status").Body(back).Do(ctx)
		}
		return false, nil
	})
	return lift
}
