package nspawn

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"unbounded-cloud.io/agent/lib/modes/bluegreen/tree"
	"unbounded-cloud.io/agent/lib/modes/bluegreen/tree/treetest"

	"github.com/coreos/go-systemd/v22/unit"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/sys/unix"

	"unbounded-cloud.io/agent/lib/devices"
	"unbounded-cloud.io/agent/lib/exitcode"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/modes"
	"unbounded-cloud.io/agent/lib/modes/modestest"
	"unbounded-cloud.io/agent/lib/modes/nspawn/machinefile"
)

// Mount tables as the kernel writes them (lib/modes/support_test.go has
// the full set): the test VMs' (every controller in v1) and a cgroup v2
// host's.
const (
	mountsLegacy = `32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,xattr,name=systemd
`
	mountsUnified = `25 22 0:22 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate
`
)

func cgroupHost(mountinfo string) modes.Host {
	return modes.Host{ReadFile: func(p string) ([]byte, error) {
		switch p {
		case "/proc/self/mountinfo":
			return []byte(mountinfo), nil
		case "/sys/fs/cgroup/cgroup.controllers":
			return []byte("cpuset cpu io memory pids\n"), nil
		}
		return nil, fs.ErrNotExist
	}}
}

type fixture struct {
	m    *Mode
	sd   *modestest.Systemd
	root string
	p    hostpaths.Paths
	logs *bytes.Buffer
	slot modes.Slot
}

func newFixture(t *testing.T, mountinfo string, ref string) *fixture {
	t.Helper()
	f := &fixture{sd: &modestest.Systemd{}, root: t.TempDir(), logs: &bytes.Buffer{}}
	f.p = hostpaths.New(f.root)
	resolv := filepath.Join(t.TempDir(), "resolv.conf")
	os.WriteFile(resolv, []byte("nameserver 127.0.0.153\n"), 0o644)
	f.m = &Mode{
		Paths:      f.p,
		Host:       cgroupHost(mountinfo),
		Systemd:    f.sd.Dial,
		ResolvConf: resolv,
		Log:        slog.New(slog.NewTextHandler(f.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	f.slot = modes.Slot{Name: "kube1", Node: modestest.Node(), Artifacts: modestest.Artifacts(t), Image: modes.Image{Ref: ref}}
	return f
}

func (f *fixture) rootfs(p string) string { return filepath.Join(f.p.MachineDir("kube1"), p) }

// noLeftovers checks that nothing but the slot is beside it.
func (f *fixture) noLeftovers(t *testing.T) {
	t.Helper()
	l, _ := leftovers(f.p.Join(hostpaths.MachinesDirHost), "kube1")
	if len(l) > 0 {
		t.Errorf("temporary trees left beside the slot: %v", l)
	}
}

func TestPrepareBuildsTheSlotFromARegistryImage(t *testing.T) {
	treetest.RequireRoot(t)
	ref := treetest.ServeRegistry(t, "unbounded/node:1.36.3", treetest.NodeImage(t))
	for _, tc := range []struct {
		cg, mountinfo string
	}{{"legacy", mountsLegacy}, {"unified", mountsUnified}} {
		t.Run(tc.cg, func(t *testing.T) {
			f := newFixture(t, tc.mountinfo, ref)
			ctx := context.Background()
			if err := f.m.Prepare(ctx, f.slot); err != nil {
				t.Fatal(err)
			}
			f.checkTree(t, tc.cg)
			f.checkMachineSettings(t, tc.cg)
			f.noLeftovers(t)
			if strings.Contains(f.logs.String(), modestest.Token) {
				t.Errorf("the bootstrap token is in the log:\n%s", f.logs)
			}

			// Again, over the existing slot: the same result (idempotent),
			// with a file of the old tree gone.
			os.WriteFile(f.rootfs("stale"), []byte("x"), 0o644)
			if err := f.m.Prepare(ctx, f.slot); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(f.rootfs("stale")); !os.IsNotExist(err) {
				t.Errorf("a second prepare kept a file of the old tree: %v", err)
			}
			f.checkTree(t, tc.cg)
			f.noLeftovers(t)

			if err := f.m.Start(ctx, "kube1"); err != nil {
				t.Fatal(err)
			}
			if want := []string{"reload", "start systemd-nspawn@kube1.service"}; !slices.Equal(f.sd.Calls, want) {
				t.Errorf("start made the calls %q, want %q", f.sd.Calls, want)
			}
			// A running slot is never rebuilt under its feet.
			if err := f.m.Prepare(ctx, f.slot); !errors.Is(err, modes.ErrSlotActive) {
				t.Errorf("prepare of a running slot: %v, want ErrSlotActive", err)
			}

			// The link systemd-nspawn makes to the machine's journal
			// goes with the machine; another's link stays.
			journal := f.p.Join("/var/log/journal")
			os.MkdirAll(journal, 0o755)
			os.Symlink("/var/lib/machines/kube1/var/log/journal/0123", filepath.Join(journal, "0123"))
			os.Symlink("/var/lib/machines/other/var/log/journal/4567", filepath.Join(journal, "4567"))

			f.sd.Calls = nil
			if err := f.m.Destroy(ctx, "kube1"); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Lstat(filepath.Join(journal, "0123")); !os.IsNotExist(err) {
				t.Errorf("the machine's journal link is still there after destroy (%v)", err)
			}
			if _, err := os.Lstat(filepath.Join(journal, "4567")); err != nil {
				t.Errorf("another machine's journal link: %v", err)
			}
			if want := []string{"stop systemd-nspawn@kube1.service", "reload"}; !slices.Equal(f.sd.Calls, want) {
				t.Errorf("destroy made the calls %q, want %q", f.sd.Calls, want)
			}
			// /etc/systemd/nspawn, made by Prepare, goes with the slot's
			// settings when nothing else is in it.
			for _, p := range append(f.m.SlotPaths("kube1"), f.p.NspawnDropInDir("kube1"), filepath.Dir(f.p.NspawnConfig("kube1"))) {
				if _, err := os.Lstat(p); !os.IsNotExist(err) {
					t.Errorf("%s is still there after destroy (%v)", f.p.Rel(p), err)
				}
			}
			if err := f.m.Destroy(ctx, "kube1"); err != nil {
				t.Errorf("destroying a destroyed slot: %v", err)
			}
		})
	}
}

func (f *fixture) checkTree(t *testing.T, cg string) {
	t.Helper()
	read := func(p string) string {
		b, err := os.ReadFile(f.rootfs(p))
		if err != nil {
			t.Errorf("%v", err)
		}
		return string(b)
	}
	mode := func(p string) fs.FileMode {
		fi, err := os.Lstat(f.rootfs(p))
		if err != nil {
			t.Errorf("%v", err)
			return 0
		}
		return fi.Mode()
	}
	// The image, unpacked.
	if read("etc/os-release") != "ID=debian\n" {
		t.Error("the image's files are not in the rootfs")
	}
	if m := mode("."); m.Perm() != 0o755 || !m.IsDir() {
		t.Errorf("the rootfs is %v, want a 0755 directory", m)
	}
	// The artifacts.
	for _, b := range []string{"usr/local/bin/kubelet", "usr/local/bin/runc", "usr/local/bin/containerd",
		"usr/local/bin/containerd-shim-runc-v2", "opt/cni/bin/bridge", "opt/cni/bin/host-local", "opt/cni/bin/loopback", "opt/cni/bin/portmap"} {
		if m := mode(b); m.Perm() != 0o755 || !m.IsRegular() {
			t.Errorf("%s: %v, want an executable", b, m)
		}
	}
	// The node configuration.
	if m := mode("etc/kubernetes/bootstrap-kubelet.conf"); m.Perm() != 0o600 {
		t.Errorf("bootstrap kubeconfig is %v, want 0600", m)
	}
	if !strings.Contains(read("etc/kubernetes/bootstrap-kubelet.conf"), modestest.Token) {
		t.Error("the bootstrap kubeconfig lacks the token")
	}
	driver := map[string]string{"legacy": "cgroupDriver: cgroupfs", "unified": "cgroupDriver: systemd"}[cg]
	if !strings.Contains(read("var/lib/kubelet/config.yaml"), driver) {
		t.Errorf("kubelet config lacks %q", driver)
	}
	if !strings.Contains(read("etc/containerd/config.toml"), "restrict_oom_score_adj = true") {
		t.Error("containerd config lacks restrict_oom_score_adj")
	}
	if !strings.Contains(read("etc/cni/net.d/10-unbounded-bridge.conflist"), "10.244.1.0/24") {
		t.Error("no CNI config for the pod CIDR")
	}
	if read("etc/hostname") != "site-w1\n" {
		t.Errorf("hostname = %q", read("etc/hostname"))
	}
	if m := mode("etc/resolv.conf"); !m.IsRegular() || !strings.Contains(read("etc/resolv.conf"), "nameserver 127.0.0.153") {
		t.Errorf("resolv.conf is %v and does not hold the host's servers (the image's was a link to the stub)", m)
	}
	if h := read("etc/hosts"); !strings.Contains(h, "192.0.2.10\tsite-w1\n") || !strings.Contains(h, "localhost") {
		t.Errorf("the machine's /etc/hosts does not name the Node at its address:\n%s", h)
	}
	if read("etc/machine-id") != "" {
		t.Error("the image's machine-id was kept: every slot must get its own")
	}
	if l, err := os.Readlink(f.rootfs("var/lib/dbus/machine-id")); err != nil || l != "/etc/machine-id" {
		t.Errorf("var/lib/dbus/machine-id -> %q (%v)", l, err)
	}
	// Units, enabled.
	wants := []string{"containerd.service", "kubelet.service", "node-local-dns.service"}
	// The node-local DNS cache: its unit before containerd, which wants
	// it, running the artifact with the Corefile, its interface made
	// before and removed after by the script beside it.
	dns := read("etc/systemd/system/node-local-dns.service")
	// The interface is made and removed as root ("+"), the server runs
	// unprivileged but for port 53 (units/security_test.go scores it).
	for _, want := range []string{"\nExecStartPre=+/usr/local/bin/unbounded-dns-link\n", "\nExecStart=/usr/local/bin/coredns -conf /etc/coredns/Corefile\n",
		"\nExecStopPost=-+ip link del unbounded-dns0\n", "\nBefore=containerd.service kubelet.service\n", "\nRestart=always\n",
		"\nDynamicUser=yes\n", "\nCapabilityBoundingSet=CAP_NET_BIND_SERVICE\n", "\nAmbientCapabilities=CAP_NET_BIND_SERVICE\n"} {
		if !strings.Contains(dns, want) {
			t.Errorf("node-local-dns.service lacks %q:\n%s", want, dns)
		}
	}
	if c := read("etc/systemd/system/containerd.service"); !strings.Contains(c, "\nWants=node-local-dns.service\nAfter=node-local-dns.service\n") {
		t.Errorf("containerd.service does not start after the cache:\n%s", c)
	}
	if m := mode("usr/local/bin/coredns"); m.Perm() != 0o755 {
		t.Errorf("coredns artifact: %v", m)
	}
	if !strings.Contains(read("etc/coredns/Corefile"), "forward . 127.0.0.153") {
		t.Errorf("the cache does not forward to the host's resolver:\n%s", read("etc/coredns/Corefile"))
	}
	if cg == "legacy" {
		wants = append(wants, "unbounded-cgroup-rw.service")
		if m := mode("usr/local/libexec/unbounded/cgroup-rw"); m.Perm() != 0o755 {
			t.Errorf("cgroup-rw script: %v", m)
		}
	} else if _, err := os.Lstat(f.rootfs("etc/systemd/system/unbounded-cgroup-rw.service")); err == nil {
		t.Error("the cgroup v1 remount unit on a unified hierarchy")
	}
	for _, u := range wants {
		l, err := os.Readlink(f.rootfs("etc/systemd/system/multi-user.target.wants/" + u))
		if err != nil || l != "/etc/systemd/system/"+u {
			t.Errorf("%s not enabled: %q %v", u, l, err)
		}
	}
	if !strings.Contains(read("etc/systemd/logind.conf.d/50-unbounded-node.conf"), "\nInhibitDelayMaxSec=30\n") {
		t.Error("the machine's logind does not let the kubelet's delay lock last its shutdownGracePeriod")
	}
	if !strings.Contains(read("etc/systemd/system.conf.d/50-unbounded-node.conf"), "\nDefaultTimeoutStopSec=10s\n") {
		t.Error("the machine's stop is not bounded (DefaultTimeoutStopSec)")
	}
	if !strings.Contains(read("etc/systemd/system/kubelet.service"), "--hostname-override=site-w1") {
		t.Error("kubelet unit does not name the node")
	}
}

// StopTimeout covers the graceful poweroff's bound and the stop after
// it; the container mode's unit, which cannot take the configured
// period, has the one of the longest period lib/config allows (10 min).
func TestStopTimeoutCoversTheGracefulShutdown(t *testing.T) {
	for grace, want := range map[time.Duration]string{0: "90s", 30 * time.Second: "90s", 2 * time.Minute: "150s", 10 * time.Minute: "630s"} {
		if got := StopTimeout(grace); got != want {
			t.Errorf("StopTimeout(%v) = %s, want %s", grace, got, want)
		}
	}
	data, err := os.ReadFile("../../../units/unbounded-container@.service")
	if err != nil {
		t.Fatal(err)
	}
	if want := "\nTimeoutStopSec=" + StopTimeout(10*time.Minute) + "\n"; !strings.Contains(string(data), want) {
		t.Errorf("unbounded-container@.service lacks %q", want)
	}
}

func parseOpts(t *testing.T, file string) []*unit.UnitOption {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	opts, err := unit.DeserializeOptions(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return opts
}

func values(opts []*unit.UnitOption, section, key string) []string {
	var v []string
	for _, o := range opts {
		if o.Section == section && o.Name == key {
			v = append(v, o.Value)
		}
	}
	return v
}

func (f *fixture) checkMachineSettings(t *testing.T, cg string) {
	t.Helper()
	ns := parseOpts(t, f.p.NspawnConfig("kube1"))
	for _, kv := range [][3]string{
		{"Exec", "Boot", "yes"}, {"Exec", "PrivateUsers", "no"}, {"Exec", "NotifyReady", "yes"},
		{"Exec", "Capability", "all"}, {"Exec", "SystemCallFilter", "@keyring bpf"}, {"Exec", "ResolvConf", "off"},
		{"Files", "Bind", "/dev/kmsg"}, {"Files", "Bind", "/var/lib/unbounded/slots/kube1/containerd:/var/lib/containerd"},
		{"Network", "VirtualEthernet", "no"},
	} {
		if !slices.Contains(values(ns, kv[0], kv[1]), kv[2]) {
			t.Errorf("kube1.nspawn: [%s] %s=%s missing (has %q)", kv[0], kv[1], kv[2], values(ns, kv[0], kv[1]))
		}
	}
	if fi, err := os.Stat(f.p.Join("/var/lib/unbounded/slots/kube1/containerd")); err != nil || !fi.IsDir() {
		t.Errorf("the containerd store to bind is missing: %v", err)
	}
	di := parseOpts(t, filepath.Join(f.p.NspawnDropInDir("kube1"), DropInName))
	unified := map[string]string{"legacy": "0", "unified": "1"}[cg]
	env := values(di, "Service", "Environment")
	for _, want := range []string{"SYSTEMD_NSPAWN_API_VFS_WRITABLE=1", "SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=" + unified} {
		if !slices.Contains(env, want) {
			t.Errorf("drop-in: Environment=%s missing (has %q)", want, env)
		}
	}
	if !slices.Equal(values(di, "Service", "DevicePolicy"), []string{"auto"}) || !slices.Equal(values(di, "Service", "DeviceAllow"), []string{""}) {
		t.Errorf("drop-in: DevicePolicy %q DeviceAllow %q, want auto and an empty reset", values(di, "Service", "DevicePolicy"), values(di, "Service", "DeviceAllow"))
	}
	if got := values(di, "Service", "ExecStartPre"); !slices.Equal(got, []string{"-/usr/libexec/unbounded/restart --devices-of=kube1"}) {
		t.Errorf("drop-in: ExecStartPre %q, want the device refresh before every start", got)
	}
	// The stop goes through the machine's logind (graceful node
	// shutdown), bounded past the kubelet's period (30 s).
	if got := values(di, "Service", "ExecStop"); !slices.Equal(got, []string{"-/usr/libexec/unbounded/restart --poweroff-of=kube1"}) {
		t.Errorf("drop-in: ExecStop %q, want the poweroff through the machine's logind", got)
	}
	if got := values(di, "Service", "TimeoutStopSec"); !slices.Equal(got, []string{"90s"}) {
		t.Errorf("drop-in: TimeoutStopSec %q, want 90s (30 s grace + 15 s + 15 s, at least 90 s)", got)
	}
	if got := values(di, "Unit", "After"); !slices.Equal(got, []string{"systemd-machined.service"}) {
		t.Errorf("drop-in: After %q, want systemd-machined.service (the stop reaches the machine through it)", got)
	}
	f.verifyWithSystemd(t)
}

// verifyWithSystemd has systemd's own parsers read what Prepare wrote:
// systemd-analyze verify loads systemd-nspawn@kube1.service with the
// drop-in (as units/verify_test.go does), and systemd-nspawn parses
// kube1.nspawn (it reads a settings file next to the directory it is given
// and says "Unknown key" for any key it does not know, then refuses the
// empty directory before starting anything).
func (f *fixture) verifyWithSystemd(t *testing.T) {
	t.Helper()
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Log("systemd-analyze is not installed: the drop-in was checked by the Go parser only")
	} else if _, err := os.Stat("/usr/lib/systemd/system/systemd-nspawn@.service"); err != nil {
		t.Log("systemd-nspawn@.service is not installed (systemd-container): the drop-in was checked by the Go parser only")
	} else {
		unitDir := f.p.UnitDir()
		os.MkdirAll(filepath.Dir(unitDir), 0o755)
		if out, err := exec.Command("cp", "-a", "/usr/lib/systemd/system", filepath.Dir(unitDir)).CombinedOutput(); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		inst := filepath.Join(unitDir, "systemd-nspawn@kube1.service")
		os.Symlink("systemd-nspawn@.service", inst)
		nspawnBin, _ := exec.LookPath("systemd-nspawn")
		if nspawnBin != "" {
			os.MkdirAll(f.p.Join("/usr/bin"), 0o755)
			exec.Command("cp", nspawnBin, f.p.Join("/usr/bin/systemd-nspawn")).Run()
		}
		out, err := exec.Command(analyze, "verify", "--root="+f.root, "--recursive-errors=no", inst).CombinedOutput()
		for _, bad := range []string{"Unknown key", "ignoring", "Unknown section", "Failed to"} {
			if strings.Contains(string(out), bad) {
				err = fmt.Errorf("output says %q", bad)
			}
		}
		if err != nil {
			t.Errorf("systemd-analyze verify systemd-nspawn@kube1.service with the drop-in: %v\n%s", err, out)
		}
		// The drop-in is in effect: the merged unit has our settings.
		show, _ := exec.Command(analyze, "cat-config", "--root="+f.root, "systemd/system/systemd-nspawn@kube1.service.d/"+DropInName).CombinedOutput()
		if !strings.Contains(string(show), "SYSTEMD_NSPAWN_UNIFIED_HIERARCHY") {
			t.Logf("systemd-analyze cat-config did not show the drop-in:\n%s", show)
		}
	}

	nspawn, err := exec.LookPath("systemd-nspawn")
	if err != nil {
		t.Log("systemd-nspawn is not installed: kube1.nspawn was checked by the Go parser only")
		return
	}
	dir := t.TempDir()
	data, _ := os.ReadFile(f.p.NspawnConfig("kube1"))
	os.WriteFile(filepath.Join(dir, "kube1.nspawn"), data, 0o644)
	os.Mkdir(filepath.Join(dir, "kube1"), 0o755)
	out, _ := exec.Command(nspawn, "-D", filepath.Join(dir, "kube1"), "-M", "kube1", "--settings=trusted", "--register=no", "/bin/true").CombinedOutput()
	if !strings.Contains(string(out), "Refusing") {
		t.Fatalf("systemd-nspawn did not stop at the empty directory; what did it do?\n%s", out)
	}
	for _, bad := range []string{"Unknown key", "ignoring", "Failed to parse", "Invalid"} {
		if strings.Contains(string(out), bad) {
			t.Errorf("systemd-nspawn does not accept kube1.nspawn (%q):\n%s", bad, out)
		}
	}
}

func TestPrepareFromLocalImagesWithoutNetwork(t *testing.T) {
	treetest.RequireRoot(t)
	img := treetest.NodeImage(t)
	// A registry reference whose registry is down: the offline layout is
	// used first, and the registry is never asked.
	down := closedPort(t)
	ref := down + "/unbounded/node:1.36.3"
	offline := t.TempDir()
	lp, err := layout.Write(filepath.Join(offline, "images"), empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendImage(img, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": ref})); err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(t.TempDir(), "node.tar")
	tag, _ := name.NewTag("unbounded/node:1.36.3")
	if err := tarball.WriteToFile(archive, tag, img); err != nil {
		t.Fatal(err)
	}
	for _, im := range []modes.Image{
		{Ref: ref, OfflineDir: offline},
		{Ref: "oci-layout:" + filepath.Join(offline, "images")},
		{Ref: "docker-archive:" + archive + ":unbounded/node:1.36.3"},
		{Ref: "docker-archive:" + archive},
	} {
		t.Run(im.Ref, func(t *testing.T) {
			f := newFixture(t, mountsLegacy, "")
			f.slot.Image = im
			if err := f.m.Prepare(context.Background(), f.slot); err != nil {
				t.Fatal(err)
			}
			if b, _ := os.ReadFile(f.rootfs("etc/os-release")); string(b) != "ID=debian\n" {
				t.Error("the image was not unpacked")
			}
		})
	}
}

func closedPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

func TestPrepareSaysWhetherAnImageErrorIsWorthARetry(t *testing.T) {
	treetest.RequireRoot(t)
	ref := treetest.ServeRegistry(t, "unbounded/node:1.36.3", treetest.NodeImage(t))
	host, _, _ := strings.Cut(ref, "/")
	garbage := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v2/" {
			return // a registry, says the ping
		}
		w.Header().Set("Content-Type", "application/vnd.oci.image.manifest.v1+json")
		w.Write([]byte("<html>not a manifest</html>"))
	}))
	t.Cleanup(garbage.Close)
	for _, tc := range []struct {
		name, ref string
		exit      int
		notFound  bool
		garbage   bool
	}{
		{"unknown tag", host + "/unbounded/node:0.0.0", exitcode.Failed, true, false},
		{"unknown repository", host + "/nothing/here:1", exitcode.Failed, true, false},
		{"registry down", closedPort(t) + "/unbounded/node:1.36.3", exitcode.TempFail, false, false},
		{"registry answering garbage", strings.TrimPrefix(garbage.URL, "http://") + "/unbounded/node:1", exitcode.Failed, false, true},
		{"missing layout", "oci-layout:/nonexistent/layout", exitcode.Failed, true, false},
		{"no image configured", "", exitcode.ConfigInvalid, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, mountsLegacy, tc.ref)
			err := f.m.Prepare(context.Background(), f.slot)
			if err == nil {
				t.Fatal("prepare succeeded")
			}
			t.Logf("%v", err)
			if got := exitcode.For(err); got != tc.exit {
				t.Errorf("exit %d, want %d", got, tc.exit)
			}
			if tc.garbage && !strings.Contains(err.Error(), "not an image manifest") {
				t.Errorf("a registry answering garbage is not said in so many words: %v", err)
			}
			if errors.Is(err, tree.ErrImageNotFound) != tc.notFound {
				t.Errorf("ErrImageNotFound: %v, want %v", errors.Is(err, tree.ErrImageNotFound), tc.notFound)
			}
			if !strings.Contains(err.Error(), "kube1") || (tc.ref != "" && !strings.Contains(err.Error(), tc.ref)) {
				t.Errorf("the error names neither the slot nor the image: %v", err)
			}
			// Nothing of the slot on the host.
			for _, p := range f.m.SlotPaths("kube1") {
				if _, err := os.Lstat(p); !os.IsNotExist(err) {
					t.Errorf("%s exists after a failed prepare", f.p.Rel(p))
				}
			}
			f.noLeftovers(t)
		})
	}
}

// An image layer made with `tar -C DIR .` of a 0700 directory carries a
// "./" entry of mode 0700. Unpacked as it is, the machine's / would lock
// every user but root out (its dbus-daemon, user messagebus, fails and
// the machine never reports ready): the slot's / is 0755 whatever the
// image says.
func TestPrepareGivesTheMachineRootMode0755WhateverTheImageSays(t *testing.T) {
	treetest.RequireRoot(t)
	base, err := treetest.NodeImage(t).Layers()
	if err != nil {
		t.Fatal(err)
	}
	root := treetest.Layer(t, treetest.Entry{Name: "./", Typ: tar.TypeDir, Mode: 0o700})
	ref := treetest.ServeRegistry(t, "unbounded/node:1.36.3", treetest.Image(t, append([]v1.Layer{root}, base...)...))
	f := newFixture(t, mountsLegacy, ref)
	if err := f.m.Prepare(context.Background(), f.slot); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(f.p.MachineDir("kube1"))
	if err != nil {
		t.Fatal(err)
	}
	if got := fi.Mode().Perm(); got != 0o755 {
		t.Errorf("machine root mode %o, want 755", got)
	}
}

// The artifacts are installed beside the unpack and moved in: an image
// that ships a kubelet of its own gets the artifact's, and an artifact
// that lacks a binary fails the prepare by name, with nothing of the slot
// and no tree of either kind left beside it.
func TestPrepareInstallsTheArtifactsOverTheImagesOwnAndLeavesNothingOnABrokenOne(t *testing.T) {
	treetest.RequireRoot(t)
	own := treetest.Layer(t,
		treetest.Entry{Name: "usr/", Typ: tar.TypeDir},
		treetest.Entry{Name: "usr/local/", Typ: tar.TypeDir},
		treetest.Entry{Name: "usr/local/bin/", Typ: tar.TypeDir},
		treetest.Entry{Name: "usr/local/bin/kubelet", Body: "the image's own kubelet", Mode: 0o755},
		treetest.Entry{Name: "usr/local/bin/crictl", Body: "crictl", Mode: 0o755},
	)
	ref := treetest.ServeRegistry(t, "unbounded/node:1.36.3", treetest.Image(t, own))
	f := newFixture(t, mountsUnified, ref)
	if err := f.m.Prepare(context.Background(), f.slot); err != nil {
		t.Fatal(err)
	}
	want, _ := os.ReadFile(f.slot.Artifacts.Kubelet)
	if got, err := os.ReadFile(f.rootfs("usr/local/bin/kubelet")); err != nil || !bytes.Equal(got, want) {
		t.Errorf("kubelet in the slot: %q %v, want the artifact's %q", got, err, want)
	}
	if got, err := os.ReadFile(f.rootfs("usr/local/bin/crictl")); err != nil || string(got) != "crictl" {
		t.Errorf("the image's other file: %q %v", got, err)
	}
	f.noLeftovers(t)

	g := newFixture(t, mountsUnified, ref)
	dir := t.TempDir()
	g.slot.Artifacts.Containerd = filepath.Join(dir, "containerd.tar.gz")
	writeTgz(t, g.slot.Artifacts.Containerd, map[string]string{"bin/containerd": "c"})
	err := g.m.Prepare(context.Background(), g.slot)
	if err == nil || !strings.Contains(err.Error(), "containerd-shim-runc-v2") || !strings.Contains(err.Error(), "kube1") {
		t.Fatalf("prepare with a containerd archive without its shim: %v", err)
	}
	for _, p := range g.m.SlotPaths("kube1") {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("%s exists after a failed prepare", g.p.Rel(p))
		}
	}
	g.noLeftovers(t)
}

func writeTgz(t *testing.T, p string, files map[string]string) {
	t.Helper()
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for name, body := range files {
		tw.WriteHeader(&tar.Header{Name: name, Mode: 0o755, Size: int64(len(body)), Typeflag: tar.TypeReg})
		tw.Write([]byte(body))
	}
	tw.Close()
	gz.Close()
	if err := os.WriteFile(p, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// Prepare gives the node the host's devices under the slot's rules: each
// bound in the settings file, recorded beside the slot (for restart and
// status), the NVIDIA GPUs described for containerd by a CDI
// specification inside the rootfs; the RDMA modules are loaded first when
// asked, and a failed load stops the prepare with nothing built.
func TestPrepareBindsTheHostsDevicesAndDescribesItsGPUs(t *testing.T) {
	treetest.RequireRoot(t)
	ref := treetest.ServeRegistry(t, "unbounded/node:1.36.3", treetest.NodeImage(t))
	f := newFixture(t, mountsUnified, ref)
	for _, d := range []struct {
		p            string
		major, minor uint32
	}{{"/dev/kvm", 10, 232}, {"/dev/net/tun", 10, 200}, {"/dev/nvidia0", 195, 0}, {"/dev/nvidiactl", 195, 255}} {
		full := f.p.Join(d.p)
		os.MkdirAll(filepath.Dir(full), 0o755)
		if err := unix.Mknod(full, unix.S_IFCHR|0o600, int(unix.Mkdev(d.major, d.minor))); err != nil {
			t.Fatal(err)
		}
	}
	os.MkdirAll(f.p.Join("/usr/lib/x86_64-linux-gnu"), 0o755)
	os.WriteFile(f.p.Join("/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.14"), []byte("elf"), 0o644)
	var loaded []string
	f.m.Modprobe = func(_ context.Context, m ...string) error { loaded = append(loaded, m...); return nil }
	f.slot.Devices = devices.Options{Auto: true, Deny: []string{"/dev/net/tun"}}
	f.slot.RDMAModules = true
	if err := f.m.Prepare(context.Background(), f.slot); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(loaded, []string{"rdma_ucm", "ib_umad"}) {
		t.Errorf("modules loaded: %v", loaded)
	}
	ns := parseOpts(t, f.p.NspawnConfig("kube1"))
	if got, want := values(ns, "Files", "Bind")[2:], []string{"/dev/kvm", "/dev/nvidia0", "/dev/nvidiactl"}; !slices.Equal(got, want) {
		t.Errorf("devices bound %v, want %v (tun denied)", got, want)
	}
	if got := values(ns, "Files", "BindReadOnly"); !slices.Equal(got, []string{"/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.14"}) {
		t.Errorf("driver files bound %v", got)
	}
	rec, err := devices.ReadRecord(f.p, "kube1")
	if err != nil || rec == nil || !rec.Options.Auto || len(rec.Found.Devices) != 3 {
		t.Errorf("device record %+v %v", rec, err)
	}
	if b, err := os.ReadFile(f.rootfs(machinefile.CDISpecPath)); err != nil || !strings.Contains(string(b), `"/dev/nvidia0"`) {
		t.Errorf("CDI spec in the rootfs: %s %v", b, err)
	}
	f.verifyWithSystemd(t)
	// The hooks bind what the record says: nothing to rewrite.
	f.sd.Calls = nil
	if err := f.m.EnsureHooks(context.Background(), "kube1"); err != nil {
		t.Fatal(err)
	}
	if slices.Contains(f.sd.Calls, "reload") {
		t.Errorf("EnsureHooks rewrote the hooks of a slot just prepared: %v", f.sd.Calls)
	}

	g := newFixture(t, mountsUnified, ref)
	g.m.Modprobe = func(context.Context, ...string) error {
		return errors.New("modprobe: FATAL: Module rdma_ucm not found")
	}
	g.slot.RDMAModules = true
	err = g.m.Prepare(context.Background(), g.slot)
	if err == nil || !strings.Contains(err.Error(), "devices.rdma-modules") || !strings.Contains(err.Error(), "rdma_ucm not found") {
		t.Fatalf("a failed module load: %v", err)
	}
	for _, p := range g.m.SlotPaths("kube1") {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("%s exists after a failed prepare", g.p.Rel(p))
		}
	}
	g.noLeftovers(t)
}
