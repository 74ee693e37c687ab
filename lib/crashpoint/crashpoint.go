// Package crashpoint is how the multi-step operations (bootstrap, reset,
// and the steps of lib/hostprep they drive) are crashed on purpose in
// tests (ARCHITECTURE section 9, "Crashes"): with
// UNBOUNDED_CRASHPOINT=<operation>/<point> in its environment, a process
// that reaches that named point kills itself with SIGKILL, as a power cut
// or `kill -9` would: no deferred function runs, no lock is released
// except by the kernel, no file is closed cleanly. A shell (and
// exec.ExitError.ExitCode via its signal) sees 137.
//
// A unit is crashed the same way through a drop-in or `systemctl
// set-environment UNBOUNDED_CRASHPOINT=bootstrap/after-slot`; systemd then
// reports the run as killed by SIGKILL (status=9/KILL), a failure, never
// as the temporary exit 75 that the units retry.
package crashpoint

import (
	"fmt"
	"log/slog"
	"os"
	"syscall"
	"time"
)

// Env is the variable that names the point to crash at.
const Env = "UNBOUNDED_CRASHPOINT"

// ExitCode is what a shell reports for a process killed by SIGKILL.
const ExitCode = 128 + int(syscall.SIGKILL)

// Hit crashes the process when name is the point Env names, and returns
// otherwise. The line on stderr says which point was hit, so that a test
// (or the journal) can tell a crash on purpose from a real one.
func Hit(name string) {
	if os.Getenv(Env) != name || name == "" {
		return
	}
	msg := fmt.Sprintf("crash point %s reached (%s): killing myself with SIGKILL", name, Env)
	// Through the process's logger too: in a unit that is the journal's
	// native socket (lib/logging), a datagram journald has queued before
	// the kill, with the unit's name in it. The stderr line travels on
	// a stream journald reads on its own time, after the process is
	// gone: clean-clone runs found it late, or never under the unit's
	// identifier.
	slog.Default().Error(msg, "crash_point", name)
	fmt.Fprintln(os.Stderr, msg)
	syscall.Kill(os.Getpid(), syscall.SIGKILL)
	// The signal is asynchronous; never go on past a crash point, even
	// if it were somehow not delivered.
	time.Sleep(time.Second)
	os.Exit(ExitCode)
}

// Via is the crash point name of an operation whose tests may replace Hit
// with hook: hook(name) when hook is set, else Hit(name).
func Via(hook func(name string), name string) {
	if hook != nil {
		hook(name)
		return
	}
	Hit(name)
}
