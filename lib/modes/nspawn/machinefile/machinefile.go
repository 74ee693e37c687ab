// Package machinefile writes the nspawn settings file of a node slot's
// machine (/etc/systemd/nspawn/<slot>.nspawn) and the host devices it
// binds (lib/devices), kept apart from lib/modes/nspawn so that
// unbounded-restart (a small binary: ARCHITECTURE section 3) can discover
// the devices again and rewrite the file before every start of the
// machine (`restart --devices-of=<slot>`, the ExecStartPre= of its unit's
// drop-in): devices appear and disappear, and systemd-nspawn reads the
// file at every start (no daemon-reload needed).
package machinefile

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"unbounded-cloud.io/agent/lib/devices"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/state"
)

// ContainerdRoot is containerd's store inside the machine, bound from the
// slot's own directory on the host.
const ContainerdRoot = "/var/lib/containerd"

// KubeletConfig is the kubelet's configuration file inside the machine
// (and the container mode's node): its shutdownGracePeriod bounds the
// machine's graceful stop (softreboot.PowerOff).
const KubeletConfig = "/var/lib/kubelet/config.yaml"

// CDISpecPath is the CDI specification of the node's NVIDIA GPUs inside
// the machine, where containerd looks (cdi_spec_dirs' first).
const CDISpecPath = "/etc/cdi/nvidia.yaml"

// ContainerdDir is the slot's containerd store on the host.
func ContainerdDir(p hostpaths.Paths, slot string) string {
	return filepath.Join(p.SlotDir(slot), "containerd")
}

// File is /etc/systemd/nspawn/<slot>.nspawn. The stock
// systemd-nspawn@.service runs nspawn with --settings=override, so every
// setting here wins over the unit's command line (-U, --network-veth).
// containerdDir is the slot's containerd store as the host names it; f
// are the host devices given to the node.
func File(slot, containerdDir string, f devices.Found) string {
	var b strings.Builder
	fmt.Fprintf(&b, `# Written by unbounded-agent for node slot %[1]s; regenerated at every
# prepare and restart of the slot, removed with it. The settings a kubelet
# with a real container runtime needs inside a machine (the agent's design
# notes, "A real kubelet with a real container runtime").

[Exec]
# The machine boots its own systemd, which runs containerd and kubelet as
# units.
Boot=yes
# The start job ends when the machine's systemd reports READY=1 (booted),
# not when nspawn has forked: "systemctl start" returns with the node
# stack's units started.
NotifyReady=yes
# Root in the machine is root on the host: kubelet and runc create cgroups,
# mounts and namespaces for pods on the host's kernel objects, which a
# root mapped into a user namespace may not.
PrivateUsers=no
# Every capability: containerd and runc need CAP_SYS_ADMIN (mounts,
# namespaces), CAP_NET_ADMIN (CNI), CAP_SYS_RESOURCE and more, and give each
# container its own smaller set. nspawn's default set is too small for a
# runtime.
Capability=all
# Beyond nspawn's default seccomp filter: runc gives each container a
# session keyring (@keyring) and loads its device filter as an eBPF
# program on cgroup v2 (bpf).
SystemCallFilter=@keyring bpf
# Prepare writes the machine's /etc/resolv.conf from the host's upstream
# servers; nspawn must not replace it at every start.
ResolvConf=off

[Files]
# kubelet reads the kernel log (OOM kills) from /dev/kmsg, which nspawn does
# not give a machine.
Bind=/dev/kmsg
# containerd's store on a host directory of its own, not on the machine's
# rootfs: on a rootfs that is itself an overlay (an image-based host, a
# machine in a test container) runc's overlay mounts of container layers
# fail. It is removed with the slot.
Bind=%[2]s:%[3]s
`, slot, containerdDir, ContainerdRoot)
	if len(f.Devices) > 0 {
		b.WriteString(`# The host's devices the node is given ([devices] in the agent's
# configuration; found again at every prepare and restart; ` + "`unbounded status`" + `
# lists them): each device node bound at its own path. The machine's device
# cgroup does not restrict them (DevicePolicy=auto without DeviceAllow= in
# the unit's drop-in): runc confines every container to the devices its
# pod asks for.
`)
		for _, d := range f.Devices {
			fmt.Fprintf(&b, "# %s (%s %d:%d)\nBind=%s\n", d.Why, kind(d), d.Major, d.Minor, bindPath(d.Path))
		}
	}
	if len(f.DriverFiles) > 0 {
		b.WriteString(`# The NVIDIA driver's user-space libraries and tools, read-only: they must
# match the host's kernel module, so the node uses the host's own.
`)
		for _, p := range f.DriverFiles {
			fmt.Fprintf(&b, "BindReadOnly=%s\n", bindPath(p))
		}
	}
	b.WriteString(`
[Network]
# The node stack uses the host's network, as a node does: kubelet's ports
# (10250, 10248) and the CNI bridge are the host's. No veth into a private
# network namespace.
VirtualEthernet=no
`)
	return b.String()
}

// bindPath escapes p for Bind=: a colon separates source and target
// there, and backslash escapes are interpreted ("\:" is a colon).
func bindPath(p string) string {
	return strings.NewReplacer(`\`, `\\`, ":", `\:`).Replace(p)
}

func kind(d devices.Device) string {
	if d.Block {
		return "block"
	}
	return "char"
}

// Discover finds the devices a node is given under o and writes the CDI
// specification into the machine's rootfs (the tree being built, or the
// slot's). The caller records them (devices.WriteRecord) once the slot
// is in place.
func Discover(p hostpaths.Paths, rootfs string, o devices.Options) (devices.Found, error) {
	f, err := devices.Host{Root: p.Join("/")}.Discover(o)
	if err != nil {
		return devices.Found{}, err
	}
	if err := WriteCDISpec(rootfs, f); err != nil {
		return devices.Found{}, err
	}
	return f, nil
}

// WriteCDISpec writes CDISpecPath under rootfs for f's GPUs, or removes
// it when there is none. Through os.Root: a symlink in the image cannot
// make the write land outside the rootfs.
func WriteCDISpec(rootfs string, f devices.Found) error {
	spec, err := devices.CDISpec(f)
	if err != nil {
		return err
	}
	r, err := os.OpenRoot(rootfs)
	if err != nil {
		return err
	}
	defer r.Close()
	rel := strings.TrimPrefix(CDISpecPath, "/")
	if spec == nil {
		if err := r.Remove(rel); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		return nil
	}
	if err := r.MkdirAll(filepath.Dir(rel), 0o755); err != nil {
		return err
	}
	if old, err := r.ReadFile(rel); err == nil && bytes.Equal(old, spec) {
		return nil
	}
	tmp := rel + ".tmp"
	if err := r.WriteFile(tmp, spec, 0o644); err != nil {
		return err
	}
	return r.Rename(tmp, rel)
}

// Rediscover finds slot's devices again under the rules of its record
// (what the node was given at its prepare, lib/devices): what its next
// start should bind. A device allowed by name that is gone is left out
// with a warning (it is the configuration's error at the next prepare,
// not a reason to keep the node down). A slot without a record (prepared
// by a release without device discovery) gives a nil record. The
// container mode's bundle is refreshed from it too.
func Rediscover(p hostpaths.Paths, slot string, log *slog.Logger) (*devices.Record, devices.Found, error) {
	rec, err := devices.ReadRecord(p, slot)
	if err != nil || rec == nil {
		return nil, devices.Found{}, err
	}
	o := rec.Options
	host := devices.Host{Root: p.Join("/")}
	o.Allow = slices.DeleteFunc(slices.Clone(o.Allow), func(d string) bool {
		if _, err := host.Discover(devices.Options{Allow: []string{d}}); err != nil {
			log.Warn("a device allowed by name is not there; the node starts without it", "device", d, "error", err.Error())
			return true
		}
		return false
	})
	f, err := host.Discover(o)
	if err != nil {
		return nil, devices.Found{}, err
	}
	return rec, f, nil
}

// Refresh discovers slot's devices again under the rules of its record
// and, when they differ from what the settings file binds, rewrites the
// file and the CDI specification: the machine's start that runs it binds
// what the host has now. A device allowed by name that
// is gone is left out with a warning (it is the configuration's error at
// the next prepare, not a reason to keep the node down). A slot without a
// record (prepared by a release without device discovery) is left alone.
func Refresh(p hostpaths.Paths, slot string, log *slog.Logger) error {
	rec, f, err := Rediscover(p, slot, log)
	if err != nil || rec == nil {
		return err
	}
	text := File(slot, p.Rel(ContainerdDir(p, slot)), f)
	cur, _ := os.ReadFile(p.NspawnConfig(slot))
	if string(cur) == text {
		return nil
	}
	if err := WriteCDISpec(p.MachineDir(slot), f); err != nil {
		return err
	}
	if err := state.WriteFileAtomic(p.NspawnConfig(slot), []byte(text), 0o644); err != nil {
		return err
	}
	if err := devices.WriteRecord(p, slot, devices.Record{Options: rec.Options, Found: f, At: time.Now().UTC()}); err != nil {
		return err
	}
	log.Info("the node's devices changed; its next start binds them", "slot", slot,
		"before", strings.Join(rec.Found.Paths(), " "), "now", strings.Join(f.Paths(), " "))
	return nil
}
