// Package hostpaths resolves every path the agent reads or writes on a host
// (ARCHITECTURE section 4) under one root prefix.
//
// Production code uses the zero value (root "/"); tests and `--root DIR`
// commands use a temporary directory, the way `systemctl --root` does. No
// other package spells a host path: a path that is not here does not exist
// for the agent.
package hostpaths

import (
	"path/filepath"
	"strings"
)

// Slots are the two node-stack slots. Exactly one is active.
var Slots = []string{"kube1", "kube2"}

// ValidSlot reports whether s names one of the two slots.
func ValidSlot(s string) bool {
	for _, v := range Slots {
		if s == v {
			return true
		}
	}
	return false
}

// OtherSlot returns the slot that is not s (kube1 <-> kube2).
func OtherSlot(s string) string {
	if s == "kube1" {
		return "kube2"
	}
	return "kube1"
}

// Paths resolves host paths under Root. The zero value is the real host.
type Paths struct {
	// Root is the prefix every path is resolved under; "" means "/".
	Root string
}

// New returns Paths rooted at root ("" or "/" is the real host).
func New(root string) Paths { return Paths{Root: root} }

// Join resolves an absolute host path under the root.
func (p Paths) Join(abs string) string {
	if p.Root == "" || p.Root == "/" {
		return filepath.Clean("/" + abs)
	}
	return filepath.Join(p.Root, abs)
}

// Rel strips the root prefix from a resolved path, giving the path as the
// host sees it (for messages and for records that must stay valid after the
// root is mounted elsewhere).
func (p Paths) Rel(resolved string) string {
	if p.Root == "" || p.Root == "/" {
		return resolved
	}
	r := strings.TrimPrefix(resolved, filepath.Clean(p.Root))
	if r == "" {
		return "/"
	}
	return r
}

// Host paths, as the host sees them. Resolve them with Join, or use the
// methods below.
const (
	ConfigFileHost      = "/etc/unbounded/agent.toml"
	ConfigDropinDirHost = "/etc/unbounded/agent.toml.d"
	HostRootHost        = "/var/lib/unbounded"
	ReprovisionDirHost  = "/var/lib/unbounded-agent-reprovision"
	RunDirHost          = "/run/unbounded"
	LibexecDirHost      = "/usr/libexec/unbounded"
	CLIHost             = "/usr/bin/unbounded"
	UnitDirHost         = "/usr/lib/systemd/system"
	UnitDirEtcHost      = "/etc/systemd/system"
	UnitDirRunHost      = "/run/systemd/system"
	GeneratorHost       = "/usr/lib/systemd/system-generators/unbounded-generator"
	PresetHost          = "/usr/lib/systemd/system-preset/80-unbounded.preset"
	MachinesDirHost     = "/var/lib/machines"
	NspawnConfigDirHost = "/etc/systemd/nspawn"
	VersionsDirHost     = "/var/lib/unbounded/versions"
	// VersionsCurrentHost is mode none's link to the version that runs.
	VersionsCurrentHost = VersionsDirHost + "/current"
	KmsgHost            = "/dev/kmsg"

	// Host preparation (lib/hostprep): the files it owns, and the kernel
	// interfaces it reads and writes.
	ModulesLoadFileHost = "/etc/modules-load.d/unbounded.conf"
	SysctlFileHost      = "/etc/sysctl.d/90-unbounded.conf"
	ProcSysHost         = "/proc/sys"
	ProcSwapsHost       = "/proc/swaps"
	ProcFilesystemsHost = "/proc/filesystems"
	SysModuleHost       = "/sys/module"
	DevNullHost         = "/dev/null"

	// Legacy root of hosts installed by the older agent (Azure/unbounded's
	// cmd/agent before its own host root): its state directory (applied
	// configs <slot>-applied-config.json with a bare-hex .sha256 sidecar,
	// and its other records), its binary with the blue/green links of its
	// self-upgrade, its daemon's unit and the recovery unit and script
	// that roll that daemon back to its last good binary. lib/adopt adopts
	// such a host; lib/reset removes all of it.
	LegacyStateDirHost       = "/etc/unbounded/agent"
	LegacyBinDirHost         = "/usr/local/bin"
	LegacyBinaryHost         = LegacyBinDirHost + "/unbounded-agent"
	LegacyRecoveryScriptHost = LegacyBinDirHost + "/unbounded-agent-daemon-recovery.sh"
	LegacyUnitHost           = UnitDirEtcHost + "/unbounded-agent-daemon.service"
	LegacyRecoveryUnitHost   = UnitDirEtcHost + "/unbounded-agent-daemon-recovery.service"
)

// LegacyBinaries are the older agent's executables and links under
// LegacyBinDirHost, by name: the binary, its self-upgrade's blue/green
// copies and current/last-good links, the nspawn lifecycle helper, the
// recovery script.
var LegacyBinaries = []string{
	"unbounded-agent", "unbounded-agent-blue", "unbounded-agent-green",
	"unbounded-agent-current", "unbounded-agent-last-good",
	"unbounded-agent-nspawn-lifecycle", "unbounded-agent-daemon-recovery.sh",
}

// ConfigFile is the operator configuration, /etc/unbounded/agent.toml.
func (p Paths) ConfigFile() string { return p.Join(ConfigFileHost) }

// ConfigDropinDir holds drop-ins applied over ConfigFile in lexical order.
func (p Paths) ConfigDropinDir() string { return p.Join(ConfigDropinDirHost) }

// HostRoot is /var/lib/unbounded: all persistent state.
func (p Paths) HostRoot() string { return p.Join(HostRootHost) }

// AppliedConfig is the record of the config applied to slot; it is written
// only once the node it describes is healthy. Its name matches the legacy
// root's, but not its format: adoption (lib/adopt) converts a legacy
// record into this one.
func (p Paths) AppliedConfig(slot string) string {
	return filepath.Join(p.HostRoot(), slot+"-applied-config.json")
}

// Checksum is the SHA-256 sidecar of a state file.
func Checksum(file string) string { return file + ".sha256" }

// Ownership is the installation lock record.
func (p Paths) Ownership() string { return filepath.Join(p.HostRoot(), "ownership") }

// JournalDir holds the journals of multi-step operations.
func (p Paths) JournalDir() string { return filepath.Join(p.HostRoot(), "journal") }

// Journal is the journal of one multi-step operation (repave, isolation,
// reprovision, upgrade).
func (p Paths) Journal(operation string) string {
	return filepath.Join(p.JournalDir(), operation+".json")
}

// OwedDir holds the cluster writes an operation owes the cluster and
// could not make (lib/owed): one file a write, carried out by the daemon
// once the API server answers.
func (p Paths) OwedDir() string { return filepath.Join(p.HostRoot(), "owed") }

// UpgradeDir holds the agent's self-upgrade (lib/upgrade): staged/ (a
// package and its .sha256, fetched or dropped there by an operator; the
// .sha256 triggers unbounded-upgrade.path), previous/ (the package a
// rollback reinstalls), installed/ (the package of the running version,
// once an upgrade installed it), rejected/ (what a refused upgrade
// staged), and failed.json or upgraded.json (the signals of builds before
// lib/outcome's record, still written for one release).
func (p Paths) UpgradeDir() string { return filepath.Join(p.HostRoot(), "upgrade") }

// UpgradeStaged is the upgrade's staging directory.
func (p Paths) UpgradeStaged() string { return filepath.Join(p.UpgradeDir(), "staged") }

// UpgradeFailed is the failure signal of the last upgrade of builds
// before lib/outcome's record (read and written for one release).
func (p Paths) UpgradeFailed() string { return filepath.Join(p.UpgradeDir(), "failed.json") }

// UpgradeSucceeded is the success signal of the last upgrade of builds
// before lib/outcome's record (read and written for one release).
func (p Paths) UpgradeSucceeded() string { return filepath.Join(p.UpgradeDir(), "upgraded.json") }

// PreparedDir holds what an image builder prepared for the first boot
// (`unbounded prepare`, lib/modes/bluegreen/tree): tree/ (the
// host-independent part of a slot's tree: the node image unpacked, the
// artifacts, the offline pod images) and stamp.json (what it was built
// from). The first slot build whose input matches takes the tree.
func (p Paths) PreparedDir() string { return filepath.Join(p.HostRoot(), "prepared") }

// OutcomeDir holds how each concern's last run ended (lib/outcome), one
// record a concern, until the daemon has reported it.
func (p Paths) OutcomeDir() string { return filepath.Join(p.HostRoot(), "outcome") }

// Outcome is concern's outcome record (lib/outcome).
func (p Paths) Outcome(concern string) string {
	return filepath.Join(p.OutcomeDir(), concern+".json")
}

// PKIDir holds the daemon's client key and certificate.
func (p Paths) PKIDir() string { return filepath.Join(p.HostRoot(), "pki") }

// UpgradeStagingDir is watched by unbounded-upgrade.path.
func (p Paths) UpgradeStagingDir() string { return filepath.Join(p.HostRoot(), "upgrade", "staged") }

// OfflineDir is the default directory of pre-staged artifact archives.
func (p Paths) OfflineDir() string { return filepath.Join(p.HostRoot(), "offline") }

// ArtifactsDir is the cache of verified node stack artifacts
// (lib/artifacts): <name>/<version>/<file>, each with a .sha256 sidecar.
func (p Paths) ArtifactsDir() string { return filepath.Join(p.HostRoot(), "artifacts") }

// HostPrepRecord is the record of the host preparation (lib/hostprep):
// every change made, with what it replaced, for reset to undo.
func (p Paths) HostPrepRecord() string { return filepath.Join(p.HostRoot(), "hostprep.json") }

// ReprovisionDir survives the reset that the reprovision handoff performs.
func (p Paths) ReprovisionDir() string { return p.Join(ReprovisionDirHost) }

// RunDir holds this boot's state: locks, the fence's and the daemon's
// records.
func (p Paths) RunDir() string { return p.Join(RunDirHost) }

// Request is a request file from the daemon to the one-shot of concern.
// It is under the host root, not /run: it must outlive a power cut in the
// middle of the run it asked for, so that the daemon of the next boot
// knows which operation the resumed run carries out (lib/request).
func (p Paths) Request(concern string) string {
	return filepath.Join(p.HostRoot(), "requests", concern+".json")
}

// Libexec is the path of a one-shot binary.
func (p Paths) Libexec(concern string) string {
	return filepath.Join(p.Join(LibexecDirHost), concern)
}

// UnitDir is where the package ships its units.
func (p Paths) UnitDir() string { return p.Join(UnitDirHost) }

// UnitSearchDirs are the directories a unit file of the system manager can
// be installed in, in systemd's order of precedence (systemd.unit(5)): the
// operator's, the runtime's, the package's. Generated units are not here.
func (p Paths) UnitSearchDirs() []string {
	return []string{p.Join(UnitDirEtcHost), p.Join(UnitDirRunHost), p.UnitDir()}
}

// MachineDir is the rootfs of an nspawn slot.
func (p Paths) MachineDir(slot string) string { return filepath.Join(p.Join(MachinesDirHost), slot) }

// VersionsDir holds the node stack versions of the `none` mode, one
// directory per version and a `current` link. Under /var, never /opt or
// /usr: both are read-only on image-based hosts (ARCHITECTURE section 4).
func (p Paths) VersionsDir() string { return p.Join(VersionsDirHost) }

// SlotDir holds what a slot keeps on the host beside its machine's rootfs
// (the nspawn mode's containerd store).
func (p Paths) SlotDir(slot string) string { return filepath.Join(p.HostRoot(), "slots", slot) }

// NspawnConfig is the nspawn settings file of a slot's machine.
func (p Paths) NspawnConfig(slot string) string {
	return filepath.Join(p.Join(NspawnConfigDirHost), slot+".nspawn")
}

// NspawnDropInDir holds the drop-ins of a slot's systemd-nspawn@.service
// instance.
func (p Paths) NspawnDropInDir(slot string) string {
	return p.UnitDropInDir("systemd-nspawn@" + slot + ".service")
}

// UnitDropInDir is the operator's drop-in directory of unit
// (/etc/systemd/system/<unit>.d): what must persist across boots.
func (p Paths) UnitDropInDir(unit string) string {
	return filepath.Join(p.Join(UnitDirEtcHost), unit+".d")
}

// AgentDir holds an image-based host's agent override: its record and
// the one-shots of each version it staged (lib/upgrade).
func (p Paths) AgentDir() string { return filepath.Join(p.HostRoot(), "agent") }

// AgentOverride is the agent override's record (lib/state).
func (p Paths) AgentOverride() string { return filepath.Join(p.AgentDir(), "override.json") }

// Kmsg is the kernel log, where the generator reports.
func (p Paths) Kmsg() string { return p.Join(KmsgHost) }

// LegacyAppliedConfig is the applied config of slot on a legacy-root host.
func (p Paths) LegacyAppliedConfig(slot string) string {
	return filepath.Join(p.LegacyStateDir(), slot+"-applied-config.json")
}

// LegacyStateDir is the older agent's state directory, all of it the
// older agent's (its own uninstall removed it whole).
func (p Paths) LegacyStateDir() string { return p.Join(LegacyStateDirHost) }

// LegacyMachineWants is the link `machinectl enable <slot>`, with which
// the older agent had systemd start its node machine at every boot
// (machines.target wants it). This agent's generator starts the node
// instead, behind the fence, never by enablement.
func (p Paths) LegacyMachineWants(slot string) string {
	return filepath.Join(p.Join(UnitDirEtcHost), "machines.target.wants", "systemd-nspawn@"+slot+".service")
}

// Adopted is the record of the adoption of an older agent's host
// (lib/adopt): what was adopted, from where, when; `unbounded status`
// shows it. It goes with the host root at reset.
func (p Paths) Adopted() string { return filepath.Join(p.HostRoot(), "adopted.json") }

// LegacyIsolationOutcome is where builds before lib/outcome's record left
// an isolation change's outcome for the daemon (read for one release).
func (p Paths) LegacyIsolationOutcome() string {
	return filepath.Join(p.HostRoot(), "isolation-outcome.json")
}

// IsolationSpec records the Machine's isolation spec the daemon first saw
// (lib/state): a change is acted on only after it.
func (p Paths) IsolationSpec() string { return filepath.Join(p.HostRoot(), "isolation-spec") }

// RecoverDir holds recovery's rate-limit history, one file per unit
// (lib/recovery).
func (p Paths) RecoverDir() string { return filepath.Join(p.HostRoot(), "recover") }

// RecoverStale is where recovery moves aside an applied record that did
// not describe the running node: never deleted (lib/recovery).
func (p Paths) RecoverStale() string { return filepath.Join(p.RecoverDir(), "stale") }

// HealthRecord is this boot's health state (lib/health): failures in a
// row, restarts given up, the fence's retries.
func (p Paths) HealthRecord() string { return filepath.Join(p.RunDir(), "health.json") }
