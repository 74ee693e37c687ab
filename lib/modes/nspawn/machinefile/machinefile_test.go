package machinefile

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/coreos/go-systemd/v22/unit"
	"golang.org/x/sys/unix"

	"unbounded-cloud.io/agent/lib/devices"
	"unbounded-cloud.io/agent/lib/hostpaths"
)

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipped: device nodes need root (mknod)")
	}
}

func mknod(t *testing.T, root, p string, major, minor uint32) {
	t.Helper()
	full := filepath.Join(root, p)
	os.MkdirAll(filepath.Dir(full), 0o755)
	if err := unix.Mknod(full, unix.S_IFCHR|0o600, int(unix.Mkdev(major, minor))); err != nil {
		t.Fatal(err)
	}
}

// values returns the values of key in section of the settings file, as
// systemd's own parser (go-systemd/unit) reads them.
func values(t *testing.T, text, section, key string) []string {
	t.Helper()
	opts, err := unit.DeserializeOptions(strings.NewReader(text))
	if err != nil {
		t.Fatalf("the settings file does not parse: %v\n%s", err, text)
	}
	var out []string
	for _, o := range opts {
		if o.Section == section && o.Name == key {
			out = append(out, o.Value)
		}
	}
	return out
}

// Each device is bound at its own path, each driver file read-only; a
// node without devices binds only what every node has.
func TestFileBindsEachDeviceAtItsPathAndTheDriverFilesReadOnly(t *testing.T) {
	f := devices.Found{
		Devices: []devices.Device{
			{Path: "/dev/kvm", Major: 10, Minor: 232, Why: "kvm"},
			{Path: "/dev/sdb", Block: true, Major: 8, Minor: 16, Why: "block"},
		},
		DriverFiles: []string{"/usr/lib/x86_64-linux-gnu/libcuda.so.550"},
	}
	text := File("kube1", "/var/lib/unbounded/slots/kube1/containerd", f)
	if got, want := values(t, text, "Files", "Bind"), []string{"/dev/kmsg", "/var/lib/unbounded/slots/kube1/containerd:" + ContainerdRoot, "/dev/kvm", "/dev/sdb"}; !slices.Equal(got, want) {
		t.Errorf("Bind= %v, want %v", got, want)
	}
	if got := values(t, text, "Files", "BindReadOnly"); !slices.Equal(got, f.DriverFiles) {
		t.Errorf("BindReadOnly= %v, want %v", got, f.DriverFiles)
	}
	if !strings.Contains(text, "# block (block 8:16)") {
		t.Errorf("a device's line does not say what it is:\n%s", text)
	}
	plain := File("kube1", "/c", devices.Found{})
	if got := values(t, plain, "Files", "Bind"); len(got) != 2 || len(values(t, plain, "Files", "BindReadOnly")) != 0 {
		t.Errorf("no devices: Bind= %v", got)
	}
	if got := values(t, plain, "Network", "VirtualEthernet"); !slices.Equal(got, []string{"no"}) {
		t.Errorf("VirtualEthernet= %v", got)
	}
}

// Refresh finds the devices again under the record's rules: a device that
// appeared is bound from the next start, the record says so; nothing
// changed rewrites nothing; a device allowed by name that is gone is left
// out, not an error.
func TestRefreshBindsTheDevicesTheHostHasNow(t *testing.T) {
	requireRoot(t)
	root := t.TempDir()
	p := hostpaths.New(root)
	os.MkdirAll(p.MachineDir("kube1"), 0o755)
	mknod(t, root, "/dev/fuse", 10, 229)
	mknod(t, root, "/dev/extra0", 240, 0)
	o := devices.Options{Auto: true, Allow: []string{"/dev/extra0"}}
	found, err := Discover(p, p.MachineDir("kube1"), o)
	if err != nil {
		t.Fatal(err)
	}
	if err := devices.WriteRecord(p, "kube1", devices.Record{Options: o, Found: found}); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Dir(p.NspawnConfig("kube1")), 0o755)
	os.WriteFile(p.NspawnConfig("kube1"), []byte(File("kube1", p.Rel(ContainerdDir(p, "kube1")), found)), 0o644)
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))

	// Nothing changed: nothing rewritten.
	fi0, _ := os.Stat(p.NspawnConfig("kube1"))
	if err := Refresh(p, "kube1", log); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(p.NspawnConfig("kube1")); !fi.ModTime().Equal(fi0.ModTime()) || logs.Len() != 0 {
		t.Errorf("an unchanged host rewrote the settings file: %s", logs.String())
	}

	// KVM appears, the allowed device goes.
	mknod(t, root, "/dev/kvm", 10, 232)
	os.Remove(filepath.Join(root, "dev/extra0"))
	if err := Refresh(p, "kube1", log); err != nil {
		t.Fatal(err)
	}
	text, _ := os.ReadFile(p.NspawnConfig("kube1"))
	if got := values(t, string(text), "Files", "Bind")[2:]; !slices.Equal(got, []string{"/dev/kvm", "/dev/fuse"}) {
		t.Errorf("after the change Bind= %v, want kvm and fuse", got)
	}
	rec, err := devices.ReadRecord(p, "kube1")
	if err != nil || rec == nil || !slices.Equal(rec.Found.Paths(), []string{"/dev/kvm", "/dev/fuse"}) || !slices.Equal(rec.Options.Allow, o.Allow) {
		t.Errorf("record after the change: %+v %v", rec, err)
	}
	if !strings.Contains(logs.String(), "/dev/extra0") || !strings.Contains(logs.String(), "devices changed") {
		t.Errorf("the log does not say what changed:\n%s", logs.String())
	}

	// A slot without a record (an older release's) is left alone.
	if err := Refresh(p, "kube2", log); err != nil {
		t.Errorf("no record: %v", err)
	}
	if _, err := os.Stat(p.NspawnConfig("kube2")); !os.IsNotExist(err) {
		t.Errorf("a slot without a record got a settings file: %v", err)
	}
}

// The CDI specification is written inside the rootfs and nowhere else,
// also when the image made /etc/cdi a symlink out of it; and removed once
// the GPUs are gone.
func TestWriteCDISpecStaysInsideTheRootfs(t *testing.T) {
	gpu := devices.Found{GPUs: []string{"/dev/nvidia0"}, Control: []string{"/dev/nvidiactl"}}
	rootfs := t.TempDir()
	if err := WriteCDISpec(rootfs, gpu); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(rootfs, CDISpecPath)); err != nil || !strings.Contains(string(b), `"nvidia.com/gpu"`) {
		t.Fatalf("spec: %s %v", b, err)
	}
	if err := WriteCDISpec(rootfs, devices.Found{}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(rootfs, CDISpecPath)); !os.IsNotExist(err) {
		t.Errorf("the spec stayed after the GPUs went: %v", err)
	}

	evil, outside := t.TempDir(), t.TempDir()
	os.MkdirAll(filepath.Join(evil, "etc"), 0o755)
	os.Symlink(outside, filepath.Join(evil, "etc", "cdi"))
	if err := WriteCDISpec(evil, gpu); err == nil {
		t.Error("a write through a symlink out of the rootfs succeeded")
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 0 {
		t.Errorf("written outside the rootfs: %v", ents)
	}
}

// A path with a colon or a backslash is escaped for Bind=, as nspawn
// reads it back.
func TestFileEscapesColonsInBindPaths(t *testing.T) {
	text := File("kube1", "/c", devices.Found{Devices: []devices.Device{{Path: `/dev/odd:name\x`, Why: "allow"}}})
	if !strings.Contains(text, "\nBind=/dev/odd\\:name\\\\x\n") {
		t.Errorf("not escaped:\n%s", text)
	}
}
