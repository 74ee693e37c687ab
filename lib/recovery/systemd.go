package recovery

import (
	"context"
	"fmt"

	sdbus "github.com/coreos/go-systemd/v22/dbus"

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

// Dial connects to the system manager over the system bus.
func Dial(ctx context.Context) (Systemd, error) {
	conn, err := sdbus.NewWithContext(ctx)
	if err != nil {
		return nil, fmt.Errorf("connect to systemd over D-Bus: %w", err)
	}
	return &dbusSystemd{Manager: units.Borrow(conn), conn: conn}, nil
}

type dbusSystemd struct {
	units.Manager
	conn *sdbus.Conn
}

func (s *dbusSystemd) Close() { s.conn.Close() }

func (s *dbusSystemd) UnitStatus(ctx context.Context, unit string) (UnitStatus, error) {
	return units.ReadStatus(ctx, s.conn, unit)
}

func (s *dbusSystemd) Unmask(ctx context.Context, unit string) error {
	// Both the persistent mask (/etc) and a runtime one (/run).
	for _, runtime := range []bool{false, true} {
		if _, err := s.conn.UnmaskUnitFilesContext(ctx, []string{unit}, runtime); err != nil {
			return fmt.Errorf("unmask %s: %w", unit, err)
		}
	}
	return nil
}
