package units

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	sdbus "github.com/coreos/go-systemd/v22/dbus"
)

// Status is what the agent reads of a unit to know whether it runs and
// how its last run ended: the daemon to report an operation's unit,
// recovery to report a failed unit and to check the daemon's.
type Status struct {
	LoadState     string // loaded, not-found, masked, bad-setting, error
	ActiveState   string // active, activating, deactivating, inactive, failed, ...
	SubState      string // for a service: running, dead, failed, auto-restart, ...
	UnitFileState string // enabled, disabled, static, masked, generated, ...
	// Result is the service's result of its last run: "success",
	// "exit-code", "signal", "core-dump", "timeout", "watchdog",
	// "start-limit-hit", ...
	Result string
	// ExecMainCode is how the main process ended (1 exited, 2 killed,
	// 3 dumped: CLD_* of waitid(2)); ExecMainStatus is its exit status
	// or signal number.
	ExecMainCode   int
	ExecMainStatus int
	// InvocationID changes at every start; "" when the unit has not run
	// since it was loaded.
	InvocationID string
	// StartedAt is when the unit's last run began (InactiveExitTimestamp);
	// zero when it has not run since it was loaded.
	StartedAt time.Time
	// MainPID is the last run's main process (ExecMainPID, kept after it
	// exited); 0 when unknown.
	MainPID int
	// NRestarts is how often systemd restarted the service by its
	// Restart= since the unit was loaded (this boot, unless a
	// daemon-reload dropped it).
	NRestarts int
}

// ReadStatus reads unit's Status over conn.
func ReadStatus(ctx context.Context, conn *sdbus.Conn, unit string) (Status, error) {
	u, err := conn.GetUnitPropertiesContext(ctx, unit)
	if err != nil {
		return Status{}, fmt.Errorf("read state of %s: %w", unit, err)
	}
	st := Status{
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
	// A unit that systemd could not load has no Service interface.
	if strings.HasSuffix(unit, ".service") && st.LoadState != "not-found" && st.LoadState != "masked" {
		svc, err := conn.GetUnitTypePropertiesContext(ctx, unit, "Service")
		if err != nil {
			return Status{}, fmt.Errorf("read service state of %s: %w", unit, err)
		}
		st.Result = str(svc["Result"])
		if v, ok := svc["ExecMainCode"].(int32); ok {
			st.ExecMainCode = int(v)
		}
		if v, ok := svc["ExecMainStatus"].(int32); ok {
			st.ExecMainStatus = int(v)
		}
		if v, ok := svc["ExecMainPID"].(uint32); ok {
			st.MainPID = int(v)
		}
		if v, ok := svc["NRestarts"].(uint32); ok {
			st.NRestarts = int(v)
		}
	}
	return st, nil
}

func str(v any) string {
	s, _ := v.(string)
	return s
}
