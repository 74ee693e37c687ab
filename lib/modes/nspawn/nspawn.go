// Package nspawn is the nspawn isolation mode (ARCHITECTURE section 2): the
// node stack runs in a systemd-nspawn machine named after the slot, rootfs
// /var/lib/machines/<slot>, supervised by the stock
// systemd-nspawn@<slot>.service. Mode implements modes.Mode; Prepare holds
// how a slot is built, Repave (repave.go) the switch between slots.
package nspawn

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/remote"

	"unbounded-cloud.io/agent/lib/devices"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/modes"
	"unbounded-cloud.io/agent/lib/modes/nodestack"
	"unbounded-cloud.io/agent/lib/modes/nspawn/machinefile"
	"unbounded-cloud.io/agent/lib/modes/softreboot"
	"unbounded-cloud.io/agent/lib/state"
	"unbounded-cloud.io/agent/lib/unitnames"
	"unbounded-cloud.io/agent/lib/units"
)

// Mode operates the nspawn mode on one host. The zero value is the real
// host; tests replace fields.
type Mode struct {
	// Paths is the host root ("" is /).
	Paths hostpaths.Paths
	// Host detects the cgroup hierarchy (/proc/self/mountinfo): the zero
	// value reads the real host, whatever Paths says, because the
	// hierarchy is the running kernel's.
	Host modes.Host
	// Systemd connects to the service manager; nil is the system bus.
	Systemd func(ctx context.Context) (modes.Systemd, error)
	// RemoteOptions are added to every registry request (a transport,
	// credentials). None by default: pulls are anonymous in this release.
	RemoteOptions []remote.Option
	// ResolvConf is the file copied into the machine as /etc/resolv.conf;
	// "" is systemd-resolved's upstream list when the host runs it (the
	// stub 127.0.0.53 is of no use to pods), else the host's
	// /etc/resolv.conf.
	ResolvConf string
	// NetworkCleaner cleans what a stopped node stack left in the host's
	// network namespace (Repave); nil is the real host
	// (bluegreen.CleanHostNetwork).
	NetworkCleaner func(ctx context.Context, slot string)
	// Modprobe loads kernel modules (Slot.RDMAModules); nil runs
	// modprobe(8).
	Modprobe func(ctx context.Context, modules ...string) error
	// Log receives progress lines; nil is slog.Default().
	Log *slog.Logger
}

var _ modes.Mode = (*Mode)(nil)

// rdmaModules give /dev/infiniband the RDMA connection manager's device
// (rdma_ucm) and the management datagram devices (ib_umad) that RDMA
// workloads open besides the verbs devices the driver makes.
var rdmaModules = []string{"rdma_ucm", "ib_umad"}

func (m *Mode) loadRDMAModules(ctx context.Context) error {
	load := m.Modprobe
	if load == nil {
		load = func(ctx context.Context, modules ...string) error {
			out, err := exec.CommandContext(ctx, "modprobe", append([]string{"-a", "--"}, modules...)...).CombinedOutput()
			if err != nil {
				return fmt.Errorf("modprobe %s: %w: %s", strings.Join(modules, " "), err, strings.TrimSpace(string(out)))
			}
			return nil
		}
	}
	if err := load(ctx, rdmaModules...); err != nil {
		return fmt.Errorf("devices.rdma-modules: %w", err)
	}
	m.log().Info("RDMA kernel modules loaded", "modules", strings.Join(rdmaModules, " "))
	return nil
}

// Name is "nspawn".
func (m *Mode) Name() string { return "nspawn" }

// NodeRoot is the machine's rootfs.
func (m *Mode) NodeRoot(slot string) string { return m.Paths.MachineDir(slot) }

// Installed: a slot's settings or its machine directory exist.
func (m *Mode) Installed() bool {
	for _, s := range hostpaths.Slots {
		for _, f := range []string{m.Paths.NspawnConfig(s), m.Paths.MachineDir(s)} {
			if _, err := os.Lstat(f); err == nil {
				return true
			}
		}
	}
	return false
}

// InPlace is false: a repave builds the other slot beside the running one.
func (m *Mode) InPlace() bool { return false }

// Unit is the supervising unit of slot.
func Unit(slot string) string { return "systemd-nspawn@" + slot + ".service" }

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

// Prepare builds the slot, in order, each step idempotent:
//  1. checks the slot (modes.Slot.Check) and that its unit is not running
//     (modes.ErrSlotActive), and chooses the cgroup hierarchy from the
//     host's (modes.Host.CgroupHierarchy: never assumed);
//  2. resolves the image (Image.Ref: registry, "oci-layout:DIR[:TAG]",
//     "docker-archive:FILE[:TAG]"; a registry reference is first looked
//     up in Image.OfflineDir/images) with go-containerregistry;
//  3. unpacks it into /var/lib/machines/.<slot>.tmp-*, beside the slot
//     (Unpack: whiteouts applied, no write outside the directory), while
//     the artifacts are installed into a tree of their own
//     (nodestack.InstallArtifacts into .<slot>.tmp-artifacts-*);
//  4. moves the artifacts into the rootfs (nodestack.MoveArtifacts) and writes the
//     node configuration (nodestack.Files), the machine's hostname (the
//     Machine's name), resolv.conf (the host's upstream servers), an empty
//     machine-id (systemd gives every copy its own at boot), and the units
//     containerd.service and kubelet.service (plus
//     unbounded-cgroup-rw.service on a legacy hierarchy), enabled; and the
//     pod images of Image.OfflineDir/images as one OCI archive, imported
//     before kubelet starts (podimages.go): an offline host runs pods
//     without a registry;
//     the host devices the node is given (Slot.Devices, after the RDMA
//     modules are loaded when Slot.RDMAModules asks: lib/devices) are
//     found and recorded beside the slot, with the CDI specification of
//     its NVIDIA GPUs in the rootfs (machinefile.Discover);
//  5. syncs the finished tree once and renames it onto
//     /var/lib/machines/<slot> (modes.SwapDir: the old tree, if any, is
//     moved aside first and removed after);
//  6. writes the settings file /etc/systemd/nspawn/<slot>.nspawn (binding
//     the devices: machinefile.File) and the
//     drop-in of systemd-nspawn@<slot>.service, and creates the slot's
//     containerd store /var/lib/unbounded/slots/<slot>/containerd.
//
// A crash at any point leaves either the previous slot or a temporary tree
// that the next Prepare (or Destroy) removes. A registry that may answer
// later wraps exitcode.ErrTemporary (exit 75); an image that does not exist
// wraps ErrImageNotFound (exit 1). The bootstrap token is written only into
// the machine's bootstrap kubeconfig (0600) and appears in no error or log
// line.
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

	machines := m.Paths.Join(hostpaths.MachinesDirHost)
	if err := os.MkdirAll(machines, 0o700); err != nil {
		return err
	}
	if err := removeLeftovers(machines, s.Name); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(machines, "."+s.Name+".tmp-")
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
	found, err := m.BuildTree(ctx, s, cg, tmp, machines, "."+s.Name+".tmp-artifacts-")
	if err != nil {
		return fmt.Errorf("prepare slot %s: %w", s.Name, err)
	}
	written := time.Now()
	if err := modes.SwapDir(tmp, m.Paths.MachineDir(s.Name)); err != nil {
		return fmt.Errorf("prepare slot %s: %w", s.Name, err)
	}
	done = true

	containerd := machinefile.ContainerdDir(m.Paths, s.Name)
	if err := os.MkdirAll(containerd, 0o711); err != nil {
		return err
	}
	if err := devices.WriteRecord(m.Paths, s.Name, devices.Record{Options: s.Devices, Found: found, At: time.Now().UTC()}); err != nil {
		return err
	}
	if err := state.WriteFileAtomic(m.Paths.NspawnConfig(s.Name),
		[]byte(machinefile.File(s.Name, m.Paths.Rel(containerd), found)), 0o644); err != nil {
		return err
	}
	if err := state.WriteFileAtomic(filepath.Join(m.Paths.NspawnDropInDir(s.Name), DropInName),
		[]byte(dropIn(s.Name, cg, s.Node.ShutdownGracePeriod)), 0o644); err != nil {
		return err
	}
	// Last: the stamp says the slot is complete for this input (Repave).
	if err := m.writeStamp(s); err != nil {
		return err
	}
	m.log().Info("slot prepared", "slot", s.Name, "mode", "nspawn", "cgroup", string(cg),
		"took", time.Since(begin).Round(time.Millisecond).String(), "syncAndSwapTook", time.Since(written).Round(time.Millisecond).String())
	return nil
}

// BuildTree builds the node's rootfs for slot s into dir, an empty
// directory the caller made beside where the tree goes (and swaps into
// place, or removes on an error): steps 1-4 of Prepare after the checks.
// The artifacts are staged in a directory made in stageParent named
// stagePrefix* (removed before it returns; an interrupted build's is the
// caller's leftover to remove). It returns the host devices found for the
// node (machinefile.Discover). The container mode builds its bundle's
// rootfs with it: a node booted by systemd-nspawn either way.
func (m *Mode) BuildTree(ctx context.Context, s modes.Slot, cg nodestack.Cgroup, dir, stageParent, stagePrefix string) (devices.Found, error) {
	if s.RDMAModules {
		if err := m.loadRDMAModules(ctx); err != nil {
			return devices.Found{}, err
		}
	}
	img, src, err := m.resolveImage(ctx, s.Image)
	if err != nil {
		return devices.Found{}, err
	}
	// The artifacts are installed into a tree of their own while the
	// image is unpacked (both are mostly decompression and writes: a
	// core each), then moved into the rootfs by renames. Named like tmp,
	// so that an interrupted Prepare's leftovers include it.
	stage, err := os.MkdirTemp(stageParent, stagePrefix)
	if err != nil {
		return devices.Found{}, err
	}
	defer os.RemoveAll(stage)
	begin := time.Now()
	installed := make(chan error, 1)
	var artifactsTook time.Duration
	go func() {
		err := nodestack.InstallArtifacts(s.Artifacts, stage, Layout)
		artifactsTook = time.Since(begin)
		installed <- err
	}()
	stats, err := Unpack(img, dir)
	unpackTook := time.Since(begin)
	ierr := <-installed // also on an unpack error: stage is removed after
	if err != nil {
		return devices.Found{}, fmt.Errorf("node image %s: %w", src, classify(err))
	}
	// A machine's / is 0755, whatever MkdirTemp made and whatever the
	// image's "./" entry says: an image built from a 0700 directory
	// (tar -C DIR .) would otherwise lock every user but root out of the
	// machine's tree, and its dbus-daemon (user messagebus) fails, so the
	// machine never reports ready.
	if err := os.Chmod(dir, 0o755); err != nil {
		return devices.Found{}, err
	}
	// nspawn refuses a directory without /usr ("doesn't look like it has
	// an OS tree"): say so now, naming the image.
	if fi, err := os.Stat(filepath.Join(dir, "usr")); err != nil || !fi.IsDir() {
		return devices.Found{}, fmt.Errorf("node image %s has no /usr directory: not an OS tree a node can boot", src)
	}
	m.log().Info("node image unpacked", "slot", s.Name, "image", src, "took", unpackTook.Round(time.Millisecond).String(),
		"artifactsTook", artifactsTook.Round(time.Millisecond).String(), "files", stats.Files,
		"bytes", stats.Bytes, "skipped_devices", stats.Devices)
	if ierr != nil {
		return devices.Found{}, ierr
	}
	if err := nodestack.MoveArtifacts(stage, dir, Layout); err != nil {
		return devices.Found{}, err
	}
	if err := m.writeNode(dir, s, cg); err != nil {
		return devices.Found{}, err
	}
	if err := m.writePodImages(dir, s); err != nil {
		return devices.Found{}, err
	}
	found, err := machinefile.Discover(m.Paths, dir, s.Devices)
	if err != nil {
		return devices.Found{}, fmt.Errorf("host devices: %w", err)
	}
	if len(found.Devices) > 0 {
		m.log().Info("host devices given to the node", "slot", s.Name, "devices", strings.Join(found.Paths(), " "),
			"driverFiles", len(found.DriverFiles))
	}
	return found, nil
}

// StopConf bounds how long the machine's stop waits for what its units
// leave behind.
const StopConf = "/etc/systemd/system.conf.d/50-unbounded-node.conf"

const stopConfText = `# Written by unbounded-agent: how long the node machine's stop may take.
# Pods' processes live in the kubelet's pod cgroups, outside any unit, and
# a container's PID 1 ignores SIGTERM unless it handles it: at the final
# kill of a stop, systemd would wait its default 90 s for each such process
# before SIGKILL, holding systemd-nspawn@<slot>.service's stop (a host
# reboot, a restart, a repave's switch) for that long. A graceful end of
# the pods is the kubelet's (graceful node shutdown, node.shutdown-grace-period:
# the machine's stop goes through its logind, and the kubelet ends them
# before its units stop) and the drain's, before a repave; what is left
# by then is killed 10 s after its SIGTERM.
[Manager]
DefaultTimeoutStopSec=10s
`

// writeNode writes the node configuration and units into the rootfs.
func (m *Mode) writeNode(rootfs string, s modes.Slot, cg nodestack.Cgroup) error {
	files, err := nodestack.Files(s.Node, Layout, cg)
	if err != nil {
		return err
	}
	resolv, err := m.resolvConf()
	if err != nil {
		return err
	}
	units := "/etc/systemd/system"
	files = append(files,
		nodestack.File{Path: "/etc/hostname", Mode: 0o644, Data: []byte(s.Node.Name + "\n")},
		nodestack.File{Path: "/etc/resolv.conf", Mode: 0o644, Data: resolv},
		nodestack.File{Path: "/etc/hosts", Mode: 0o644, Data: nodestack.Hosts(s.Node)},
		// Empty: systemd gives the machine an id of its own at its first
		// boot, so two slots (and every copy of one image) differ, as
		// kubelet's machine ID and the journal expect.
		nodestack.File{Path: "/etc/machine-id", Mode: 0o444, Data: nil},
		nodestack.File{Path: units + "/" + ContainerdUnit, Mode: 0o644, Data: []byte(containerdUnit(cg, s.Node.LocalDNS))},
		nodestack.File{Path: units + "/" + KubeletUnit, Mode: 0o644, Data: []byte(kubeletUnit(s.Node))},
		nodestack.File{Path: StopConf, Mode: 0o644, Data: []byte(stopConfText)},
	)
	files = append(files, nodestack.LogindFiles(s.Node)...)
	enabled := []string{ContainerdUnit, KubeletUnit}
	if s.Node.LocalDNS {
		dns, err := LocalDNSUnitFile()
		if err != nil {
			return err
		}
		files = append(files, nodestack.LocalDNSFiles(s.Node, Layout, nodestack.ParseResolvConf(resolv))...)
		files = append(files, nodestack.File{Path: units + "/" + LocalDNSUnit, Mode: 0o644, Data: dns})
		enabled = append(enabled, LocalDNSUnit)
	}
	if cg == nodestack.Legacy {
		files = append(files,
			nodestack.File{Path: units + "/" + CgroupRWUnit, Mode: 0o644, Data: []byte(cgroupRWUnitText)},
			nodestack.File{Path: cgroupRWScript, Mode: 0o755, Data: []byte(cgroupRWScriptText)},
		)
		enabled = append(enabled, CgroupRWUnit)
	}
	if err := nodestack.WriteFiles(rootfs, files); err != nil {
		return err
	}
	// D-Bus reads /var/lib/dbus/machine-id: a link keeps it the one
	// systemd writes.
	if err := symlinkUnder(rootfs, "/var/lib/dbus/machine-id", "/etc/machine-id"); err != nil {
		return err
	}
	for _, u := range enabled {
		if err := symlinkUnder(rootfs, units+"/multi-user.target.wants/"+u, units+"/"+u); err != nil {
			return err
		}
	}
	return nil
}

// writePodImages puts the offline directory's pod images into the
// machine, with the unit that imports them (podimages.go).
func (m *Mode) writePodImages(rootfs string, s modes.Slot) error {
	names, err := writePodImages(rootfs, s.Image)
	if err != nil || len(names) == 0 {
		return err
	}
	if _, err := os.Stat(filepath.Join(rootfs, Layout.BinDir, "ctr")); err != nil {
		return fmt.Errorf("offline pod images: importing them needs ctr, which the containerd artifact does not hold: %w", err)
	}
	units := "/etc/systemd/system"
	if err := nodestack.WriteFile(rootfs, units+"/"+PodImagesUnit, []byte(podImagesUnitText()), 0o644); err != nil {
		return err
	}
	if err := symlinkUnder(rootfs, units+"/multi-user.target.wants/"+PodImagesUnit, units+"/"+PodImagesUnit); err != nil {
		return err
	}
	m.log().Info("offline pod images staged", "slot", s.Name, "images", strings.Join(names, " "))
	return nil
}

// symlinkUnder makes name (a path inside rootfs) a symlink to target,
// replacing what is there; no directory on the way may be a symlink.
func symlinkUnder(rootfs, name, target string) error {
	dir, err := nodestack.MkdirUnder(rootfs, filepath.Dir(name))
	if err != nil {
		return err
	}
	p := filepath.Join(dir, filepath.Base(name))
	if err := os.RemoveAll(p); err != nil {
		return err
	}
	return os.Symlink(target, p)
}

func (m *Mode) resolvConf() ([]byte, error) {
	candidates := []string{m.ResolvConf}
	if m.ResolvConf == "" {
		candidates = []string{m.Paths.Join("/run/systemd/resolve/resolv.conf"), m.Paths.Join("/etc/resolv.conf")}
	}
	for _, c := range candidates {
		data, err := os.ReadFile(c)
		if err == nil {
			return append([]byte("# Copied by unbounded-agent from the host's "+m.Paths.Rel(c)+" at prepare.\n"), data...), nil
		}
		if !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("resolv.conf: %w", err)
		}
	}
	// A host without any: the node resolves nothing but cluster names.
	return []byte("# The host had no resolv.conf at prepare.\n"), nil
}

// leftovers are the trees an interrupted Prepare left beside a slot.
func leftovers(machines, slot string) ([]string, error) {
	var out []string
	for _, pat := range []string{"." + slot + ".tmp-*", "." + slot + ".old-*"} {
		m, err := filepath.Glob(filepath.Join(machines, pat))
		if err != nil {
			return nil, err
		}
		out = append(out, m...)
	}
	return out, nil
}

// journalLinks are the links systemd-nspawn made in the host's
// /var/log/journal to the journal of the slot's machine
// (--link-journal=try-guest, systemd-nspawn@.service's default): once the
// rootfs is gone they would dangle there.
func (m *Mode) journalLinks(slot string) ([]string, error) {
	dir := m.Paths.Join("/var/log/journal")
	ents, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	into := filepath.Join(hostpaths.MachinesDirHost, slot) + "/"
	var out []string
	for _, e := range ents {
		if e.Type()&fs.ModeSymlink == 0 {
			continue
		}
		p := filepath.Join(dir, e.Name())
		if t, err := os.Readlink(p); err == nil && strings.HasPrefix(t, into) {
			out = append(out, p)
		}
	}
	return out, nil
}

func removeLeftovers(machines, slot string) error {
	l, err := leftovers(machines, slot)
	if err != nil {
		return err
	}
	return modes.RemoveVerified(l...)
}

// Start daemon-reloads (Prepare's .nspawn file and drop-in are read at
// unit load) and starts the machine; it returns when the machine's systemd
// has booted (NotifyReady=yes).
func (m *Mode) Start(ctx context.Context, slot string) error {
	if !hostpaths.ValidSlot(slot) {
		return fmt.Errorf("slot %q: must be one of %v", slot, hostpaths.Slots)
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

// Restart reboots the machine (systemd restarts
// systemd-nspawn@<slot>.service: its payload shuts down cleanly and boots
// again); the host is not touched. The body is lib/modes/softreboot's,
// which unbounded-restart links without the rest of this mode.
func (m *Mode) Restart(ctx context.Context, slot string) error {
	if !hostpaths.ValidSlot(slot) {
		return fmt.Errorf("slot %q: must be one of %v", slot, hostpaths.Slots)
	}
	sd, err := m.systemd(ctx)
	if err != nil {
		return err
	}
	defer sd.Close()
	return softreboot.Restart(ctx, sd, m.Name(), slot)
}

// EnsureHooks makes the host-side files of the running slot's machine
// current (the .nspawn settings file and the unit drop-in, as this
// release's Prepare writes them): a file that differs is rewritten and
// systemd reloaded, so that the next start of the machine uses it; the
// running machine is not restarted. A slot with no rootfs is an error
// (there is no node to hook).
func (m *Mode) EnsureHooks(ctx context.Context, slot string) error {
	if !hostpaths.ValidSlot(slot) {
		return fmt.Errorf("slot %q: must be one of %v", slot, hostpaths.Slots)
	}
	if _, err := os.Stat(m.Paths.MachineDir(slot)); err != nil {
		return fmt.Errorf("lifecycle hooks of slot %s: %w", slot, err)
	}
	cgs, err := m.Host.CgroupHierarchy()
	if err != nil {
		return fmt.Errorf("lifecycle hooks of slot %s: %w", slot, err)
	}
	// The devices the slot's node was given (its record): the hooks bind
	// the same, and its next restart discovers again (machinefile.Refresh).
	rec, err := devices.ReadRecord(m.Paths, slot)
	if err != nil {
		return fmt.Errorf("lifecycle hooks of slot %s: %w", slot, err)
	}
	var found devices.Found
	if rec != nil {
		found = rec.Found
	}
	// The node's graceful shutdown period, as its kubelet has it (an
	// older slot's config without one: 0).
	grace, err := softreboot.ShutdownGrace(filepath.Join(m.Paths.MachineDir(slot), machinefile.KubeletConfig))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("lifecycle hooks of slot %s: %w", slot, err)
	}
	want := map[string]string{
		m.Paths.NspawnConfig(slot):                               machinefile.File(slot, m.Paths.Rel(machinefile.ContainerdDir(m.Paths, slot)), found),
		filepath.Join(m.Paths.NspawnDropInDir(slot), DropInName): dropIn(slot, nodestack.Cgroup(cgs), grace),
	}
	var changed []string
	for file, text := range want {
		if got, err := os.ReadFile(file); err == nil && string(got) == text {
			continue
		}
		if err := state.WriteFileAtomic(file, []byte(text), 0o644); err != nil {
			return fmt.Errorf("lifecycle hooks of slot %s: %w", slot, err)
		}
		changed = append(changed, m.Paths.Rel(file))
	}
	if len(changed) == 0 {
		m.log().Info("lifecycle hooks current", "slot", slot)
		return nil
	}
	sd, err := m.systemd(ctx)
	if err != nil {
		return err
	}
	defer sd.Close()
	if err := sd.Reload(ctx); err != nil {
		return err
	}
	m.log().Info("lifecycle hooks made current; the running machine keeps running and uses them from its next start",
		"slot", slot, "rewritten", strings.Join(changed, " "))
	return nil
}

// SlotPaths lists everything Prepare writes on the host for slot (for
// Destroy, and for a reset's manifest check).
func (m *Mode) SlotPaths(slot string) []string {
	return []string{
		m.Paths.MachineDir(slot),
		m.Paths.NspawnConfig(slot),
		filepath.Join(m.Paths.NspawnDropInDir(slot), DropInName),
		m.Paths.SlotDir(slot),
	}
}

// Destroy stops the machine, removes the slot's rootfs, settings file,
// drop-in, containerd store and any leftover of an interrupted Prepare,
// checks that each is gone, and daemon-reloads so that systemd forgets the
// drop-in.
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
	paths := m.SlotPaths(slot)
	l, err := leftovers(m.Paths.Join(hostpaths.MachinesDirHost), slot)
	if err != nil {
		return err
	}
	links, err := m.journalLinks(slot)
	if err != nil {
		return err
	}
	l = append(l, links...)
	if err := modes.RemoveVerified(append(paths, l...)...); err != nil {
		return fmt.Errorf("destroy slot %s: %w", slot, err)
	}
	// The drop-in directory and /etc/systemd/nspawn (Prepare makes it on
	// a host that had none) go when they hold nothing else (an
	// operator's own drop-in or machine settings stay, and with them the
	// directory).
	for _, dir := range []string{m.Paths.NspawnDropInDir(slot), filepath.Dir(m.Paths.NspawnConfig(slot))} {
		if ents, err := os.ReadDir(dir); err == nil && len(ents) == 0 {
			if err := modes.RemoveVerified(dir); err != nil {
				return err
			}
		}
	}
	if err := sd.Reload(ctx); err != nil {
		return err
	}
	rel := make([]string, len(paths))
	for i, p := range paths {
		rel[i] = m.Paths.Rel(p)
	}
	m.log().Info("slot destroyed", "slot", slot, "mode", "nspawn", "removed", strings.Join(rel, " "))
	return nil
}
