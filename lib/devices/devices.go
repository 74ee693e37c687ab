// Package devices finds the host's devices that a node is given: the
// virtualization, network and FUSE devices, block devices that the host
// does not run from, RDMA devices, and NVIDIA and AMD GPUs with the
// NVIDIA driver's user-space files (ARCHITECTURE section 2). Mode nspawn
// binds what it finds into the node machine at prepare and at every
// restart (devices come and go); mode none sees the host's /dev anyway.
//
// A leaf: it reads /dev, /sys and /proc under a root (a fake tree in
// tests) and imports only the leaves hostpaths and state of the agent
// (Record), so that restart, a small binary, can discover again.
package devices

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/regfile"
	"unbounded-cloud.io/agent/lib/state"
)

// Options are the [devices] section of the configuration.
type Options struct {
	// Auto discovers the devices this package knows (Discover).
	Auto bool
	// Allow are device paths given to the node whatever discovery says
	// (a loop device, a disk the host does not use); each must exist and
	// be a character or block device.
	Allow []string
	// Deny are device paths never given, discovered or not.
	Deny []string
}

// Device is one device node given to the node, at the same path there.
type Device struct {
	Path  string `json:"path"`
	Block bool   `json:"block,omitempty"`
	Major uint32 `json:"major"`
	Minor uint32 `json:"minor"`
	// Why names the rule that chose it: "kvm", "tun", "block", "rdma",
	// "nvidia", "amd", "allow".
	Why string `json:"why"`
}

// Found is what Discover chose.
type Found struct {
	Devices []Device `json:"devices,omitempty"`
	// DriverFiles are host files bound read-only at the same path: the
	// NVIDIA driver's user-space libraries and tools, which must match
	// the host's kernel module.
	DriverFiles []string `json:"driverFiles,omitempty"`
	// GPUs are the NVIDIA GPU device nodes (/dev/nvidia0, ...), in order,
	// for the CDI specification (CDISpec).
	GPUs []string `json:"gpus,omitempty"`
	// Control are the NVIDIA device nodes every GPU container needs
	// (/dev/nvidiactl, /dev/nvidia-uvm, ...).
	Control []string `json:"control,omitempty"`
}

// Paths returns the device paths of f, in order.
func (f Found) Paths() []string {
	out := make([]string, 0, len(f.Devices))
	for _, d := range f.Devices {
		out = append(out, d.Path)
	}
	return out
}

// ErrDevice is an explicit device (Options.Allow, Options.Deny) that is
// missing or is not a device; the configuration layer names its key.
var ErrDevice = errors.New("not a device")

// Host is where Discover looks: Root "/" on a host.
type Host struct {
	Root string
}

func (h Host) join(p string) string { return filepath.Join(h.root(), p) }

func (h Host) root() string {
	if h.Root == "" {
		return "/"
	}
	return h.Root
}

// Fixed are the character devices given whenever the host has them:
// KVM and vhost for virtual machines (KubeVirt, Kata), tun for VPNs and
// virtual networks, FUSE for user-space filesystems.
var Fixed = []struct{ Path, Why string }{
	{"/dev/kvm", "kvm"},
	{"/dev/net/tun", "tun"},
	{"/dev/vhost-net", "vhost"},
	{"/dev/vhost-vsock", "vhost"},
	{"/dev/fuse", "fuse"},
}

// skippedBlock are the block devices a node is never given by discovery:
// loop and RAM disks, compressed swap in RAM, floppies, optical drives,
// and the volumes the host builds itself (device mapper, MD RAID), which
// are its own whether mounted or not (devices.allow gives one by name).
var skippedBlock = []string{"loop", "ram", "zram", "fd", "sr", "dm-", "md"}

// nvidiaLibDirs are where a distribution's NVIDIA driver puts its
// user-space libraries; nvidiaLibs are their names (the driver's own,
// not the CUDA toolkit's).
var (
	nvidiaLibDirs = []string{"/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib"}
	nvidiaLibs    = []string{"libnvidia-*.so*", "libcuda.so*", "libcudadebugger.so*", "libnvcuvid.so*", "libnvoptix.so*"}
	nvidiaTools   = []string{"/usr/bin/nvidia-smi", "/usr/bin/nvidia-debugdump", "/usr/bin/nvidia-persistenced"}
)

// Discover returns the devices the node is given under o: with o.Auto
// those this package knows and the host has, then o.Allow, less o.Deny.
// An explicit path that is missing or not a device wraps ErrDevice and
// names the path; so does an allowed block device the host runs from.
func (h Host) Discover(o Options) (Found, error) {
	var f Found
	// Denied and given devices are compared by kind and number, so that a
	// device named by one of its links (/dev/disk/by-id/...) is the same
	// device as its node.
	deny := map[string]bool{}
	for _, p := range o.Deny {
		if d, err := h.device(path.Clean(p), func(m os.FileMode) bool { return m&fs.ModeDevice != 0 }); err == nil {
			deny[d.key()] = true
		}
	}
	seen := map[string]bool{}
	add := func(p, why string, want func(os.FileMode) bool) (bool, error) {
		p = path.Clean(p)
		d, err := h.device(p, want)
		if err != nil {
			return false, err
		}
		if seen[d.key()] || deny[d.key()] {
			return false, nil
		}
		d.Why = why
		seen[d.key()] = true
		f.Devices = append(f.Devices, d)
		return true, nil
	}
	char := func(m os.FileMode) bool { return m&fs.ModeCharDevice != 0 }
	anyDev := func(m os.FileMode) bool { return m&fs.ModeDevice != 0 }
	inUse, err := h.blockInUse()
	if err != nil {
		return Found{}, err
	}
	if o.Auto {
		for _, x := range Fixed {
			if _, err := add(x.Path, x.Why, char); !absent(err) {
				return Found{}, err
			}
		}
		blocks, err := h.blockDevices(inUse)
		if err != nil {
			return Found{}, err
		}
		for _, p := range blocks {
			if _, err := add(p, "block", func(m os.FileMode) bool { return m&fs.ModeDevice != 0 && m&fs.ModeCharDevice == 0 }); !absent(err) {
				return Found{}, err
			}
		}
		for _, g := range []struct{ dir, why string }{{"/dev/infiniband", "rdma"}, {"/dev/nvidia-caps", "nvidia"}, {"/dev/dri", "amd"}} {
			names, err := h.charsIn(g.dir)
			if err != nil {
				return Found{}, err
			}
			for _, p := range names {
				if _, err := add(p, g.why, char); !absent(err) {
					return Found{}, err
				}
			}
		}
		if _, err := add("/dev/kfd", "amd", char); !absent(err) {
			return Found{}, err
		}
		if err := h.nvidia(&f, add, char); err != nil {
			return Found{}, err
		}
	}
	for _, p := range o.Allow {
		if !path.IsAbs(p) || !strings.HasPrefix(path.Clean(p), "/dev/") {
			return Found{}, fmt.Errorf("%s: %w: a device path is absolute, under /dev", p, ErrDevice)
		}
		// A link (/dev/disk/by-id/..., /dev/mapper/...) is given as the
		// node it names: the node's /dev has the same node.
		node, err := h.resolve(path.Clean(p))
		if err != nil {
			return Found{}, err
		}
		d, err := h.device(node, anyDev)
		if errors.Is(err, fs.ErrNotExist) {
			return Found{}, fmt.Errorf("%s: %w: there is no such device node on this host", p, ErrDevice)
		}
		if err != nil {
			return Found{}, err // names p, wraps ErrDevice
		}
		if deny[d.key()] {
			return Found{}, fmt.Errorf("%s: %w: allowed and denied both", p, ErrDevice)
		}
		if d.Block && inUse[devKey(d.Major, d.Minor)] {
			return Found{}, fmt.Errorf("%s: %w the node may have: the host uses it (mounted, swap, or its disk holds the host's filesystems)", p, ErrDevice)
		}
		why := "allow"
		if node != path.Clean(p) {
			why = "allow as " + p
		}
		if _, err := add(node, why, anyDev); err != nil {
			return Found{}, err
		}
	}
	for _, p := range o.Deny {
		if !path.IsAbs(p) || !strings.HasPrefix(path.Clean(p), "/dev/") {
			return Found{}, fmt.Errorf("%s: %w: a device path is absolute, under /dev", p, ErrDevice)
		}
	}
	return f, nil
}

// key is the device's kind and number.
func (d Device) key() string {
	k := "c"
	if d.Block {
		k = "b"
	}
	return k + devKey(d.Major, d.Minor)
}

// resolve follows the links of p (a path on the host, under /dev) to the
// node they name, which must be under /dev too.
func (h Host) resolve(p string) (string, error) {
	real, err := filepath.EvalSymlinks(h.join(p))
	if errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("%s: %w: there is no such device node on this host", p, ErrDevice)
	}
	if err != nil {
		return "", err
	}
	rel, err := filepath.Rel(h.root(), real)
	if err != nil || strings.HasPrefix(rel, "..") {
		return "", fmt.Errorf("%s: %w: it leads out of /dev", p, ErrDevice)
	}
	node := "/" + filepath.ToSlash(rel)
	if !strings.HasPrefix(node, "/dev/") {
		return "", fmt.Errorf("%s: %w: it leads to %s, out of /dev", p, ErrDevice, node)
	}
	return node, nil
}

// device stats p (a path on the host) and checks its kind.
func (h Host) device(p string, want func(os.FileMode) bool) (Device, error) {
	var st unix.Stat_t
	if err := unix.Stat(h.join(p), &st); err != nil {
		return Device{}, &fs.PathError{Op: "stat", Path: p, Err: err}
	}
	var mode os.FileMode
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFCHR:
		mode = fs.ModeDevice | fs.ModeCharDevice
	case unix.S_IFBLK:
		mode = fs.ModeDevice
	}
	if mode == 0 || !want(mode) {
		return Device{}, fmt.Errorf("%s: %w", p, ErrDevice)
	}
	return Device{
		Path:  p,
		Block: mode&fs.ModeCharDevice == 0,
		Major: unix.Major(uint64(st.Rdev)),
		Minor: unix.Minor(uint64(st.Rdev)),
	}, nil
}

// charsIn lists dir's entries (a directory of device nodes, one level).
func (h Host) charsIn(dir string) ([]string, error) {
	ents, err := os.ReadDir(h.join(dir))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		out = append(out, path.Join(dir, e.Name()))
	}
	return out, nil
}

// nvidia adds the NVIDIA device nodes, and the driver's user-space files
// when there is a GPU.
func (h Host) nvidia(f *Found, add func(string, string, func(os.FileMode) bool) (bool, error), char func(os.FileMode) bool) error {
	ents, err := os.ReadDir(h.join("/dev"))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	var gpus, control []string
	for _, e := range ents {
		n := e.Name()
		if !strings.HasPrefix(n, "nvidia") || e.IsDir() {
			continue
		}
		if _, err := strconv.Atoi(strings.TrimPrefix(n, "nvidia")); err == nil {
			gpus = append(gpus, "/dev/"+n)
		} else {
			control = append(control, "/dev/"+n)
		}
	}
	slices.SortFunc(gpus, func(a, b string) int {
		x, _ := strconv.Atoi(strings.TrimPrefix(a, "/dev/nvidia"))
		y, _ := strconv.Atoi(strings.TrimPrefix(b, "/dev/nvidia"))
		return x - y
	})
	for _, p := range append(slices.Clone(gpus), control...) {
		ok, err := add(p, "nvidia", char)
		if !absent(err) {
			return err
		}
		if ok && slices.Contains(gpus, p) {
			f.GPUs = append(f.GPUs, p)
		} else if ok {
			f.Control = append(f.Control, p)
		}
	}
	if len(f.GPUs) == 0 {
		return nil
	}
	seen := map[string]bool{}
	for _, dir := range nvidiaLibDirs {
		for _, pat := range nvidiaLibs {
			m, err := filepath.Glob(filepath.Join(h.join(dir), pat))
			if err != nil {
				return err
			}
			for _, p := range m {
				rel := "/" + strings.TrimPrefix(strings.TrimPrefix(p, h.root()), "/")
				if !seen[rel] {
					seen[rel] = true
					f.DriverFiles = append(f.DriverFiles, rel)
				}
			}
		}
	}
	for _, p := range nvidiaTools {
		if fi, err := os.Stat(h.join(p)); err == nil && fi.Mode().IsRegular() {
			f.DriverFiles = append(f.DriverFiles, p)
		}
	}
	slices.Sort(f.DriverFiles)
	return nil
}

// absent says whether err from a discovery's look at a path means only
// "not there" (missing, or not a device node): discovery skips those.
func absent(err error) bool {
	return err == nil || errors.Is(err, fs.ErrNotExist) || errors.Is(err, ErrDevice)
}

func devKey(major, minor uint32) string { return fmt.Sprintf("%d:%d", major, minor) }

// blockDevices lists /dev/<name> for each block device of /sys/class/block
// that discovery may give: not a skipped kind, not in use by the host.
func (h Host) blockDevices(inUse map[string]bool) ([]string, error) {
	ents, err := os.ReadDir(h.join("/sys/class/block"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		n := e.Name()
		if slices.ContainsFunc(skippedBlock, func(p string) bool { return strings.HasPrefix(n, p) }) {
			continue
		}
		dev, err := os.ReadFile(h.join("/sys/class/block/" + n + "/dev"))
		if err != nil {
			continue
		}
		if inUse[strings.TrimSpace(string(dev))] {
			continue
		}
		// Held by another block device (a device mapper or MD volume of
		// the host's, mounted or not): the host's, not the node's.
		if held, _ := os.ReadDir(h.join("/sys/class/block/" + n + "/holders")); len(held) > 0 {
			continue
		}
		out = append(out, "/dev/"+n)
	}
	slices.Sort(out)
	return out, nil
}

// blockInUse returns the block devices ("major:minor") the host uses: each
// one a mount or a swap area is on, what it is built from (a device
// mapper or MD device's slaves, recursively), and for each of those its
// whole disk and every partition of that disk. Never hand the node the
// disk the host runs from.
func (h Host) blockInUse() (map[string]bool, error) {
	used := map[string]bool{}
	mi, err := os.ReadFile(h.join("/proc/self/mountinfo"))
	if !absent(err) {
		return nil, err
	}
	sc := bufio.NewScanner(bytes.NewReader(mi))
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 2 && !strings.HasPrefix(fields[2], "0:") {
			used[fields[2]] = true
		}
	}
	if sw, err := os.ReadFile(h.join("/proc/swaps")); err == nil {
		for i, l := range strings.Split(string(sw), "\n") {
			fields := strings.Fields(l)
			if i == 0 || len(fields) == 0 {
				continue
			}
			var st unix.Stat_t
			if unix.Stat(h.join(fields[0]), &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFBLK {
				used[devKey(unix.Major(uint64(st.Rdev)), unix.Minor(uint64(st.Rdev)))] = true
			}
		}
	}
	// Follow each to what it is built from, and to its disk.
	todo := make([]string, 0, len(used))
	for k := range used {
		todo = append(todo, k)
	}
	for len(todo) > 0 {
		k := todo[len(todo)-1]
		todo = todo[:len(todo)-1]
		sys := h.join("/sys/dev/block/" + k)
		real, err := filepath.EvalSymlinks(sys)
		if err != nil {
			continue
		}
		mark := func(dir string) {
			if b, err := os.ReadFile(filepath.Join(dir, "dev")); err == nil {
				if d := strings.TrimSpace(string(b)); !used[d] {
					used[d] = true
					todo = append(todo, d)
				}
			}
		}
		disk := real
		if _, err := os.Stat(filepath.Join(real, "partition")); err == nil {
			disk = filepath.Dir(real)
		}
		mark(disk)
		// Every partition of the disk.
		if ents, err := os.ReadDir(disk); err == nil {
			for _, e := range ents {
				if _, err := os.Stat(filepath.Join(disk, e.Name(), "partition")); err == nil {
					mark(filepath.Join(disk, e.Name()))
				}
			}
		}
		if ents, err := os.ReadDir(filepath.Join(real, "slaves")); err == nil {
			for _, e := range ents {
				if r, err := filepath.EvalSymlinks(filepath.Join(real, "slaves", e.Name())); err == nil {
					mark(r)
				}
			}
		}
	}
	return used, nil
}

// CDIVersion is the CDI specification version CDISpec writes (0.6.0:
// what containerd 1.7+ and the NVIDIA device plugin read).
const CDIVersion = "0.6.0"

// CDIKind is the device kind of the NVIDIA GPUs in CDISpec: a pod's
// container asks for "nvidia.com/gpu=0", "nvidia.com/gpu=all".
const CDIKind = "nvidia.com/gpu"

type cdiSpec struct {
	CDIVersion     string      `json:"cdiVersion"`
	Kind           string      `json:"kind"`
	Devices        []cdiDevice `json:"devices"`
	ContainerEdits cdiEdits    `json:"containerEdits"`
}

type cdiDevice struct {
	Name           string   `json:"name"`
	ContainerEdits cdiEdits `json:"containerEdits"`
}

type cdiEdits struct {
	DeviceNodes []cdiNode  `json:"deviceNodes,omitempty"`
	Mounts      []cdiMount `json:"mounts,omitempty"`
}

type cdiNode struct {
	Path string `json:"path"`
}

type cdiMount struct {
	HostPath      string   `json:"hostPath"`
	ContainerPath string   `json:"containerPath"`
	Options       []string `json:"options"`
}

// CDISpec is the CDI specification of f's NVIDIA GPUs (nil when there is
// none): one device per GPU by its index ("0", "1", ...) and "all"; every
// GPU container gets the control devices and the driver's files, bound
// read-only at the same paths (as they are in the node). It is JSON, which
// is YAML too: /etc/cdi/nvidia.yaml.
func CDISpec(f Found) ([]byte, error) {
	if len(f.GPUs) == 0 {
		return nil, nil
	}
	s := cdiSpec{CDIVersion: CDIVersion, Kind: CDIKind}
	var all []cdiNode
	for _, g := range f.GPUs {
		n := cdiNode{Path: g}
		s.Devices = append(s.Devices, cdiDevice{Name: strings.TrimPrefix(g, "/dev/nvidia"), ContainerEdits: cdiEdits{DeviceNodes: []cdiNode{n}}})
		all = append(all, n)
	}
	s.Devices = append(s.Devices, cdiDevice{Name: "all", ContainerEdits: cdiEdits{DeviceNodes: all}})
	for _, c := range f.Control {
		s.ContainerEdits.DeviceNodes = append(s.ContainerEdits.DeviceNodes, cdiNode{Path: c})
	}
	for _, p := range f.DriverFiles {
		s.ContainerEdits.Mounts = append(s.ContainerEdits.Mounts, cdiMount{HostPath: p, ContainerPath: p, Options: []string{"ro", "nosuid", "nodev", "bind"}})
	}
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// Record is what a slot's node was given and by which rules, kept beside
// the slot (RecordPath): restart discovers again under the same rules
// without the configuration, and `unbounded status` lists it.
type Record struct {
	Options Options   `json:"options"`
	Found   Found     `json:"found"`
	At      time.Time `json:"at"`
}

// RecordPath is /var/lib/unbounded/slots/<slot>/devices.json.
func RecordPath(p hostpaths.Paths, slot string) string {
	return filepath.Join(p.SlotDir(slot), "devices.json")
}

// ReadRecord reads slot's record; nil, nil when there is none (a slot
// prepared by a release without device discovery, or mode none).
func ReadRecord(p hostpaths.Paths, slot string) (*Record, error) {
	data, err := regfile.Read(RecordPath(p, slot), 1<<20)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var r Record
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", RecordPath(p, slot), err)
	}
	return &r, nil
}

// WriteRecord writes slot's record atomically.
func WriteRecord(p hostpaths.Paths, slot string, r Record) error {
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return state.WriteFileAtomic(RecordPath(p, slot), append(data, '\n'), 0o644)
}
