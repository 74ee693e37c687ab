package system_test

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/modes"
	"unbounded-cloud.io/agent/lib/modes/bluegreen/tree"
	"unbounded-cloud.io/agent/lib/modes/modestest"
	"unbounded-cloud.io/agent/lib/modes/nspawn"
	"unbounded-cloud.io/agent/lib/units"
	"unbounded-cloud.io/agent/tests/system/harness"
)

// rootfsLayout writes the test rootfs as a one-layer OCI image layout, the
// node image of the nspawn mode in these tests.
func rootfsLayout(t *testing.T, rootfs string) string {
	t.Helper()
	tarPath := filepath.Join(t.TempDir(), "rootfs.tar")
	f, err := os.Create(tarPath)
	if err != nil {
		t.Fatal(err)
	}
	tw := tar.NewWriter(f)
	err = filepath.WalkDir(rootfs, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(rootfs, p)
		if rel == "." {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		h, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		h.Name = rel
		if fi.IsDir() {
			h.Name += "/"
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			h.Uid, h.Gid = int(st.Uid), int(st.Gid)
		}
		h.Uname, h.Gname = "", ""
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			src, err := os.Open(p)
			if err != nil {
				return err
			}
			_, err = io.Copy(tw, src)
			src.Close()
			return err
		}
		return nil
	})
	if err == nil {
		err = tw.Close()
	}
	if err == nil {
		err = f.Close()
	}
	if err != nil {
		t.Fatal(err)
	}
	l, err := tarball.LayerFromFile(tarPath, tarball.WithCompressionLevel(gzip.BestSpeed))
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, l)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "layout")
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestNspawnSlotRunsNestedWithTheNodeSettings prepares an nspawn slot in a
// booted test host (a systemd container) from an OCI image of the test
// rootfs, and drives it with the mode's own calls over the host's D-Bus:
// the stock systemd-nspawn@kube1.service with the mode's .nspawn file and
// drop-in boots the machine (NotifyReady), which then has its host name,
// resolv.conf, /dev/kmsg, the containerd store bound in, the v1 cgroup
// controllers writable (legacy hierarchy, as on these VMs), and its own
// machine id; Restart reboots it; Destroy leaves nothing.
//
// The node stack's binaries are stand-ins here (lib/modes/modestest): this
// scenario checks what the mode builds and how systemd runs it. The real
// kubelet, containerd and runc run in the first-boot scenarios, from the
// artifacts of tests/kube's fixtures.
func TestNspawnSlotRunsNestedWithTheNodeSettings(t *testing.T) {
	rootfs, _ := harness.Require(t, false)
	// The test host gets what TESTING.md's nested kubelet recipe gives
	// it: the same settings the mode gives its machine.
	t.Setenv("SYSTEMD_NSPAWN_UNIFIED_HIERARCHY", "0")
	t.Setenv("SYSTEMD_NSPAWN_API_VFS_WRITABLE", "1")
	host := harness.Boot(t, harness.Options{NspawnArgs: []string{"--capability=all", "--system-call-filter=@keyring bpf"}})
	ref := "oci-layout:" + rootfsLayout(t, rootfs)

	paths := hostpaths.New(host.Root())
	resolv := filepath.Join(t.TempDir(), "resolv.conf")
	os.WriteFile(resolv, []byte("nameserver 127.0.0.153\n"), 0o644)
	m := &nspawn.Mode{
		Paths:      paths,
		Systemd:    func(context.Context) (modes.Systemd, error) { return units.Borrow(host.Bus()), nil },
		ResolvConf: resolv,
	}
	slot := modes.Slot{Name: "kube1", Node: modestest.Node(), Artifacts: modestest.Artifacts(t), Image: modes.Image{Ref: ref}}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	begin := time.Now()
	if err := m.Prepare(ctx, slot); err != nil {
		t.Fatal(err)
	}
	t.Logf("prepare (unpack of the test rootfs included): %v", time.Since(begin).Round(time.Millisecond))
	begin = time.Now()
	if err := m.Start(ctx, "kube1"); err != nil {
		t.Fatalf("%v\n%s", err, host.Journal(nspawn.Unit("kube1")))
	}
	t.Logf("start of systemd-nspawn@kube1.service: %v", time.Since(begin).Round(time.Millisecond))

	in := func(args ...string) string {
		t.Helper()
		out, err := host.Run(append([]string{"systemd-run", "-M", "kube1", "--wait", "--pipe", "-q"}, args...)...)
		if err != nil {
			t.Errorf("in kube1: %v: %v", args, err)
		}
		return strings.TrimSpace(out)
	}
	if got := in("hostname"); got != "site-w1" {
		t.Errorf("machine hostname %q, want the Machine's name", got)
	}
	if got := in("cat", "/etc/resolv.conf"); !strings.Contains(got, "nameserver 127.0.0.153") {
		t.Errorf("resolv.conf in the machine: %q", got)
	}
	// The test host's /dev/kmsg is the harness's stand-in file (a
	// container gets none), so compare identities rather than kinds.
	if got, want := in("stat", "-c", "%d:%i %F", "/dev/kmsg"), strings.TrimSpace(host.MustRun("stat", "-c", "%d:%i %F", "/dev/kmsg")); got != want {
		t.Errorf("/dev/kmsg in the machine is %q, the host's is %q: not bound in", got, want)
	}
	if id := in("cat", "/etc/machine-id"); len(id) != 32 {
		t.Errorf("machine-id %q: systemd did not give the machine its own", id)
	}
	// The containerd store is the host's directory: a file made inside is
	// on the host.
	in("touch", "/var/lib/containerd/probe")
	if _, err := os.Stat(paths.Join("/var/lib/unbounded/slots/kube1/containerd/probe")); err != nil {
		t.Errorf("/var/lib/containerd is not the slot's host directory: %v", err)
	}
	if got := in("systemctl", "is-active", tree.CgroupRWUnit); got != "active" {
		t.Errorf("%s is %q\n%s", tree.CgroupRWUnit, got, in("journalctl", "-u", tree.CgroupRWUnit, "--no-pager"))
	}
	// kubelet and runc create cgroups in every controller.
	if got := in("sh", "-c", "for c in cpu memory pids; do mkdir /sys/fs/cgroup/$c/unbounded-probe && rmdir /sys/fs/cgroup/$c/unbounded-probe || exit 1; done; echo ok"); got != "ok" {
		t.Error("the machine's cgroup v1 controllers are not writable")
	}
	// kubelet writes sysctls at start.
	if got := in("sh", "-c", "cat /proc/sys/vm/overcommit_memory > /proc/sys/vm/overcommit_memory && echo ok"); got != "ok" {
		t.Error("/proc/sys is not writable in the machine")
	}
	for _, u := range []string{tree.ContainerdUnit, tree.KubeletUnit} {
		if got := in("systemctl", "is-enabled", u); got != "enabled" {
			t.Errorf("%s is %q in the machine", u, got)
		}
	}

	// Restart: a reboot of the machine, not of the test host.
	hostLeader := host.Leader()
	before := in("systemctl", "show", "-P", "InvocationID", "multi-user.target")
	if err := m.Restart(ctx, "kube1"); err != nil {
		t.Fatal(err)
	}
	if after := in("systemctl", "show", "-P", "InvocationID", "multi-user.target"); after == before {
		t.Error("restart did not boot the machine again")
	}
	if host.Leader() != hostLeader {
		t.Error("restart rebooted the test host")
	}

	if err := m.Destroy(ctx, "kube1"); err != nil {
		t.Fatal(err)
	}
	if st := host.UnitState(nspawn.Unit("kube1")); st.ActiveState == "active" {
		t.Errorf("%s is %s after destroy", nspawn.Unit("kube1"), st)
	}
	for _, p := range append(m.SlotPaths("kube1"), paths.NspawnDropInDir("kube1")) {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("%s is still there after destroy (%v)", paths.Rel(p), err)
		}
	}
}
