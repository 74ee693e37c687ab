// Package manager is the service manager the isolation modes drive:
// systemd over D-Bus (go-systemd), behind lib/modes.Systemd.
package manager

import (
	"context"
	"fmt"

	sdbus "github.com/coreos/go-systemd/v22/dbus"

	"unbounded-cloud.io/agent/lib/modes"
)

// Dial connects to the system manager over the system bus.
func Dial(ctx context.Context) (modes.Systemd, error) {
	conn, err := sdbus.NewWithContext(ctx)
	if err != nil {
		return nil, fmt.Errorf("connect to systemd over D-Bus: %w", err)
	}
	return dbusSystemd{conn: conn}, nil
}

// Borrow drives the service manager behind an open connection (another
// machine's bus, say) that its owner closes: Close does nothing.
func Borrow(conn *sdbus.Conn) modes.Systemd { return dbusSystemd{conn: conn, borrowed: true} }

type dbusSystemd struct {
	conn     *sdbus.Conn
	borrowed bool
}

func (s dbusSystemd) Close() {
	if !s.borrowed {
		s.conn.Close()
	}
}

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
