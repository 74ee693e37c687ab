package recover

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

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

// UnitStatus is what recovery reads of a unit.
type UnitStatus struct {
	LoadState     string // loaded, not-found, masked, bad-setting, error
	ActiveState   string // active, inactive, failed, activating, ...
	SubState      string // for a service: running, dead, failed, auto-restart, ...
	UnitFileState string // enabled, disabled, static, masked, masked-runtime, generated, ...
	// Result is the service's result of its last run: "success",
	// "exit-code", "signal", "core-dump", "timeout", "watchdog",
	// "start-limit-hit", ...
	Result string
	// ExecMainCode is how the main process ended (1 exited, 2 killed,
	// 3 dumped: CLD_* of waitid(2)); ExecMainStatus its exit status or
	// signal number.
	ExecMainCode   int
	ExecMainStatus int
	InvocationID   string
	// StartedAt is when the unit's last run began (InactiveExitTimestamp).
	StartedAt time.Time
}

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
	u, err := s.conn.GetUnitPropertiesContext(ctx, unit)
	if err != nil {
		return UnitStatus{}, fmt.Errorf("read state of %s: %w", unit, err)
	}
	st := UnitStatus{
		LoadState:     str(u["LoadState"]),
		ActiveState:   str(u["ActiveState"]),
		SubState:      str(u["SubState"]),
		UnitFileState: str(u["UnitFileState"]),
	}
	if id, ok := u["InvocationID"].([]byte); ok && len(id) > 0 && !bytes.Equal(id, make([]byte, len(id))) {
		st.InvocationID = hex.EncodeToString(id)
	}
	if us, ok := u["InactiveExitTimestamp"].(uint64); ok && us > 0 {
		st.StartedAt = time.UnixMicro(int64(us))
	}
	if strings.HasSuffix(unit, ".service") && st.LoadState == "loaded" {
		svc, err := s.conn.GetUnitTypePropertiesContext(ctx, unit, "Service")
		if err != nil {
			return UnitStatus{}, fmt.Errorf("read service state of %s: %w", unit, err)
		}
		st.Result = str(svc["Result"])
		if v, ok := svc["ExecMainCode"].(int32); ok {
			st.ExecMainCode = int(v)
		}
		if v, ok := svc["ExecMainStatus"].(int32); ok {
			st.ExecMainStatus = int(v)
		}
	}
	return st, nil
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

func str(v any) string {
	s, _ := v.(string)
	return s
}
