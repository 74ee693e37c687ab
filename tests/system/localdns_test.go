package system_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/remotecommand"

	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/modes/bluegreen/tree"
	stack "unbounded-cloud.io/agent/lib/modes/nodestack"
	"unbounded-cloud.io/agent/lib/unitnames"
	"unbounded-cloud.io/agent/tests/system/nodestack"
)

// The resolvers a test host's node-local DNS cache forwards to, both run by
// the test on the host's own loopback (never any other address): a
// stand-in for the cluster's DNS Service (the test control plane runs no
// cluster DNS and no service proxy), answering a real Service's name with
// its ClusterIP, and the host's upstream resolver (its resolv.conf),
// answering one external name. Both are CoreDNS (the staged artifact,
// with its hosts plugin), with a TTL of 2 s, so that a cached answer
// expires within a test.
const (
	testClusterDNS  = "127.0.0.55"
	testUpstreamDNS = "127.0.0.56"
	// externalName is answered by the upstream with externalAddr (an
	// address of TEST-NET-1, only ever an answer: nothing connects to it).
	externalName = "mirror.unbounded.test"
	externalAddr = "192.0.2.80"
	resolversTTL = 2 * time.Second
	// benchNames are how many more names the upstream answers
	// (benchName), for the benchmark's lookups of names never asked.
	benchNames = 2 * benchLookups
	benchName  = "b%d.bench.unbounded.test"
	// benchLookups is each set's count of lookups (make bench).
	benchLookups = 1000
	// benchSlowZone is answered by the upstream benchUpstreamDelay late:
	// a resolver some way off (a cluster DNS across the network, a site's
	// resolver), where the one above answers from the same host.
	benchSlowZone      = "slow.unbounded.test"
	benchUpstreamDelay = "2ms"
	// resolversUnit runs both.
	resolversUnit = "ubt-resolvers.service"
)

// withResolvers gives the test host (before its boot) the two resolvers,
// makes the upstream its resolv.conf's only nameserver, and points
// [cluster] cluster-dns at the stand-in, which answers clusterHosts (lines
// of a hosts file).
func (f *firstBoot) withResolvers(t *testing.T, clusterHosts string) {
	t.Helper()
	archive := filepath.Join(f.stage.Dir, "artifacts", "coredns_"+f.stage.Versions["coredns"]+"_linux_"+runtime.GOARCH+".tgz")
	dir := filepath.Join(f.m.Root(), "var/lib/ubt-dns")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("tar", "-C", dir, "-xzf", archive, "coredns").CombinedOutput(); err != nil {
		t.Fatalf("unpack %s: %v\n%s", archive, err, out)
	}
	ttl := int(resolversTTL / time.Second)
	f.m.WriteFile("/etc/ubt-dns/Corefile", []byte(fmt.Sprintf(`# tests/system: the cluster DNS stand-in and the host's upstream resolver.
.:53 {
    bind %s
    hosts /etc/ubt-dns/cluster.hosts {
        ttl %d
    }
}
.:53 {
    bind %s %s
    hosts /etc/ubt-dns/external.hosts {
        ttl %[2]d
    }
}
# A resolver some way off, for the benchmark: every answer (192.0.2.53,
# whatever the name) %[5]s late.
%[6]s:53 {
    bind %[3]s %[4]s
    erratic {
        delay 1 %[5]s
    }
}
`, testClusterDNS, ttl, testUpstreamDNS, nodestack.NodeIP, benchUpstreamDelay, benchSlowZone)), 0o644)
	f.m.WriteFile("/etc/ubt-dns/cluster.hosts", []byte(clusterHosts), 0o644)
	external := externalAddr + " " + externalName + "\n"
	for i := range benchNames {
		external += externalAddr + " " + fmt.Sprintf(benchName, i) + "\n"
	}
	f.m.WriteFile("/etc/ubt-dns/external.hosts", []byte(external), 0o644)
	f.m.WriteFile("/etc/systemd/system/"+resolversUnit, []byte(`[Unit]
Description=The test's resolvers (tests/system): cluster DNS stand-in and upstream
# The upstream also listens on the host's address (the benchmark's pods
# ask it there without the cache), which the host has from network.target.
After=network.target
Before=unbounded-bootstrap.service
[Service]
ExecStart=/var/lib/ubt-dns/coredns -conf /etc/ubt-dns/Corefile
`), 0o644)
	f.m.WriteFile("/etc/systemd/system/multi-user.target.d/ubt-resolvers.conf", []byte("[Unit]\nWants="+resolversUnit+"\n"), 0o644)
	f.m.WriteFile("/etc/resolv.conf", []byte("# tests/system: the test's upstream resolver.\nnameserver "+testUpstreamDNS+"\nsearch unbounded.test\n"), 0o644)
	f.m.WriteFile("/etc/unbounded/agent.toml.d/50-cluster-dns.toml", []byte("[cluster]\ncluster-dns = \""+testClusterDNS+"\"\n"), 0o644)
}

// execPod runs cmd in the pod's container "sleep" through the API server
// (kubectl exec's way) and returns its output, stdout then stderr.
func (f *firstBoot) execPod(t *testing.T, ns, pod string, cmd ...string) (string, error) {
	t.Helper()
	req := f.env.kube.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns).Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: "sleep", Command: cmd, Stdout: true, Stderr: true}, scheme.ParameterCodec)
	e, err := remotecommand.NewWebSocketExecutor(f.env.RESTConfig(), "GET", req.URL().String())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out, errOut bytes.Buffer
	err = e.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &out, Stderr: &errOut})
	return out.String() + errOut.String(), err
}

// lookup asks the pod's resolver (busybox's nslookup, as the pod's
// resolv.conf says) for name and returns the addresses of the answer.
func (f *firstBoot) lookup(t *testing.T, ns, pod, name string) ([]string, string) {
	t.Helper()
	out, err := f.execPod(t, ns, pod, "nslookup", name)
	if err != nil {
		return nil, fmt.Sprintf("%v: %s", err, out)
	}
	// The answer's addresses follow its "Name:" line; the "Address:" line
	// before it is the server's.
	var addrs []string
	named := false
	for _, line := range strings.Split(out, "\n") {
		k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		switch {
		case k == "Name":
			named = true
		case named && k == "Address":
			addrs = append(addrs, strings.TrimSpace(v))
		}
	}
	return addrs, out
}

// wantLookup asserts that the pod resolves name to want.
func (f *firstBoot) wantLookup(t *testing.T, ns, pod, name, want, when string) {
	t.Helper()
	begin := time.Now()
	addrs, out := f.lookup(t, ns, pod, name)
	if len(addrs) != 1 || addrs[0] != want {
		t.Errorf("%s: %s resolves to %v, want %s:\n%s", when, name, addrs, want, out)
		return
	}
	t.Logf("%s: %s -> %s in %v", when, name, want, time.Since(begin).Round(time.Millisecond))
}

// podOf is the name of the one running pod of the Deployment in ns.
func (f *firstBoot) podOf(t *testing.T, ns string) string {
	t.Helper()
	return f.waitPodRunning(t, ns, 3*time.Minute).Name
}

// TestLocalDNSCacheServesPodsThroughAnOutageARestartAndARepave: a node of
// mode nspawn with node.local-dns on (the default), whose pods resolve a
// cluster Service's name and an external name through the cache; the
// names cached keep resolving while both resolvers behind it are down
// (serve-stale); DNS works after a restart and a repave of the node; and
// a repave to local-dns = false gives the node without a cache: the
// kubelet's cluster DNS is cluster-dns again, the interface gone.
func TestLocalDNSCacheServesPodsThroughAnOutageARestartAndARepave(t *testing.T) {
	defer scenario(t)()
	f := newFirstBoot(t, firstBootOptions{prepared: true})
	ctx := context.Background()
	c := f.env.kube
	ns := newNamespace(t, c, "dns")
	svc, err := c.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "sleeper"},
			Ports: []corev1.ServicePort{{Port: 80}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	svcName := "web." + ns + ".svc.cluster.local"
	f.withResolvers(t, svc.Spec.ClusterIP+" "+svcName+"\n")

	begin := time.Now()
	f.m.Start()
	f.wantBootstrapped(t, "nspawn", "systemd-nspawn@kube1.service")
	if t.Failed() {
		return
	}
	t.Logf("first boot: %v", time.Since(begin).Round(time.Millisecond))
	if out, err := f.m.Run("ip", "-o", "addr", "show", "dev", stack.LocalDNSInterface); err != nil ||
		!strings.Contains(out, stack.LocalDNSHostAddr+"/32") || !strings.Contains(out, stack.LocalDNSClusterAddr+"/32") {
		t.Errorf("the cache's interface %s: %v\n%s", stack.LocalDNSInterface, err, out)
	}
	f.wantLocalDNSUnprivileged(t, "kube1")
	if _, err := c.AppsV1().Deployments(ns).Create(ctx, nodestack.SleeperDeployment(ns, f.name, f.app), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := f.podOf(t, ns)
	if out, err := f.execPod(t, ns, pod, "cat", "/etc/resolv.conf"); err != nil || !strings.Contains(out, "nameserver "+stack.LocalDNSClusterAddr+"\n") {
		t.Errorf("the pod's resolv.conf does not name the cache (%v):\n%s", err, out)
	}
	f.wantLookup(t, ns, pod, svcName, svc.Spec.ClusterIP, "first boot, cluster name")
	f.wantLookup(t, ns, pod, externalName, externalAddr, "first boot, external name")
	// The cache's memory, for the record (make bench measures; this only
	// says what a node of this scenario spends).
	if out, err := f.m.Run("ps", "-C", "coredns", "-o", "rss=,args="); err == nil {
		t.Logf("coredns processes (RSS KiB, command):\n%s", out)
	}
	if os.Getenv(benchEnv) != "" {
		f.benchDNS(t, ns)
	}

	// Both resolvers behind the cache down, past the answers' TTL: the
	// names asked before are served stale; a name never asked is not.
	if out, err := f.m.Systemctl("stop", resolversUnit); err != nil {
		t.Fatalf("stop the resolvers: %v\n%s", err, out)
	}
	time.Sleep(resolversTTL + time.Second)
	f.wantLookup(t, ns, pod, svcName, svc.Spec.ClusterIP, "resolvers down, cluster name (stale)")
	f.wantLookup(t, ns, pod, externalName, externalAddr, "resolvers down, external name (stale)")
	if addrs, out := f.lookup(t, ns, pod, "never-asked.unbounded.test"); len(addrs) != 0 {
		t.Errorf("resolvers down: a name never asked resolves to %v: the cache answers what it never got\n%s", addrs, out)
	}
	if out, err := f.m.Systemctl("start", resolversUnit); err != nil {
		t.Fatalf("start the resolvers: %v\n%s", err, out)
	}
	if t.Failed() {
		return
	}

	// A restart of the node stack (the machine's soft reboot): the cache
	// comes back with it, and the pod, started again, resolves.
	restarted := time.Now()
	if out, err := f.m.Systemctl("start", restartUnit); err != nil {
		t.Fatalf("restart: %v\n%s\n%s", err, out, f.m.Journal(restartUnit))
	}
	t.Logf("restart (machine stop, boot, kubelet healthy): %v", time.Since(restarted).Round(time.Millisecond))
	logRestartTimeline(t, f.m, restarted, "systemd-nspawn@kube1.service", "kube1")
	// The machine's stop went through its logind: the kubelet ended the
	// pod (a busybox sleep, which ignores SIGTERM) in its graceful node
	// shutdown, not the machine's final kill.
	wantEndedByShutdown(t, f.env.kube, ns, pod)
	f.waitPodStartedSince(t, ns, restarted)
	pod = f.podOf(t, ns)
	f.wantLookup(t, ns, pod, svcName, svc.Spec.ClusterIP, "after the restart, cluster name")
	f.wantLookup(t, ns, pod, externalName, externalAddr, "after the restart, external name")

	// A repave: the new slot's node has its own cache.
	f.repaveFlags(t, "--force")
	p, took := f.repave(t, 8*time.Minute)
	if p["Result"] != "success" {
		t.Fatalf("repave: %v\n%s", p, f.lastRunJournal(t, p))
	}
	t.Logf("repave (cache on): %v", took.Round(time.Millisecond))
	pod = f.podOf(t, ns)
	f.wantLookup(t, ns, pod, svcName, svc.Spec.ClusterIP, "after the repave, cluster name")
	f.wantLookup(t, ns, pod, externalName, externalAddr, "after the repave, external name")

	// local-dns = false, repaved (forced again: the drain is not what
	// this scenario is about): today's node without a cache.
	f.m.WriteFile("/etc/unbounded/agent.toml.d/60-no-local-dns.toml", []byte("[node]\nlocal-dns = false\n"), 0o644)
	p, took = f.repave(t, 8*time.Minute)
	if p["Result"] != "success" {
		t.Fatalf("repave to local-dns = false: %v\n%s", p, f.lastRunJournal(t, p))
	}
	t.Logf("repave (cache off): %v", took.Round(time.Millisecond))
	pod = f.podOf(t, ns)
	if out, err := f.execPod(t, ns, pod, "cat", "/etc/resolv.conf"); err != nil || !strings.Contains(out, "nameserver "+testClusterDNS+"\n") {
		t.Errorf("local-dns = false: the pod's resolv.conf does not name cluster-dns %s (%v):\n%s", testClusterDNS, err, out)
	}
	if out, err := f.m.Run("ip", "-o", "link", "show", "dev", stack.LocalDNSInterface); err == nil {
		t.Errorf("local-dns = false: the interface %s is still there:\n%s", stack.LocalDNSInterface, out)
	}
}

// capNetBindService is CAP_NET_BIND_SERVICE (10) as /proc/<pid>/status
// shows a capability set holding it alone.
const capNetBindService = "0000000000000400"

// wantLocalDNSUnprivileged checks that the node-local DNS cache runs in
// its sandbox as the kernel sees it (lib/modes/nodestack's
// LocalDNSSandbox; units/security_test.go scores the unit files): a user
// other than root with CAP_NET_BIND_SERVICE alone, no_new_privs and a
// seccomp filter; and that its journal holds nothing that looks like the
// sandbox refusing it something. machine is the node's machine (modes
// nspawn and container: node-local-dns.service), "" the test host itself
// (mode none: unbounded-local-dns.service, which sees nothing of the host
// root but the versions of the node stack).
func (f *firstBoot) wantLocalDNSUnprivileged(t *testing.T, machine string) {
	t.Helper()
	unit, where := tree.LocalDNSUnit, "machine "+machine
	in := func(script string) (string, error) {
		return f.m.Run("systemd-run", "-M", machine, "--wait", "--pipe", "-q", "sh", "-c", script)
	}
	if machine == "" {
		unit, where = unitnames.LocalDNS, "the host"
		in = func(script string) (string, error) { return f.m.Run("sh", "-c", script) }
	}
	pid, err := in("systemctl show -P MainPID " + unit)
	pid = strings.TrimSpace(pid)
	if err != nil || pid == "" || pid == "0" {
		t.Errorf("%s on %s has no main process (%v): %s", unit, where, err, pid)
		return
	}
	status, err := in("cat /proc/" + pid + "/status")
	if err != nil {
		t.Errorf("%s's status on %s: %v\n%s", unit, where, err, status)
		return
	}
	fields := map[string]string{}
	for _, l := range strings.Split(status, "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok {
			fields[k] = strings.TrimSpace(v)
		}
	}
	if uid := strings.Fields(fields["Uid"]); len(uid) != 4 || slices.Contains(uid, "0") {
		t.Errorf("%s runs as uid %q, want a user of its own (DynamicUser=yes)", unit, fields["Uid"])
	}
	for k, want := range map[string]string{
		// An ambient capability is inheritable too (capabilities(7)).
		"CapInh": capNetBindService, "CapPrm": capNetBindService, "CapEff": capNetBindService,
		"CapBnd": capNetBindService, "CapAmb": capNetBindService, "NoNewPrivs": "1", "Seccomp": "2",
	} {
		if fields[k] != want {
			t.Errorf("%s: %s is %q, want %q", unit, k, fields[k], want)
		}
	}
	if machine == "" {
		// Of the host root (0700: tokens, keys, records), only the
		// versions, read-only (TemporaryFileSystem= and
		// BindReadOnlyPaths= of the unit).
		if out, err := in("nsenter -t " + pid + " -m -- ls -A " + hostpaths.HostRootHost); err != nil || strings.TrimSpace(out) != path.Base(hostpaths.VersionsDirHost) {
			t.Errorf("%s sees %s holding %q (%v), want only %s", unit, hostpaths.HostRootHost, out, err, path.Base(hostpaths.VersionsDirHost))
		}
	}
	journal, err := in("journalctl -b -q -o cat --no-pager -u " + unit)
	if err != nil {
		t.Errorf("%s's journal on %s: %v\n%s", unit, where, err, journal)
	} else if hits := sandboxDenials(journal); len(hits) > 0 {
		t.Errorf("%s's journal shows its sandbox refusing it something:\n  %s", unit, strings.Join(hits, "\n  "))
	} else {
		t.Logf("%s's journal:\n%s", unit, journal)
	}
	t.Logf("%s on %s: uids %q, capabilities %s (CAP_NET_BIND_SERVICE)", unit, where, fields["Uid"], fields["CapEff"])
}

// benchEnv, set by tests/bench.sh (its part "dns"), has the scenario also
// time lookups from a pod (benchDNS); make test leaves it unset.
const benchEnv = "UNBOUNDED_BENCH_DNS"

// benchDNS times benchLookups lookups from a pod of the node, of one name
// again and again and of names never asked, with the node-local DNS cache
// (its cluster address) and without it (the upstream resolver itself, at
// the host's address), against an upstream on the same host and against
// one benchUpstreamDelay away, and logs dnsbench's lines, which
// tests/bench.sh reads. Nothing is asserted on the times: make bench
// reports them.
func (f *firstBoot) benchDNS(t *testing.T, ns string) {
	t.Helper()
	ctx := context.Background()
	c := f.env.kube
	img := f.reg.Push(t, "dnsbench:1", nodestack.DNSBenchImage(t))
	for i, run := range []struct{ label, server, zone string }{
		{"with-cache", stack.LocalDNSClusterAddr + ":53", "unbounded.test"},
		{"without-cache", nodestack.NodeIP + ":53", "unbounded.test"},
		{"with-cache-upstream-" + benchUpstreamDelay, stack.LocalDNSClusterAddr + ":53", benchSlowZone},
		{"without-cache-upstream-" + benchUpstreamDelay, nodestack.NodeIP + ":53", benchSlowZone},
	} {
		cached, uncached := externalName, benchName
		if run.zone == benchSlowZone {
			cached, uncached = "cached."+benchSlowZone, "b%d."+benchSlowZone
		}
		name := fmt.Sprintf("dnsbench-%d", i)
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.PodSpec{
				NodeName: f.name, RestartPolicy: corev1.RestartPolicyNever,
				Containers: []corev1.Container{{Name: "dnsbench", Image: img, Args: []string{
					"-server", run.server, "-label", run.label, "-name", cached,
					"-uncached", uncached, "-from", fmt.Sprint(i * benchLookups), "-n", fmt.Sprint(benchLookups)}}},
			},
		}
		if _, err := c.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitUntil(t, 5*time.Minute, "pod "+name+" Succeeded", func(ctx context.Context) (bool, error) {
			p, err := c.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
			if err == nil && p.Status.Phase == corev1.PodFailed {
				return false, fmt.Errorf("pod %s failed: %+v", name, p.Status)
			}
			return err == nil && p.Status.Phase == corev1.PodSucceeded, nil
		})
		logs, err := c.CoreV1().Pods(ns).GetLogs(name, &corev1.PodLogOptions{}).DoRaw(ctx)
		if err != nil {
			t.Fatalf("dnsbench's log: %v", err)
		}
		t.Logf("%s", strings.TrimSpace(string(logs)))
		c.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{})
	}
}
