package modes

import (
	"context"
	"fmt"

	sdbus "github.com/coreos/go-systemd/v22/dbus"
)

// Systemd is the part of the service manager the modes use. The real one
// is systemd over D-Bus (DialSystemd); unit tests put a recorder here. It
// is an interface because a fake needs state shared between calls (a
// started unit changes what ActiveState answers).
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

// DialSystemd connects to the system manager over the system bus.
func DialSystemd(ctx context.Context) (Systemd, error) {
	conn, err := sdbus.NewWithContext(ctx)
	if err != nil {
		return nil, fmt.Errorf("connect to systemd over D-Bus: %w", err)
	}
	return dbusSystemd{conn}, nil
}

type dbusSystemd struct{ conn *sdbus.Conn }

func (s dbusSystemd) Close() { s.conn.Close() }

func (s dbusSystemd) Reload(ctx context.Context) error {
	if err := s.conn.ReloadContext(ctx); err != nil {
		return fmt.Errorf("daemon-reload: %w", err)
	}
	return nil
}

type jobFunc func(ctx context.Context, name, mode string, ch chan<- string) (int, error)

// job queues one job and waits for systemd's JobRemoved result, which
// go-systemd delivers on ch (systemd sends it to the client that queued
// the job, so no Subscribe is needed).
func (s dbusSystemd) job(ctx context.Context, verb string, f jobFunc, unit string) error {
	ch := make(chan string, 1)
	if _, err := f(ctx, unit, "replace", ch); err != nil {
		return fmt.Errorf("%s %s: %w", verb, unit, err)
	}
	select {
	case res := <-ch:
		if res != "done" {
			return fmt.Errorf("%s %s: job %s (see journalctl -u %s)", verb, unit, res, unit)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%s %s: %w", verb, unit, ctx.Err())
	}
}

func (s dbusSystemd) StartUnit(ctx context.Context, unit string) error {
	return s.job(ctx, "start", s.conn.StartUnitContext, unit)
}

func (s dbusSystemd) RestartUnit(ctx context.Context, unit string) error {
	return s.job(ctx, "restart", s.conn.RestartUnitContext, unit)
}

func (s dbusSystemd) StopUnit(ctx context.Context, unit string) error {
	return s.job(ctx, "stop", s.conn.StopUnitContext, unit)
}

func (s dbusSystemd) ActiveState(ctx context.Context, unit string) (string, error) {
	p, err := s.conn.GetUnitPropertyContext(ctx, unit, "ActiveState")
	if err != nil {
		return "", fmt.Errorf("read state of %s: %w", unit, err)
	}
	v, _ := p.Value.Value().(string)
	return v, nil
}

// Running reports whether an ActiveState means the unit runs or is in a
// transition that will leave it running or stopping.
func Running(activeState string) bool {
	switch activeState {
	case "active", "activating", "reloading", "refreshing", "deactivating":
		return true
	}
	return false
}
