// Package bundle is the container mode's OCI bundle on the host
// (/var/lib/unbounded/slots/<slot>/bundle: config.json, rootfs, and the
// runtime's environment): its configuration (Spec) and the refresh of its
// host devices before every start of the container (Refresh). A leaf, so
// that unbounded-restart, which runs the refresh, stays small (no image
// code).
package bundle

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"unbounded-cloud.io/agent/lib/devices"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/modes/nspawn/machinefile"
	"unbounded-cloud.io/agent/lib/state"
)

// Dir is the slot's OCI bundle on the host.
func Dir(p hostpaths.Paths, slot string) string {
	return filepath.Join(p.SlotDir(slot), "bundle")
}

// Bundle files, relative to the bundle directory.
const (
	// ConfigFile is the OCI runtime configuration.
	ConfigFile = "config.json"
	// RootfsDir is the container's root (config.json's root.path).
	RootfsDir = "rootfs"
	// EnvFile is the environment of the slot's systemd-nspawn, read by
	// unbounded-container@.service (EnvironmentFile=): what the OCI
	// configuration cannot say (the cgroup hierarchy).
	EnvFile = "nspawn.env"
)

// OCIVersion is the runtime-spec version the bundle says: systemd-nspawn
// (252, Debian 12's) reads only "1.0.0" and refuses any other, and
// everything the bundle uses is in 1.0.0.
const OCIVersion = "1.0.0"

// Annotation keys of config.json: JSON has no comments, so the reasons
// for the settings are written here, where `cat config.json` shows them
// (systemd-nspawn ignores annotations).
const annotationPrefix = "io.unbounded-cloud.agent.why."

// Spec is the slot's OCI runtime configuration: the container the node
// stack runs in, as the nspawn mode's machine (machinefile.File says the
// same settings in nspawn's words). name is the node's host name, init the
// image's systemd, caps the capabilities given, containerdDir the slot's
// containerd store as the host names it, f the host devices given.
func Spec(name, init string, caps []string, containerdDir string, f devices.Found) *specs.Spec {
	s := &specs.Spec{
		Version: OCIVersion,
		Process: &specs.Process{
			User: specs.User{UID: 0, GID: 0},
			Args: []string{init},
			Env:  []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
			Cwd:  "/",
			Capabilities: &specs.LinuxCapabilities{
				Bounding: caps, Effective: caps, Permitted: caps, Inheritable: caps,
			},
			NoNewPrivileges: false,
		},
		Root:     &specs.Root{Path: RootfsDir, Readonly: false},
		Hostname: name,
		Mounts: []specs.Mount{
			{Destination: "/dev/kmsg", Type: "bind", Source: "/dev/kmsg"},
			{Destination: machinefile.ContainerdRoot, Type: "bind", Source: containerdDir},
		},
		Linux: &specs.Linux{
			// No network namespace (the host's network, as a node's) and
			// no user namespace (root inside is root on the host).
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.MountNamespace}, {Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace}, {Type: specs.CgroupNamespace},
			},
		},
		Annotations: map[string]string{
			annotationPrefix + "process":      "the node image's systemd runs as the container's PID 1 and starts the node-local DNS cache, containerd and the kubelet as units, as in the nspawn mode's machine; its READY=1 ends the unit's start job",
			annotationPrefix + "capabilities": "every capability of the host's bounding set (nspawn's Capability=all): containerd and runc need CAP_SYS_ADMIN, CAP_NET_ADMIN and more, and give each pod's container its own smaller set",
			annotationPrefix + "namespaces":   "pid, mount, ipc, uts and cgroup of its own; the host's network (the kubelet's ports and the CNI bridge are the host's) and the host's users (runc creates cgroups, mounts and namespaces for pods, which a mapped root may not)",
			annotationPrefix + "mounts":       "/dev/kmsg for the kubelet's OOM watcher; /var/lib/containerd on the slot's own host directory (runc's overlay mounts fail on a rootfs that is itself an overlay); the host devices the node is given ([devices])",
			annotationPrefix + "cgroup":       "the hierarchy is chosen at prepare from the host's and given to nspawn in nspawn.env beside this file",
		},
	}
	setDevices(s, f)
	return s
}

// fixedMounts are Spec's mounts before the devices'.
const fixedMounts = 2

// setDevices makes s bind the host devices f (after the fixed mounts).
func setDevices(s *specs.Spec, f devices.Found) {
	s.Mounts = s.Mounts[:min(len(s.Mounts), fixedMounts)]
	s.Linux.ReadonlyPaths = nil
	for _, d := range f.Devices {
		s.Mounts = append(s.Mounts, specs.Mount{Destination: d.Path, Type: "bind", Source: d.Path})
	}
	for _, p := range f.DriverFiles {
		// Bound, then made read-only where it lands: nspawn's OCI
		// mounts take no "ro" option for a bind.
		s.Mounts = append(s.Mounts, specs.Mount{Destination: p, Type: "bind", Source: p})
		s.Linux.ReadonlyPaths = append(s.Linux.ReadonlyPaths, p)
	}
}

// Marshal is the text of config.json for s.
func Marshal(s *specs.Spec) ([]byte, error) {
	data, err := json.MarshalIndent(s, "", "\t")
	if err != nil {
		return nil, err
	}
	return append(data, '\n'), nil
}

// Read reads the slot's config.json.
func Read(p hostpaths.Paths, slot string) (*specs.Spec, error) {
	data, err := os.ReadFile(filepath.Join(Dir(p, slot), ConfigFile))
	if err != nil {
		return nil, err
	}
	var s specs.Spec
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, fmt.Errorf("%s: %w", p.Rel(filepath.Join(Dir(p, slot), ConfigFile)), err)
	}
	if s.Linux == nil {
		s.Linux = &specs.Linux{}
	}
	return &s, nil
}

// Refresh finds the host devices of slot's node again under the rules of
// its record (machinefile.Rediscover) and, when they differ from what
// config.json binds, rewrites it (and the CDI specification in the
// rootfs): unbounded-container@<slot>.service runs it before every start
// (unbounded-restart --devices-of), so a restart, a reboot or a repave's
// switch binds what the host has now, as in mode nspawn. A slot without a
// bundle or a record is left alone.
func Refresh(p hostpaths.Paths, slot string, log *slog.Logger) error {
	s, err := Read(p, slot)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	rec, f, err := machinefile.Rediscover(p, slot, log)
	if err != nil || rec == nil {
		return err
	}
	cur, err := Marshal(s)
	if err != nil {
		return err
	}
	setDevices(s, f)
	text, err := Marshal(s)
	if err != nil {
		return err
	}
	if string(cur) == string(text) {
		return nil
	}
	if err := machinefile.WriteCDISpec(filepath.Join(Dir(p, slot), RootfsDir), f); err != nil {
		return err
	}
	if err := state.WriteFileAtomic(filepath.Join(Dir(p, slot), ConfigFile), text, 0o600); err != nil {
		return err
	}
	if err := devices.WriteRecord(p, slot, devices.Record{Options: rec.Options, Found: f, At: time.Now().UTC()}); err != nil {
		return err
	}
	log.Info("the node's devices changed; its next start binds them", "slot", slot,
		"before", strings.Join(rec.Found.Paths(), " "), "now", strings.Join(f.Paths(), " "))
	return nil
}
