package tree

import (
	"fmt"
	"io"
	"strings"

	"github.com/coreos/go-systemd/v22/unit"

	"unbounded-cloud.io/agent/lib/modes"
	"unbounded-cloud.io/agent/lib/modes/nodestack"
	"unbounded-cloud.io/agent/lib/modes/nspawn/machinefile"
	"unbounded-cloud.io/agent/lib/unitnames"
)

// Layout is where the node stack lives inside the machine: the usual
// places, so that an operator inside (`machinectl shell kube1`) finds
// kubelet, crictl's socket and the CNI files where every guide says.
var Layout = nodestack.Layout{
	BinDir:              "/usr/local/bin",
	CNIBinDir:           "/opt/cni/bin",
	CNIConfDir:          "/etc/cni/net.d",
	KubeletConfig:       machinefile.KubeletConfig,
	BootstrapKubeconfig: "/etc/kubernetes/bootstrap-kubelet.conf",
	Kubeconfig:          "/etc/kubernetes/kubelet.conf",
	CACert:              "/etc/kubernetes/pki/ca.crt",
	ContainerdConfig:    "/etc/containerd/config.toml",
	ContainerdRoot:      machinefile.ContainerdRoot,
	ContainerdState:     "/run/containerd",
	ResolvConf:          "/etc/resolv.conf",
	LocalDNSCorefile:    "/etc/coredns/Corefile",
	PodResolvConf:       "/etc/kubernetes/resolv.conf",
}

// Units inside the machine, in its /etc/systemd/system, enabled by links
// in multi-user.target.wants (the machine boots to its default target).
const (
	ContainerdUnit = unitnames.MachineContainerd
	KubeletUnit    = unitnames.MachineKubelet
	// LocalDNSUnit exists where the node runs the node-local DNS cache.
	LocalDNSUnit = unitnames.MachineLocalDNS
	// CgroupRWUnit exists on a legacy hierarchy only.
	CgroupRWUnit   = "unbounded-cgroup-rw.service"
	cgroupRWScript = "/usr/local/libexec/unbounded/cgroup-rw"
)

// containerdUnit runs containerd inside the machine; localDNS: after the
// node-local DNS cache.
func containerdUnit(cg nodestack.Cgroup, localDNS bool) string {
	after := "local-fs.target network.target"
	if cg == nodestack.Legacy {
		after += " " + CgroupRWUnit
	}
	dns := ""
	if localDNS {
		dns = `# The node-local DNS cache serves before any pod starts (a Wants=: pods
# run without it, their lookups fail until it is back).
Wants=` + LocalDNSUnit + `
After=` + LocalDNSUnit + `
`
	}
	return fmt.Sprintf(`# Written by unbounded-agent: the node's container runtime.
[Unit]
Description=containerd container runtime (unbounded node stack)
Documentation=https://unbounded-cloud.io/docs/agent/modes/nspawn
Documentation=https://containerd.io
# On a legacy cgroup hierarchy the controllers must be writable before
# containerd creates a container's cgroups.
After=%[1]s
%[4]s
[Service]
ExecStart=%[2]s/containerd --config %[3]s
# containerd reports READY=1 once its socket serves.
Type=notify
# Containers' cgroups are containerd's to manage (systemd driver on v2).
Delegate=yes
# Stopping containerd must not kill the containers: kubelet and the shims
# own them, and a runtime upgrade keeps pods running.
KillMode=process
Restart=always
RestartSec=2s
LimitNPROC=infinity
LimitCORE=infinity
TasksMax=infinity
# No OOMScoreAdjust=: setting it needs CAP_SYS_RESOURCE, which root lacks in
# nested machines; the unit would not start at all.

[Install]
WantedBy=multi-user.target
`, after, Layout.BinDir, Layout.ContainerdConfig, dns)
}

// LocalDNSUnitFile is the node-local DNS cache's unit inside the node
// (nodestack.LocalDNSFiles), /etc/systemd/system/LocalDNSUnit in the
// rootfs of an nspawn machine and of a container alike: CoreDNS on its
// own interface, in the network namespace the node shares with the host,
// in the sandbox of nodestack.LocalDNSSandbox. The lint tier scores it
// with systemd-analyze security (units/security_test.go).
func LocalDNSUnitFile() ([]byte, error) {
	u := func(name, value string) *unit.UnitOption { return unit.NewUnitOption("Unit", name, value) }
	opts := []*unit.UnitOption{
		u("Description", nodestack.LocalDNSUnitDescription),
		u("Documentation", "https://unbounded-cloud.io/docs/agent/modes/nspawn"),
		u("Documentation", "https://coredns.io/manual/toc/"),
		// Started before the runtime (ContainerdUnit Wants= it), so pods
		// find it from their first lookup; a restart of the runtime
		// restarts it first.
		u("Before", ContainerdUnit+" "+KubeletUnit),
		u("PartOf", ContainerdUnit),
	}
	opts = append(opts, nodestack.LocalDNSService(Layout)...)
	opts = append(opts, unit.NewUnitOption("Install", "WantedBy", "multi-user.target"))
	body, err := io.ReadAll(unit.Serialize(opts))
	if err != nil {
		return nil, err
	}
	return append([]byte(localDNSUnitHeader), body...), nil
}

// localDNSUnitHeader says, in the unit file itself, what its settings do
// (go-systemd's serializer writes no comments).
const localDNSUnitHeader = `# Written by unbounded-agent: the node-local DNS cache (node.local-dns),
# regenerated at every prepare of the node.
#
# Its interface is made and removed by the "+" commands, as root with
# every privilege (CAP_NET_ADMIN). CoreDNS itself runs as a dynamic user
# with CAP_NET_BIND_SERVICE alone (port 53), nothing writable, sockets of
# AF_INET and AF_INET6 only (so the bind plugin warns that it cannot list
# the interfaces: the Corefile binds addresses, not interface names), on
# the host's network, which it serves and forwards to. The sandbox and
# its reasons: unbounded-agent's lib/modes/nodestack, LocalDNSSandbox.
`

// kubeletUnit runs kubelet inside the machine.
func kubeletUnit(n modes.Node) string {
	return fmt.Sprintf(`# Written by unbounded-agent: the node's kubelet.
[Unit]
Description=kubelet (unbounded node stack)
Documentation=https://unbounded-cloud.io/docs/agent/modes/nspawn
Documentation=https://kubernetes.io/docs/reference/command-line-tools-reference/kubelet/
# kubelet talks to containerd's CRI socket from its first second; started
# before containerd it only logs errors until the socket appears.
Wants=%[1]s
After=%[1]s

[Service]
ExecStart=%[2]s/kubelet %[3]s
Restart=always
RestartSec=2s

[Install]
WantedBy=multi-user.target
`, ContainerdUnit, Layout.BinDir, strings.Join(nodestack.KubeletArgs(n, Layout), " "))
}

// cgroupRWUnit makes the machine's cgroup v1 controllers writable.
const cgroupRWUnitText = `# Written by unbounded-agent: on a legacy cgroup hierarchy.
[Unit]
Description=Writable cgroup v1 controllers for the node stack
Documentation=https://unbounded-cloud.io/docs/agent/modes/nspawn
# nspawn mounts the v1 controllers read-only when the machine shares the
# host's users (PrivateUsers=no). kubelet and runc create /kubepods and the
# pods' cgroups in every controller, so they must be writable before either
# starts. The remount is a bind of the machine's own subtree: only the
# machine's cgroup becomes writable, not the host's.
DefaultDependencies=no
After=local-fs.target
Before=containerd.service kubelet.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=` + cgroupRWScript + `

[Install]
WantedBy=multi-user.target
`

// cgroupRWScriptText remounts every cgroup (v1) mount rw. The fifth field
// of mountinfo is the mount point, the one after " - " the fs type.
const cgroupRWScriptText = `#!/bin/sh
# Written by unbounded-agent: see unbounded-cgroup-rw.service.
set -eu
awk '{ for (i = 1; i <= NF; i++) if ($i == "-") { if ($(i+1) == "cgroup") print $5; break } }' /proc/self/mountinfo |
while read -r m; do
	mount -o remount,bind,rw "$m"
done
`
