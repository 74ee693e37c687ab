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
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/remote"

	"unbounded-cloud.io/agent/lib/devices"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/modes"
	"unbounded-cloud.io/agent/lib/modes/bluegreen/tree"
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

// builder builds the slot's tree (lib/modes/bluegreen/tree, as the
// container mode's) on this mode's host.
func (m *Mode) builder() *tree.Builder {
	return &tree.Builder{Paths: m.Paths, RemoteOptions: m.RemoteOptions, ResolvConf: m.ResolvConf, Modprobe: m.Modprobe, Log: m.log()}
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
//  2. builds the machine's tree into /var/lib/machines/.<slot>.tmp-*,
//     beside the slot, as the container mode builds its bundle's rootfs
//     (tree.Builder.Build, lib/modes/bluegreen/tree: the node image
//     resolved and unpacked, the artifacts staged in
//     .<slot>.tmp-artifacts-* and moved in, the node's files and units,
//     the offline pod images, the host devices found);
//  3. syncs the finished tree once and renames it onto
//     /var/lib/machines/<slot> (modes.SwapDir: the old tree, if any, is
//     moved aside first and removed after);
//  4. creates the slot's containerd store
//     /var/lib/unbounded/slots/<slot>/containerd, records the devices
//     found beside the slot, writes the settings file
//     /etc/systemd/nspawn/<slot>.nspawn (binding the devices:
//     machinefile.File) and the drop-in of systemd-nspawn@<slot>.service,
//     and stamps the slot as prepared from this input (Repave).
//
// A crash at any point leaves either the previous slot or a temporary tree
// that the next Prepare (or Destroy) removes. A registry that may answer
// later wraps exitcode.ErrTemporary (exit 75); an image that does not exist
// wraps tree.ErrImageNotFound (exit 1). The bootstrap token is written only
// into the machine's bootstrap kubeconfig (0600) and appears in no error or
// log line.
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
	found, err := m.builder().Build(ctx, s, cg, tmp, machines, "."+s.Name+".tmp-artifacts-")
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
