package system_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/uuid"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/fence/record"
)

// Mode nspawn, one host launched for an allocation: a restart by hand
// and one by a Restart MachineOperation each reboot the node machine
// (a new machine process), never the test host (same PID 1, same boot);
// the Node stays registered (same object) and is Ready again. Then the
// allocation is fenced: a restart runs the fence, which refuses (77), and
// the node stays down; once the Machine is unfenced the daemon starts the
// node by itself within seconds, through the fence. The host hands its
// devices to the node (lib/devices: kvm, tun, fuse, a loop device allowed
// by name), a privileged pod uses them, and one that appears before the
// restart is the node's after it.
func TestRestartNspawnRebootsOnlyTheMachineAndAnUnfencedMachineComesBackByItself(t *testing.T) {
	defer scenario(t)()
	uid := string(uuid.NewUUID())
	devs := newHostDevices(t)
	f := newFirstBoot(t, firstBootOptions{
		extra:      fmt.Sprintf("\n[allocation]\nuid = %q\n\n[fence]\nretry-budget = \"10s\"\n", uid) + devs.config(),
		nspawnArgs: devs.nspawnArgs,
		prepared:   true,
	})
	logJournalsOnFailure(t, f)
	allocatedHost(t, f, uid)
	begin := time.Now()
	f.m.Start()
	f.wantBootstrapped(t, "nspawn", nspawnKube1)
	t.Logf("first boot: %v", time.Since(begin).Round(time.Millisecond))
	if t.Failed() {
		return
	}
	// The daemon reads operations with its client certificate, once the
	// cluster side approved its CSR (as an approver does).
	approveAgentCSR(t, f.env, f.m, f.name)
	node := nodeUID(t, f)
	host := hostIdentityOf(t, f.m)
	// The host's devices are the node's.
	devs.wantInNode(t, f)
	// The operator's way into the node: unbounded exec and logs find the
	// active slot's machine.
	// (The node machine's host name is the Node's; the host's is not.)
	if out, err := f.m.Run("unbounded", "exec", "--", "hostname"); err != nil || strings.TrimSpace(out) != f.name {
		t.Errorf("unbounded exec -- hostname: %q %v, want the node machine's %s", out, err, f.name)
	}
	if out, err := f.m.Run("unbounded", "exec", "--", "sh", "-c", "exit 7"); err == nil || !strings.Contains(err.Error(), "exit status 7") {
		t.Errorf("unbounded exec of a command that exits 7: %v\n%s", err, out)
	}
	if out, err := f.m.Run("unbounded", "logs", "-n", "50"); err != nil || !strings.Contains(out, "kubelet") {
		t.Errorf("unbounded logs: %v\n%s", err, out)
	}
	// A device appears on the host: the restart gives it to the node.
	if out, err := f.m.Run("mknod", "-m", "0600", "/dev/vhost-net", "c", "10", "238"); err != nil {
		t.Fatalf("mknod /dev/vhost-net on the test host: %v\n%s", err, out)
	}

	// By hand.
	machine0 := mainPID(t, f.m, nspawnKube1)
	begin = time.Now()
	if out, err := f.m.Systemctl("start", restartUnit); err != nil {
		t.Fatalf("systemctl start %s: %v\n%s\n%s", restartUnit, err, out, f.m.Journal(restartUnit))
	}
	t.Logf("restart by hand (machine stop, boot, kubelet healthy): %v", time.Since(begin).Round(time.Millisecond))
	logRestartTimeline(t, f.m, begin, nspawnKube1, "kube1")
	machine1 := mainPID(t, f.m, nspawnKube1)
	if machine1 == machine0 || machine1 == "0" {
		t.Errorf("%s main pid %s -> %s: want a new, running machine", nspawnKube1, machine0, machine1)
	}
	wantSameHost(t, f.m, host)
	if a := isActive(f.m, nodeTarget); a != "active" {
		t.Errorf("%s is %s after the restart", nodeTarget, a)
	}
	if out, err := f.m.Run("systemd-run", "-M", "kube1", "--wait", "--pipe", "-q", "test", "-c", "/dev/vhost-net"); err != nil {
		t.Errorf("the device that appeared before the restart is not in the node after it: %v\n%s\n%s", err, out, progLog(f.m, "restart"))
	}
	if out, _ := f.m.Run("unbounded", "status"); !strings.Contains(out, "device:      /dev/vhost-net (char 10:238, vhost)") {
		t.Errorf("unbounded status after the restart does not list /dev/vhost-net:\n%s", out)
	}
	// A heartbeat since the restarted unit's start is the new kubelet's.
	waitNodeReadySince(t, f, node, unitStartedAt(t, f.m, nspawnKube1), 3*time.Minute)

	// By a Restart MachineOperation: the daemon starts the unit and
	// completes the operation.
	begin = time.Now()
	op := f.env.createOp(t, f.name, v1alpha3.OperationRestart)
	done := waitOpFinished(t, f, op.Name, 6*time.Minute)
	t.Logf("Restart operation %s: %s %s %q after %v", op.Name, done.Status.State, done.Status.Reason, done.Status.Message, time.Since(begin).Round(time.Millisecond))
	if done.Status.State != v1alpha3.OperationComplete {
		t.Errorf("Restart operation ended %s (%s: %s), want Complete\n%s", done.Status.State, done.Status.Reason, done.Status.Message, f.m.Journal(restartUnit))
	}
	if m2 := mainPID(t, f.m, nspawnKube1); m2 == machine1 || m2 == "0" {
		t.Errorf("%s main pid %s -> %s after the Restart operation: want a new, running machine", nspawnKube1, machine1, m2)
	}
	wantSameHost(t, f.m, host)
	// A heartbeat since the restarted unit's start is the new kubelet's.
	waitNodeReadySince(t, f, node, unitStartedAt(t, f.m, nspawnKube1), 3*time.Minute)

	// Fenced: the restart runs the fence, which refuses; the node stays
	// down.
	setFenced(t, f, true)
	fenced := time.Now()
	if out, err := f.m.Systemctl("start", restartUnit); err == nil {
		t.Errorf("restart of a fenced node succeeded:\n%s\n%s", out, f.m.Journal(restartUnit))
	}
	if p := showProps(t, f.m, restartUnit, "ExecMainStatus"); p["ExecMainStatus"] != "77" {
		t.Errorf("restart of a fenced node: %v, want exit 77\n%s", p, f.m.Journal(restartUnit))
	}
	if a := isActive(f.m, nspawnKube1); a == "active" || a == "activating" {
		t.Errorf("%s is %s after the fence refused", nspawnKube1, a)
	}
	if r := fenceRecord(t, f.m); r == nil || r.Outcome != record.Refused || r.Reason != v1alpha3.ReasonAllocationFenced {
		t.Errorf("fence record after the refusal: %+v, want refused/%s", r, v1alpha3.ReasonAllocationFenced)
	}
	t.Logf("fenced: restart refused %v after the fence flag was set", time.Since(fenced).Round(time.Millisecond))
	// Nothing brings it back while the Machine refuses (health neither:
	// an explicit refusal is not retried).
	allowedBefore := strings.Count(progLog(f.m, "fence"), "allocation launch allowed")

	// Unfenced: the daemon starts the node, through the fence.
	setFenced(t, f, false)
	unfenced := time.Now()
	waitUntil(t, 2*time.Minute, "the node started after the unfence", func(context.Context) (bool, error) {
		return isActive(f.m, nspawnKube1) == "active" && isActive(f.m, nodeTarget) == "active", nil
	})
	took := time.Since(unfenced)
	t.Logf("node machine running %v after the unfence", took.Round(time.Millisecond))
	if n := strings.Count(progLog(f.m, "fence"), "allocation launch allowed"); n <= allowedBefore {
		t.Errorf("the node started without a fence that allowed it (allowed lines %d -> %d)\n%s", allowedBefore, n, progLog(f.m, "fence"))
	}
	if !strings.Contains(progLog(f.m, "daemon"), "no longer refuses") {
		t.Errorf("the daemon's journal does not say it started the node:\n%s", f.m.Journal(daemonUnit))
	}
	if took > 30*time.Second {
		t.Errorf("the node started %v after the unfence, want within seconds (the machine's boot included: 30 s)", took)
	}
	waitNodeReadySince(t, f, node, unfenced, 3*time.Minute)
	wantSameHost(t, f.m, host)
}
