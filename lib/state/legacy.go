package state

import (
	"os"

	"unbounded-cloud.io/agent/lib/hostpaths"
)

// Legacy describes what the older agent left on a host (ARCHITECTURE
// section 4). Adoption (linking it into the host root) is the host-root
// migration's job; this only detects.
type Legacy struct {
	AppliedConfigs []string // host paths of legacy applied configs found
	Binary         bool
	Unit           bool
}

// Found reports whether anything of the legacy agent is on the host.
func (l Legacy) Found() bool { return len(l.AppliedConfigs) > 0 || l.Binary || l.Unit }

// DetectLegacy looks for the legacy root's files.
func DetectLegacy(p hostpaths.Paths) Legacy {
	var l Legacy
	for _, slot := range hostpaths.Slots {
		if _, err := os.Stat(p.LegacyAppliedConfig(slot)); err == nil {
			l.AppliedConfigs = append(l.AppliedConfigs, p.Rel(p.LegacyAppliedConfig(slot)))
		}
	}
	if _, err := os.Stat(p.Join(hostpaths.LegacyBinaryHost)); err == nil {
		l.Binary = true
	}
	if _, err := os.Stat(p.Join(hostpaths.LegacyUnitHost)); err == nil {
		l.Unit = true
	}
	return l
}
