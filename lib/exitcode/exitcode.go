// Package exitcode holds the exit codes every one-shot and the operator CLI
// use (ARCHITECTURE section 6), and the one mapping from an error to a code.
//
// The codes are a contract with the units: SuccessExitStatus=,
// RestartPreventExitStatus= and Restart=on-failure decide what systemd does
// with a run from its exit code alone, so a command never invents its own.
package exitcode

import (
	"errors"

	"unbounded-cloud.io/agent/lib/state"
)

const (
	// OK: done. The unit is active (or inactive, for a oneshot) and nothing
	// follows.
	OK = 0
	// NeedsRoot: run without root, the command cannot read what only root
	// may (the host root /var/lib/unbounded, the bootstrap token). It is
	// the "insufficient privilege" code of LSB init actions and systemd
	// (EXIT_NOPERMISSION); sysexits' EX_NOPERM is 77, which is the fence's
	// refusal here. Units run as root and never see it.
	NeedsRoot = 4
	// Failed: the run failed. Every agent unit carries
	// OnFailure=unbounded-recover@%n.service, so recovery starts.
	Failed = 1
	// Deferred: an installation (bootstrap, reprovision, reset) owns the
	// host. Not a failure: units list 69 in SuccessExitStatus= and
	// RestartPreventExitStatus=, so systemd neither restarts nor recovers;
	// the installation starts what it needs when it is done.
	Deferred = 69
	// TempFail: a temporary failure (cluster unreachable, download
	// interrupted). Units that retry have Restart=on-failure; the run is
	// repeated, never "recovered".
	TempFail = 75
	// Refused: the allocation fence refused the launch, final. Listed in
	// RestartPreventExitStatus=: the node stays down until the cluster
	// side changes its mind and the node unit is started again.
	Refused = 77
	// ConfigInvalid: the configuration is invalid; the message names the
	// file, line and key. No restart: a rerun would read the same file.
	ConfigInvalid = 78
)

var (
	// ErrTemporary marks an error as temporary (exit 75): wrap it,
	// fmt.Errorf("list machines: %w: %w", exitcode.ErrTemporary, err).
	ErrTemporary = errors.New("temporary failure")
	// ErrRefused marks a final refusal by the allocation fence (exit 77).
	ErrRefused = errors.New("refused by the allocation fence")
	// ErrNeedsRoot marks an error that only running as root avoids (exit
	// 4); lib/privilege makes them.
	ErrNeedsRoot = errors.New("needs root")
	// ErrConfigInvalid marks an invalid configuration (exit 78).
	// lib/config's *Error and Errors match it with errors.Is, so that this
	// package does not link the config parser into every binary.
	ErrConfigInvalid = errors.New("configuration invalid")
)

// For returns the exit code for the outcome err of a run. The order
// matters: "needs root" comes first because a run that could not read its
// state decided nothing; ownership next because a deferred run must stay
// silent and successful whatever else went wrong on the way; a refusal is
// final and wins over "temporary".
func For(err error) int {
	switch {
	case err == nil:
		return OK
	case errors.Is(err, ErrNeedsRoot):
		return NeedsRoot
	case errors.Is(err, state.ErrOwned):
		return Deferred
	case errors.Is(err, ErrConfigInvalid):
		return ConfigInvalid
	case errors.Is(err, ErrRefused):
		return Refused
	case errors.Is(err, ErrTemporary):
		return TempFail
	default:
		return Failed
	}
}
