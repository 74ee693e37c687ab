package system_test

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"unbounded-cloud.io/agent/lib/hostpaths"
	stack "unbounded-cloud.io/agent/lib/modes/nodestack"
	"unbounded-cloud.io/agent/lib/modes/none"
	"unbounded-cloud.io/agent/lib/unitnames"
	"unbounded-cloud.io/agent/tests/system/nodestack"
)

// First boot in mode none and offline first boot, on the first-boot
// fixture (firstboot_test.go).

// TestFirstBootNoneBringsUpAReadyNode: first boot in mode none. The
// shipped unbounded-containerd.service and unbounded-kubelet.service run
// the node stack on the test host itself, from
// /var/lib/unbounded/versions/<v>/ through the `current` link; the Node
// is Ready and runs a Deployment's pod; nothing was written under /usr or
// /opt while the host booted and bootstrapped (ARCHITECTURE section 4).
func TestFirstBootNoneBringsUpAReadyNode(t *testing.T) {
	defer scenario(t)()
	// The host's OS (iptables, writable cgroup v1 controllers) and
	// containerd's store at /var/lib/containerd on the VM's file system:
	// nodestack.FirstBootHost in mode none.
	// node.ip set: the host's second address, not the default route's
	// (wantBootstrapped checks the Node's InternalIP).
	f := newFirstBoot(t, firstBootOptions{mode: "none", nodeIP: nodestack.OtherNodeIP})
	t.Cleanup(func() {
		if t.Failed() {
			f.diagnoseNone(t)
		}
	})

	// What /usr and /opt hold before the first boot (package installed,
	// the host's OS complete), to compare after the node runs.
	before := treeManifest(t, f.m.Root(), "usr", "opt")
	t.Logf("manifest of /usr and /opt: %d entries", len(before))

	begin := time.Now()
	f.m.Start()
	t.Logf("boot (bootstrap included): %v", time.Since(begin).Round(time.Millisecond))
	waitUntil(t, 8*time.Minute, "bootstrap finished", func(context.Context) (bool, error) {
		p := showProps(t, f.m, bootstrapUnit, "ActiveState", "SubState", "ExecMainStatus", "InvocationID")
		if p["ActiveState"] == "failed" {
			return false, fmt.Errorf("bootstrap failed: %v", p)
		}
		return p["InvocationID"] != "" && p["ActiveState"] == "inactive" && p["ExecMainStatus"] == "0", nil
	})
	t.Logf("bootstrap succeeded %v after the boot began", time.Since(begin).Round(time.Millisecond))

	f.wantBootstrapped(t, "none", none.KubeletUnit)
	if st := isActive(f.m, none.ContainerdUnit); st != "active" {
		t.Errorf("%s is %s, want active", none.ContainerdUnit, st)
	}
	if st := isActive(f.m, "unbounded-mode-none.target"); st != "active" {
		t.Errorf("unbounded-mode-none.target is %s, want active", st)
	}
	// No machine: mode none runs nothing in nspawn.
	if out, _ := f.m.Systemctl("list-units", "--state=active,activating,reloading", "--plain", "--no-legend", "systemd-nspawn@*"); strings.TrimSpace(out) != "" {
		t.Errorf("nspawn machines run on a mode none host:\n%s", out)
	}

	// The version directory and the `current` link, and the units' own
	// processes running from it.
	v := f.stage.Versions["kubelet"]
	if target, err := f.m.Readlink(none.Current); err != nil || target != v {
		t.Errorf("%s -> %q (%v), want %q", none.Current, target, err, v)
	}
	vdir := hostpaths.VersionsDirHost + "/" + v
	for _, p := range []string{vdir + "/bin/kubelet", vdir + "/bin/containerd", vdir + "/bin/runc", vdir + "/cni/bin/bridge", vdir + "/etc/kubelet/config.yaml", vdir + "/etc/containerd/config.toml"} {
		if _, err := os.Stat(filepath.Join(f.m.Root(), p)); err != nil {
			t.Errorf("version directory: %v", err)
		}
	}
	if fi, err := os.Stat(filepath.Join(f.m.Root(), vdir, "etc/kubelet/bootstrap-kubeconfig")); err != nil {
		t.Errorf("bootstrap kubeconfig: %v", err)
	} else if fi.Mode().Perm() != 0o600 {
		t.Errorf("bootstrap kubeconfig has mode %o, want 0600 (it holds the token)", fi.Mode().Perm())
	}
	// The node-local DNS cache (node.local-dns, on by default) runs from
	// the version too, on its interface, before containerd.
	if _, err := os.Stat(filepath.Join(f.m.Root(), vdir, "etc/coredns/Corefile")); err != nil {
		t.Errorf("version directory: the cache's Corefile: %v", err)
	}
	if out, err := f.m.Run("ip", "-o", "addr", "show", "dev", stack.LocalDNSInterface); err != nil ||
		!strings.Contains(out, stack.LocalDNSClusterAddr+"/32") {
		t.Errorf("the cache's interface %s: %v\n%s", stack.LocalDNSInterface, err, out)
	}
	for unit, bin := range map[string]string{none.KubeletUnit: "kubelet", none.ContainerdUnit: "containerd", unitnames.LocalDNS: "coredns"} {
		pid := showProps(t, f.m, unit, "MainPID")["MainPID"]
		exe, err := f.m.Run("readlink", "/proc/"+pid+"/exe")
		if want := vdir + "/bin/" + bin; err != nil || strings.TrimSpace(exe) != want {
			t.Errorf("%s runs %q (PID %s, %v), want %s", unit, strings.TrimSpace(exe), pid, err, want)
		}
	}
	// The cache alone of the node stack runs sandboxed (issue 41).
	f.wantLocalDNSUnprivileged(t, "")

	ns := f.runPod(t)
	pod := f.podOf(t, ns)
	if out, err := f.execPod(t, ns, pod, "cat", "/etc/resolv.conf"); err != nil || !strings.Contains(out, "nameserver "+stack.LocalDNSClusterAddr+"\n") {
		t.Errorf("the pod's resolv.conf does not name the node-local DNS cache (%v):\n%s", err, out)
	}

	// Nothing under /usr or /opt changed: boot, bootstrap, containerd,
	// kubelet and a running pod included.
	after := treeManifest(t, f.m.Root(), "usr", "opt")
	if diff := manifestDiff(before, after); len(diff) > 0 {
		if len(diff) > 40 {
			diff = append(diff[:40], fmt.Sprintf("... and %d more", len(diff)-40))
		}
		t.Errorf("written under /usr or /opt at run time (ARCHITECTURE section 4):\n%s", strings.Join(diff, "\n"))
	}

	f.powerOffEndsPod(t, ns, pod, f.m.PowerOffThroughLogind)
}

// shutdownGrace is node.shutdown-grace-period as the test hosts have it:
// the product's default (lib/config/reference.toml).
const shutdownGrace = 30 * time.Second

// powerOffEndsPod powers the node off by poweroff with the namespace's pod
// (a busybox sleep, whose PID 1 ignores SIGTERM; terminationGracePeriodSeconds
// 1) running, and checks that the kubelet's graceful node shutdown ended
// it: the pod is Failed with the shutdown manager's reason and message,
// so the kubelet was told before the node went down and sent its
// SIGTERM (then SIGKILL after the pod's grace), and the poweroff took
// less than node.shutdown-grace-period + 10 s. Without it the pod's
// process meets the final kill of the shutdown: a mode none host waits
// its DefaultTimeoutStopSec (90 s) for it (issue 41).
func (f *firstBoot) powerOffEndsPod(t *testing.T, ns, pod string, poweroff func()) {
	t.Helper()
	begin := time.Now()
	poweroff()
	took := time.Since(begin)
	t.Logf("powered off with a pod running in %v", took.Round(time.Millisecond))
	if bound := shutdownGrace + 10*time.Second; took > bound {
		t.Errorf("the poweroff with a pod running took %v, want under node.shutdown-grace-period + 10 s (%v)", took.Round(time.Millisecond), bound)
	}
	wantEndedByShutdown(t, f.env.kube, ns, pod)
	logNodeShutdownEvent(t, f.env.kube, f.name)
}

// wantEndedByShutdown: pod was ended by its kubelet's graceful node
// shutdown (its status says so; only the kubelet's shutdown manager
// writes that reason and message).
func wantEndedByShutdown(t *testing.T, c kubernetes.Interface, ns, pod string) {
	t.Helper()
	p, err := c.CoreV1().Pods(ns).Get(context.Background(), pod, metav1.GetOptions{})
	if err != nil {
		t.Errorf("pod %s after the shutdown: %v", pod, err)
		return
	}
	if p.Status.Phase != corev1.PodFailed || p.Status.Reason != "Terminated" || !strings.Contains(p.Status.Message, "node shutdown") {
		t.Errorf("pod %s after the node's shutdown: phase %s, reason %q, message %q; want Failed, Terminated, \"...node shutdown.\" (the kubelet's graceful node shutdown)",
			pod, p.Status.Phase, p.Status.Reason, p.Status.Message)
		return
	}
	t.Logf("pod %s ended by the kubelet's graceful node shutdown: %s", pod, p.Status.Message)
}

// logNodeShutdownEvent logs the Node's events from the kubelet's shutdown
// manager (reason NodeShutdown: how the Node says why it went away). Only
// logged: the kubelet sends events asynchronously and may be gone first.
func logNodeShutdownEvent(t *testing.T, c kubernetes.Interface, node string) {
	t.Helper()
	evs, err := c.CoreV1().Events(metav1.NamespaceDefault).List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + node + ",reason=NodeShutdown"})
	if err != nil {
		t.Logf("the Node's NodeShutdown events: %v", err)
		return
	}
	for _, e := range evs.Items {
		t.Logf("Node %s event %s: %s (%d, last %s)", node, e.Reason, e.Message, e.Count, e.LastTimestamp.Format(time.RFC3339))
	}
	if len(evs.Items) == 0 {
		t.Logf("Node %s: no NodeShutdown event (the kubelet may have gone before sending it)", node)
	}
}

// drainAndPowerOff deletes the pod's namespace, waits until the pod is
// gone, and powers the test host off, as an operator drains a node before
// a reboot. Without the drain a mode none host's poweroff waits for
// systemd's final SIGKILL, DefaultTimeoutStopSec (90 s) later: the pod's
// PID 1 (busybox sleep, no SIGTERM handler) outlives the node stack's
// units (KillMode=process keeps pods across a runtime restart) and
// ignores the shutdown's SIGTERM. Stop's poweroff (SIGRTMIN+4 to the
// host's systemd) does not go through logind, so the kubelet's graceful
// node shutdown is not told (an operator's `systemctl poweroff` is:
// powerOffEndsPod). (Mode nspawn bounds its machine's stop with
// DefaultTimeoutStopSec=10s inside the machine; on a mode none host that
// setting is the operator's, not the product's.)
func (f *firstBoot) drainAndPowerOff(t *testing.T, ns string) {
	t.Helper()
	drained := time.Now()
	if err := f.env.kube.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 2*time.Minute, "the pod deleted", func(ctx context.Context) (bool, error) {
		pods, err := f.env.kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		return err == nil && len(pods.Items) == 0, nil
	})
	t.Logf("drained in %v", time.Since(drained).Round(time.Millisecond))
	stopped := time.Now()
	f.m.Stop()
	t.Logf("powered off in %v", time.Since(stopped).Round(time.Millisecond))
}

// diagnoseNone logs what explains a failed first boot in mode none.
func (f *firstBoot) diagnoseNone(t *testing.T) {
	for _, u := range []string{none.ContainerdUnit, none.KubeletUnit} {
		out, _ := f.m.Run("sh", "-c", `journalctl --no-pager -q -u "$1" -p warning | grep -v "not registered yet" | tail -n 60`, "sh", u)
		t.Logf("%s warnings:\n%s", u, out)
	}
}

// treeManifest describes every entry under root/dirs: type, mode, owner,
// size, modification time and link target. A file created and removed
// again still shows, in its directory's modification time.
func treeManifest(t *testing.T, root string, dirs ...string) map[string]string {
	t.Helper()
	m := map[string]string{}
	for _, d := range dirs {
		top := filepath.Join(root, d)
		if _, err := os.Lstat(top); os.IsNotExist(err) {
			m["/"+d] = "absent"
			continue
		}
		err := filepath.WalkDir(top, func(p string, e fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			fi, err := e.Info()
			if err != nil {
				return err
			}
			rel := "/" + strings.TrimPrefix(p, root+"/")
			st := fi.Sys().(*syscall.Stat_t)
			desc := fmt.Sprintf("%v %d:%d size %d mtime %d.%09d", fi.Mode(), st.Uid, st.Gid, fi.Size(), st.Mtim.Sec, st.Mtim.Nsec)
			if fi.Mode()&fs.ModeSymlink != 0 {
				l, _ := os.Readlink(p)
				desc += " -> " + l
			}
			m[rel] = desc
			return nil
		})
		if err != nil {
			t.Fatalf("manifest of /%s: %v", d, err)
		}
	}
	return m
}

// manifestDiff lists what was added, removed or changed, sorted.
func manifestDiff(before, after map[string]string) []string {
	var d []string
	for p, a := range after {
		if b, ok := before[p]; !ok {
			d = append(d, "added   "+p+": "+a)
		} else if a != b {
			d = append(d, "changed "+p+": "+b+" => "+a)
		}
	}
	for p, b := range before {
		if _, ok := after[p]; !ok {
			d = append(d, "removed "+p+": "+b)
		}
	}
	slices.Sort(d)
	return d
}

// TestFirstBootOfflineWithoutAnyNetwork: nspawn mode on a host that
// reaches no mirror and no registry at all. agent.toml still names them
// (base-url, nspawn.image and the sandbox image point at loopback ports
// that are closed on the test host: nothing is forwarded there but the
// API server); the artifacts (mirror layout + SHA256SUMS) and the node
// image (an OCI layout whose ref.name is the configured reference) are in
// the offline directory, and so are the pod images. First boot succeeds
// and a Deployment's pod runs without a single try that could reach
// anything.
func TestFirstBootOfflineWithoutAnyNetwork(t *testing.T) {
	defer scenario(t)()
	f := newFirstBoot(t, firstBootOptions{offline: true})
	// Nothing answers behind these either, should anything get through.
	f.mirror.Close()
	offline := filepath.Join(f.m.Root(), hostpaths.HostRootHost, "offline")
	begin := time.Now()
	if err := os.MkdirAll(offline, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("cp", "-a", "--", f.stage.Mirror(t)+"/.", offline+"/").CombinedOutput(); err != nil {
		t.Fatalf("stage the offline directory: %v\n%s", err, out)
	}
	// The node image and the pod images (the sandbox image and the
	// workload's), each named by the reference agent.toml and the pod
	// spec use.
	images := filepath.Join(offline, "images")
	nodestack.WriteLayout(t, images, f.nodeRef, f.stage.NodeImage(t))
	nodestack.WriteLayout(t, images, f.pause, f.stage.PauseImage(t))
	nodestack.WriteLayout(t, images, f.app, f.stage.BusyboxImage(t))
	t.Logf("offline directory staged in %v", time.Since(begin).Round(time.Millisecond))
	if _, err := os.Stat(filepath.Join(offline, "SHA256SUMS")); err != nil {
		t.Fatal(err)
	}

	begin = time.Now()
	f.m.Start()
	t.Logf("boot (bootstrap included): %v", time.Since(begin).Round(time.Millisecond))
	waitUntil(t, 8*time.Minute, "bootstrap finished", func(context.Context) (bool, error) {
		p := showProps(t, f.m, bootstrapUnit, "ActiveState", "SubState", "ExecMainStatus", "NRestarts", "InvocationID")
		if p["ActiveState"] == "failed" {
			return false, fmt.Errorf("bootstrap failed: %v", p)
		}
		return p["InvocationID"] != "" && p["ActiveState"] == "inactive" && p["ExecMainStatus"] == "0", nil
	})
	t.Logf("bootstrap succeeded %v after the boot began", time.Since(begin).Round(time.Millisecond))
	// Offline, nothing is temporary: the first run succeeds.
	if p := showProps(t, f.m, bootstrapUnit, "NRestarts"); p["NRestarts"] != "0" {
		t.Errorf("bootstrap restarted %s times offline, want 0\n%s", p["NRestarts"], f.m.Journal(bootstrapUnit))
	}
	f.wantBootstrapped(t, "nspawn", "systemd-nspawn@kube1.service")

	j := f.m.Journal(bootstrapUnit)
	for _, want := range []string{"artifact from the offline directory", "offline copy of " + f.nodeRef} {
		if !strings.Contains(j, want) {
			t.Errorf("the bootstrap journal does not say %q:\n%s", want, j)
		}
	}
	if r := f.mirror.Requests(); len(r) != 0 {
		t.Errorf("the mirror was asked %d times: %v", len(r), r)
	}
	if !strings.Contains(j, "offline pod images staged") {
		t.Errorf("the bootstrap journal does not say the pod images were staged:\n%s", j)
	}
	// A Deployment's pod runs, its images (and the sandbox image) from
	// the offline directory: no registry is reachable.
	f.runPod(t)
}
