package system_test

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

// Mode none, one host: a restart by hand restarts containerd and the
// kubelet while the pod keeps running (the same container), the Node
// stays registered and the host is the same; then the kubelet is killed
// over and over: health restarts the node stack, then gives up once
// (exit 1, saying why) and stays quiet, no restart loop; a restart by
// hand once the payload stops dying brings the node back, and health
// sees it healthy again.
func TestRestartNoneKeepsPodsRunningAndHealthGivesUpOnAPayloadThatKeepsDying(t *testing.T) {
	defer scenario(t)()
	f := newFirstBoot(t, firstBootOptions{mode: "none"})
	logJournalsOnFailure(t, f)
	healthTimings{interval: 3 * time.Second, failures: 2, maxRestarts: 1, restartTimeout: 30 * time.Second}.write(f)
	begin := time.Now()
	f.m.Start()
	f.wantBootstrapped(t, "none", kubeletUnit)
	t.Logf("first boot: %v", time.Since(begin).Round(time.Millisecond))
	if t.Failed() {
		return
	}
	ns := f.runPod(t)
	pod := f.waitPodRunning(t, ns, time.Minute)
	cid := pod.Status.ContainerStatuses[0].ContainerID
	node := nodeUID(t, f)
	host := hostIdentityOf(t, f.m)
	kubelet0, containerd0 := mainPID(t, f.m, kubeletUnit), mainPID(t, f.m, containerd)

	// A restart by hand.
	begin = time.Now()
	if out, err := f.m.Systemctl("start", restartUnit); err != nil {
		t.Fatalf("systemctl start %s: %v\n%s\n%s", restartUnit, err, out, f.m.Journal(restartUnit))
	}
	t.Logf("restart (containerd, kubelet, healthy again): %v", time.Since(begin).Round(time.Millisecond))
	if k, c := mainPID(t, f.m, kubeletUnit), mainPID(t, f.m, containerd); k == kubelet0 || c == containerd0 || k == "0" || c == "0" {
		t.Errorf("kubelet pid %s -> %s, containerd pid %s -> %s: want both restarted and running", kubelet0, k, containerd0, c)
	}
	wantSameHost(t, f.m, host)
	// A heartbeat since the restarted unit's start is the new kubelet's.
	waitNodeReadySince(t, f, node, unitStartedAt(t, f.m, kubeletUnit), 3*time.Minute)
	p, err := f.env.kube.CoreV1().Pods(ns).Get(context.Background(), pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if cs := p.Status.ContainerStatuses; len(cs) != 1 || cs[0].ContainerID != cid || cs[0].State.Running == nil || cs[0].RestartCount != 0 {
		t.Errorf("pod after the restart: %+v; want the same container %s still running, never restarted", cs, cid)
	}
	if j := progLog(f.m, "restart"); !strings.Contains(j, "node stack healthy again") {
		t.Errorf("restart journal does not say the node is healthy:\n%s", j)
	}

	// The payload dies over and over: the kubelet is killed every half
	// second (bounded: the unit stops itself after 10 min). Once health
	// has given this boot its verdict (its checks skipped while the
	// restart ran), so that what follows is its counting and restarts.
	waitHealthBootChecked(t, f)
	restartsBefore := strings.Count(progLog(f.m, "restart"), "restarting the node stack")
	if out, err := f.m.Run("systemd-run", "--unit=ubt-kubelet-killer", "-p", "RuntimeMaxSec=600", "sh", "-c",
		"while :; do systemctl kill -s KILL "+kubeletUnit+" 2>/dev/null; sleep 0.5; done"); err != nil {
		t.Fatalf("start the kubelet killer: %v\n%s", err, out)
	}
	stopKiller := func() {
		if f.m.Leader() != 0 {
			f.m.Systemctl("stop", "ubt-kubelet-killer.service")
		}
	}
	t.Cleanup(stopKiller)
	killed := time.Now()
	waitUntil(t, 6*time.Minute, "health gave up", func(context.Context) (bool, error) {
		return strings.Contains(progLog(f.m, "health"), "gave up restarting the node stack"), nil
	})
	t.Logf("health gave up %v after the kubelet began dying", time.Since(killed).Round(time.Millisecond))
	// The program says it gave up before it exits and systemd logs the
	// exit status: wait for that line, not one look (CI read the
	// journal in between).
	var hj string
	if err := wait.PollUntilContextTimeout(context.Background(), 250*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		hj = f.m.Journal(healthUnit)
		return strings.Contains(hj, "status=1/FAILURE"), nil
	}); err != nil {
		t.Errorf("the give-up did not fail unbounded-health.service (exit 1), which is what recovery reports:\n%s", hj)
	}
	restarts := strings.Count(progLog(f.m, "restart"), "restarting the node stack") - restartsBefore
	if restarts != 1 {
		t.Errorf("health started %d restart(s) before giving up, want 1 (--max-restarts=1)", restarts)
	}
	if !strings.Contains(progLog(f.m, "restart"), "not healthy within") {
		t.Errorf("the restart did not fail for the node not becoming healthy:\n%s", progLog(f.m, "restart"))
	}

	// No loop: several more checks, each quiet (exit 0), no restart.
	inv := showProps(t, f.m, healthUnit, "InvocationID")["InvocationID"]
	runs := 0
	waitUntil(t, 2*time.Minute, "three more health checks", func(context.Context) (bool, error) {
		if cur := showProps(t, f.m, healthUnit, "InvocationID")["InvocationID"]; cur != inv {
			inv = cur
			runs++
		}
		return runs >= 3, nil
	})
	waitFinished(t, f.m, healthUnit)
	if n := strings.Count(progLog(f.m, "restart"), "restarting the node stack") - restartsBefore; n != restarts {
		t.Errorf("health restarted the node after giving up: %d restarts, want %d", n, restarts)
	}
	if n := strings.Count(progLog(f.m, "health"), "gave up earlier"); n < 1 {
		t.Errorf("the checks after the give-up do not say they stay quiet (%d lines):\n%s", n, progLog(f.m, "health"))
	}
	if n := journalCount(f.m, healthUnit, "status=1/FAILURE"); n != 1 {
		t.Errorf("unbounded-health.service failed %d times, want once:\n%s", n, f.m.Journal(healthUnit))
	}
	wantSameHost(t, f.m, host)

	// Something changes: the payload stops dying and an operator
	// restarts the node; health sees it healthy again.
	stopKiller()
	if out, err := f.m.Systemctl("start", restartUnit); err != nil {
		t.Fatalf("restart once the kubelet is left alone: %v\n%s\n%s", err, out, f.m.Journal(restartUnit))
	}
	waitUntil(t, time.Minute, "health sees the node healthy again", func(context.Context) (bool, error) {
		return strings.Contains(progLog(f.m, "health"), "the node is healthy again; restarts are allowed again"), nil
	})
	waitNodeReadySince(t, f, node, unitStartedAt(t, f.m, kubeletUnit), 3*time.Minute)
	wantSameHost(t, f.m, host)
	// The pod, which outlived every restart, is drained before the
	// poweroff (drainAndPowerOff says why).
	f.drainAndPowerOff(t, ns)
}
