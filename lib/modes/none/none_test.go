package none

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/coreos/go-systemd/v22/unit"

	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/modes"
	"unbounded-cloud.io/agent/lib/modes/modestest"
	"unbounded-cloud.io/agent/lib/modes/nodestack"
	"unbounded-cloud.io/agent/lib/unitnames"
)

const mountsLegacy = `32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,xattr,name=systemd
`

func newMode(t *testing.T) (*Mode, *modestest.Systemd, hostpaths.Paths) {
	t.Helper()
	sd := &modestest.Systemd{}
	p := hostpaths.New(t.TempDir())
	return &Mode{
		Paths:      p,
		Host:       modes.Host{ReadFile: func(string) ([]byte, error) { return []byte(mountsLegacy), nil }},
		Systemd:    sd.Dial,
		CgroupRoot: t.TempDir(),
		MountInfo:  func() ([]byte, error) { return nil, nil },
		Unmount:    func(string) error { return errors.New("no mount expected") },
	}, sd, p
}

func slot(t *testing.T, version string) modes.Slot {
	n := modestest.Node()
	n.KubernetesVersion = version
	return modes.Slot{Name: "kube1", Node: n, Artifacts: modestest.Artifacts(t)}
}

func TestPrepareInstallsAVersionAndFlipsCurrentWithNothingUnderUsrOrOpt(t *testing.T) {
	m, sd, p := newMode(t)
	ctx := context.Background()
	if err := m.Prepare(ctx, slot(t, "1.36.3")); err != nil {
		t.Fatal(err)
	}
	v := m.VersionDir("1.36.3")
	for _, f := range []string{"bin/kubelet", "bin/runc", "bin/containerd", "bin/containerd-shim-runc-v2", "cni/bin/bridge", "cni/bin/portmap"} {
		if fi, err := os.Stat(filepath.Join(v, f)); err != nil || fi.Mode().Perm() != 0o755 {
			t.Errorf("%s: %v %v", f, fi, err)
		}
	}
	if fi, err := os.Stat(filepath.Join(v, "etc/kubelet/bootstrap-kubeconfig")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("bootstrap kubeconfig: %v %v, want 0600", fi, err)
	}
	env, _ := os.ReadFile(filepath.Join(v, "etc/kubelet/kubelet.env"))
	for _, want := range []string{"KUBELET_ARGS=", "--config=" + Current + "/etc/kubelet/config.yaml", "--hostname-override=site-w1"} {
		if !strings.Contains(string(env), want) {
			t.Errorf("kubelet.env lacks %q:\n%s", want, env)
		}
	}
	cd, _ := os.ReadFile(filepath.Join(v, "etc/containerd/config.toml"))
	if !strings.Contains(string(cd), `BinaryName = "`+Current+`/bin/runc"`) || !strings.Contains(string(cd), `bin_dir = "`+Current+`/cni/bin"`) {
		t.Errorf("containerd config does not run through current:\n%s", cd)
	}
	if cur, _ := m.CurrentVersion(); cur != "1.36.3" {
		t.Errorf("current -> %q", cur)
	}
	// Pods' resolv.conf names the node-local DNS cache (on by default),
	// whose Corefile and link script are the version's.
	if kc, _ := os.ReadFile(filepath.Join(v, "etc/kubelet/config.yaml")); !strings.Contains(string(kc), "resolvConf: "+Current+"/etc/kubelet/resolv.conf") {
		t.Errorf("kubelet's resolvConf is not the cache's:\n%s", kc)
	}
	for _, f := range []string{"etc/coredns/Corefile", "etc/kubelet/resolv.conf", "bin/unbounded-dns-link", "bin/coredns"} {
		if _, err := os.Stat(filepath.Join(v, f)); err != nil {
			t.Errorf("the cache's files: %v", err)
		}
	}
	// What kubelet and containerd create at every start, by default under
	// /usr and /opt, is named under /var instead.
	if kc, _ := os.ReadFile(filepath.Join(v, "etc/kubelet/config.yaml")); !strings.Contains(string(kc), "volumePluginDir: /var/lib/kubelet/volumeplugins") {
		t.Errorf("kubelet's FlexVolume directory is not under /var:\n%s", kc)
	}
	if !strings.Contains(string(cd), "[plugins.\"io.containerd.internal.v1.opt\"]\n  path = \"/var/lib/containerd/opt\"") {
		t.Errorf("containerd's opt directory is not under /var:\n%s", cd)
	}
	// Everything written is under /var/lib/unbounded, except the CNI
	// config in /etc/cni/net.d; nothing under /usr or /opt.
	filepath.WalkDir(p.Join("/"), func(path string, d fs.DirEntry, err error) error {
		rel := p.Rel(path)
		if d.IsDir() {
			return nil
		}
		if !strings.HasPrefix(rel, "/var/lib/unbounded/versions/") && rel != "/etc/cni/net.d/10-unbounded-bridge.conflist" {
			t.Errorf("prepare wrote %s", rel)
		}
		return nil
	})

	// A second version: installed beside, current flipped, the first kept
	// (an in-place repave's rollback target). This host runs
	// systemd-resolved: kubelet gets its upstream list, not the stub.
	os.MkdirAll(p.Join("/run/systemd/resolve"), 0o755)
	os.WriteFile(p.Join("/run/systemd/resolve/resolv.conf"), []byte("nameserver 127.0.0.153\n"), 0o644)
	if err := m.Prepare(ctx, slot(t, "1.36.4")); err != nil {
		t.Fatal(err)
	}
	if cf, _ := os.ReadFile(filepath.Join(m.VersionDir("1.36.4"), "etc/coredns/Corefile")); !strings.Contains(string(cf), "forward . 127.0.0.153\n") {
		t.Errorf("the cache does not forward to systemd-resolved's upstream servers:\n%s", cf)
	}
	if cur, _ := m.CurrentVersion(); cur != "1.36.4" {
		t.Errorf("current -> %q after the second prepare", cur)
	}
	if _, err := os.Stat(filepath.Join(v, "bin/kubelet")); err != nil {
		t.Errorf("the first version is gone: %v", err)
	}
	ents, _ := os.ReadDir(p.VersionsDir())
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if !slices.Equal(names, []string{"1.36.3", "1.36.4", "current"}) {
		t.Errorf("versions/ holds %q: a temporary name was left", names)
	}

	if err := m.Start(ctx, "kube1"); err != nil {
		t.Fatal(err)
	}
	if want := []string{"reload", "start " + ContainerdUnit, "start " + KubeletUnit}; !slices.Equal(sd.Calls, want) {
		t.Errorf("start: %q, want %q", sd.Calls, want)
	}
	if err := m.Prepare(ctx, slot(t, "1.36.5")); !errors.Is(err, modes.ErrSlotActive) {
		t.Errorf("prepare while the node runs: %v, want ErrSlotActive", err)
	}
}

func TestPrepareRefusesAVersionThatIsNoDirectoryName(t *testing.T) {
	m, _, p := newMode(t)
	for _, v := range []string{"current", "../../etc", "1.36"} {
		if err := m.Prepare(context.Background(), slot(t, v)); err == nil {
			t.Errorf("version %q accepted", v)
		}
	}
	if _, err := os.Stat(p.VersionsDir()); !os.IsNotExist(err) {
		t.Errorf("a refused prepare created %s", p.VersionsDir())
	}
}

// /var/lib/containerd on a file system of its own (a disk the operator
// mounted there): Destroy unmounts what the node stack mounted below it,
// but not it, and empties it instead of removing it. Unmounted and
// removed, the operator's mount came back at the next boot with
// everything the old node had stored (the system scenario of a
// reprovision cut by a power failure after its reset).
func TestDestroyEmptiesAStateDirectoryThatIsAMountPoint(t *testing.T) {
	m, _, p := newMode(t)
	ctx := context.Background()
	if err := m.Prepare(ctx, slot(t, "1.36.3")); err != nil {
		t.Fatal(err)
	}
	store := p.Join("/var/lib/containerd")
	snap := filepath.Join(store, "io.containerd.snapshotter.v1.overlayfs/snapshots/1/fs")
	if err := os.MkdirAll(snap, 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(store, "io.containerd.metadata.v1.bolt"), []byte("db"), 0o600)
	rootfs := p.Join("/var/lib/containerd/tmpmounts/containerd-mount1")
	m.MountInfo = func() ([]byte, error) {
		return []byte("1 0 8:1 / / rw - ext4 /dev/sda1 rw\n" +
			"2 1 8:17 / " + store + " rw - ext4 /dev/sdb1 rw\n" +
			"3 2 0:51 / " + rootfs + " rw - overlay overlay rw\n"), nil
	}
	var unmounted []string
	m.Unmount = func(target string) error { unmounted = append(unmounted, target); return nil }
	if err := m.Destroy(ctx, "kube1"); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(unmounted, []string{rootfs}) {
		t.Errorf("unmounted %q, want only %s (below the operator's mount, not it)", unmounted, rootfs)
	}
	ents, err := os.ReadDir(store)
	if err != nil || len(ents) != 0 {
		t.Errorf("%s: %v (%v), want kept and empty", p.Rel(store), ents, err)
	}
	for _, gone := range []string{p.VersionsDir(), p.Join("/var/lib/kubelet"), p.Join("/run/containerd")} {
		if _, err := os.Lstat(gone); !os.IsNotExist(err) {
			t.Errorf("%s is still there (%v)", p.Rel(gone), err)
		}
	}
}

func TestDestroyKillsWhatOutlivesTheUnitsUnmountsAndRemovesEverything(t *testing.T) {
	m, sd, p := newMode(t)
	ctx := context.Background()
	if err := m.Prepare(ctx, slot(t, "1.36.3")); err != nil {
		t.Fatal(err)
	}
	if err := m.Start(ctx, "kube1"); err != nil {
		t.Fatal(err)
	}
	// A pod process left in a kubepods cgroup (a stand-in hierarchy: the
	// test must not kill the host's pods); the kernel would drop it from
	// cgroup.procs at exit, the test does it when it reaps it.
	pod := exec.Command("sleep", "60")
	if err := pod.Start(); err != nil {
		t.Fatal(err)
	}
	procs := filepath.Join(m.CgroupRoot, "memory", "kubepods", "besteffort", "pod1", "cgroup.procs")
	os.MkdirAll(filepath.Dir(procs), 0o755)
	os.WriteFile(procs, []byte(fmt.Sprintf("%d\n", pod.Process.Pid)), 0o644)
	reaped := make(chan error, 1)
	go func() { err := pod.Wait(); os.WriteFile(procs, nil, 0o644); reaped <- err }()

	// A pod volume mounted under /var/lib/kubelet.
	vol := p.Join("/var/lib/kubelet/pods/uid/volumes/kubernetes.io~secret/token")
	os.MkdirAll(vol, 0o755)
	m.MountInfo = func() ([]byte, error) {
		return []byte("1 0 8:1 / / rw - ext4 /dev/sda1 rw\n" +
			"2 1 0:50 / " + vol + " rw - tmpfs tmpfs rw\n" +
			"3 1 0:51 / " + p.Join("/run/containerd/io.containerd.runtime.v2.task/k8s.io/abc/rootfs") + " rw - overlay overlay rw\n"), nil
	}
	var unmounted []string
	m.Unmount = func(target string) error { unmounted = append(unmounted, target); return nil }
	sd.Calls = nil
	// The kubelet raised the host's logind delay for its graceful node
	// shutdown (its own drop-in, in a directory it made); an operator's
	// drop-in of the same name is not the node's.
	override := p.Join(KubeletLogindOverride)
	os.MkdirAll(filepath.Dir(override), 0o755)
	os.WriteFile(override, []byte("# Kubelet logind override\n[Login]\nInhibitDelayMaxSec=30\n"), 0o644)

	if err := m.Destroy(ctx, "kube1"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Dir(override)); !os.IsNotExist(err) {
		t.Errorf("the kubelet's logind drop-in (or its directory, empty) is still there: %v", err)
	}
	if err := <-reaped; err == nil || !strings.Contains(err.Error(), "killed") {
		t.Errorf("the pod process was not killed: %v", err)
	}
	if want := []string{"stop " + KubeletUnit, "stop " + ContainerdUnit, "reload"}; !slices.Equal(sd.Calls, want) {
		t.Errorf("destroy: %q, want %q", sd.Calls, want)
	}
	if len(unmounted) != 2 || unmounted[0] != vol || unmounted[1] != p.Join("/run/containerd/io.containerd.runtime.v2.task/k8s.io/abc/rootfs") {
		t.Errorf("unmounted %q, want both under the state directories, deepest first, and nothing else (not /)", unmounted)
	}
	for _, gone := range append([]string{p.VersionsDir(), p.Join("/etc/cni/net.d/10-unbounded-bridge.conflist")}, StateDirs...) {
		if !strings.HasPrefix(gone, p.Root) {
			gone = p.Join(gone)
		}
		if _, err := os.Lstat(gone); !os.IsNotExist(err) {
			t.Errorf("%s is still there (%v)", p.Rel(gone), err)
		}
	}
	os.MkdirAll(filepath.Dir(override), 0o755)
	os.WriteFile(override, []byte("[Login]\nInhibitDelayMaxSec=45\n"), 0o644)
	if err := m.Destroy(ctx, "kube1"); err != nil {
		t.Errorf("destroying again: %v", err)
	}
	if _, err := os.Stat(override); err != nil {
		t.Errorf("an operator's logind drop-in was removed: %v", err)
	}
}

func TestWithoutTheLocalDNSCacheKubeletGetsTheHostsUpstreamResolvers(t *testing.T) {
	m, _, p := newMode(t)
	ctx := context.Background()
	s := slot(t, "1.36.3")
	s.Node.LocalDNS, s.Artifacts.CoreDNS = false, ""
	if err := m.Prepare(ctx, s); err != nil {
		t.Fatal(err)
	}
	v := m.VersionDir("1.36.3")
	if kc, _ := os.ReadFile(filepath.Join(v, "etc/kubelet/config.yaml")); !strings.Contains(string(kc), "resolvConf: /etc/resolv.conf") || !strings.Contains(string(kc), "- 10.96.0.10") {
		t.Errorf("kubelet on a host without systemd-resolved and without the cache:\n%s", kc)
	}
	for _, f := range []string{"etc/coredns/Corefile", "bin/coredns"} {
		if _, err := os.Stat(filepath.Join(v, f)); err == nil {
			t.Errorf("%s without the cache: unbounded-local-dns.service would start", f)
		}
	}
	// A host that runs systemd-resolved: kubelet gets its upstream list,
	// not the stub 127.0.0.53, which is of no use in a pod.
	os.MkdirAll(p.Join("/run/systemd/resolve"), 0o755)
	os.WriteFile(p.Join("/run/systemd/resolve/resolv.conf"), []byte("nameserver 127.0.0.153\n"), 0o644)
	if err := m.Prepare(ctx, func() modes.Slot { s := s; s.Node.KubernetesVersion = "1.36.4"; return s }()); err != nil {
		t.Fatal(err)
	}
	if kc, _ := os.ReadFile(filepath.Join(m.VersionDir("1.36.4"), "etc/kubelet/config.yaml")); !strings.Contains(string(kc), "resolvConf: /run/systemd/resolve/resolv.conf") {
		t.Errorf("kubelet's resolvConf on a host with systemd-resolved:\n%s", kc)
	}
}

// The shipped unbounded-local-dns.service runs what Prepare installs,
// where Layout puts it: its paths cannot drift from the version's. Its
// [Service] section is nodestack.LocalDNSService (the cache's unit in the
// nspawn and container nodes too, sandbox included), plus only what
// mode none needs to show the server the version directory under the
// host root (0700): neither side of the sandbox drifts from the other.
func TestTheShippedLocalDNSUnitRunsTheVersionsCache(t *testing.T) {
	data, err := os.ReadFile("../../../units/" + unitnames.LocalDNS)
	if err != nil {
		t.Fatal(err)
	}
	opts, err := unit.DeserializeOptions(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	key := func(o *unit.UnitOption) string { return o.Section + "." + o.Name + "=" + o.Value }
	var got []string
	for _, o := range opts {
		if o.Section == "Service" {
			got = append(got, key(o))
		}
	}
	var want []string
	for _, o := range nodestack.LocalDNSService(Layout) {
		want = append(want, key(o))
	}
	want = append(want,
		"Service.TemporaryFileSystem="+hostpaths.HostRootHost+":ro",
		"Service.BindReadOnlyPaths="+hostpaths.VersionsDirHost)
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("%s's [Service] is not nodestack.LocalDNSService's (with mode none's view of the versions):\n got %q\nwant %q", unitnames.LocalDNS, got, want)
	}
	for _, want := range []string{
		"\nConditionPathExists=" + Layout.LocalDNSCorefile + "\n",
		"\nExecStartPre=+" + path.Join(Layout.BinDir, nodestack.LocalDNSLinkScript) + "\n",
		"\nExecStart=" + path.Join(Layout.BinDir, "coredns") + " -conf " + Layout.LocalDNSCorefile + "\n",
		"\nPartOf=" + ContainerdUnit + "\n",
	} {
		if !strings.Contains(string(data), want) {
			t.Errorf("%s lacks %q", unitnames.LocalDNS, want)
		}
	}
}
