package units_test

import (
	"os"
	"testing"

	"unbounded-cloud.io/agent/lib/unitnames"
)

// Every name of the one table (lib/unitnames) that this release ships is
// a file here, so that a renamed unit is a failing test, not a start of a
// unit systemd does not know. notYet names a concern still to come (none
// at present; the health check treats such runs as busy).
func TestEveryUnitNameOfTheTableIsShipped(t *testing.T) {
	notYet := map[string]bool{}
	names := []string{unitnames.NodeTarget, unitnames.Daemon, unitnames.Bootstrap, unitnames.Fence, unitnames.Lifecycle,
		unitnames.Repave, unitnames.Restart, unitnames.Reset, unitnames.Isolation, unitnames.Reprovision, unitnames.Upgrade, unitnames.Health,
		unitnames.HealthTimer, unitnames.UpgradePath, unitnames.Containerd, unitnames.Kubelet, "unbounded-recover@.service"}
	for _, m := range []string{"nspawn", "container", "none"} {
		names = append(names, unitnames.ModeTarget(m))
	}
	for _, n := range names {
		_, err := os.Stat(n)
		switch {
		case notYet[n] && err == nil:
			t.Errorf("%s ships now: take it out of this test's list of units still to come", n)
		case !notYet[n] && err != nil:
			t.Errorf("lib/unitnames names %s, which units/ does not ship: %v", n, err)
		}
	}
}

// unitnames.HostReboot is a transient unit the daemon starts over D-Bus
// with its properties (lib/units.RebootProperties): a file of that name
// would be a second definition, which the transient start refuses.
func TestTheTransientRebootUnitIsNotShipped(t *testing.T) {
	if _, err := os.Stat(unitnames.HostReboot); err == nil {
		t.Errorf("units/ ships %s, the transient unit the daemon defines at its start", unitnames.HostReboot)
	}
}
