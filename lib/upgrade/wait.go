package upgrade

import (
	"context"
	"fmt"
	"os"
	"syscall"
	"time"

	"unbounded-cloud.io/agent/lib/unitnames"
)

// Manager is what the upgrade asks of the service manager.
type Manager interface {
	Reload(ctx context.Context) error
	// StartUnit starts the daemon when the upgrade hands a host a cut
	// run of it owned back (a no-op on a running unit).
	StartUnit(ctx context.Context, unit string) error
	RestartUnit(ctx context.Context, unit string) error
	ActiveState(ctx context.Context, unit string) (string, error)
	// MainPID is the unit's main process, 0 when it has none.
	MainPID(ctx context.Context, unit string) (uint32, error)
	Close()
}

// Wait says when a restarted daemon is up: active, its main process
// running the installed executable (not the one it replaced: dpkg
// renames the new file over the old, so the inode tells them apart), and
// the same process for Settle; at most Timeout after the restart.
type Wait struct {
	Timeout, Settle, Poll time.Duration
	// ExeOf returns the executable of a process; nil reads
	// /proc/<pid>/exe.
	ExeOf func(pid uint32) (os.FileInfo, error)
}

func (w Wait) exeOf(pid uint32) (os.FileInfo, error) {
	if w.ExeOf != nil {
		return w.ExeOf(pid)
	}
	return os.Stat(fmt.Sprintf("/proc/%d/exe", pid))
}

func orDefault(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

// restart restarts unbounded-daemon.service and waits until it runs exe;
// afterRestart is called once the restart job has returned, before the
// wait. It returns how long the daemon was down: from the restart until
// the new process was seen active.
func (w Wait) restart(ctx context.Context, sd Manager, exe string, afterRestart func()) (down time.Duration, err error) {
	timeout, settle, poll := orDefault(w.Timeout, 60*time.Second), orDefault(w.Settle, 5*time.Second), orDefault(w.Poll, 250*time.Millisecond)
	want, err := os.Stat(exe)
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	// The restart job ends when the daemon said READY=1 or failed; the
	// judgement is the state after it, so its error is only the last
	// word when nothing better is known.
	restarted := time.Now()
	jobErr := sd.RestartUnit(ctx, unitnames.Daemon)
	if afterRestart != nil {
		afterRestart()
	}
	var pid uint32
	var since time.Time
	last := "not started"
	for {
		st, err := sd.ActiveState(ctx, unitnames.Daemon)
		if err == nil {
			p, perr := sd.MainPID(ctx, unitnames.Daemon)
			switch {
			case perr != nil:
				err = perr
			case st != "active" || p == 0:
				last, pid = fmt.Sprintf("%s is %s", unitnames.Daemon, st), 0
			default:
				fi, xerr := w.exeOf(p)
				switch {
				case xerr != nil:
					last, pid = fmt.Sprintf("main process %d: %v", p, xerr), 0
				case !sameFile(fi, want):
					last, pid = fmt.Sprintf("main process %d runs another executable than %s", p, exe), 0
				case p != pid:
					pid, since = p, time.Now()
					if down == 0 {
						down = since.Sub(restarted)
					}
				case time.Since(since) >= settle:
					return down, nil
				}
			}
		}
		if err != nil {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			if jobErr != nil {
				last += "; the restart: " + jobErr.Error()
			}
			return 0, fmt.Errorf("%s did not run %s for %v within %v: %s", unitnames.Daemon, exe, settle, timeout, last)
		case <-time.After(poll):
		}
	}
}

func sameFile(a, b os.FileInfo) bool {
	sa, ok1 := a.Sys().(*syscall.Stat_t)
	sb, ok2 := b.Sys().(*syscall.Stat_t)
	if ok1 && ok2 {
		return sa.Dev == sb.Dev && sa.Ino == sb.Ino
	}
	return os.SameFile(a, b)
}
