// Package lifecycle is the unbounded-lifecycle one-shot, run by
// unbounded-lifecycle.service before the daemon: it adopts a host the
// older agent installed, resumes an interrupted installation or repave
// and makes the running node's hooks current. The logic is in lib/lifecycle; this is flags, one call, and the
// exit code: 0 done, 1 failed.
package lifecycle

import (
	"context"
	"io"
	"log/slog"

	"unbounded-cloud.io/agent/lib/concern"
	"unbounded-cloud.io/agent/lib/exitcode"
	"unbounded-cloud.io/agent/lib/lifecycle"
	"unbounded-cloud.io/agent/lib/logging"
	"unbounded-cloud.io/agent/lib/modes/all"
	"unbounded-cloud.io/agent/lib/steps"
)

type cli struct {
	concern.Root
}

// Main runs lifecycle with args (without the program name) and returns the
// exit code.
func Main(args []string) int {
	return concern.Main(args, run)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var c cli
	paths, code, done := concern.Start("lifecycle", "Before the daemon: adopt the older agent's node (its state moved into /var/lib/unbounded, its units removed, the node kept running), resume an installation or a repave that was interrupted (its unit is queued), and make the running node's lifecycle hooks current without restarting it. Exit 0: done; 1: failed; 78: the older agent's record cannot be adopted (file and key named, nothing changed).", &c, args, stdout, stderr)
	if done {
		return code
	}
	log := logging.New(stderr, slog.LevelInfo)
	l := &lifecycle.Lifecycle{Host: steps.Host{Paths: paths, Log: log}, Mode: all.Func(paths, log)}
	err := l.Run(ctx)
	code = exitcode.For(err)
	if code != exitcode.OK {
		log.Error("lifecycle: "+err.Error(), "exit", code)
	}
	return code
}
