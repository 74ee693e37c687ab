// Package daemon is unbounded-daemon, the agent's only long-running
// process, started by unbounded-daemon.service (Type=notify). The logic is
// in lib/daemon; this is flags, one call, and the exit code: 69 (deferred,
// printed as nothing) while an installation owns the host, 78 for an
// invalid configuration, 1 for anything else that stops it.
package daemon

import (
	"context"
	"errors"
	"io"
	"os"

	"unbounded-cloud.io/agent/lib/concern"

	"unbounded-cloud.io/agent/lib/config"
	"unbounded-cloud.io/agent/lib/daemon"
	"unbounded-cloud.io/agent/lib/exitcode"
	"unbounded-cloud.io/agent/lib/logging"
	"unbounded-cloud.io/agent/lib/state"
)

type cli struct {
	concern.Root
	LogLevel string `help:"Log level: debug, info, warn or error (default: [daemon] log-level of the config, else info)." enum:",debug,info,warn,error" default:""`
}

// Main runs the daemon with args (without the program name) until SIGTERM
// and returns the exit code.
func Main(args []string) int {
	ctx, stop := concern.Context()
	defer stop()
	return run(ctx, args, os.Stdout, os.Stderr, daemon.Host{})
}

// run is Main with its outputs and host seam as arguments, for tests.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, host daemon.Host) int {
	var c cli
	// Run by hand without root, the host root reads as "permission
	// denied", which the daemon would take for a host owned by an
	// unknown installation (69, silent): say it needs root (exit 4).
	paths, code, done := concern.Start("daemon", "Watch this host's Machine, Node and MachineOperations and carry the operations out by starting units. Exit 69: an installation owns the host (not a failure).", &c, args, stdout, stderr)
	if done {
		return code
	}
	lvl, metricsAddress := c.LogLevel, ""
	// An invalid config is reported by daemon.Run (exit 78); here it
	// only leaves the level at info and the metrics unserved.
	if cfg, err := config.Load(paths); err == nil {
		if lvl == "" {
			lvl = cfg.Daemon.LogLevel
		}
		metricsAddress = cfg.Daemon.MetricsAddress
	}
	log := logging.New(stderr, concern.Level(lvl))

	err := daemon.Run(ctx, daemon.Options{Paths: paths, Host: host, Log: log, MetricsAddress: metricsAddress})
	if err != nil && !errors.Is(err, state.ErrOwned) {
		// Deferred is not an error: systemd counts 69 as success, and
		// the journal should not say otherwise.
		log.Error("daemon stopped", "error", err.Error())
	}
	return exitcode.For(err)
}
