package devices

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// fakeHost is a /dev, /sys and /proc tree with real device nodes
// (mknod needs root) and sysfs-shaped block entries.
type fakeHost struct {
	t    *testing.T
	root string
}

func newFakeHost(t *testing.T) *fakeHost {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipped: device nodes need root (mknod)")
	}
	return &fakeHost{t: t, root: t.TempDir()}
}

func (h *fakeHost) mknod(p string, block bool, major, minor uint32) {
	h.t.Helper()
	full := filepath.Join(h.root, p)
	os.MkdirAll(filepath.Dir(full), 0o755)
	mode := uint32(unix.S_IFCHR | 0o600)
	if block {
		mode = unix.S_IFBLK | 0o600
	}
	if err := unix.Mknod(full, mode, int(unix.Mkdev(major, minor))); err != nil {
		h.t.Fatal(err)
	}
}

func (h *fakeHost) write(p, data string) {
	h.t.Helper()
	full := filepath.Join(h.root, p)
	os.MkdirAll(filepath.Dir(full), 0o755)
	if err := os.WriteFile(full, []byte(data), 0o644); err != nil {
		h.t.Fatal(err)
	}
}

// disk makes a block disk in /sys (devices/virtual/block/<name>, linked
// from class/block and dev/block) with its partitions, and its /dev nodes.
func (h *fakeHost) disk(name string, major, minor uint32, parts ...string) {
	h.t.Helper()
	dir := "/sys/devices/pci0000:00/block/" + name
	h.write(dir+"/dev", devKey(major, minor)+"\n")
	h.link(dir, "/sys/class/block/"+name)
	h.link(dir, "/sys/dev/block/"+devKey(major, minor))
	h.mknod("/dev/"+name, true, major, minor)
	for i, p := range parts {
		pd := dir + "/" + p
		mn := minor + uint32(i) + 1
		h.write(pd+"/dev", devKey(major, mn)+"\n")
		h.write(pd+"/partition", "1\n")
		h.link(pd, "/sys/class/block/"+p)
		h.link(pd, "/sys/dev/block/"+devKey(major, mn))
		h.mknod("/dev/"+p, true, major, mn)
	}
}

func (h *fakeHost) link(target, name string) {
	h.t.Helper()
	full := filepath.Join(h.root, name)
	os.MkdirAll(filepath.Dir(full), 0o755)
	if err := os.Symlink(filepath.Join(h.root, target), full); err != nil {
		h.t.Fatal(err)
	}
}

func paths(f Found) []string { return f.Paths() }

// A host with KVM, tun and FUSE, a root disk with its partitions, a
// second disk, loop, RAM and optical devices, RDMA and an NVIDIA and an
// AMD GPU: discovery gives the node everything but the disk the host
// runs from and the kinds never given.
func TestDiscoverGivesTheNodeTheHostsDevicesButNeverItsRootDisk(t *testing.T) {
	h := newFakeHost(t)
	h.mknod("/dev/kvm", false, 10, 232)
	h.mknod("/dev/net/tun", false, 10, 200)
	h.mknod("/dev/fuse", false, 10, 229)
	h.disk("sda", 8, 0, "sda1", "sda2")
	h.disk("sdb", 8, 16, "sdb1")
	h.disk("nvme0n1", 259, 0)
	h.disk("loop0", 7, 0)
	h.disk("zram0", 252, 0)
	h.disk("sr0", 11, 0)
	// / on sda2, /boot on sda1 would be enough: one mount on the disk
	// keeps the whole disk.
	h.write("/proc/self/mountinfo", "22 1 8:2 / / rw - ext4 /dev/sda2 rw\n23 22 0:21 / /proc rw - proc proc rw\n")
	h.write("/proc/swaps", "Filename\tType\tSize\tUsed\tPriority\n")
	h.mknod("/dev/infiniband/uverbs0", false, 231, 192)
	h.mknod("/dev/infiniband/rdma_cm", false, 10, 58)
	h.mknod("/dev/nvidia0", false, 195, 0)
	h.mknod("/dev/nvidia1", false, 195, 1)
	h.mknod("/dev/nvidiactl", false, 195, 255)
	h.mknod("/dev/nvidia-uvm", false, 508, 0)
	h.mknod("/dev/nvidia-caps/nvidia-cap1", false, 511, 1)
	h.write("/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.14", "elf")
	h.write("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.14", "elf")
	h.write("/usr/lib/x86_64-linux-gnu/libc.so.6", "not nvidia's")
	h.write("/usr/bin/nvidia-smi", "elf")
	h.mknod("/dev/kfd", false, 235, 0)
	h.mknod("/dev/dri/renderD128", false, 226, 128)

	f, err := Host{Root: h.root}.Discover(Options{Auto: true})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"/dev/kvm", "/dev/net/tun", "/dev/fuse", "/dev/nvme0n1", "/dev/sdb", "/dev/sdb1",
		"/dev/infiniband/rdma_cm", "/dev/infiniband/uverbs0", "/dev/nvidia-caps/nvidia-cap1", "/dev/dri/renderD128", "/dev/kfd",
		"/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia-uvm", "/dev/nvidiactl"}
	if got := paths(f); !slices.Equal(got, want) {
		t.Errorf("discovered:\n %v\nwant\n %v", got, want)
	}
	for _, d := range f.Devices {
		if strings.HasPrefix(d.Path, "/dev/sd") && (!d.Block || d.Major != 8) {
			t.Errorf("%+v: want a block device 8:x", d)
		}
		if d.Path == "/dev/kvm" && (d.Block || d.Major != 10 || d.Minor != 232 || d.Why != "kvm") {
			t.Errorf("%+v: want char 10:232 by rule kvm", d)
		}
	}
	if !slices.Equal(f.GPUs, []string{"/dev/nvidia0", "/dev/nvidia1"}) || !slices.Equal(f.Control, []string{"/dev/nvidia-uvm", "/dev/nvidiactl"}) {
		t.Errorf("GPUs %v control %v", f.GPUs, f.Control)
	}
	if want := []string{"/usr/bin/nvidia-smi", "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.14", "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.14"}; !slices.Equal(f.DriverFiles, want) {
		t.Errorf("driver files %v, want %v", f.DriverFiles, want)
	}

	// Off: nothing but what is allowed by name; a denied one never.
	f, err = Host{Root: h.root}.Discover(Options{Allow: []string{"/dev/loop0", "/dev/kvm"}})
	if err != nil || !slices.Equal(paths(f), []string{"/dev/loop0", "/dev/kvm"}) {
		t.Errorf("auto off, two allowed: %v %v", paths(f), err)
	}
	f, err = Host{Root: h.root}.Discover(Options{Auto: true, Deny: []string{"/dev/sdb1", "/dev/nvidia1"}})
	if err != nil || slices.Contains(paths(f), "/dev/sdb1") || slices.Contains(paths(f), "/dev/nvidia1") || slices.Contains(f.GPUs, "/dev/nvidia1") {
		t.Errorf("denied devices given: %v %v", paths(f), err)
	}
}

// A device mapper volume of the root filesystem keeps the disks under
// it, and a swap partition its disk: neither is given; nor is a disk that
// holds a volume of the host's, nor the volumes (mounted or not).
func TestDiscoverKeepsTheDisksUnderTheHostsVolumesAndSwap(t *testing.T) {
	h := newFakeHost(t)
	h.disk("sda", 8, 0, "sda1")
	h.disk("sdb", 8, 16, "sdb1")
	h.disk("sdc", 8, 32)
	h.disk("sdd", 8, 48)
	h.disk("dm-0", 253, 0)
	h.disk("dm-1", 253, 1) // an LV on sdd, not mounted: sdd is still the host's
	h.link("/sys/devices/pci0000:00/block/dm-1", "/sys/devices/pci0000:00/block/sdd/holders/dm-1")
	h.link("/sys/devices/pci0000:00/block/sda/sda1", "/sys/devices/pci0000:00/block/dm-0/slaves/sda1")
	h.write("/proc/self/mountinfo", "22 1 253:0 / / rw - ext4 /dev/mapper/vg-root rw\n")
	h.write("/proc/swaps", "Filename\tType\tSize\tUsed\tPriority\n/dev/sdb1 partition 1024 0 -2\n")
	f, err := Host{Root: h.root}.Discover(Options{Auto: true})
	if err != nil {
		t.Fatal(err)
	}
	if got := paths(f); !slices.Equal(got, []string{"/dev/sdc"}) {
		t.Errorf("discovered %v, want only /dev/sdc", got)
	}
	// Asked for by name, the root disk is still refused.
	_, err = Host{Root: h.root}.Discover(Options{Allow: []string{"/dev/sda"}})
	if !errors.Is(err, ErrDevice) || !strings.Contains(err.Error(), "/dev/sda") || !strings.Contains(err.Error(), "the host uses it") {
		t.Errorf("the root disk allowed by name: %v", err)
	}
}

// An explicit device that is missing, not a device, not under /dev, or
// both allowed and denied is an error naming it.
func TestDiscoverRefusesAnExplicitPathThatIsNoDevice(t *testing.T) {
	h := newFakeHost(t)
	h.write("/dev/notadevice", "x")
	for _, o := range []Options{
		{Allow: []string{"/dev/missing"}},
		{Allow: []string{"/dev/notadevice"}},
		{Allow: []string{"relative"}},
		{Allow: []string{"/etc/passwd"}},
		{Deny: []string{"kvm"}},
		{Allow: []string{"/dev/notadevice"}, Deny: []string{"/dev/notadevice"}},
	} {
		_, err := Host{Root: h.root}.Discover(o)
		name := append(o.Allow, o.Deny...)[0]
		if !errors.Is(err, ErrDevice) || !strings.Contains(err.Error(), name) {
			t.Errorf("%+v: %v, want ErrDevice naming %s", o, err, name)
		}
	}
}

// This host: discovery runs on the real /dev and /sys and never gives
// the disk / is on.
func TestDiscoverOnThisHostNeverGivesTheRootDisk(t *testing.T) {
	f, err := Host{}.Discover(Options{Auto: true})
	if err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Stat("/", &st); err != nil {
		t.Fatal(err)
	}
	for _, d := range f.Devices {
		if d.Block && d.Major == unix.Major(uint64(st.Dev)) && d.Minor == unix.Minor(uint64(st.Dev)) {
			t.Errorf("the root filesystem's device %s was given", d.Path)
		}
	}
	t.Logf("this host gives: %v", f.Paths())
}

// The CDI specification of two GPUs is one the CDI library reads and
// validates (the code containerd uses): a device per GPU and "all", the
// control devices and the driver's files for every GPU container.
func TestCDISpecIsValidForTheCDILibrary(t *testing.T) {
	f := Found{
		GPUs:        []string{"/dev/nvidia0", "/dev/nvidia1"},
		Control:     []string{"/dev/nvidia-uvm", "/dev/nvidiactl"},
		DriverFiles: []string{"/usr/bin/nvidia-smi", "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.14"},
	}
	b, err := CDISpec(f)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "nvidia.yaml")
	os.WriteFile(p, b, 0o644)
	spec, err := cdi.ReadSpec(p, 0)
	if err != nil {
		t.Fatalf("the CDI library refuses the spec: %v\n%s", err, b)
	}
	if spec.GetVendor() != "nvidia.com" || spec.GetClass() != "gpu" {
		t.Errorf("vendor %q class %q", spec.GetVendor(), spec.GetClass())
	}
	for _, name := range []string{"0", "1", "all"} {
		if spec.GetDevice(name) == nil {
			t.Errorf("no device %q in\n%s", name, b)
		}
	}
	if v, err := cdispec.MinimumRequiredVersion(spec.Spec); err != nil || v > CDIVersion {
		t.Errorf("minimum version %s (%v), the spec says %s", v, err, CDIVersion)
	}
	if b, err := CDISpec(Found{}); b != nil || err != nil {
		t.Errorf("no GPU: %s %v, want no spec", b, err)
	}
}

// A device named by a link is given as the node the link names, and a
// denied link denies its node.
func TestDiscoverGivesALinkAsItsNodeAndDeniesByNumber(t *testing.T) {
	h := newFakeHost(t)
	h.disk("sdb", 8, 16)
	h.disk("sdc", 8, 32)
	h.write("/proc/self/mountinfo", "")
	os.MkdirAll(filepath.Join(h.root, "dev/disk/by-id"), 0o755)
	os.Symlink("../../sdb", filepath.Join(h.root, "dev/disk/by-id/ata-DISK_B"))
	os.Symlink("../../sdc", filepath.Join(h.root, "dev/disk/by-id/ata-DISK_C"))
	os.Symlink("/etc/passwd", filepath.Join(h.root, "dev/escape"))
	f, err := Host{Root: h.root}.Discover(Options{Auto: true, Allow: []string{"/dev/disk/by-id/ata-DISK_B"}, Deny: []string{"/dev/disk/by-id/ata-DISK_C"}})
	if err != nil {
		t.Fatal(err)
	}
	if got := paths(f); !slices.Equal(got, []string{"/dev/sdb"}) {
		t.Errorf("discovered %v, want /dev/sdb once (found and allowed by its link), /dev/sdc denied by its link", got)
	}
	f, err = Host{Root: h.root}.Discover(Options{Allow: []string{"/dev/disk/by-id/ata-DISK_B"}})
	if err != nil || len(f.Devices) != 1 || f.Devices[0].Path != "/dev/sdb" || f.Devices[0].Why != "allow as /dev/disk/by-id/ata-DISK_B" {
		t.Errorf("allowed by its link: %+v %v", f.Devices, err)
	}
	if _, err := (Host{Root: h.root}).Discover(Options{Allow: []string{"/dev/escape"}}); !errors.Is(err, ErrDevice) {
		t.Errorf("a link out of /dev: %v, want ErrDevice", err)
	}
}
