// Package container is the container isolation mode (ARCHITECTURE
// section 2, experimental): the node stack runs in an OCI container run
// from an unpacked bundle, /var/lib/unbounded/slots/<slot>/bundle
// (config.json + rootfs), supervised by the shipped
// unbounded-container@<slot>.service, blue/green between kube1 and kube2
// as nspawn. Mode implements modes.Mode itself.
//
// The runtime is systemd-nspawn's OCI runtime (--oci-bundle=, systemd 242
// and later): the bundle's process is the node image's systemd, as in the
// nspawn mode's machine, and nspawn is the runtime that knows how to run
// a systemd as PID 1 on both cgroup hierarchies (the cgroup namespace, the
// name=systemd hierarchy, READY=1 passed on as the unit's own, the
// container's poweroff and reboot). runc would run the same bundle but
// needs, for a systemd payload, the mounts, the stop signal and the notify
// socket done by hand, and is not on the host unless a package brings it;
// the README's table "container mode: the runtime" has the measurements.
package container

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/remote"

	"unbounded-cloud.io/agent/lib/devices"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/modes"
	"unbounded-cloud.io/agent/lib/modes/bluegreen"
	"unbounded-cloud.io/agent/lib/modes/bluegreen/tree"
	"unbounded-cloud.io/agent/lib/modes/container/bundle"
	"unbounded-cloud.io/agent/lib/modes/nodestack"
	"unbounded-cloud.io/agent/lib/modes/nspawn/machinefile"
	"unbounded-cloud.io/agent/lib/modes/softreboot"
	"unbounded-cloud.io/agent/lib/unitnames"
	"unbounded-cloud.io/agent/lib/units"
)

// Name is the mode's name in the config.
const Name = "container"

// Mode operates the container mode on one host. The zero value is the
// real host; tests replace fields.
type Mode struct {
	// Paths is the host root ("" is /).
	Paths hostpaths.Paths
	// Host detects the cgroup hierarchy (/proc/self/mountinfo; the zero
	// value reads the running kernel's, as the nspawn mode's).
	Host modes.Host
	// Systemd connects to the service manager; nil is the system bus.
	Systemd func(ctx context.Context) (modes.Systemd, error)
	// RemoteOptions are added to every registry request.
	RemoteOptions []remote.Option
	// ResolvConf is the file copied into the container as
	// /etc/resolv.conf (tree.Builder.ResolvConf).
	ResolvConf string
	// NetworkCleaner cleans what a stopped node stack left in the host's
	// network namespace (Repave); nil is the real host
	// (bluegreen.CleanHostNetwork).
	NetworkCleaner func(ctx context.Context, slot string)
	// Modprobe loads kernel modules (Slot.RDMAModules); nil runs
	// modprobe(8).
	Modprobe func(ctx context.Context, modules ...string) error
	// BoundingSet reads the capabilities the container may get; nil
	// reads the service manager's bounding set (/proc/1/status): the one
	// unbounded-container@.service's nspawn runs with, not this
	// process's, which its own unit narrows (CapabilityBoundingSet=).
	BoundingSet func() ([]string, error)
	// Log receives progress lines; nil is slog.Default().
	Log *slog.Logger
}

var _ modes.Mode = (*Mode)(nil)

var _ bluegreen.Slots = (*Mode)(nil)

// Unit is the supervising unit of slot.
func Unit(slot string) string { return bluegreen.Unit(Name, slot) }

// Name is "container".
func (m *Mode) Name() string { return Name }

// NodeRoot is the container's rootfs.
func (m *Mode) NodeRoot(slot string) string {
	return filepath.Join(bundle.Dir(m.Paths, slot), bundle.RootfsDir)
}

// Installed: a slot's bundle or state directory exists.
func (m *Mode) Installed() bool {
	for _, s := range hostpaths.Slots {
		if _, err := os.Lstat(bundle.Dir(m.Paths, s)); err == nil {
			return true
		}
	}
	return false
}

// InPlace is false: a repave builds the other slot beside the running one.
func (m *Mode) InPlace() bool { return false }

func (m *Mode) log() *slog.Logger {
	if m.Log != nil {
		return m.Log
	}
	return slog.Default()
}

func (m *Mode) systemd(ctx context.Context) (modes.Systemd, error) {
	if m.Systemd != nil {
		return m.Systemd(ctx)
	}
	return units.Dial(ctx)
}

// builder builds the container's rootfs (lib/modes/bluegreen/tree, as
// the nspawn mode's machine): a node booted by systemd-nspawn either way,
// with the same units and files inside.
func (m *Mode) builder() *tree.Builder {
	return &tree.Builder{Paths: m.Paths, RemoteOptions: m.RemoteOptions, ResolvConf: m.ResolvConf, Modprobe: m.Modprobe, Log: m.log()}
}

// Prepare builds the slot's bundle, each step idempotent:
//  1. checks the slot and that its unit is not running
//     (modes.ErrSlotActive), and chooses the cgroup hierarchy from the
//     host's;
//  2. builds the rootfs into /var/lib/unbounded/slots/<slot>/.bundle.tmp-*
//     exactly as the nspawn mode builds its machine (tree.Builder.Build:
//     the node image unpacked, the artifacts, the node's files and units,
//     the offline pod images, the host devices found);
//  3. writes config.json (Spec) and nspawn.env beside it;
//  4. syncs the tree and renames it onto .../bundle (modes.SwapDir);
//  5. creates the slot's containerd store, records the devices, and
//     stamps the slot as prepared from this input (Repave).
//
// A crash at any point leaves the previous bundle or a temporary tree
// that the next Prepare (or Destroy) removes.
func (m *Mode) Prepare(ctx context.Context, s modes.Slot) error {
	if err := s.Check(); err != nil {
		return err
	}
	sd, err := m.systemd(ctx)
	if err != nil {
		return err
	}
	defer sd.Close()
	if st, err := sd.ActiveState(ctx, Unit(s.Name)); err != nil {
		return err
	} else if unitnames.Running(st) {
		return fmt.Errorf("prepare slot %s: %w (%s is %s)", s.Name, modes.ErrSlotActive, Unit(s.Name), st)
	}
	cgs, err := m.Host.CgroupHierarchy()
	if err != nil {
		return fmt.Errorf("prepare slot %s: %w", s.Name, err)
	}
	cg := nodestack.Cgroup(cgs)
	caps, err := m.capabilities()
	if err != nil {
		return fmt.Errorf("prepare slot %s: %w", s.Name, err)
	}
	dir := m.Paths.SlotDir(s.Name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if err := removeLeftovers(dir); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(dir, ".bundle.tmp-")
	if err != nil {
		return err
	}
	done := false
	defer func() {
		if !done {
			os.RemoveAll(tmp)
		}
	}()
	begin := time.Now()
	rootfs := filepath.Join(tmp, bundle.RootfsDir)
	if err := os.Mkdir(rootfs, 0o755); err != nil {
		return err
	}
	found, err := m.builder().Build(ctx, s, cg, rootfs, dir, ".bundle.tmp-artifacts-")
	if err != nil {
		return fmt.Errorf("prepare slot %s: %w", s.Name, err)
	}
	init, err := findInit(rootfs)
	if err != nil {
		return fmt.Errorf("prepare slot %s: %w", s.Name, err)
	}
	containerd := machinefile.ContainerdDir(m.Paths, s.Name)
	spec, err := bundle.Marshal(bundle.Spec(s.Node.Name, init, caps, m.Paths.Rel(containerd), found))
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(tmp, bundle.ConfigFile), spec, 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(tmp, bundle.EnvFile), []byte(envFile(cg)), 0o600); err != nil {
		return err
	}
	written := time.Now()
	if err := modes.SwapDir(tmp, bundle.Dir(m.Paths, s.Name)); err != nil {
		return fmt.Errorf("prepare slot %s: %w", s.Name, err)
	}
	done = true
	if err := os.MkdirAll(containerd, 0o711); err != nil {
		return err
	}
	if err := devices.WriteRecord(m.Paths, s.Name, devices.Record{Options: s.Devices, Found: found, At: time.Now().UTC()}); err != nil {
		return err
	}
	// Last: the stamp says the slot is complete for this input (Repave).
	if err := bluegreen.WriteStamp(m.Paths, Name, s); err != nil {
		return err
	}
	m.log().Info("slot prepared", "slot", s.Name, "mode", Name, "cgroup", string(cg), "init", init,
		"took", time.Since(begin).Round(time.Millisecond).String(), "syncAndSwapTook", time.Since(written).Round(time.Millisecond).String())
	return nil
}

// inits are where a node image's systemd may be, in the order nspawn's
// --boot looks.
var inits = []string{"/usr/lib/systemd/systemd", "/lib/systemd/systemd", "/sbin/init"}

// findInit is the node image's systemd: the container's process.
func findInit(rootfs string) (string, error) {
	for _, p := range inits {
		if fi, err := os.Stat(filepath.Join(rootfs, p)); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("the node image has no systemd to run as the container's init (none of %s)", strings.Join(inits, ", "))
}

// envFile is the slot's nspawn.env.
func envFile(cg nodestack.Cgroup) string {
	unified, why := "0", "the host binds the kubelet's controllers (cpu, memory, pids) to cgroup v1: legacy"
	if cg == nodestack.Unified {
		unified, why = "1", "the host's cgroup2 hierarchy carries the kubelet's controllers: unified"
	}
	return fmt.Sprintf(`# Written by unbounded-agent at the slot's prepare; read by
# unbounded-container@.service. The container's cgroup hierarchy, chosen
# from this host's: %s.
SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=%s
`, why, unified)
}

// leftovers are the trees an interrupted Prepare left in the slot's
// directory.
func leftovers(dir string) ([]string, error) {
	var out []string
	for _, pat := range []string{".bundle.tmp-*", ".bundle.old-*"} {
		m, err := filepath.Glob(filepath.Join(dir, pat))
		if err != nil {
			return nil, err
		}
		out = append(out, m...)
	}
	return out, nil
}

func removeLeftovers(dir string) error {
	l, err := leftovers(dir)
	if err != nil {
		return err
	}
	return modes.RemoveVerified(l...)
}

// Start daemon-reloads and starts the slot's unit; it returns when the
// container's systemd has booted (the unit is Type=notify and nspawn
// passes the container's READY=1 on).
func (m *Mode) Start(ctx context.Context, slot string) error {
	if !hostpaths.ValidSlot(slot) {
		return fmt.Errorf("slot %q: must be one of %v", slot, hostpaths.Slots)
	}
	if _, err := os.Stat(filepath.Join(bundle.Dir(m.Paths, slot), bundle.ConfigFile)); err != nil {
		return fmt.Errorf("start slot %s: no bundle: %w", slot, err)
	}
	sd, err := m.systemd(ctx)
	if err != nil {
		return err
	}
	defer sd.Close()
	if err := sd.Reload(ctx); err != nil {
		return err
	}
	return sd.StartUnit(ctx, Unit(slot))
}

// Restart restarts the slot's unit: the container's systemd shuts down
// cleanly and the container boots again (lib/modes/softreboot); the host
// is not touched.
func (m *Mode) Restart(ctx context.Context, slot string) error {
	if !hostpaths.ValidSlot(slot) {
		return fmt.Errorf("slot %q: must be one of %v", slot, hostpaths.Slots)
	}
	sd, err := m.systemd(ctx)
	if err != nil {
		return err
	}
	defer sd.Close()
	return softreboot.Restart(ctx, sd, Name, slot)
}

// Stop stops the slot's container, bounded, and cleans the host
// networking it left (bluegreen.Stop); the slot's files stay.
func (m *Mode) Stop(ctx context.Context, slot string) error {
	sd, err := m.systemd(ctx)
	if err != nil {
		return err
	}
	defer sd.Close()
	return bluegreen.Stop(ctx, m, sd, slot)
}

// Repave replaces the node stack of slot running by s, blue/green
// (lib/modes/bluegreen.Repave's steps, with each slot's container as its
// node).
func (m *Mode) Repave(ctx context.Context, running string, s modes.Slot, h modes.RepaveHooks) error {
	sd, err := m.systemd(ctx)
	if err != nil {
		return err
	}
	defer sd.Close()
	return bluegreen.Repave(ctx, m.Paths, m, sd, m.log(), running, s, h)
}

// CleanNetwork cleans what the stopped node stack of slot left in the
// host's network namespace, with the iptables tools of the slot's rootfs.
func (m *Mode) CleanNetwork(ctx context.Context, slot string) {
	if m.NetworkCleaner != nil {
		m.NetworkCleaner(ctx, slot)
		return
	}
	bluegreen.CleanHostNetwork(ctx, m.log(), m.NodeRoot, slot)
}

// EnsureHooks: everything the container mode writes on the host for a
// slot is in its bundle, rebuilt at every prepare; the unit is the
// package's. There is nothing to make current but to check the slot is
// there.
func (m *Mode) EnsureHooks(ctx context.Context, slot string) error {
	if !hostpaths.ValidSlot(slot) {
		return fmt.Errorf("slot %q: must be one of %v", slot, hostpaths.Slots)
	}
	if _, err := os.Stat(filepath.Join(bundle.Dir(m.Paths, slot), bundle.ConfigFile)); err != nil {
		return fmt.Errorf("lifecycle hooks of slot %s: %w", slot, err)
	}
	m.log().Info("lifecycle hooks current", "slot", slot, "mode", Name)
	return nil
}

// SlotPaths lists everything Prepare writes on the host for slot (for
// Destroy, and for a reset's manifest check): the slot's directory holds
// the bundle, the containerd store, the devices record and the stamp.
func (m *Mode) SlotPaths(slot string) []string {
	return []string{bundle.Dir(m.Paths, slot), m.Paths.SlotDir(slot)}
}

// Destroy stops the container, removes the slot's directory (bundle,
// containerd store, records, leftovers of an interrupted Prepare) and
// checks that it is gone.
func (m *Mode) Destroy(ctx context.Context, slot string) error {
	if !hostpaths.ValidSlot(slot) {
		return fmt.Errorf("slot %q: must be one of %v", slot, hostpaths.Slots)
	}
	sd, err := m.systemd(ctx)
	if err != nil {
		return err
	}
	defer sd.Close()
	st, err := sd.ActiveState(ctx, Unit(slot))
	if err != nil {
		return err
	}
	if st != "inactive" && st != "failed" && st != "" {
		if err := sd.StopUnit(ctx, Unit(slot)); err != nil {
			return fmt.Errorf("destroy slot %s: %w", slot, err)
		}
	}
	if err := modes.RemoveVerified(m.SlotPaths(slot)...); err != nil {
		return fmt.Errorf("destroy slot %s: %w", slot, err)
	}
	m.log().Info("slot destroyed", "slot", slot, "mode", Name, "removed", m.Paths.Rel(m.Paths.SlotDir(slot)))
	return nil
}

// capabilities are the names of the capabilities the container gets: the
// service manager's whole bounding set, which the container's unit (no
// CapabilityBoundingSet=) gives its nspawn, what nspawn's Capability=all
// gives the nspawn mode's machine (a capability outside it cannot be
// given, and nspawn refuses a set that names one). Not this process's:
// bootstrap's and repave's units narrow theirs.
func (m *Mode) capabilities() ([]string, error) {
	if m.BoundingSet != nil {
		return m.BoundingSet()
	}
	data, err := os.ReadFile("/proc/1/status")
	if err != nil {
		return nil, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "CapBnd:"); ok {
			return CapabilityNames(strings.TrimSpace(v))
		}
	}
	return nil, errors.New("/proc/1/status has no CapBnd line")
}

// capNames are the kernel's capabilities by number (linux/capability.h).
var capNames = []string{"CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID",
	"SETPCAP", "LINUX_IMMUTABLE", "NET_BIND_SERVICE", "NET_BROADCAST", "NET_ADMIN", "NET_RAW", "IPC_LOCK", "IPC_OWNER",
	"SYS_MODULE", "SYS_RAWIO", "SYS_CHROOT", "SYS_PTRACE", "SYS_PACCT", "SYS_ADMIN", "SYS_BOOT", "SYS_NICE",
	"SYS_RESOURCE", "SYS_TIME", "SYS_TTY_CONFIG", "MKNOD", "LEASE", "AUDIT_WRITE", "AUDIT_CONTROL", "SETFCAP",
	"MAC_OVERRIDE", "MAC_ADMIN", "SYSLOG", "WAKE_ALARM", "BLOCK_SUSPEND", "AUDIT_READ", "PERFMON", "BPF", "CHECKPOINT_RESTORE"}

// CapabilityNames turns a hexadecimal capability mask (/proc's CapBnd)
// into OCI capability names ("CAP_SYS_ADMIN"), in the kernel's order.
// Bits this build does not know are left out.
func CapabilityNames(mask string) ([]string, error) {
	var v uint64
	if _, err := fmt.Sscanf(mask, "%x", &v); err != nil {
		return nil, fmt.Errorf("capability mask %q: %w", mask, err)
	}
	var out []string
	for i, n := range capNames {
		if v&(1<<uint(i)) != 0 {
			out = append(out, "CAP_"+n)
		}
	}
	if !slices.Contains(out, "CAP_SYS_ADMIN") {
		return nil, fmt.Errorf("capability mask %s lacks CAP_SYS_ADMIN: the node's runtime cannot run containers", mask)
	}
	return out, nil
}
