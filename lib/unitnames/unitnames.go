// Package unitnames is the one table of the units and targets the agent
// ships, starts and waits for (ARCHITECTURE section 6; units/ holds the
// files). It imports nothing, so that the generator and the small health
// and restart binaries share it with the multicall executable.
package unitnames

// The agent's services and targets.
const (
	// NodeTarget is active exactly while the active node stack is up.
	NodeTarget = "unbounded-node.target"
	Daemon     = "unbounded-daemon.service"
	Bootstrap  = "unbounded-bootstrap.service"
	Fence      = "unbounded-fence.service"
	Lifecycle  = "unbounded-lifecycle.service"
	Repave     = "unbounded-repave.service"
	Restart    = "unbounded-restart.service"
	Reset      = "unbounded-reset.service"
	Isolation  = "unbounded-isolation.service"
	// Reprovision runs the reprovision handoff (lib/reprovision).
	Reprovision = "unbounded-reprovision.service"
	Upgrade     = "unbounded-upgrade.service"
	Health      = "unbounded-health.service"
	// UpgradePath starts Upgrade when a package is staged (while the
	// node is up: the preset hangs it on the node target).
	UpgradePath = "unbounded-upgrade.path"
	// HealthTimer starts Health every 30 s while the node is up.
	HealthTimer = "unbounded-health.timer"
	// RecoverGenerator is the recovery the generator pulls in on corrupt
	// state: the instance name says who asked, as OnFailure=
	// unbounded-recover@%n.service does for failed units.
	RecoverGenerator = "unbounded-recover@generator.service"
	// Containerd and Kubelet are mode none's node stack.
	Containerd = "unbounded-containerd.service"
	Kubelet    = "unbounded-kubelet.service"
	// MachineContainerd and MachineKubelet are the node stack's units
	// inside an nspawn (or container) node machine.
	MachineContainerd = "containerd.service"
	MachineKubelet    = "kubelet.service"
	// MachineLocalDNS is the node-local DNS cache inside a machine, and
	// LocalDNS mode none's, on the host (node.local-dns).
	MachineLocalDNS = "node-local-dns.service"
	LocalDNS        = "unbounded-local-dns.service"
	// HostReboot is the transient unit (no file in units/) that the
	// daemon starts over D-Bus for a Reboot operation: it runs
	// `systemctl reboot` with the service manager's privileges
	// (lib/units' Bus.Reboot).
	HostReboot = "unbounded-host-reboot.service"
)

// The older agent's units (hostpaths' legacy root), which adoption
// (lib/adopt) and reset stop, disable and remove: its daemon, and the
// recovery its daemon's OnFailure= starts (a script that rolls the
// daemon back to its last good binary and restarts it).
const (
	LegacyDaemon   = "unbounded-agent-daemon.service"
	LegacyRecovery = "unbounded-agent-daemon-recovery.service"
)

// Legacy are the older agent's units, the recovery first: stopped in
// this order, the daemon's stop can start no rollback.
var Legacy = []string{LegacyRecovery, LegacyDaemon}

// ModeTarget is the target of an isolation mode.
func ModeTarget(mode string) string { return "unbounded-mode-" + mode + ".target" }

// Running says whether a unit in ActiveState runs or is in a transition
// that leaves it running or stopping: what "a node unit still runs"
// means (a slot that must not be rebuilt, a unit that must be stopped).
func Running(activeState string) bool {
	switch activeState {
	case "active", "activating", "reloading", "refreshing", "deactivating":
		return true
	}
	return false
}

// InTransition says whether a unit in ActiveState has a job under way: a
// oneshot stays "activating" while its ExecStart= runs, so this is what
// "the operation runs now" means. A finished oneshot with
// RemainAfterExit= is "active", not in transition.
func InTransition(activeState string) bool {
	switch activeState {
	case "activating", "deactivating", "reloading", "refreshing":
		return true
	}
	return false
}
