// Package recover is the unbounded-recover one-shot, run by
// unbounded-recover@.service: `recover UNIT`, where UNIT is the failed
// unit (the template's instance, from OnFailure=unbounded-recover@%n.service)
// or "generator" (the generator's safe state). The logic is in
// lib/recovery; this is flags, one call, and the exit code: 0 nothing to
// recover, recovered, or held back by the rate limit; 1 something could
// not be repaired (reported); 69 an installation owns the host (reported,
// nothing touched).
package recover

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"

	"unbounded-cloud.io/agent/lib/concern"
	"unbounded-cloud.io/agent/lib/exitcode"
	"unbounded-cloud.io/agent/lib/logging"
	"unbounded-cloud.io/agent/lib/recovery"
)

type cli struct {
	concern.Root
	Unit string `arg:"" help:"The failed unit (unbounded-recover@UNIT.service's instance), or \"generator\"."`
}

// Main runs recovery with args (without the program name) and returns the
// exit code.
func Main(args []string) int {
	ctx, stop := concern.Context()
	defer stop()
	return run(ctx, args, os.Stdout, os.Stderr, os.Getenv)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	var c cli
	paths, code, done := concern.Start("recover", "Recover from the failure of an agent unit: report it on the Machine (condition Recovered and an Event with the unit's result and last journal lines) and repair the daemon from the current applied config (with two applied configs and exactly one slot's node running, the other record is moved aside to /var/lib/unbounded/recover/stale). Exits 77, 78, 69 and a 75 the unit retries are not failures and are left alone. At most 3 recoveries per unit per hour. Exit 0: done, nothing to do, or held back; 1: something could not be repaired; 69: an installation owns the host.", &c, args, stdout, stderr)
	if done {
		return code
	}
	log := logging.New(stderr, slog.LevelInfo)
	r := &recovery.Recovery{Paths: paths, Failure: recovery.FailureFromEnv(c.Unit, getenv), Log: log}
	err := r.Run(ctx)
	code = exitcode.For(err)
	if code != exitcode.OK && code != exitcode.Deferred && !isUnrepaired(err) {
		log.Error("recover: "+err.Error(), "exit", code)
	}
	return code
}

// isUnrepaired: Run has said what it could not repair already.
func isUnrepaired(err error) bool { return errors.Is(err, recovery.ErrUnrepaired) }
