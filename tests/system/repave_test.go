package system_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/kube"
	"unbounded-cloud.io/agent/lib/modes/container/bundle"
	"unbounded-cloud.io/agent/lib/modes/facts"
	"unbounded-cloud.io/agent/lib/state"
)

const repaveService = "unbounded-repave.service"

// Repave of the nspawn mode end to end, on a host that booted for the
// first time (newFirstBoot): the real kubelet, containerd and CNI in the
// nested machine, the real control plane (its node lifecycle, garbage
// collector, scheduler and disruption controllers).

// nodeHistory records what happens to the Node while it is watched: the
// cordon, the deletion, a new Node (another UID) under the same name.
type nodeHistory struct {
	mu       sync.Mutex
	uids     []types.UID
	cordoned bool
	deleted  bool
	stop     func()
}

func (f *firstBoot) watchNode(t *testing.T) *nodeHistory {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w, err := f.env.kube.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", f.name).String()})
	if err != nil {
		t.Fatal(err)
	}
	h := &nodeHistory{stop: func() { cancel(); w.Stop() }}
	t.Cleanup(h.stop)
	go func() {
		for ev := range w.ResultChan() {
			n, ok := ev.Object.(*corev1.Node)
			if !ok {
				continue
			}
			h.mu.Lock()
			if len(h.uids) == 0 || h.uids[len(h.uids)-1] != n.UID {
				h.uids = append(h.uids, n.UID)
			}
			if n.Spec.Unschedulable {
				h.cordoned = true
			}
			if ev.Type == watch.Deleted {
				h.deleted = true
			}
			h.mu.Unlock()
		}
	}()
	return h
}

func (h *nodeHistory) snapshot() (uids []types.UID, cordoned, deleted bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]types.UID(nil), h.uids...), h.cordoned, h.deleted
}

// waitAgentCertificate approves the daemon's CSR as the cluster side does
// and waits until the certificate is stored: only that certificate may
// cordon, drain and delete the Node.
func (f *firstBoot) waitAgentCertificate(t *testing.T) {
	t.Helper()
	approveAgentCSR(t, f.env, f.m, f.name)
	f.waitAgentCertificateStored(t, 2*time.Minute, func() {
		// A CSR of a daemon that started after the first approval (a
		// restart in between) waits too.
		approvePendingAgentCSRs(t, f.env, f.name)
	})
}

// waitAgentCertificateStored waits until the daemon stored its
// certificate, calling meanwhile (if not nil) while it has none.
func (f *firstBoot) waitAgentCertificateStored(t *testing.T, within time.Duration, meanwhile func()) {
	t.Helper()
	store := kube.CertStore{Dir: f.paths.PKIDir()}
	waitUntil(t, within, "the daemon's certificate stored", func(context.Context) (bool, error) {
		_, err := store.Load()
		if err != nil && meanwhile != nil {
			meanwhile()
		}
		return err == nil, nil
	})
}

// bootNode boots the first-boot host and waits for a Ready node with a
// running pod and the daemon's certificate.
func (f *firstBoot) bootNode(t *testing.T) (ns string) {
	t.Helper()
	f.boot(t)
	f.waitAgentCertificate(t)
	return f.runPod(t)
}

// boot boots the first-boot host and waits until its first boot succeeded
// (from the prepared image where the host has it).
func (f *firstBoot) boot(t *testing.T) {
	t.Helper()
	begin := time.Now()
	f.m.Start()
	p := waitUnitDone(t, f, bootstrapUnit, "", 8*time.Minute)
	if p["ExecMainStatus"] != "0" {
		t.Fatalf("first boot failed: %v\n%s", p, f.m.Journal(bootstrapUnit))
	}
	t.Logf("first boot: %v", time.Since(begin).Round(time.Millisecond))
	f.wantPreparedTaken(t)
}

// setNodeImage pushes the node image under tag and makes agent.toml name
// it: a new desired config with the same artifacts.
func (f *firstBoot) setNodeImage(t *testing.T, tag string) string {
	t.Helper()
	ref := f.reg.Push(t, "unbounded/node:"+tag, f.stage.NodeImage(t))
	f.setImageRef(t, ref)
	return ref
}

// setImageRef makes agent.toml name the node image ref.
func (f *firstBoot) setImageRef(t *testing.T, ref string) {
	t.Helper()
	file := f.paths.ConfigFile()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	replaced := false
	for _, l := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "image = ") {
			l, replaced = "image = \""+ref+"\"", true
		}
		out = append(out, l)
	}
	if !replaced {
		t.Fatalf("agent.toml names no node image:\n%s", data)
	}
	if err := os.WriteFile(file, []byte(strings.Join(out, "\n")), 0o644); err != nil {
		t.Fatal(err)
	}
}

// wantSlot asserts the converged host: exactly slot `slot`, with its one
// applied config naming ref, its machine running, the node target active.
func (f *firstBoot) wantSlot(t *testing.T, slot, ref string) {
	t.Helper()
	a, err := state.ReadActive(f.paths)
	if err != nil || a == nil || a.Slot != slot {
		t.Fatalf("active applied config: %+v, %v; want slot %s", a, err, slot)
	}
	// The mode the host runs now (an isolation change may have changed
	// it since the first boot).
	mode := a.Mode
	for _, s := range hostpaths.Slots {
		_, errApplied := os.Stat(f.paths.AppliedConfig(s))
		// Through the running host: the container mode's slots are on a
		// directory bound into it (nodestack.FirstBootHost).
		_, errMachine := f.m.Lstat(nodeRootOnHost(mode, s))
		settings := hostpaths.New("/").NspawnConfig(s)
		if mode == "container" {
			settings = filepath.Join(bundle.Dir(hostpaths.New("/"), s), bundle.ConfigFile)
		}
		_, errSettings := f.m.Lstat(settings)
		want := s == slot
		for what, err := range map[string]error{"applied config": errApplied, "node root": errMachine, "settings": errSettings} {
			if (err == nil) != want {
				t.Errorf("slot %s %s: %v, want present=%v", s, what, err, want)
			}
		}
	}
	if ref != "" && !strings.Contains(string(a.Config), ref) {
		t.Errorf("the applied config of %s does not name image %s", slot, ref)
	}
	for _, p := range []string{f.paths.Ownership(), f.paths.Journal("repave")} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("repave left %s (%v)", f.paths.Rel(p), err)
		}
	}
	for _, u := range []string{"unbounded-node.target", facts.KubeletHost(mode, slot), "unbounded-daemon.service", "unbounded-lifecycle.service"} {
		waitUntil(t, time.Minute, u+" active", func(context.Context) (bool, error) { return isActive(f.m, u) == "active", nil })
	}
	other := facts.KubeletHost(mode, hostpaths.OtherSlot(slot))
	if s := isActive(f.m, other); s == "active" || s == "activating" {
		t.Errorf("%s is %s after the repave", other, s)
	}
	if out, err := f.m.Run("unbounded", "status"); err != nil || !strings.Contains(out, slot) {
		t.Errorf("unbounded status does not show slot %s (%v):\n%s", slot, err, out)
	} else {
		t.Logf("unbounded status:\n%s", out)
	}
}

// wantMachineSlot waits (bounded) until the Machine's status names slot
// as its isolation slot: the daemon reports the slot of the applied config
// after every repave, without a restart.
func (f *firstBoot) wantMachineSlot(t *testing.T, slot string) {
	t.Helper()
	begin := time.Now()
	var got *v1alpha3.IsolationStatus
	err := wait.PollUntilContextTimeout(context.Background(), 250*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		got = f.machine(t).Status.Isolation
		return got != nil && string(got.Slot) == slot, nil
	})
	if err != nil {
		t.Errorf("Machine %s status.isolation = %+v, want slot %s (waited %v)", f.name, got, slot, time.Since(begin).Round(time.Millisecond))
		return
	}
	t.Logf("Machine status.isolation.slot %s after %v", slot, time.Since(begin).Round(time.Millisecond))
}

// TestRepaveNspawnByHandThenByOperation: the operator changes the node
// image and starts unbounded-repave.service: the Node is cordoned,
// drained, deleted and registered afresh under the same name from slot
// kube2, the Deployment's pod runs again, slot kube1 and its record are
// gone. Then a Repave MachineOperation (forced: the config is unchanged)
// goes back to kube1 through the daemon: Complete, with an Event on the
// Machine.
func TestRepaveNspawnByHandThenByOperation(t *testing.T) {
	defer scenario(t)()
	// The daemon serves the host's metrics (read after the operation).
	f := newFirstBoot(t, firstBootOptions{extra: "\n[daemon]\nmetrics-address = \"127.0.0.1:9464\"\n", prepared: true})
	ns := f.bootNode(t)
	before := f.nodeObject(t)

	f.wantMachineSlot(t, "kube1")
	// The daemon runs through the repave by hand (it waits for the unit,
	// takes the Node's deletion for the repave's, does not defer): the
	// same process before and after.
	daemonBefore := showProps(t, f.m, daemonUnit, "InvocationID", "MainPID")

	ref := f.setNodeImage(t, "bookworm-2")
	hist := f.watchNode(t)
	begin := time.Now()
	cursor := journalCursor(t, f)
	if out, err := f.m.Systemctl("start", "--no-block", repaveService); err != nil {
		t.Fatalf("start %s: %v\n%s", repaveService, err, out)
	}
	// What an operator types next: the steps as they happen, each once,
	// until the repave ends.
	follow, ferr := f.m.Run("unbounded", "status", "--follow")
	wantFollowed(t, follow, ferr, repaveService, 4)
	p := waitUnitDone(t, f, repaveService, cursor, 10*time.Minute)
	took := time.Since(begin)
	if p["ExecMainStatus"] != "0" || p["ActiveState"] != "inactive" {
		t.Fatalf("repave by hand: %v\n%s", p, f.m.Journal(repaveService))
	}
	t.Logf("repave kube1 -> kube2 by hand: %v", took.Round(time.Millisecond))
	out, _ := f.m.Run("journalctl", "-q", "--no-pager", "-o", "short-precise", "-u", repaveService)
	t.Logf("repave's journal:\n%s", out)
	uids, cordoned, deleted := hist.snapshot()
	if !cordoned || !deleted {
		t.Errorf("Node history: cordoned=%v deleted=%v, want both", cordoned, deleted)
	}
	if ok, _ := f.nodeReady(context.Background()); !ok {
		t.Errorf("Node %s not Ready after the repave", f.name)
	}
	after := f.nodeObject(t)
	if after.UID == before.UID {
		t.Errorf("Node %s has the UID it had before the repave (%s): not registered afresh (history %v)", f.name, after.UID, uids)
	}
	if after.Spec.Unschedulable {
		t.Errorf("the new Node is cordoned")
	}
	f.wantSlot(t, "kube2", ref)
	if now := showProps(t, f.m, daemonUnit, "InvocationID", "MainPID", "ActiveState"); now["InvocationID"] != daemonBefore["InvocationID"] || now["MainPID"] != daemonBefore["MainPID"] || now["ActiveState"] != "active" {
		t.Errorf("the daemon did not run through the repave by hand: %v -> %v\n%s", daemonBefore, now, f.m.Journal(daemonUnit))
	}
	if j, _ := f.m.Run("journalctl", "-q", "--no-pager", "-o", "cat", "-u", daemonUnit); strings.Contains(j, "repaving") || !strings.Contains(j, "a node operation runs; waiting for it") {
		t.Errorf("the daemon's journal does not say it waited for the repave by hand (or says it repaved):\n%s", j)
	}
	f.wantMachineSlot(t, "kube2")
	pod := f.waitPodRunning(t, ns, 3*time.Minute)
	t.Logf("the Deployment's pod %s runs again on the new node", pod.Name)
	if failed := failedUnits(t, f.m, "unbounded*"); len(failed) != 0 {
		t.Errorf("failed units after the repave: %v", failed)
	}
	if t.Failed() {
		return
	}

	// A Repave MachineOperation, forced through its parameters: the
	// daemon writes the request, starts the unit and reports.
	op := &v1alpha3.MachineOperation{
		ObjectMeta: metav1.ObjectMeta{GenerateName: f.name + "-", Labels: map[string]string{v1alpha3.MachineLabel: f.name}},
		Spec: v1alpha3.MachineOperationSpec{MachineRef: v1alpha3.MachineRef{Name: f.name}, Operation: v1alpha3.OperationRepave,
			Parameters: map[string]string{"force": "true"}},
	}
	created := &v1alpha3.MachineOperation{}
	if err := f.env.api.Post().Resource(v1alpha3.ResourceMachineOperations).Body(op).Do(context.Background()).Into(created); err != nil {
		t.Fatalf("create operation: %v", err)
	}
	begin = time.Now()
	var done *v1alpha3.MachineOperation
	waitUntil(t, 10*time.Minute, "the Repave operation finished", func(ctx context.Context) (bool, error) {
		o := &v1alpha3.MachineOperation{}
		if err := f.env.api.Get().Resource(v1alpha3.ResourceMachineOperations).Name(created.Name).Do(ctx).Into(o); err != nil {
			return false, nil
		}
		done = o
		return o.Status.State.Finished(), nil
	})
	t.Logf("Repave operation %s: %s (%s) after %v", created.Name, done.Status.State, done.Status.Message, time.Since(begin).Round(time.Millisecond))
	if done.Status.State != v1alpha3.OperationComplete {
		t.Fatalf("operation %s ended %s: %s\ndaemon:\n%s", created.Name, done.Status.State, done.Status.Message, f.m.Journal(daemonUnit))
	}
	f.wantSlot(t, "kube1", ref)
	f.wantMachineSlot(t, "kube1")
	f.waitPodRunning(t, ns, 3*time.Minute)
	evs, err := f.env.kube.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("involvedObject.name", f.name).String()})
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, e := range evs.Items {
		if strings.Contains(e.Message, created.Name) && e.Reason == "Operation"+string(v1alpha3.OperationComplete) {
			found = true
		}
	}
	if !found {
		var got []string
		for _, e := range evs.Items {
			got = append(got, e.Reason+": "+e.Message)
		}
		t.Errorf("no OperationComplete Event on Machine %s naming %s; events: %q", f.name, created.Name, got)
	}

	// The host's metrics, as a hostNetwork scraper on the host reads
	// them: the one operation the daemon carried out (the repave by hand
	// was the operator's, not counted), the last outcomes, the node's
	// machine running.
	metrics := scrapeHostMetrics(t, f.m, "127.0.0.1", 9464)
	for _, want := range []string{
		`unbounded_operations_total{operation="Repave",state="Complete"} 1`,
		`unbounded_operation_duration_seconds_count{operation="Repave",state="Complete"} 1`,
		`unbounded_last_outcome{concern="repave",state="Succeeded",reason=""} 1`,
		`unbounded_last_outcome{concern="bootstrap",state="Succeeded",reason=""} 1`,
		`unbounded_fence_last_decision{outcome="allowed",reason=""} 1`,
		`unbounded_node_stack_unit_active{unit="systemd-nspawn@kube1.service"} 1`,
		`mode="nspawn",slot="kube1"} 1`,
		`unbounded_metrics_read_errors 0`,
	} {
		if !strings.Contains(metrics, want+"\n") {
			t.Errorf("the host's metrics lack %s:\n%s", want, metrics)
		}
	}

	// Lifecycle hooks: a settings file of the running slot that this
	// release writes differently is rewritten by unbounded-lifecycle,
	// without restarting the node.
	settings := f.paths.NspawnConfig("kube1")
	want, err := os.ReadFile(settings)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(settings, []byte("# stale\n[Exec]\nBoot=yes\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	machine := showProps(t, f.m, "systemd-nspawn@kube1.service", "InvocationID", "MainPID")
	if out, err := f.m.Systemctl("restart", "unbounded-lifecycle.service"); err != nil {
		t.Fatalf("restart unbounded-lifecycle.service: %v\n%s", err, out)
	}
	if got, _ := os.ReadFile(settings); string(got) != string(want) {
		t.Errorf("lifecycle did not make %s current:\n%s", f.paths.Rel(settings), got)
	}
	if now := showProps(t, f.m, "systemd-nspawn@kube1.service", "InvocationID", "MainPID"); now["InvocationID"] != machine["InvocationID"] || now["MainPID"] != machine["MainPID"] {
		t.Errorf("lifecycle restarted the node: %v -> %v", machine, now)
	}
	// By its syslog identifier: a short-lived process's lines often lack
	// the unit's fields (journald reads them from its cgroup).
	if j, _ := f.m.Run("journalctl", "-b", "-q", "--no-pager", "-o", "cat", "-t", "lifecycle"); !strings.Contains(j, "lifecycle hooks made current") {
		t.Errorf("lifecycle's journal does not say it rewrote the hooks:\n%s", j)
	}
}

// wantFollowed checks `unbounded status --follow`'s output for a run of
// unit that succeeded: it followed that unit, showed at least steps
// distinct STATUS= lines, none twice, and said when the run ended.
func wantFollowed(t *testing.T, out string, err error, unit string, steps int) {
	t.Helper()
	_, follow, _ := strings.Cut(out, "following "+unit+"\n")
	if err != nil || follow == "" || !strings.Contains(follow, unit+" finished after") {
		t.Errorf("unbounded status --follow: %v\n%s", err, out)
		return
	}
	seen := map[string]bool{}
	for _, l := range strings.Split(strings.TrimSpace(follow), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 || strings.HasPrefix(l, unit) {
			continue
		}
		line := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(l), f[0]))
		if i := strings.LastIndex(line, "  ("); i > 0 {
			line = line[:i] // the step before's time
		}
		if seen[line] {
			t.Errorf("unbounded status --follow shows %q twice:\n%s", line, follow)
		}
		seen[line] = true
	}
	if len(seen) < steps {
		t.Errorf("unbounded status --follow shows %d steps, want at least %d:\n%s", len(seen), steps, follow)
	}
	t.Logf("unbounded status --follow:\n%s", follow)
}
