package recovery

import (
	"context"

	"unbounded-cloud.io/agent/lib/units"
)

// Systemd is the part of the service manager recovery uses: lib/units'
// Manager (start, reset-failed, daemon-reload, active state) and what a
// repair must read of a unit besides (its load and unit-file state, how
// its last run ended) and the unmask of a masked unit. The real one is
// systemd over D-Bus; unit tests put a fake here.
type Systemd interface {
	units.Manager
	// UnitStatus reads the unit's state.
	UnitStatus(ctx context.Context, unit string) (UnitStatus, error)
	// Unmask removes a mask of unit (a link to /dev/null in
	// /etc/systemd/system or /run/systemd/system), as `systemctl unmask`
	// does, without a reload.
	Unmask(ctx context.Context, unit string) error
}

// UnitStatus is what recovery reads of a unit (lib/units, shared with the
// daemon).
type UnitStatus = units.Status

// Dial connects to the system manager over the system bus (lib/units'
// Bus).
func Dial(ctx context.Context) (Systemd, error) { return units.DialBus(ctx) }
