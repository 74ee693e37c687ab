package system_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/config"
	"unbounded-cloud.io/agent/lib/fleet"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/modes/all"
	"unbounded-cloud.io/agent/lib/modes/bluegreen/tree"
	"unbounded-cloud.io/agent/tests/kubeenv"
	"unbounded-cloud.io/agent/tests/system/harness"
	"unbounded-cloud.io/agent/tests/system/nodestack"
)

// First boot end to end: a test host (a systemd container with the .deb
// installed and a private network) gets /etc/unbounded/agent.toml and
// boots; unbounded-bootstrap.service turns it into a Ready Node of the
// test control plane, with the real kubelet, containerd, runc and CNI
// plugins from the loopback artifact mirror, the node image and the pod
// images from the loopback registry.
//
// What the test host gets from the test, and why (none of it is the
// product's: a real host has these already): nodestack.FirstBootHost.

// firstBoot is a test host about to boot for the first time, with its
// cluster side: a bootstrap token of its own, no Machine yet (bootstrap
// registers it).
type firstBoot struct {
	// mode is agent.toml's isolation mode.
	mode   string
	env    *kubeEnv
	stage  *nodestack.Stage
	name   string // the Machine's and the Node's name
	m      *harness.Machine
	mirror *nodestack.ArtifactServer
	// mirrorDir is the directory the mirror serves (files are hard
	// links to the staged ones: replace a file, never write into it).
	mirrorDir string
	reg       *nodestack.Registry
	app       string // the workload image
	pause     string
	nodeRef   string
	paths     hostpaths.Paths
	// fwd forwards the API server (and the mirror and the registry) to
	// the test host's loopback: fwd.SetFault(f.env.Host(), ...) cuts the
	// API server off from the host.
	fwd *nodestack.Forwarder
	// joined is what `kubectl unbounded join` made for the host
	// (firstBootOptions.join), nil otherwise.
	joined *fleet.Joined
	// prepared: the host boots from the run's prepared image
	// (firstBootOptions.prepared).
	prepared bool
}

type firstBootOptions struct {
	// mode is the isolation mode: "nspawn" (the default) or "none".
	mode string
	// extra is appended to agent.toml.
	extra string
	// nspawnArgs are added to the test host's systemd-nspawn command
	// line (binds of directories of the VM's own file system, say).
	nspawnArgs []string
	// offline forwards only the API server to the test host: the mirror's
	// and the registry's ports on its loopback stay closed, so base-url
	// and the image references in agent.toml reach nothing.
	offline bool
	// env is the control plane the host joins; nil: the shared one.
	env *kubeEnv
	// nodeIP is agent.toml's node.ip (empty: not set, the default
	// route's address).
	nodeIP string
	// join gives the host the files `kubectl unbounded join` writes
	// (lib/fleet.Join), the test's own settings in a drop-in beside
	// them; f.joined is what join made.
	join bool
	// serve are more loopback servers the host reaches at the same
	// address (nodestack.FirstBootOptions.Serve).
	serve []string
	// alsoNone: a host of mode nspawn that can also run mode none
	// (nodestack.FirstBootOptions.AlsoNone), for isolation changes.
	alsoNone bool
	// reg is the registry the host pulls from; nil: the test process's
	// shared one (nodestack.SharedRegistry), which every image this file
	// pushes is the same in (a tag names the same image in every test).
	// A test that makes its registry misbehave gives the host its own.
	reg *nodestack.Registry
	// gzipNode: the node image's root file system layer is gzip (the
	// default image's is zstd: nodestack.NodeImage).
	gzipNode bool
	// prepared boots the host from the run's prepared image (a host of
	// the default config whose image builder ran `unbounded prepare`:
	// sharedPreparedImage), as a fleet's image-built hosts boot: its
	// first boot takes the prepared tree instead of unpacking the node
	// image (wantBootstrapped checks that it did). For scenarios that
	// start from a Ready node of the default config (mode nspawn, the
	// default node image); a scenario of the first boot's own path
	// (unpack, its crash points, its failures) boots without it.
	prepared bool
}

func newFirstBoot(t *testing.T, o firstBootOptions) *firstBoot {
	t.Helper()
	if o.mode == "" {
		o.mode = "nspawn"
	}
	s := nodestack.Require(t)
	env := o.env
	if env == nil {
		env = requireKube(t)
	}
	harness.Require(t, true)
	f := &firstBoot{mode: o.mode, env: env, stage: s}
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	f.name = "fb-" + hex.EncodeToString(rnd[:])
	t.Cleanup(func() {
		ctx := context.Background()
		env.api.Delete().Resource(v1alpha3.ResourceMachines).Name(f.name).Do(ctx)
		env.kube.CoreV1().Nodes().Delete(ctx, f.name, metav1.DeleteOptions{})
	})

	f.reg = o.reg
	if f.reg == nil {
		f.reg = nodestack.SharedRegistry(t)
	}
	f.pause = f.reg.Push(t, "pause:3.10", s.PauseImage(t))
	f.app = f.reg.Push(t, "busybox:1.35", s.BusyboxImage(t))
	switch {
	case o.gzipNode:
		f.nodeRef = f.reg.Push(t, "unbounded/node:bookworm-gzip", s.NodeImageGzip(t))
	case o.mode != "none":
		f.nodeRef = f.reg.Push(t, "unbounded/node:bookworm", s.NodeImage(t))
	}
	f.mirrorDir = s.Mirror(t)
	f.mirror = nodestack.ServeArtifacts(t, f.mirrorDir)
	if o.join {
		f.joined = joinHost(t, env, f.name, o.mode, f.nodeRef, s.Versions["kubelet"])
	}
	h := nodestack.NewFirstBootHost(t, nodestack.FirstBootOptions{
		Env: env.Env, Stage: s, Name: f.name, Mode: o.mode,
		RegistryHost: f.reg.Host, MirrorURL: f.mirror.URL, Pause: f.pause, NodeRef: f.nodeRef,
		Offline: o.offline, Extra: o.extra, NodeIP: o.nodeIP, Joined: f.joined, Serve: o.serve, AlsoNone: o.alsoNone,
	})
	if o.prepared {
		h.Layers = []string{sharedPreparedImage(t)}
		f.prepared = true
	}
	f.fwd = h.Forward
	f.m = h.Machine(t, 8*time.Minute, o.nspawnArgs...)
	f.paths = hostpaths.New(f.m.Root())
	if _, err := config.Load(f.paths); err != nil {
		t.Fatalf("the first-boot config is not valid: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			f.diagnose(t)
		}
	})
	return f
}

// nodeRootOnHost is where the host finds the root of the node stack of
// mode in slot, as the mode says (modes.Mode.NodeRoot on the real host's
// paths).
func nodeRootOnHost(mode, slot string) string {
	m, err := all.For(mode, hostpaths.Paths{}, nil)
	if err != nil {
		panic(err)
	}
	return m.NodeRoot(slot)
}

// nodeIP is the address the Node must have: node.ip when the test sets
// it in agent.toml, else the test host's default route's.
func (f *firstBoot) nodeIP() string {
	if cfg, err := config.Load(f.paths); err == nil && cfg.Node.IP != "" {
		return cfg.Node.IP
	}
	return nodestack.NodeIP
}

// diagnose logs what explains a failed first boot.
func (f *firstBoot) diagnose(t *testing.T) {
	out, _ := f.m.Systemctl("status", "--no-pager", "-n", "0", "unbounded-*", "systemd-nspawn@*")
	t.Logf("units:\n%s", out)
	t.Logf("bootstrap journal:\n%s", f.m.Journal(bootstrapUnit))
	// This boot's fence, lifecycle and health: why the node did not
	// start (a fence that failed, and whether health retried it).
	out, _ = f.m.Run("sh", "-c", `journalctl --no-pager -q -b -o short-precise -u unbounded-fence -u unbounded-lifecycle -u unbounded-health | tail -n 60`)
	t.Logf("this boot's fence, lifecycle and health (last lines):\n%s", out)
	if n, err := f.env.kube.CoreV1().Nodes().Get(context.Background(), f.name, metav1.GetOptions{}); err == nil {
		for _, c := range n.Status.Conditions {
			t.Logf("Node condition %s=%s %s: %s", c.Type, c.Status, c.Reason, c.Message)
		}
	}
	// The kubelet logs its own errors at info priority (klog's E lines):
	// the last lines of each unit, without the kubelet's repeats of "not
	// registered yet" before it registers.
	node := `journalctl --no-pager -q -o short-precise -u containerd -u kubelet | grep -v -e "not registered yet" -e "from lister" | tail -n 80`
	if isActive(f.m, "systemd-nspawn@kube1.service") == "active" {
		out, _ = f.m.Run("sh", "-c", `systemd-run -M kube1 --wait --pipe -q sh -c '`+node+`' 2>&1`)
		t.Logf("node machine's kubelet and containerd (last lines):\n%s", out)
	}
	out, _ = f.m.Run("sh", "-c", `journalctl --no-pager -q -o short-precise -u unbounded-containerd -u unbounded-kubelet | grep -v -e "not registered yet" -e "from lister" | tail -n 80`)
	t.Logf("host's unbounded-containerd and unbounded-kubelet (last lines, mode none):\n%s", out)
}

// machine reads the Machine.
func (f *firstBoot) machine(t *testing.T) *v1alpha3.Machine {
	t.Helper()
	m := &v1alpha3.Machine{}
	if err := f.env.api.Get().Resource(v1alpha3.ResourceMachines).Name(f.name).Do(context.Background()).Into(m); err != nil {
		t.Fatalf("get Machine %s: %v", f.name, err)
	}
	return m
}

// nodeReady says whether the Node is Ready.
func (f *firstBoot) nodeReady(ctx context.Context) (bool, error) {
	return nodestack.NodeReady(ctx, f.env.kube, f.name)
}

// runPod creates a namespace and a Deployment of one pod pinned to the
// Node, and waits until its pod runs with an IP of the CNI bridge.
func (f *firstBoot) runPod(t *testing.T) (ns string) {
	t.Helper()
	ctx := context.Background()
	c := f.env.kube
	ns = newNamespace(t, c, "ns")
	dep := nodestack.SleeperDeployment(ns, f.name, f.app)
	if _, err := c.AppsV1().Deployments(ns).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitPodRunning(t, ns, 150*time.Second)
	return ns
}

// newNamespace creates a namespace named after prefix and the test,
// deleted at cleanup, and waits for its default ServiceAccount (a pod is
// refused before the controller made it).
func newNamespace(t *testing.T, c kubernetes.Interface, prefix string) string {
	t.Helper()
	ns := kubeenv.UniqueName(t, prefix)
	if _, err := c.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })
	waitUntil(t, 30*time.Second, "ServiceAccount default", func(ctx context.Context) (bool, error) {
		_, err := c.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	})
	return ns
}

// waitPodRunning waits until the namespace's one pod runs on the Node with
// an IP of the CNI bridge.
func (f *firstBoot) waitPodRunning(t *testing.T, ns string, timeout time.Duration) corev1.Pod {
	t.Helper()
	var pod corev1.Pod
	begin := time.Now()
	waitUntil(t, timeout, "the Deployment's pod Running on "+f.name, func(ctx context.Context) (bool, error) {
		pods, err := f.env.kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		for _, p := range pods.Items {
			if p.DeletionTimestamp == nil && p.Spec.NodeName == f.name && p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" {
				pod = p
				return true, nil
			}
		}
		return false, nil
	})
	t.Logf("pod %s Running with IP %s after %v", pod.Name, pod.Status.PodIP, time.Since(begin).Round(time.Millisecond))
	if !strings.HasPrefix(pod.Status.PodIP, "10.88.") {
		t.Errorf("pod IP %s, want one of the pod CIDR 10.88.0.0/16", pod.Status.PodIP)
	}
	return pod
}

func waitUntil(t *testing.T, timeout time.Duration, what string, cond func(ctx context.Context) (bool, error)) {
	t.Helper()
	begin := time.Now()
	err := wait.PollUntilContextTimeout(context.Background(), 250*time.Millisecond, timeout, true, cond)
	logWait(t, begin, what)
	if err != nil {
		t.Fatalf("%s: not within %v: %v", what, timeout, err)
	}
}

// logWait tells the tier summary (tests/tiersum) how long a scenario
// waited on a condition (the cluster's or the host's state) since begin;
// waits under a second are not worth a line.
func logWait(t *testing.T, begin time.Time, what string) {
	t.Helper()
	if d := time.Since(begin); d >= time.Second {
		t.Logf("timing: wait %.2fs (%s)", d.Seconds(), what)
	}
}

// wantBootstrapped asserts the end state of a successful first boot.
// wantPreparedTaken: a host booted from the run's prepared image
// (firstBootOptions.prepared) took the prepared tree at its first boot
// rather than unpacking the node image (its stamp matched the config).
func (f *firstBoot) wantPreparedTaken(t *testing.T) {
	t.Helper()
	if !f.prepared {
		return
	}
	if j := f.m.Journal(bootstrapUnit); !strings.Contains(j, "prepared by the image builder: taken") {
		t.Errorf("%s boots from the run's prepared image, but its first boot did not take the prepared tree:\n%s", f.name, j)
	}
}

func (f *firstBoot) wantBootstrapped(t *testing.T, mode, supervisor string) {
	t.Helper()
	m := f.m
	f.wantPreparedTaken(t)
	for _, u := range []string{"unbounded-node.target", supervisor, "unbounded-daemon.service"} {
		waitUntil(t, 60*time.Second, u+" active", func(context.Context) (bool, error) {
			return isActive(m, u) == "active", nil
		})
	}
	// Ready within a bound, not at once: after a power cut the daemon
	// may report the earlier bootstrap's outcome, and the units be
	// active, before the kubelet has posted Ready again (the node
	// lifecycle controller marked it Unknown meanwhile).
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := wait.PollUntilContextCancel(ctx, 250*time.Millisecond, true, f.nodeReady); err != nil {
		t.Errorf("Node %s is not Ready within 2m0s: %v", f.name, err)
	}
	// The Node's address is the host's, given to the kubelet, never
	// looked up: the host's resolver never answers (nodestack.DNSSink).
	if n, err := f.env.kube.CoreV1().Nodes().Get(context.Background(), f.name, metav1.GetOptions{}); err == nil {
		var internal []string
		for _, a := range n.Status.Addresses {
			if a.Type == corev1.NodeInternalIP {
				internal = append(internal, a.Address)
			}
		}
		if want := f.nodeIP(); !slices.Equal(internal, []string{want}) {
			t.Errorf("Node %s InternalIP %v, want %s (node.ip, or the default route's address)", f.name, internal, want)
		}
	}
	// Given, not found by the kubelet itself (which would look the name
	// up first, and wait on the resolver).
	machine := nodeRootOnHost(mode, "kube1")
	kubeletArgs := machine + "/etc/systemd/system/" + tree.KubeletUnit
	if mode == "none" {
		kubeletArgs = hostpaths.VersionsDirHost + "/current/etc/kubelet/kubelet.env"
	}
	if data, err := m.ReadFile(kubeletArgs); err != nil || !strings.Contains(string(data), "--node-ip="+f.nodeIP()) {
		t.Errorf("the kubelet is not given --node-ip=%s (%v):\n%s", f.nodeIP(), err, data)
	}
	if mode != "none" {
		if h, err := m.ReadFile(machine + "/etc/hosts"); err != nil || !strings.Contains(string(h), f.nodeIP()+"\t"+f.name+"\n") {
			t.Errorf("the node machine's /etc/hosts does not name %s at %s (%v):\n%s", f.name, f.nodeIP(), err, h)
		}
	}
	if q, err := m.Run("ss", "-Hnl", "src", nodestack.DNSSink); err == nil {
		t.Logf("DNS queries left unanswered at %s (ss: Recv-Q holds what was asked):\n%s", nodestack.DNSSink, q)
	}
	applied := f.paths.AppliedConfig("kube1")
	for _, p := range []string{applied, applied + ".sha256"} {
		if fi, err := os.Stat(p); err != nil {
			t.Errorf("applied config: %v", err)
		} else if fi.Mode().Perm()&0o077 != 0 {
			t.Errorf("%s has mode %o: state is root's only", f.paths.Rel(p), fi.Mode().Perm())
		}
	}
	if data, err := os.ReadFile(applied); err == nil && !strings.Contains(string(data), `"`+mode+`"`) {
		t.Errorf("applied config does not name mode %s:\n%s", mode, data)
	}
	for _, p := range []string{f.paths.Ownership(), f.paths.Journal("bootstrap")} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("bootstrap left %s (%v)", f.paths.Rel(p), err)
		}
	}
	mc := f.machine(t)
	if mc.Status.Bootstrap == nil || mc.Status.Bootstrap.State != v1alpha3.BootstrapSucceeded {
		t.Errorf("Machine status.bootstrap = %+v, want Succeeded", mc.Status.Bootstrap)
	}
	var cond *metav1.Condition
	for i := range mc.Status.Conditions {
		if mc.Status.Conditions[i].Type == v1alpha3.ConditionBootstrapped {
			cond = &mc.Status.Conditions[i]
		}
	}
	if cond == nil || cond.Status != metav1.ConditionTrue {
		t.Errorf("Machine condition Bootstrapped = %+v, want True", cond)
	}
	if out, err := m.Run("unbounded", "status"); err != nil {
		t.Errorf("unbounded status: %v\n%s", err, out)
	} else {
		t.Logf("unbounded status:\n%s", out)
	}
	if f := failedUnits(t, m, "unbounded*"); len(f) != 0 {
		t.Errorf("failed units after the first boot: %v", f)
	}
}

// TestFirstBootNspawnBringsUpAReadyNode: the headline scenario. The
// artifact mirror is down when the host boots: bootstrap exits 75 and
// the unit retries it; the mirror comes back and the first boot finishes
// without anyone touching the host. Then the node runs a Deployment's
// pod. Its node image's layer is gzip, as most registries serve layers
// (every other scenario's is zstd).
func TestFirstBootNspawnBringsUpAReadyNode(t *testing.T) {
	defer scenario(t)()
	f := newFirstBoot(t, firstBootOptions{gzipNode: true})
	f.mirror.Close()
	begin := time.Now()
	f.m.Start()
	t.Logf("boot with the mirror down: %v", time.Since(begin).Round(time.Millisecond))

	// A 75 leaves the unit activating (auto-restart) until RestartSec=.
	var p map[string]string
	waitUntil(t, 3*time.Minute, "bootstrap's first run ended", func(context.Context) (bool, error) {
		p = showProps(t, f.m, bootstrapUnit, "ExecMainStatus", "ExecMainExitTimestampMonotonic", "SubState")
		return p["ExecMainExitTimestampMonotonic"] != "0" && p["ExecMainExitTimestampMonotonic"] != "", nil
	})
	if p["ExecMainStatus"] != "75" || p["SubState"] == "failed" {
		t.Fatalf("bootstrap with the mirror down: %v, want exit 75 and a restart\n%s", p, f.m.Journal(bootstrapUnit))
	}
	if j := f.m.Journal(bootstrapUnit); !strings.Contains(j, f.mirror.URL) && !strings.Contains(j, "artifact") {
		t.Errorf("the journal does not say what was unreachable:\n%s", j)
	}
	f.mirror.Reopen(t)
	reopened := time.Now()
	waitUntil(t, 8*time.Minute, "bootstrap retried and finished", func(context.Context) (bool, error) {
		p := showProps(t, f.m, bootstrapUnit, "ActiveState", "SubState", "ExecMainStatus", "NRestarts")
		if p["ActiveState"] == "failed" {
			return false, fmt.Errorf("bootstrap failed: %v", p)
		}
		return p["NRestarts"] != "0" && p["ActiveState"] == "inactive" && p["SubState"] == "dead" && p["ExecMainStatus"] == "0", nil
	})
	t.Logf("bootstrap succeeded %v after the mirror came back", time.Since(reopened).Round(time.Millisecond))
	out, _ := f.m.Run("journalctl", "-q", "--no-pager", "-o", "short-precise", "-u", bootstrapUnit, "-g", "phase|ready|waiting")
	t.Logf("bootstrap's phases:\n%s", out)
	f.wantBootstrapped(t, "nspawn", "systemd-nspawn@kube1.service")
	ns := f.runPod(t)
	if t.Failed() {
		return
	}
	before := f.waitPodRunning(t, ns, time.Minute)

	// Reboot of the same host: its poweroff stops the machine through the
	// machine's logind, so the kubelet's graceful node shutdown ends the
	// pod (Failed, Terminated) within the period; the generator brings the
	// node back behind the fence, bootstrap does not run again, and the
	// Deployment's pod runs on the node again.
	rebooted := time.Now()
	f.powerOffEndsPod(t, ns, before.Name, f.m.Stop)
	f.m.Start()
	t.Logf("reboot (poweroff with the node running, then boot): %v", time.Since(rebooted).Round(time.Millisecond))
	if p := showProps(t, f.m, bootstrapUnit, "InvocationID"); p["InvocationID"] != "" {
		t.Errorf("bootstrap ran again at the reboot:\n%s", f.m.Journal(bootstrapUnit))
	}
	wantFencedUnit(t, f.m, "unbounded-mode-nspawn.target", "systemd-nspawn@kube1.service")
	for _, u := range []string{"unbounded-node.target", "systemd-nspawn@kube1.service", "unbounded-daemon.service"} {
		waitUntil(t, 2*time.Minute, u+" active after the reboot", func(context.Context) (bool, error) {
			return isActive(f.m, u) == "active", nil
		})
	}
	if p := showProps(t, f.m, fenceUnit, "InvocationID", "ExecMainStatus"); p["InvocationID"] == "" || p["ExecMainStatus"] != "0" {
		t.Errorf("the fence did not run and allow at the reboot: %v", p)
	}
	// The Node's status from before the reboot may still say Ready: what
	// counts is the Deployment's new pod Running on the node and a Ready
	// the kubelet reported since.
	f.waitPodRunningAgain(t, ns, before.Name)
	waitUntil(t, 2*time.Minute, "Node Ready reported after the reboot", func(ctx context.Context) (bool, error) {
		n, err := f.env.kube.CoreV1().Nodes().Get(ctx, f.name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady {
				return c.Status == corev1.ConditionTrue && c.LastHeartbeatTime.Time.After(rebooted), nil
			}
		}
		return false, nil
	})
	t.Logf("node and pod back %v after the reboot began", time.Since(rebooted).Round(time.Millisecond))
	if fu := failedUnits(t, f.m, "unbounded*"); len(fu) != 0 {
		t.Errorf("failed units after the reboot: %v", fu)
	}
}
