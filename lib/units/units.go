// Package units is the service manager as the one-shots that drive other
// units (bootstrap, reset, the CLI's `unbounded reset`) see it: systemd
// over D-Bus (go-systemd), never `systemctl` in a subprocess.
//
// It is a superset of lib/modes.Systemd (the isolation modes' seam), so
// one connection serves both; what it adds is what an installation needs
// beyond a mode: queueing a start without waiting for it (the node target
// is ordered after bootstrap, so bootstrap waiting for its job would wait
// for itself), and a finished oneshot's exit status (the fence's 77 is a
// refusal, any other failure is not).
package units

import (
	"context"
	"errors"
	"fmt"
	"time"

	sdbus "github.com/coreos/go-systemd/v22/dbus"
	"github.com/godbus/dbus/v5"

	"unbounded-cloud.io/agent/lib/unitnames"
)

// Manager is the service manager. The real one is Dial's; tests have
// their own.
type Manager interface {
	// Reload is `systemctl daemon-reload`; it returns once systemd has
	// re-run the generators and reloaded the units.
	Reload(ctx context.Context) error
	// StartUnit, RestartUnit and StopUnit queue a job (mode "replace")
	// and wait for its result; an error names the unit and systemd's job
	// result when it is not "done".
	StartUnit(ctx context.Context, unit string) error
	RestartUnit(ctx context.Context, unit string) error
	StopUnit(ctx context.Context, unit string) error
	// EnqueueStart queues a start job and returns at once (`systemctl
	// start --no-block`).
	EnqueueStart(ctx context.Context, unit string) error
	// ActiveState is the unit's ActiveState ("active", "inactive",
	// "failed", "activating", ...); a unit systemd does not know is
	// "inactive".
	ActiveState(ctx context.Context, unit string) (string, error)
	// ExecMainStatus is the exit status of the unit's last main process
	// (ExecMainStatus: for a oneshot, the ExecStart= that ran last).
	ExecMainStatus(ctx context.Context, unit string) (int, error)
	// MainStartedAt is when the unit's main process last started
	// (ExecMainStartTimestamp); zero when it never did.
	MainStartedAt(ctx context.Context, unit string) (time.Time, error)
	// ResetFailed forgets a unit's failed state (`systemctl
	// reset-failed UNIT`); a unit that is not failed is no error.
	ResetFailed(ctx context.Context, unit string) error
	Close()
}

// Dial connects to the system manager over the system bus.
func Dial(ctx context.Context) (Manager, error) { return DialBus(ctx) }

// Bus is the real service manager: Manager, and what the daemon and
// recovery do beyond it (a unit's whole status, a start job's result as
// systemd names it, an unmask, the host's reboot). It is the project's
// one D-Bus adapter to systemd.
type Bus struct{ dbusManager }

// DialBus connects to the system manager over the system bus.
func DialBus(ctx context.Context) (*Bus, error) {
	conn, err := sdbus.NewWithContext(ctx)
	if err != nil {
		return nil, fmt.Errorf("connect to systemd over D-Bus: %w", err)
	}
	return &Bus{dbusManager{conn: conn}}, nil
}

// UnitStatus reads the unit's state (ReadStatus).
func (b *Bus) UnitStatus(ctx context.Context, unit string) (Status, error) {
	return ReadStatus(ctx, b.conn, unit)
}

// StartJob queues a start job (mode "replace") and waits for it; it
// returns systemd's job result ("done", "failed", "dependency", ...),
// which the caller judges.
func (b *Bus) StartJob(ctx context.Context, unit string) (string, error) {
	// go-systemd delivers the JobRemoved result on ch; systemd sends that
	// signal to the client that queued the job, so no Subscribe is needed.
	ch := make(chan string, 1)
	if _, err := b.conn.StartUnitContext(ctx, unit, "replace", ch); err != nil {
		return "", fmt.Errorf("start %s: %w", unit, err)
	}
	select {
	case res := <-ch:
		return res, nil
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// Unmask removes a mask of unit (a link to /dev/null in
// /etc/systemd/system or /run/systemd/system), as `systemctl unmask`
// does, without a reload.
func (b *Bus) Unmask(ctx context.Context, unit string) error {
	// Both the persistent mask (/etc) and a runtime one (/run).
	for _, runtime := range []bool{false, true} {
		if _, err := b.conn.UnmaskUnitFilesContext(ctx, []string{unit}, runtime); err != nil {
			return fmt.Errorf("unmask %s: %w", unit, err)
		}
	}
	return nil
}

// Reboot asks for the host's reboot as an operator's `systemctl reboot`
// does, through systemd-logind: a transient unit (unitnames.HostReboot)
// runs that command with the service manager's privileges, which this
// caller (the daemon, without capabilities) lacks for logind's Reboot
// (CAP_SYS_BOOT). logind first tells the holders of delay locks, the
// kubelet's graceful node shutdown in mode none among them (in modes
// nspawn and container the machine's stop asks the machine's own logind),
// waits for them at most its InhibitDelayMaxSec, then queues
// reboot.target (replace-irreversibly). Without logind, systemctl queues
// reboot.target itself. A reboot already asked (the unit still there) is
// not asked twice. It returns once the unit's start is queued.
func (b *Bus) Reboot(ctx context.Context) error {
	if _, err := b.conn.StartTransientUnitContext(ctx, unitnames.HostReboot, "replace", RebootProperties(), nil); err != nil {
		var de dbus.Error
		if errors.As(err, &de) && de.Name == "org.freedesktop.systemd1.UnitExists" {
			return nil
		}
		return fmt.Errorf("start %s (systemctl reboot): %w", unitnames.HostReboot, err)
	}
	return nil
}

// RebootProperties are the properties of the transient unit Reboot
// starts: a oneshot running `systemctl --no-ask-password reboot`, in the
// sandbox that job allows (ARCHITECTURE section 6, Sandboxing). systemctl
// needs only the system bus and PID 1's private socket, both path sockets
// under /run, which a read-only file system and a private network
// namespace leave reachable (connecting to a socket is no write of its
// file system, and only abstract sockets belong to a network namespace).
// Its capabilities are left whole on purpose: logind grants Reboot to a
// caller holding CAP_SYS_BOOT without asking polkit, and without logind
// PID 1 is asked as root. NoNewPrivileges= is left out too: on an SELinux
// host the exec of systemctl is a domain transition (to
// systemd_systemctl_t), which a policy without nnp_transition for it
// refuses under NoNewPrivileges=, and the reboot would never be asked.
func RebootProperties() []sdbus.Property {
	return []sdbus.Property{
		sdbus.PropDescription("unbounded-agent: the host's reboot (a Reboot MachineOperation), through systemd-logind"),
		{Name: "Documentation", Value: dbus.MakeVariant([]string{
			"https://unbounded-cloud.io/docs/agent/units/" + unitnames.HostReboot, "man:systemctl(1)"})},
		sdbus.PropType("oneshot"),
		sdbus.PropExecStart([]string{"/usr/bin/systemctl", "--no-ask-password", "reboot"}, true),
		// No network: the bus and PID 1 are reached through path sockets.
		{Name: "PrivateNetwork", Value: dbus.MakeVariant(true)},
		// Nothing to write: the whole tree read-only, /dev, /proc and
		// /sys as systemd's API file systems; no home, a /tmp of its own.
		{Name: "ProtectSystem", Value: dbus.MakeVariant("strict")},
		{Name: "ProtectHome", Value: dbus.MakeVariant("yes")},
		{Name: "PrivateTmp", Value: dbus.MakeVariant(true)},
	}
}

// Borrow drives the service manager behind an open connection (another
// machine's bus, say) that its owner closes: Close does nothing.
func Borrow(conn *sdbus.Conn) Manager { return dbusManager{conn: conn, borrowed: true} }

type dbusManager struct {
	conn     *sdbus.Conn
	borrowed bool
}

func (m dbusManager) Close() {
	if !m.borrowed {
		m.conn.Close()
	}
}

func (m dbusManager) Reload(ctx context.Context) error {
	if err := m.conn.ReloadContext(ctx); err != nil {
		return fmt.Errorf("daemon-reload: %w", err)
	}
	return nil
}

type jobFunc func(ctx context.Context, name, mode string, ch chan<- string) (int, error)

// job queues one job and waits for systemd's JobRemoved result, which
// go-systemd delivers on ch to the client that queued it.
func (m dbusManager) job(ctx context.Context, verb string, f jobFunc, unit string) error {
	ch := make(chan string, 1)
	if _, err := f(ctx, unit, "replace", ch); err != nil {
		return fmt.Errorf("%s %s: %w", verb, unit, err)
	}
	select {
	case res := <-ch:
		switch res {
		case "done":
			return nil
		case "dependency":
			return fmt.Errorf("%s %s: job dependency: a unit it requires did not start (see systemctl list-dependencies %s and journalctl -u %s)", verb, unit, unit, unit)
		}
		return fmt.Errorf("%s %s: job %s (see journalctl -u %s)", verb, unit, res, unit)
	case <-ctx.Done():
		return fmt.Errorf("%s %s: %w", verb, unit, ctx.Err())
	}
}

func (m dbusManager) StartUnit(ctx context.Context, unit string) error {
	return m.job(ctx, "start", m.conn.StartUnitContext, unit)
}

func (m dbusManager) RestartUnit(ctx context.Context, unit string) error {
	return m.job(ctx, "restart", m.conn.RestartUnitContext, unit)
}

func (m dbusManager) StopUnit(ctx context.Context, unit string) error {
	return m.job(ctx, "stop", m.conn.StopUnitContext, unit)
}

func (m dbusManager) EnqueueStart(ctx context.Context, unit string) error {
	// A nil channel: go-systemd does not wait for the job.
	if _, err := m.conn.StartUnitContext(ctx, unit, "replace", nil); err != nil {
		return fmt.Errorf("start %s: %w", unit, err)
	}
	return nil
}

func (m dbusManager) ActiveState(ctx context.Context, unit string) (string, error) {
	p, err := m.conn.GetUnitPropertyContext(ctx, unit, "ActiveState")
	if err != nil {
		return "", fmt.Errorf("read state of %s: %w", unit, err)
	}
	v, _ := p.Value.Value().(string)
	return v, nil
}

func (m dbusManager) ExecMainStatus(ctx context.Context, unit string) (int, error) {
	p, err := m.conn.GetServicePropertyContext(ctx, unit, "ExecMainStatus")
	if err != nil {
		return 0, fmt.Errorf("read exit status of %s: %w", unit, err)
	}
	v, ok := p.Value.Value().(int32)
	if !ok {
		return 0, fmt.Errorf("read exit status of %s: unexpected %s", unit, p.Value.Signature())
	}
	return int(v), nil
}

// MainPID is the service's main process (MainPID), 0 when it has none.
// Not part of Manager: only the upgrade asks it (which process runs which
// executable), and it asserts the method on what Dial returns.
func (m dbusManager) MainPID(ctx context.Context, unit string) (uint32, error) {
	p, err := m.conn.GetServicePropertyContext(ctx, unit, "MainPID")
	if err != nil {
		return 0, fmt.Errorf("read main process of %s: %w", unit, err)
	}
	v, ok := p.Value.Value().(uint32)
	if !ok {
		return 0, fmt.Errorf("read main process of %s: unexpected %s", unit, p.Value.Signature())
	}
	return v, nil
}

func (m dbusManager) MainStartedAt(ctx context.Context, unit string) (time.Time, error) {
	p, err := m.conn.GetServicePropertyContext(ctx, unit, "ExecMainStartTimestamp")
	if err != nil {
		return time.Time{}, fmt.Errorf("read start time of %s: %w", unit, err)
	}
	v, ok := p.Value.Value().(uint64)
	if !ok {
		return time.Time{}, fmt.Errorf("read start time of %s: unexpected %s", unit, p.Value.Signature())
	}
	if v == 0 {
		return time.Time{}, nil
	}
	return time.UnixMicro(int64(v)), nil
}

func (m dbusManager) ResetFailed(ctx context.Context, unit string) error {
	err := m.conn.ResetFailedUnitContext(ctx, unit)
	var de dbus.Error
	if errors.As(err, &de) && (de.Name == "org.freedesktop.systemd1.NoSuchUnit" || de.Name == "org.freedesktop.systemd1.UnitNotFailed") {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reset-failed %s: %w", unit, err)
	}
	return nil
}
