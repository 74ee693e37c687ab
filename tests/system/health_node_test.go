package system_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/uuid"

	"unbounded-cloud.io/agent/lib/noderecord"
)

// Mode none, one host:
//   - the Node made NotReady by the cluster while the kubelet's healthz
//     stays ok and its units run: the CNI config is taken away, so
//     containerd reports its network not ready and the kubelet reports the
//     Node Ready=False (KubeletNotReady), within seconds and for as long
//     as the config is away. The daemon records it in
//     /run/unbounded/node.json; health counts it as an unhealthy check
//     naming the reason (and nothing else: the healthz stays ok); the
//     config back, health sees the node healthy again. K is set high here,
//     so that no restart of containerd mixes with the config's return
//     (that health restarts after K unhealthy checks is lib/health's unit
//     test and restart_none_test's);
//     the restart's wait for Node Ready is lib/restart's unit test;
//   - the fence refusing a restart: containerd's restart fails on the
//     fence, and the kubelet is stopped too (the refused node is down,
//     not half up); unfenced, the daemon starts the node again.
func TestHealthCountsANodeTheClusterReportsNotReadyAndARefusedNoneRestartLeavesTheNodeDown(t *testing.T) {
	defer scenario(t)()
	uid := string(uuid.NewUUID())
	f := newFirstBoot(t, firstBootOptions{mode: "none", extra: fmt.Sprintf("\n[allocation]\nuid = %q\n\n[fence]\nretry-budget = \"10s\"\n", uid)})
	logJournalsOnFailure(t, f)
	healthTimings{interval: 3 * time.Second, failures: 1000, maxRestarts: 1, restartTimeout: 3 * time.Minute}.write(f)
	allocatedHost(t, f, uid)
	begin := time.Now()
	f.m.Start()
	f.wantBootstrapped(t, "none", kubeletUnit)
	t.Logf("first boot: %v", time.Since(begin).Round(time.Millisecond))
	if t.Failed() {
		return
	}
	// The daemon reads the Node with its client certificate (the
	// bootstrap token may not), once the cluster side approved its CSR.
	approveAgentCSR(t, f.env, f.m, f.name)
	node := nodeUID(t, f)
	nodeRec := func() *noderecord.Record {
		data, err := f.m.ReadFile("/run/unbounded/node.json")
		if err != nil {
			return nil
		}
		var r noderecord.Record
		if err := json.Unmarshal(data, &r); err != nil {
			t.Fatalf("node record: %v\n%s", err, data)
		}
		return &r
	}
	begin = time.Now()
	waitUntil(t, 3*time.Minute, "the daemon records the Node Ready", func(context.Context) (bool, error) {
		r := nodeRec()
		return r != nil && r.Present && r.Ready, nil
	})
	t.Logf("Node Ready recorded by the daemon %v after the CSR's approval", time.Since(begin).Round(time.Millisecond))

	// The Node NotReady, the kubelet's healthz ok.
	const cni = "/etc/cni/net.d/10-unbounded-bridge.conflist"
	if out, err := f.m.Run("mv", cni, "/root/cni.conflist"); err != nil {
		t.Fatalf("take the CNI config away: %v\n%s", err, out)
	}
	away := time.Now()
	waitUntil(t, 3*time.Minute, "the daemon records the Node NotReady", func(context.Context) (bool, error) {
		r := nodeRec()
		return r != nil && r.Present && !r.Ready, nil
	})
	r := nodeRec()
	t.Logf("Node NotReady recorded %v after the CNI config went away: %+v", time.Since(away).Round(time.Millisecond), r)
	if r.Status != "False" || r.Reason != "KubeletNotReady" {
		t.Errorf("node record %+v, want Ready False, reason KubeletNotReady", r)
	}
	var counted []string
	waitUntil(t, 2*time.Minute, "health counts two checks of a Node that is not Ready", func(context.Context) (bool, error) {
		counted = counted[:0]
		for _, l := range strings.Split(progLog(f.m, "health"), "\n") {
			if strings.Contains(l, "node unhealthy failures=") {
				counted = append(counted, l)
			}
		}
		return len(counted) >= 2, nil
	})
	t.Logf("health counted 2 unhealthy checks %v after the CNI config went away", time.Since(away).Round(time.Millisecond))
	for _, l := range counted {
		if !strings.Contains(l, "Node "+f.name+" is not Ready (Ready False, reason KubeletNotReady") || strings.Contains(l, "healthz") || strings.Contains(l, ".service is") {
			t.Errorf("health's unhealthy check is %q; want it to name only the Node's Ready condition (the healthz stayed ok, the units active)", l)
		}
	}

	// The config back: health sees the node healthy.
	// Copied, not moved: containerd's watch of the CNI directory ignores
	// a file's creation (it may be half written) and loads it on a write;
	// a rename brings only the creation, and the Node stayed NotReady for
	// minutes after a `mv` back.
	if out, err := f.m.Run("cp", "/root/cni.conflist", cni); err != nil {
		t.Fatalf("put the CNI config back: %v\n%s", err, out)
	}
	back := time.Now()
	waitUntil(t, 4*time.Minute, "health sees the node healthy again", func(context.Context) (bool, error) {
		// A line of its own: "... until the node is healthy again" is
		// the give-up's.
		return strings.Contains("\n"+progLog(f.m, "health"), "\nthe node is healthy again"), nil
	})
	t.Logf("healthy again %v after the CNI config came back", time.Since(back).Round(time.Millisecond))
	waitNodeReadySince(t, f, node, back, 3*time.Minute)

	// The fence refuses a restart: containerd's start fails on it, and the
	// kubelet is stopped too.
	setFenced(t, f, true)
	fenced := time.Now()
	if out, err := f.m.Systemctl("start", restartUnit); err == nil {
		t.Errorf("restart of a fenced node succeeded:\n%s\n%s", out, f.m.Journal(restartUnit))
	}
	if p := showProps(t, f.m, restartUnit, "ExecMainStatus"); p["ExecMainStatus"] != "77" {
		t.Errorf("restart of a fenced node: %v, want exit 77\n%s", p, f.m.Journal(restartUnit))
	}
	for _, u := range []string{containerd, kubeletUnit} {
		if a := isActive(f.m, u); a == "active" || a == "activating" {
			t.Errorf("%s is %s after the fence refused the restart: the refused node must be down", u, a)
		}
	}
	if !strings.Contains(progLog(f.m, "restart"), "stopped "+kubeletUnit+" too") {
		t.Errorf("the restart's journal does not say it stopped the kubelet:\n%s", progLog(f.m, "restart"))
	}
	t.Logf("fenced: restart refused, containerd and kubelet down, %v after the fence flag was set", time.Since(fenced).Round(time.Millisecond))

	// Unfenced: the daemon starts the node, through the fence.
	setFenced(t, f, false)
	unfenced := time.Now()
	waitUntil(t, 2*time.Minute, "the node started after the unfence", func(context.Context) (bool, error) {
		return isActive(f.m, kubeletUnit) == "active" && isActive(f.m, containerd) == "active" && isActive(f.m, nodeTarget) == "active", nil
	})
	t.Logf("node running %v after the unfence", time.Since(unfenced).Round(time.Millisecond))
	waitNodeReadySince(t, f, node, unfenced, 3*time.Minute)
}
