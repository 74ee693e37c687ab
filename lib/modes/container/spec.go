package container

import (
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"unbounded-cloud.io/agent/lib/devices"
	"unbounded-cloud.io/agent/lib/modes/nspawn/machinefile"
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
	for _, d := range f.Devices {
		s.Mounts = append(s.Mounts, specs.Mount{Destination: d.Path, Type: "bind", Source: d.Path})
	}
	for _, p := range f.DriverFiles {
		// Bound, then made read-only where it lands: nspawn's OCI
		// mounts take no "ro" option for a bind.
		s.Mounts = append(s.Mounts, specs.Mount{Destination: p, Type: "bind", Source: p})
		s.Linux.ReadonlyPaths = append(s.Linux.ReadonlyPaths, p)
	}
	return s
}
