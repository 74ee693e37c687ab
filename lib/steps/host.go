package steps

import (
	"context"
	"log/slog"
	"time"

	"unbounded-cloud.io/agent/lib/crashpoint"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/sdstatus"
	"unbounded-cloud.io/agent/lib/units"
)

// Host is the host an operation runs on, as the seams its tests replace:
// filled once, embedded by the operations (lib/repave, lib/isolation),
// its methods the one way to reach each seam. The zero value of every
// field but Paths is the real host.
type Host struct {
	Paths hostpaths.Paths
	// Systemd connects to the service manager; nil: the system bus.
	Systemd func(ctx context.Context) (units.Manager, error)
	// Notify sends an sd_notify state; nil: sd_notify.
	Notify func(state string)
	// CrashPoint is called at each crash point; nil: crashpoint.Hit.
	CrashPoint func(name string)
	// Now is the clock; nil: time.Now.
	Now func() time.Time
	// Log is the logger; nil: slog.Default().
	Log *slog.Logger
}

// Logger is the host's logger.
func (h *Host) Logger() *slog.Logger {
	if h.Log != nil {
		return h.Log
	}
	return slog.Default()
}

// Time is the host's clock.
func (h *Host) Time() time.Time {
	if h.Now != nil {
		return h.Now()
	}
	return time.Now()
}

// Crash is the crash point name (lib/crashpoint).
func (h *Host) Crash(name string) { crashpoint.Via(h.CrashPoint, name) }

// Status shows a status line: STATUS= and the log (lib/sdstatus).
func (h *Host) Status(format string, args ...any) {
	sdstatus.Show(h.Logger(), h.Notify, format, args...)
}

// Manager connects to the service manager; the caller closes it.
func (h *Host) Manager(ctx context.Context) (units.Manager, error) {
	if h.Systemd != nil {
		return h.Systemd(ctx)
	}
	return units.Dial(ctx)
}

// Runner is a step runner on this host for operation's journal.
func (h *Host) Runner(operation string, j Journal) *Runner {
	return &Runner{Paths: h.Paths, Operation: operation, Journal: j, Notify: h.Notify, CrashPoint: h.CrashPoint, Log: h.Logger()}
}
