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
	Upgrade    = "unbounded-upgrade.service"
	Health     = "unbounded-health.service"
	// HealthTimer starts Health every 30 s while the node is up.
	HealthTimer = "unbounded-health.timer"
	// RecoverGenerator is the recovery the generator pulls in on corrupt
	// state: the instance name says who asked, as OnFailure=
	// unbounded-recover@%n.service does for failed units.
	RecoverGenerator = "unbounded-recover@generator.service"
	// Containerd and Kubelet are mode none's node stack.
	Containerd = "unbounded-containerd.service"
	Kubelet    = "unbounded-kubelet.service"
)

// ModeTarget is the target of an isolation mode.
func ModeTarget(mode string) string { return "unbounded-mode-" + mode + ".target" }

// Supervising are the units that run the node stack of mode in slot
// (ARCHITECTURE section 2): what the mode target requires, what the
// fence guards, what "the node runs" means. Nil for an unknown mode.
func Supervising(mode, slot string) []string {
	switch mode {
	case "nspawn":
		return []string{"systemd-nspawn@" + slot + ".service"}
	case "container":
		return []string{"unbounded-container@" + slot + ".service"}
	case "none":
		return []string{Containerd, Kubelet}
	}
	return nil
}
