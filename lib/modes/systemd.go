package modes

import "context"

// Systemd is the part of the service manager the modes use. The real one
// is systemd over D-Bus (lib/units.Dial, in its own package so
// that the operator CLI, which links this package for
// supports-isolation, does not link D-Bus); unit tests put a recorder
// here. It is an interface because a fake needs state shared between
// calls (a started unit changes what ActiveState answers).
type Systemd interface {
	// Reload is `systemctl daemon-reload`: it returns once systemd has
	// reloaded (and re-run the generators).
	Reload(ctx context.Context) error
	// StartUnit, RestartUnit and StopUnit queue a job in mode "replace"
	// and wait for it; an error names the unit and systemd's job result
	// when it is not "done".
	StartUnit(ctx context.Context, unit string) error
	RestartUnit(ctx context.Context, unit string) error
	StopUnit(ctx context.Context, unit string) error
	// ActiveState is the unit's ActiveState ("active", "inactive",
	// "failed", "activating", ...); a unit systemd does not know is
	// "inactive".
	ActiveState(ctx context.Context, unit string) (string, error)
	Close()
}
