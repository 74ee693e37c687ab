package daemon

import (
	"context"
	"os"
	"strings"
	"time"

	sddaemon "github.com/coreos/go-systemd/v22/daemon"

	"unbounded-cloud.io/agent/lib/crashpoint"
	"unbounded-cloud.io/agent/lib/modes"
	"unbounded-cloud.io/agent/lib/unitjournal"
	"unbounded-cloud.io/agent/lib/unitnames"
	"unbounded-cloud.io/agent/lib/units"
)

// Systemd is the part of the service manager the daemon talks to. The real
// one is systemd over D-Bus; unit tests put a fake here. It is an interface,
// not a struct of functions, because the fake needs state shared between
// the calls (a started unit changes what UnitState answers).
type Systemd interface {
	// StartUnit starts unit (job mode "replace": a unit that is already
	// starting is joined, not started twice) and returns once the job has
	// finished, with systemd's job result: "done", "failed", "canceled",
	// "timeout", "dependency", "skipped". For a oneshot the job finishes
	// when its ExecStart= has exited.
	StartUnit(ctx context.Context, unit string) (string, error)
	// UnitState reads the unit's current state.
	UnitState(ctx context.Context, unit string) (UnitState, error)
	// Reboot asks for the host's reboot through systemd-logind, as
	// `systemctl reboot` does (lib/units.Bus.Reboot: the kubelet's
	// graceful node shutdown is told first), and returns once the
	// request is queued; logind's reboot is irreversible.
	Reboot(ctx context.Context) error
	Close()
}

// UnitState is what the daemon reads of a unit to know whether it runs and
// how its last run ended.
type UnitState struct {
	ActiveState string // active, activating, deactivating, inactive, failed, ...
	SubState    string
	// Result is the service's result of its last run: "success",
	// "exit-code", "signal", "timeout", ...
	Result string
	// ExecMainStatus is the exit status (or signal number) of ExecStart=.
	ExecMainStatus int
	// InvocationID changes at every start; "" when the unit has not run
	// since it was loaded.
	InvocationID string
	// StartedAt is when the unit's last run began (InactiveExitTimestamp);
	// zero when it has not run since it was loaded.
	StartedAt time.Time
	// MainPID is the last run's main process (ExecMainPID); 0 when
	// unknown. Its lines are the run's (lib/unitjournal Query.PID).
	MainPID int
	// NRestarts is how often systemd restarted the service by its
	// Restart= (the node stack's units: the host metrics).
	NRestarts int
}

// Running reports whether the unit is in a transition (a oneshot stays in
// "activating" while its ExecStart= runs).
func (s UnitState) Running() bool { return unitnames.InTransition(s.ActiveState) }

// Succeeded reports whether the unit's last run ended well.
func (s UnitState) Succeeded() bool {
	return s.ActiveState != "failed" && (s.Result == "" || s.Result == "success")
}

// JournalQuery selects the journal lines of one unit (lib/unitjournal,
// shared with recovery's report of a failed unit).
type JournalQuery = unitjournal.Query

// Host holds every step that touches the host outside the daemon's own
// files. The zero value is the real host; tests replace single fields.
// There is no package-level hook: two daemons in one test process (the
// idle benchmark runs 200) each have their own Host.
type Host struct {
	// Systemd connects to the service manager; nil is the system bus.
	Systemd func(ctx context.Context) (Systemd, error)
	// Journal returns journal lines, oldest first; nil runs journalctl.
	Journal func(ctx context.Context, q JournalQuery) ([]string, error)
	// Now is the clock; nil is time.Now.
	Now func() time.Time
	// Notify sends a sd_notify(3) message; nil uses $NOTIFY_SOCKET
	// (and does nothing without it).
	Notify func(state string) error
	// Watchdog returns the watchdog interval; 0 when systemd asked for
	// none. nil reads $WATCHDOG_USEC.
	Watchdog func() (time.Duration, error)
	// BootID identifies the current boot; nil reads
	// /proc/sys/kernel/random/boot_id.
	BootID func() (string, error)
	// ChangeMethod says how this build changes the isolation mode from
	// one mode to another when asked is the method asked for ("": the
	// build's for the pair), or that it does not; nil is
	// modes.ChangeMethodAsked, the build's table (which has every pair
	// of today's modes, by either method: tests give a build that lacks
	// one).
	ChangeMethod func(from, to, asked string) (string, error)
	// CrashPoint is called at the daemon's crash points (Crash*); nil is
	// crashpoint.Hit (UNBOUNDED_CRASHPOINT).
	CrashPoint func(name string)
}

// The daemon's crash points: the windows of an isolation change's
// hand-over that a cut must not lose (lib/crashpoint).
const (
	// CrashIsolationInProgress: the change shown InProgress on the
	// Machine, its request not yet written.
	CrashIsolationInProgress = "daemon/isolation-in-progress"
	// CrashIsolationRequested: the request written, the spec not yet
	// recorded as asked for.
	CrashIsolationRequested = "daemon/isolation-requested"
)

func (h Host) crash(name string) { crashpoint.Via(h.CrashPoint, name) }

func (h Host) changeMethod(from, to, asked string) (string, error) {
	if h.ChangeMethod != nil {
		return h.ChangeMethod(from, to, asked)
	}
	return modes.ChangeMethodAsked(from, to, asked)
}

func (h Host) systemd(ctx context.Context) (Systemd, error) {
	if h.Systemd != nil {
		return h.Systemd(ctx)
	}
	b, err := units.DialBus(ctx)
	if err != nil {
		return nil, err
	}
	return dbusSystemd{b}, nil
}

func (h Host) journal(ctx context.Context, q JournalQuery) ([]string, error) {
	if h.Journal != nil {
		return h.Journal(ctx, q)
	}
	return unitjournal.Read(ctx, q)
}

func (h Host) now() time.Time {
	if h.Now != nil {
		return h.Now()
	}
	return time.Now()
}

func (h Host) notify(state string) error {
	if h.Notify != nil {
		return h.Notify(state)
	}
	_, err := sddaemon.SdNotify(false, state)
	return err
}

func (h Host) watchdog() (time.Duration, error) {
	if h.Watchdog != nil {
		return h.Watchdog()
	}
	return sddaemon.SdWatchdogEnabled(false)
}

func (h Host) bootID() (string, error) {
	if h.BootID != nil {
		return h.BootID()
	}
	// A kernel interface, not agent state: it is not under the host root.
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	return strings.TrimSpace(string(b)), err
}

// dbusSystemd is the real service manager: lib/units' Bus, its start
// named as the daemon's seam names it.
type dbusSystemd struct{ *units.Bus }

func (s dbusSystemd) StartUnit(ctx context.Context, unit string) (string, error) {
	return s.StartJob(ctx, unit)
}

func (s dbusSystemd) UnitState(ctx context.Context, unit string) (UnitState, error) {
	st, err := s.UnitStatus(ctx, unit)
	if err != nil {
		return UnitState{}, err
	}
	return UnitState{
		ActiveState:    st.ActiveState,
		SubState:       st.SubState,
		Result:         st.Result,
		ExecMainStatus: st.ExecMainStatus,
		InvocationID:   st.InvocationID,
		StartedAt:      st.StartedAt,
		MainPID:        st.MainPID,
		NRestarts:      st.NRestarts,
	}, nil
}
