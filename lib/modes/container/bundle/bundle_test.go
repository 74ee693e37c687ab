package bundle

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"unbounded-cloud.io/agent/lib/devices"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/modes/nspawn/machinefile"
)

func mknod(t *testing.T, root, p string, major, minor uint32) {
	t.Helper()
	full := filepath.Join(root, p)
	os.MkdirAll(filepath.Dir(full), 0o755)
	if err := unix.Mknod(full, unix.S_IFCHR|0o600, int(unix.Mkdev(major, minor))); err != nil {
		t.Fatal(err)
	}
}

// Before every start of the container its devices are found again and
// config.json rewritten when they changed; the fixed mounts and every
// other setting stay; an unchanged host rewrites nothing.
func TestRefreshBindsTheDevicesTheHostHasNow(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipped: device nodes need root (mknod)")
	}
	root := t.TempDir()
	p := hostpaths.New(root)
	rootfs := filepath.Join(Dir(p, "kube1"), RootfsDir)
	os.MkdirAll(rootfs, 0o755)
	mknod(t, root, "/dev/fuse", 10, 229)
	o := devices.Options{Auto: true}
	found, err := machinefile.Discover(p, rootfs, o)
	if err != nil {
		t.Fatal(err)
	}
	if err := devices.WriteRecord(p, "kube1", devices.Record{Options: o, Found: found}); err != nil {
		t.Fatal(err)
	}
	spec := Spec("w1", "/usr/lib/systemd/systemd", []string{"CAP_SYS_ADMIN"}, "/var/lib/unbounded/slots/kube1/containerd", found)
	data, err := Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(Dir(p, "kube1"), ConfigFile)
	os.WriteFile(cfg, data, 0o600)
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))

	fi0, _ := os.Stat(cfg)
	if err := Refresh(p, "kube1", log); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(cfg); !fi.ModTime().Equal(fi0.ModTime()) || logs.Len() != 0 {
		t.Errorf("an unchanged host rewrote config.json: %s", logs.String())
	}

	mknod(t, root, "/dev/kvm", 10, 232)
	if err := Refresh(p, "kube1", log); err != nil {
		t.Fatal(err)
	}
	got, err := Read(p, "kube1")
	if err != nil {
		t.Fatal(err)
	}
	var dst []string
	for _, m := range got.Mounts {
		dst = append(dst, m.Destination)
	}
	if want := []string{"/dev/kmsg", "/var/lib/containerd", "/dev/kvm", "/dev/fuse"}; !slices.Equal(dst, want) {
		t.Errorf("mounts after /dev/kvm appeared: %v, want %v", dst, want)
	}
	if got.Hostname != "w1" || !slices.Equal(got.Process.Args, []string{"/usr/lib/systemd/systemd"}) {
		t.Errorf("the refresh changed more than the devices: %+v", got)
	}
	if fi, err := os.Stat(cfg); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("config.json after the refresh: %v %v", fi, err)
	}
	rec, err := devices.ReadRecord(p, "kube1")
	if err != nil || rec == nil || !slices.Equal(rec.Found.Paths(), []string{"/dev/kvm", "/dev/fuse"}) {
		t.Errorf("record after the change: %+v %v", rec, err)
	}
	if !strings.Contains(logs.String(), "devices changed") {
		t.Errorf("the log does not say what changed:\n%s", logs.String())
	}
	// A slot without a bundle is left alone.
	if err := Refresh(p, "kube2", log); err != nil {
		t.Errorf("no bundle: %v", err)
	}
}
