//go:build demo

// The demo of `make demo` (tests/demo/demo.sh runs it; the build tag keeps
// it out of `make test`, whose scenarios assert what it shows).
//
// It is a test binary because it reuses the system tier's fixtures, which
// live in tests: the booted systemd host with the .deb installed
// (tests/system/harness), the loopback artifact mirror and OCI registry
// with the real node stack (tests/system/nodestack), and the test control
// plane (tests/kubeenv, under tests/kube/with-env.sh). What it prints goes
// to standard output as it happens; the fixtures' own logs (t.Logf) show
// only when something fails.
//
// Ctrl-C (SIGINT) or SIGTERM: the host is powered off (its PID 1 gets
// SIGRTMIN+4), which ends whatever waits on it, and the test ends through
// its cleanups: machine stopped, overlay and forwarder sockets removed,
// cluster objects deleted. with-env.sh then stops the API server.
package demo_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/modes/facts"
	"unbounded-cloud.io/agent/tests/kubeenv"
	"unbounded-cloud.io/agent/tests/system/harness"
	"unbounded-cloud.io/agent/tests/system/nodestack"
)

func TestMain(m *testing.M) { harness.Main(m) }

const bootstrapUnit = "unbounded-bootstrap.service"

// sigPoweroff is systemd's "power off" signal, SIGRTMIN+4.
const sigPoweroff = syscall.Signal(38)

// out prints the demo's lines with the time since it started.
type out struct {
	mu    sync.Mutex
	begin time.Time
}

func (o *out) say(format string, args ...any) {
	o.mu.Lock()
	defer o.mu.Unlock()
	fmt.Printf("[%6.1fs] %s\n", time.Since(o.begin).Seconds(), fmt.Sprintf(format, args...))
}

func (o *out) step(format string, args ...any) {
	o.mu.Lock()
	defer o.mu.Unlock()
	fmt.Printf("\n[%6.1fs] == %s\n", time.Since(o.begin).Seconds(), fmt.Sprintf(format, args...))
}

// block prints text indented, under the last line.
func (o *out) block(text string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, l := range strings.Split(strings.TrimRight(text, "\n"), "\n") {
		fmt.Printf("           %s\n", l)
	}
}

func took(d time.Duration) string { return fmt.Sprintf("%.1fs", d.Seconds()) }

func TestDemo(t *testing.T) {
	o := &out{begin: time.Now()}
	if s := os.Getenv("UNBOUNDED_DEMO_START_NS"); s != "" {
		// demo.sh's start: the builds before this binary count too.
		if ns, err := strconv.ParseInt(s, 10, 64); err == nil {
			o.begin = time.Unix(0, ns)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var host atomic.Pointer[harness.Machine]
	var signalled, deployed, resetDone atomic.Bool
	// With UNBOUNDED_DEMO_BENCH=FILE (tests/bench.sh) the demo also writes
	// its measurements to FILE, one "NAME SECONDS" a line, measures the
	// floor's image unpack beside the artifact install (mode nspawn) or
	// the artifact install (mode none) and resets the host.
	bench := &benchOut{path: os.Getenv("UNBOUNDED_DEMO_BENCH")}
	// With UNBOUNDED_DEMO_MODE=none the host is a mode none host: the node
	// stack runs on it directly, no node image (tests/bench.sh measures
	// both modes).
	mode := os.Getenv("UNBOUNDED_DEMO_MODE")
	switch mode {
	case "":
		mode = "nspawn"
	case "nspawn", "container", "none":
	default:
		t.Fatalf("UNBOUNDED_DEMO_MODE=%q: want nspawn, container or none", mode)
	}
	// With UNBOUNDED_DEMO_ISOLATION=MODE (the other mode) the demo ends
	// with an isolation change: the Machine's spec.isolation.mode set to
	// MODE, the node moved in place (the host can run both modes).
	changeTo := os.Getenv("UNBOUNDED_DEMO_ISOLATION")
	if changeTo != "" && (changeTo == mode || (changeTo != "nspawn" && changeTo != "none")) {
		t.Fatalf("UNBOUNDED_DEMO_ISOLATION=%q: want the other mode than the host's %s (nspawn or none)", changeTo, mode)
	}
	// Registered first, so it runs last: every other cleanup is done.
	t.Cleanup(func() {
		o.say("cleaned up: host powered off, its overlay, cgroups and sockets removed, cluster objects deleted")
	})

	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	t.Cleanup(func() { signal.Stop(sigs) })
	go func() {
		n := 0
		for s := range sigs {
			n++
			signalled.Store(true)
			if n == 1 {
				o.say("%v: stopping (powering the host off, then cleaning up; this takes a few seconds)", s)
			} else {
				o.say("%v: still cleaning up", s)
			}
			cancel()
			if m := host.Load(); m != nil {
				if l := m.Leader(); l != 0 {
					_ = syscall.Kill(l, sigPoweroff)
				}
			}
		}
	}()
	interrupted := func() {
		t.Helper()
		if ctx.Err() != nil {
			t.Fatal("interrupted")
		}
	}

	o.step("control plane (tests/kube: etcd, kube-apiserver, controller-manager, scheduler, in one process)")
	env := kubeenv.Get(t)
	kube := env.Client()
	o.say("API server at %s", env.Host())

	o.step("the cluster side: unbounded-controller (here a process beside the control plane; in a cluster a Deployment: unbounded manifests --controller-image)")
	controller := startController(t, o)

	o.step("node stack: artifact mirror and OCI registry on loopback")
	s := nodestack.Require(t)
	reg := nodestack.StartRegistry(t)
	begin := time.Now()
	pause := reg.Push(t, "pause:3.10", s.PauseImage(t))
	app := reg.Push(t, "busybox:1.35", s.BusyboxImage(t))
	nodeRef, pushed := "", "pause, busybox"
	if mode != "none" || changeTo == "nspawn" {
		nodeRef, pushed = reg.Push(t, "unbounded/node:bookworm", s.NodeImage(t)), "node image, pause, busybox"
	}
	o.say("registry %s: %s pushed in %s", reg.Host, pushed, took(time.Since(begin)))
	mirrorDir := s.Mirror(t)
	mirror := nodestack.ServeArtifacts(t, mirrorDir)
	o.say("mirror %s: kubelet %s, containerd %s, runc %s, CNI plugins %s, CoreDNS %s (the node-local DNS cache), with SHA256SUMS",
		mirror.URL, s.Versions["kubelet"], s.Versions["containerd"], s.Versions["runc"], s.Versions["cni-plugins"], s.Versions["coredns"])
	interrupted()

	o.step("host: a systemd container with the .deb installed and /etc/unbounded/agent.toml (mode %s)", mode)
	var rnd [3]byte
	_, _ = rand.Read(rnd[:])
	name := "demo-" + hex.EncodeToString(rnd[:]) // the Machine's, the Node's and the host's name
	machines := env.Dynamic().Resource(schema.GroupVersionResource{Group: v1alpha3.SchemeGroupVersion.Group, Version: v1alpha3.SchemeGroupVersion.Version, Resource: v1alpha3.ResourceMachines})
	t.Cleanup(func() {
		ctx := context.Background()
		machines.Delete(ctx, name, metav1.DeleteOptions{})
		kube.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{})
	})
	// What the host gets, and why: nodestack.FirstBootHost.
	h := nodestack.NewFirstBootHost(t, nodestack.FirstBootOptions{
		Env: env, Stage: s, Name: name, Mode: mode,
		RegistryHost: reg.Host, MirrorURL: mirror.URL, Pause: pause, NodeRef: nodeRef,
		AlsoNone: changeTo == "none",
	})
	begin = time.Now()
	m := h.Machine(t, 10*time.Minute)
	host.Store(m)
	switch v := os.Getenv("UNBOUNDED_DEMO_LOCAL_DNS"); v {
	case "":
	case "true", "false":
		m.WriteFile("/etc/unbounded/agent.toml.d/50-local-dns.toml", []byte("[node]\nlocal-dns = "+v+"\n"), 0o644)
		o.say("node.local-dns = %s (a drop-in)", v)
	default:
		t.Fatalf("UNBOUNDED_DEMO_LOCAL_DNS=%q: want true or false", v)
	}
	// Runs before the harness powers the host off: the node stack is
	// stopped first, in the order systemd stops it on a poweroff, so the
	// demo can say how long it takes.
	t.Cleanup(func() {
		if signalled.Load() || resetDone.Load() || m.Leader() == 0 {
			return
		}
		begin := time.Now()
		// The pod first, by its kubelet: a pod's process left to the
		// node machine's poweroff holds it for minutes (systemd-nspawn
		// waits for it, then for its SIGKILL).
		if deployed.Load() {
			o.say("deleting the Deployment; waiting for its pod to stop")
			kube.AppsV1().Deployments("demo").Delete(context.Background(), "sleeper", metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationForeground)})
			err := wait.PollUntilContextTimeout(context.Background(), 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
				pods, err := kube.CoreV1().Pods("demo").List(ctx, metav1.ListOptions{})
				return err == nil && len(pods.Items) == 0, nil
			})
			if err != nil {
				o.say("the pod did not stop within 2m: %v", err)
			}
		}
		o.say("stopping the node (systemctl stop unbounded-node.target in the host)")
		stop := []string{"stop", "unbounded-daemon.service", "unbounded-node.target", "systemd-nspawn@kube1.service", "systemd-nspawn@kube2.service",
			"unbounded-container@kube1.service", "unbounded-container@kube2.service", "unbounded-kubelet.service", "unbounded-containerd.service"}
		if out, err := m.Systemctl(stop...); err != nil {
			o.say("stopping the node: %v\n%s", err, out)
		}
		o.say("node stopped in %s", took(time.Since(begin)))
	})
	o.say("host %s ready to boot in %s (package installed with dpkg -i in a booted copy of the rootfs; the host's root is an overlay on it)", m.Name, took(time.Since(begin)))
	o.say("%s (the bootstrap token file, 0600, is not shown):", hostpaths.ConfigFileHost)
	o.block(h.Config)
	interrupted()

	o.step("boot: systemd starts; unbounded-bootstrap.service turns the host into a node")
	f := &follower{o: o, m: m}
	followDone := make(chan struct{})
	followCtx, stopFollow := context.WithCancel(ctx)
	go func() { defer close(followDone); f.run(followCtx) }()
	bootBegin := time.Now()
	m.Start()
	stopFollow()
	<-followDone
	f.poll(ctx) // what came after the last poll
	o.say("boot finished (%s, bootstrap included) in %s", m.State, took(time.Since(bootBegin)))
	f.summary(bootBegin)
	f.record(bench)
	interrupted()

	o.step("Node Ready")
	var node *corev1.Node
	waitUntil(t, ctx, 2*time.Minute, "Node "+name+" Ready", func(ctx context.Context) (bool, error) {
		n, err := kube.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
				node = n
				return true, nil
			}
		}
		return false, nil
	})
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			o.say("Node %s Ready since %s (%s after the boot started), kubelet %s, %s",
				name, c.LastTransitionTime.Format("15:04:05"), took(c.LastTransitionTime.Sub(bootBegin.Truncate(time.Second))),
				node.Status.NodeInfo.KubeletVersion, node.Status.NodeInfo.ContainerRuntimeVersion)
		}
	}
	bench.kubeletStart(t, ctx, o, kube, m, "firstboot", name, bootstrapUnit, bootBegin)
	if controller {
		o.step("the host's certificate requests, decided by unbounded-controller")
		showApprovals(t, ctx, o, kube, name, bootBegin)
	}

	o.step("unbounded status (inside the host)")
	st, err := m.Run("unbounded", "status")
	if err != nil {
		t.Fatalf("unbounded status: %v\n%s", err, st)
	}
	o.block(st)
	units, _ := m.Systemctl("list-units", "--no-legend", "--plain", "unbounded-*", "systemd-nspawn@*")
	o.say("$ systemctl list-units 'unbounded-*' 'systemd-nspawn@*'")
	o.block(units)
	interrupted()

	o.step("a Deployment, placed by the scheduler, runs a pod on the node")
	ns := "demo"
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { kube.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })
	waitUntil(t, ctx, time.Minute, "ServiceAccount default in "+ns, func(ctx context.Context) (bool, error) {
		_, err := kube.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	})
	dep := nodestack.SleeperDeployment(ns, name, app)
	begin = time.Now()
	if _, err := kube.AppsV1().Deployments(ns).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	deployed.Store(true)
	o.say("Deployment %s/%s created (image %s, pinned to %s)", ns, dep.Name, app, name)
	var pod corev1.Pod
	phase := ""
	waitUntil(t, ctx, 3*time.Minute, "the Deployment's pod Running", func(ctx context.Context) (bool, error) {
		pods, err := kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil || len(pods.Items) == 0 {
			return false, nil
		}
		p := pods.Items[0]
		if now := string(p.Status.Phase) + " on " + p.Spec.NodeName; now != phase && p.Spec.NodeName != "" {
			phase = now
			o.say("pod %s: %s", p.Name, now)
		}
		if p.Spec.NodeName == name && p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" {
			pod = p
			return true, nil
		}
		return false, nil
	})
	o.say("pod %s Running on %s with IP %s, %s after the Deployment was created", pod.Name, pod.Spec.NodeName, pod.Status.PodIP, took(time.Since(begin)))
	if mode != "none" {
		// The memory of the node's supervisor on the host (nspawn's
		// machine or the container's runtime: systemd-nspawn either
		// way), the node running a pod.
		sup := facts.KubeletHost(mode, "kube1")
		if pid, err := m.Systemctl("show", "-p", "MainPID", "--value", sup); err == nil {
			if rss, err := m.Run("ps", "-o", "rss=", "-p", strings.TrimSpace(pid)); err == nil {
				o.say("%s's supervisor (systemd-nspawn, PID %s): %s KiB resident", sup, strings.TrimSpace(pid), strings.TrimSpace(rss))
				bench.lines = append(bench.lines, "supervisor.rss-kib "+strings.TrimSpace(rss))
			}
		}
	}

	if bench.path != "" {
		// A restart of the node stack (the node only, never the host): the
		// unit's run holds the stop, the start and the wait for a healthy
		// kubelet; then the Node Ready as the cluster sees it.
		o.step("bench: $ systemctl start unbounded-restart.service")
		begin := time.Now()
		// Ready as the restarted kubelet wrote it, watched while the
		// unit runs (its run holds a settle window after it): the
		// cluster keeps the stopped kubelet's Ready for 40 s, so only a
		// heartbeat since the start of the unit that runs the kubelet
		// (known once the restart is done) counts.
		type seen struct {
			at        time.Duration
			heartbeat time.Time
		}
		var (
			mu    sync.Mutex
			seens []seen
		)
		watch, stopWatch := context.WithTimeout(ctx, 3*time.Minute)
		defer stopWatch()
		go wait.PollUntilContextCancel(watch, 250*time.Millisecond, true, func(ctx context.Context) (bool, error) {
			n, err := kube.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			for _, c := range n.Status.Conditions {
				if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
					mu.Lock()
					seens = append(seens, seen{time.Since(begin), c.LastHeartbeatTime.Time})
					mu.Unlock()
				}
			}
			return false, nil
		})
		if out, err := m.Systemctl("start", "unbounded-restart.service"); err != nil {
			t.Fatalf("systemctl start unbounded-restart.service: %v\n%s\n%s", err, out, m.Journal("unbounded-restart.service"))
		}
		unit := time.Since(begin)
		sup := facts.KubeletHost(mode, "kube1")
		started, err := m.Systemctl("show", "-p", "ExecMainStartTimestamp", "--value", "--timestamp=unix", sup)
		var kubeletFrom time.Time
		if v, ok := strings.CutPrefix(strings.TrimSpace(started), "@"); err == nil && ok {
			if sec, err := strconv.ParseInt(v, 10, 64); err == nil {
				kubeletFrom = time.Unix(sec, 0)
			}
		}
		if kubeletFrom.IsZero() {
			t.Fatalf("%s's start after the restart: %q %v", sup, started, err)
		}
		ready := time.Duration(-1)
		waitUntil(t, ctx, 3*time.Minute, "Node Ready from the restarted kubelet", func(ctx context.Context) (bool, error) {
			mu.Lock()
			defer mu.Unlock()
			for _, s := range seens {
				if !s.heartbeat.Before(kubeletFrom) {
					ready = s.at
					return true, nil
				}
			}
			return false, nil
		})
		stopWatch()
		bench.add("restart.unit", unit)
		bench.add("restart.ready", ready)
		o.say("restart: the unit's run %s, Node Ready (a heartbeat since its start) %s after its start", took(unit), took(ready))

		// The host's poweroff with the pod running, as an operator's
		// `systemctl poweroff` (through logind: the kubelet's graceful
		// node shutdown ends the pod, whose PID 1 ignores SIGTERM, within
		// its grace period), to the host gone; then its boot, to the pod
		// running again on the node it brings up.
		o.step("bench: $ systemctl poweroff   (the host, the pod running), then its boot")
		begin = time.Now()
		m.PowerOffThroughLogind()
		off := time.Since(begin)
		bench.add("poweroff", off)
		if p, err := kube.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{}); err == nil {
			o.say("poweroff: %s; pod %s %s (%s: %s)", took(off), p.Name, p.Status.Phase, p.Status.Reason, p.Status.Message)
		}
		booted := time.Now()
		m.Start()
		waitUntil(t, ctx, 5*time.Minute, "the Deployment's pod Running again after the host's boot", func(ctx context.Context) (bool, error) {
			pods, err := kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				return false, nil
			}
			for _, p := range pods.Items {
				if p.Spec.NodeName != name || p.Status.Phase != corev1.PodRunning || p.DeletionTimestamp != nil {
					continue
				}
				for _, c := range p.Status.ContainerStatuses {
					if r := c.State.Running; r != nil && r.StartedAt.After(booted) {
						pod = p
						return true, nil
					}
				}
			}
			return false, nil
		})
		o.say("boot after the poweroff: pod %s Running again %s after the host's start", pod.Name, took(time.Since(booted)))
	}

	o.step("$ kubectl get nodes,pods -o wide -n %s   (the API server's own table, as kubectl prints it)", ns)
	if err := printTables(ctx, kube, ns); err != nil {
		t.Fatal(err)
	}
	d := &repaveDemo{o: o, m: m, env: env, kube: kube, reg: reg, stage: s, mirrorDir: mirrorDir, name: name, ns: ns, bench: bench}
	if mode != "none" {
		d.run(t, ctx)
	} else {
		d.runNone(t, ctx)
	}
	if changeTo != "" {
		interrupted()
		d.isolationChange(t, ctx, machines, mode, changeTo)
	}
	interrupted()
	if bench.path != "" {
		o.step("bench: unbounded reset --yes, then the floor in the reset host")
		begin = time.Now()
		resetDone.Store(true)
		out, rerr := resetHost(ctx, m)
		bench.add("reset", time.Since(begin))
		if rerr != nil {
			// Measured and shown, not fatal: the bench reports it.
			bench.lines = append(bench.lines, "reset.failed 1")
			o.say("unbounded reset --yes FAILED after %s: %v", took(time.Since(begin)), rerr)
			o.block(string(out))
		} else {
			o.say("unbounded reset --yes (the pod still running) in %s", took(time.Since(begin)))
		}
		// The floor is measured in the reset host, as a first boot finds
		// it: measured beside the running node, its kubelet, containerd
		// and pod on the same two cores, the unpack took twice the
		// first boot's own (10.3 s against 6.4 s).
		if mode != "none" {
			// The slot's floor is its payload put in place by hand: the
			// node image pulled and unpacked, and the node stack's
			// artifacts (kubelet, containerd, runc, CNI plugins)
			// downloaded, checked and unpacked beside it, as the agent
			// does them. Mode none's floor holds the same install; a
			// floor of the unpack alone counted the node stack's
			// binaries, which the machine cannot start without, against
			// the agent. Each alone is shown too (floorpart.*, not in
			// the sum).
			o.step("bench: the floor's image pull and unpack in the reset host beside the artifacts' install by hand")
			// On a quiet disk, as the first boot finds it: the reset's
			// removals (the node's tree) written out first, so that the
			// floor does not pay for them.
			if out, err := m.Run("sync"); err != nil {
				t.Fatalf("sync in the host: %v\n%s", err, out)
			}
			begin = time.Now()
			type installed struct {
				n   int64
				d   time.Duration
				err error
			}
			inst := make(chan installed, 1)
			instDir := floorDir(t, m)
			go func() {
				defer os.RemoveAll(instDir)
				n, err := installByHand(ctx, mirror.URL, s, instDir)
				inst <- installed{n, time.Since(begin), err}
			}()
			files, bytes, secs, err := floorUnpack(t, ctx, m, nodeRef)
			in := <-inst
			slot := time.Since(begin)
			if err != nil {
				t.Fatalf("the floor's unpack of %s: %v", nodeRef, err)
			}
			if in.err != nil {
				t.Fatalf("the floor's artifacts by hand: %v", in.err)
			}
			bench.add("floor.slot", slot)
			bench.add("floorpart.unpack", secs)
			bench.add("floorpart.install", in.d)
			o.say("node image pulled and unpacked by hand in the host (lib/modes/bluegreen/tree.Unpack, tests/demo/floorunpack): %d files, %d MB in %s; beside it the artifacts downloaded, checked and unpacked by hand: %d MB in %s; both done in %s",
				files, bytes>>20, took(secs), in.n>>20, took(in.d), took(slot))
		} else {
			o.step("bench: the floor's artifact install in the reset host")
			begin = time.Now()
			dir := floorDir(t, m)
			n, err := installByHand(ctx, mirror.URL, s, dir)
			if err != nil {
				t.Fatalf("the artifacts by hand: %v", err)
			}
			bench.add("floor.install", time.Since(begin))
			os.RemoveAll(dir)
			o.say("artifacts downloaded from the mirror, checked against its SHA256SUMS and unpacked by hand: %d MB in %s", n>>20, took(time.Since(begin)))
		}
		if rerr == nil {
			firstBootLoop(t, ctx, o, kube, m, name, bench)
		}
		if err := bench.write(); err != nil {
			t.Fatal(err)
		}
	}
	what := "a host with a config file became a Ready node running a pod"
	if mode != "none" {
		what += ", repaved blue/green into its other slot"
	} else {
		what += ", repaved in place to another Kubernetes version"
	}
	if changeTo != "" {
		what += ", then moved into mode " + changeTo + " by its Machine's spec"
	}
	o.step("done: %s, %s since make demo started; cleaning up", what, took(time.Since(o.begin)))
}

// resetHost runs `unbounded reset --yes` in the host. Not m.Run: its
// 2-minute bound is shorter than a reset of a node with a running pod
// takes here.
func resetHost(ctx context.Context, m *harness.Machine) ([]byte, error) {
	rctx, rcancel := context.WithTimeout(ctx, 10*time.Minute)
	defer rcancel()
	cmd := exec.CommandContext(rctx, "nsenter", "-t", strconv.Itoa(m.Leader()), "-a", "--", "unbounded", "reset", "--yes")
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"}
	return cmd.CombinedOutput()
}

// firstBootLoop, after the host's reset, makes it a node again
// UNBOUNDED_DEMO_FIRSTBOOTS times (bounded: at most 100), each time with
// its Node deleted first, as on a fresh host, and resets it after each:
// it adds to the bench file the longest first boot (the bootstrap unit's
// start to its end, Node Ready included) and how many of them restarted
// the node stack for the kubelet's CSINode (the ready wait's guard; goal:
// none).
func firstBootLoop(t *testing.T, ctx context.Context, o *out, kube kubernetes.Interface, m *harness.Machine, name string, bench *benchOut) {
	t.Helper()
	n, _ := strconv.Atoi(os.Getenv("UNBOUNDED_DEMO_FIRSTBOOTS"))
	if n <= 0 {
		return
	}
	n = min(n, 100)
	o.step("bench: %d more first boots of the reset host, every second one from a prepared image (unbounded prepare --root / after the reset), counting the node stack restarts for the kubelet's CSINode", n)
	restarts := 0
	var longest time.Duration
	var plain, prepared []time.Duration
	for i := 1; i <= n; i++ {
		if err := kube.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Fatalf("first boot %d of %d: delete Node %s: %v", i, n, name, err)
		}
		// Paired with the unprepared ones in one run: what an image
		// builder's prepare saves a first boot (issue 42).
		fromImage := i%2 == 0
		if fromImage {
			if out, err := prepareHost(ctx, m); err != nil {
				t.Fatalf("first boot %d of %d: unbounded prepare --root /: %v\n%s", i, n, err, out)
			}
		}
		begin := time.Now()
		m.Systemctl("reset-failed", bootstrapUnit)
		if out, err := m.Systemctl("start", "--no-block", bootstrapUnit); err != nil {
			t.Fatalf("start %s: %v\n%s", bootstrapUnit, err, out)
		}
		if !waitUnitEnd(t, ctx, m, bootstrapUnit, begin, nil) {
			t.Fatalf("first boot %d of %d failed:\n%s", i, n, m.Journal(bootstrapUnit))
		}
		took := time.Since(begin)
		longest = max(longest, took)
		lines := unitJournal(t, m, bootstrapUnit, begin)
		restarts += csinodeRestarts(lines)
		if fromImage {
			taken := false
			for _, l := range lines {
				taken = taken || strings.Contains(l.msg, "prepared by the image builder: taken")
			}
			if !taken && os.Getenv("UNBOUNDED_DEMO_MODE") != "none" {
				t.Fatalf("first boot %d of %d after unbounded prepare did not take the prepared tree:\n%s", i, n, m.Journal(bootstrapUnit))
			}
			prepared = append(prepared, took)
		} else {
			plain = append(plain, took)
		}
		if out, err := resetHost(ctx, m); err != nil {
			t.Fatalf("reset after first boot %d of %d: %v\n%s", i, n, err, out)
		}
	}
	o.say("%d first boots: %d CSINode restarts, slowest %s (unit start -> its end, Node Ready included)", n, restarts, took(longest))
	bench.lines = append(bench.lines, fmt.Sprintf("firstboot.loop.runs %d", n), fmt.Sprintf("firstboot.loop.csinode-restarts %d", restarts))
	bench.add("firstboot.loop.unit-max", longest)
	if len(prepared) > 0 && len(plain) > 0 {
		o.say("first boots, unit start -> its end (Node Ready included), median: %s unprepared, %s from a prepared image", took(median(plain)), took(median(prepared)))
		bench.add("firstboot.loop.plain-median", median(plain))
		bench.add("firstboot.loop.prepared-median", median(prepared))
	}
}

// prepareHost runs `unbounded prepare --root /` in m (reset: the host
// root is gone), as an image builder runs it in an image's root.
func prepareHost(ctx context.Context, m *harness.Machine) ([]byte, error) {
	pctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(pctx, "nsenter", "-t", strconv.Itoa(m.Leader()), "-a", "--", "unbounded", "prepare", "--root", "/")
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"}
	return cmd.CombinedOutput()
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// waitUnitEnd waits for the end of unit's run in m started after begin,
// passing each journal line of the run to show once (nil: none); it
// returns whether the run succeeded.
func waitUnitEnd(t *testing.T, ctx context.Context, m *harness.Machine, unit string, begin time.Time, show func(journalLine)) bool {
	t.Helper()
	ok := false
	shown := 0
	waitUntil(t, ctx, 15*time.Minute, unit+" ended", func(context.Context) (bool, error) {
		lines := unitJournal(t, m, unit, begin)
		for ; show != nil && shown < len(lines); shown++ {
			if l := lines[shown]; !l.at.Before(begin) {
				show(l)
			}
		}
		for _, l := range lines {
			if l.at.Before(begin) {
				// The query reaches a second back: the end of a run
				// before this one is not this run's.
				continue
			}
			switch {
			case strings.HasPrefix(l.msg, unit+": Deactivated successfully"):
				ok = true
				return true, nil
			case strings.HasPrefix(l.msg, unit+": Failed with result"):
				return true, nil
			}
		}
		return false, nil
	})
	return ok
}

func waitUntil(t *testing.T, ctx context.Context, timeout time.Duration, what string, cond func(ctx context.Context) (bool, error)) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, timeout, true, cond); err != nil {
		t.Fatalf("%s: not within %v: %v", what, timeout, err)
	}
}

// follower prints unbounded-bootstrap.service's journal as it is written,
// and times its phases (each "phase NAME: ..." line, which bootstrap also
// sends as STATUS=, starts one).
type follower struct {
	o      *out
	m      *harness.Machine
	cursor string
	phases []phaseMark
	start  time.Time // systemd's "Starting ..." of the unit
	end    time.Time // its "Finished ..." (or deactivation)
}

type phaseMark struct {
	name string
	at   time.Time
}

func (f *follower) run(ctx context.Context) {
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		f.poll(ctx)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// poll prints the journal entries written since the last poll. The
// machine's journal may not be up yet early in the boot: no entries then.
func (f *follower) poll(ctx context.Context) {
	leader := f.m.Leader()
	if leader == 0 {
		return
	}
	args := []string{"-t", strconv.Itoa(leader), "-a", "--", "journalctl", "--no-pager", "-q", "-b", "-o", "json", "-u", bootstrapUnit}
	if f.cursor != "" {
		args = append(args, "--after-cursor="+f.cursor)
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(cctx, "nsenter", args...)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"}
	data, err := cmd.Output()
	if err != nil && len(data) == 0 {
		return
	}
	sc := bufio.NewScanner(strings.NewReader(string(data)))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var e map[string]any
		if json.Unmarshal(sc.Bytes(), &e) != nil {
			continue
		}
		f.cursor, _ = e["__CURSOR"].(string)
		msg, _ := e["MESSAGE"].(string) // binary messages are arrays: not ours
		us, _ := strconv.ParseInt(fmt.Sprint(e["__REALTIME_TIMESTAMP"]), 10, 64)
		at := time.UnixMicro(us)
		f.entry(at, msg)
	}
}

func (f *follower) entry(at time.Time, msg string) {
	switch {
	case strings.HasPrefix(msg, "Starting ") && f.start.IsZero():
		f.start = at
	case strings.HasPrefix(msg, "Finished ") || strings.HasSuffix(msg, "Deactivated successfully."):
		if f.end.IsZero() {
			f.end = at
		}
	case strings.HasPrefix(msg, "phase "):
		name, _, _ := strings.Cut(strings.TrimPrefix(msg, "phase "), ":")
		if n := len(f.phases); n == 0 || f.phases[n-1].name != name {
			if n > 0 {
				f.o.say("   (%s took %s)", f.phases[n-1].name, took(at.Sub(f.phases[n-1].at)))
			}
			f.phases = append(f.phases, phaseMark{name, at})
		}
	}
	if len(msg) > 160 {
		msg = msg[:157] + "..."
	}
	f.o.say("bootstrap: %s", msg)
}

// summary prints each phase's duration: from its first line to the next
// phase's (the last one to the unit's end).
func (f *follower) summary(bootBegin time.Time) {
	if len(f.phases) == 0 {
		f.o.say("no bootstrap phases seen in the journal")
		return
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "           \tphase\tseconds\t")
	if !f.start.IsZero() {
		fmt.Fprintf(w, "           \thost boot until bootstrap starts\t%.1f\t\n", f.start.Sub(bootBegin).Seconds())
	}
	end := f.end
	for i, p := range f.phases {
		next := end
		if i+1 < len(f.phases) {
			next = f.phases[i+1].at
		}
		if next.IsZero() {
			continue
		}
		fmt.Fprintf(w, "           \t%s\t%.1f\t\n", p.name, next.Sub(p.at).Seconds())
	}
	if !f.start.IsZero() && !end.IsZero() {
		fmt.Fprintf(w, "           \tunbounded-bootstrap.service in all\t%.1f\t\n", end.Sub(f.start).Seconds())
	}
	f.o.mu.Lock()
	w.Flush()
	f.o.mu.Unlock()
}

// printTables prints `kubectl get nodes,pods -o wide` as kubectl would:
// the API server's table (Accept: as=Table, the same columns and cells
// kubectl shows, -o wide being every column), names prefixed with the
// resource as kubectl does when it gets more than one kind.
func printTables(ctx context.Context, kube kubernetes.Interface, ns string) error {
	for _, r := range []struct{ kind, path string }{{"node", "/api/v1/nodes"}, {"pod", "/api/v1/namespaces/" + ns + "/pods"}} {
		raw, err := kube.CoreV1().RESTClient().Get().AbsPath(r.path).
			SetHeader("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io").DoRaw(ctx)
		if err != nil {
			return fmt.Errorf("get %s: %w", r.path, err)
		}
		var tbl metav1.Table
		if err := json.Unmarshal(raw, &tbl); err != nil {
			return fmt.Errorf("table of %s: %w", r.path, err)
		}
		w := tabwriter.NewWriter(os.Stdout, 0, 0, 3, ' ', 0)
		var head []string
		for _, c := range tbl.ColumnDefinitions {
			head = append(head, strings.ToUpper(c.Name))
		}
		fmt.Fprintln(w, "           "+strings.Join(head, "\t"))
		rows := tbl.Rows
		sort.SliceStable(rows, func(i, j int) bool { return fmt.Sprint(rows[i].Cells[0]) < fmt.Sprint(rows[j].Cells[0]) })
		for _, row := range rows {
			var cells []string
			for i, c := range row.Cells {
				s := fmt.Sprint(c)
				if i == 0 {
					s = r.kind + "/" + s
				}
				if s == "" {
					s = "<none>"
				}
				cells = append(cells, s)
			}
			fmt.Fprintln(w, "           "+strings.Join(cells, "\t"))
		}
		w.Flush()
		fmt.Println()
	}
	return nil
}

// floorUnpack runs tests/demo/floorunpack in the host: the node image
// pulled from ref as the host's agent pulls it (its network, its port
// forward to the registry) and unpacked into a directory on the host's
// file system, in the host's cgroup, by the code the mode runs.
func floorUnpack(t *testing.T, ctx context.Context, m *harness.Machine, ref string) (files int, bytes int64, d time.Duration, err error) {
	t.Helper()
	src := os.Getenv("UNBOUNDED_DEMO_FLOORUNPACK") // demo.sh builds it
	if src == "" {
		return 0, 0, 0, errors.New("UNBOUNDED_DEMO_FLOORUNPACK is not set (tests/demo/demo.sh builds tests/demo/floorunpack for the bench)")
	}
	data, err := os.ReadFile(src)
	if err != nil {
		return 0, 0, 0, err
	}
	bin := filepath.Join(m.Root(), "var/tmp/unbounded-bench-floorunpack")
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		return 0, 0, 0, err
	}
	defer os.Remove(bin)
	dir := floorDir(t, m)
	defer os.RemoveAll(dir)
	out, err := m.Run("/var/tmp/"+filepath.Base(bin), ref, "/"+strings.TrimPrefix(strings.TrimPrefix(dir, m.Root()), "/"))
	if err != nil {
		return 0, 0, 0, fmt.Errorf("%v\n%s", err, out)
	}
	var secs float64
	if _, err := fmt.Sscanf(strings.TrimSpace(out), "%d %d %f", &files, &bytes, &secs); err != nil {
		return 0, 0, 0, fmt.Errorf("floorunpack said %q: %v", out, err)
	}
	return files, bytes, time.Duration(secs * float64(time.Second)), nil
}

// floorDir is where the floor unpacks by hand: a directory on the host's
// own file system (its overlay root, through the mount the harness made),
// where the agent writes its slot, so that the floor and the first boot
// pay for the same file system. (Before, the floor unpacked into the
// test process's temporary directory on this machine's disk, and the
// overlay's cost counted against the agent.)
func floorDir(t *testing.T, m *harness.Machine) string {
	t.Helper()
	dir, err := os.MkdirTemp(filepath.Join(m.Root(), "var/tmp"), "unbounded-bench-floor-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// installByHand is the floor's artifact install in mode none: each
// artifact downloaded from the mirror, its SHA-256 checked against the
// mirror's SHA256SUMS, the tarballs unpacked (tar) and the binaries made
// executable, under dir. It returns the bytes downloaded.
func installByHand(ctx context.Context, mirrorURL string, s *nodestack.Stage, dir string) (int64, error) {
	get := func(rel string, w io.Writer) (int64, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, mirrorURL+"/"+rel, nil)
		if err != nil {
			return 0, err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return 0, fmt.Errorf("GET %s: %s", rel, resp.Status)
		}
		return io.Copy(w, resp.Body)
	}
	var sums strings.Builder
	if _, err := get("SHA256SUMS", &sums); err != nil {
		return 0, err
	}
	want := map[string]string{}
	for _, l := range strings.Split(sums.String(), "\n") {
		if sum, rel, ok := strings.Cut(l, "  "); ok {
			want[rel] = sum
		}
	}
	var total int64
	for _, a := range nodestack.Artifacts {
		rel := s.Path(a)
		file := filepath.Join(dir, filepath.Base(rel))
		f, err := os.OpenFile(file, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
		if err != nil {
			return 0, err
		}
		h := sha256.New()
		n, err := get(rel, io.MultiWriter(f, h))
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return 0, err
		}
		total += n
		if got := hex.EncodeToString(h.Sum(nil)); got != want[rel] {
			return 0, fmt.Errorf("%s: SHA-256 %s, the mirror's SHA256SUMS says %q", rel, got, want[rel])
		}
		if strings.HasSuffix(rel, ".tar.gz") || strings.HasSuffix(rel, ".tgz") {
			into := filepath.Join(dir, a)
			if err := os.MkdirAll(into, 0o755); err != nil {
				return 0, err
			}
			if out, err := exec.CommandContext(ctx, "tar", "-xzf", file, "-C", into).CombinedOutput(); err != nil {
				return 0, fmt.Errorf("unpack %s: %v\n%s", rel, err, out)
			}
		}
	}
	return total, nil
}

// benchOut collects the measurements tests/bench.sh prints.
type benchOut struct {
	path  string
	lines []string
}

func (b *benchOut) add(name string, d time.Duration) {
	b.lines = append(b.lines, fmt.Sprintf("%s %.3f", name, d.Seconds()))
}

func (b *benchOut) write() error {
	if b.path == "" {
		return nil
	}
	return os.WriteFile(b.path, []byte(strings.Join(b.lines, "\n")+"\n"), 0o644)
}

// record adds the first boot's measurements: each phase, and from the
// unit's start to the end of the ready phase (bootstrap saw the Node
// Ready), which is `systemctl start unbounded-bootstrap.service` to Node
// Ready.
func (f *follower) record(b *benchOut) {
	for i, p := range f.phases {
		next := f.end
		if i+1 < len(f.phases) {
			next = f.phases[i+1].at
		}
		if !next.IsZero() {
			b.add("phase."+p.name, next.Sub(p.at))
		}
		if p.name == "ready" && !f.start.IsZero() && !next.IsZero() {
			b.add("firstboot.start-to-ready", next.Sub(f.start))
		}
	}
	if !f.start.IsZero() && !f.end.IsZero() {
		b.add("firstboot.unit", f.end.Sub(f.start))
	}
}
