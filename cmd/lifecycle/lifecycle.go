// Package lifecycle is the unbounded-lifecycle one-shot, run by
// unbounded-lifecycle.service before the daemon: it resumes an
// interrupted installation or repave and makes the running node's hooks
// current. The logic is in lib/lifecycle; this is flags, one call, and the
// exit code: 0 done, 1 failed.
package lifecycle

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"unbounded-cloud.io/agent/lib/bootstrap"
	"unbounded-cloud.io/agent/lib/concern"
	"unbounded-cloud.io/agent/lib/exitcode"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/lifecycle"
	"unbounded-cloud.io/agent/lib/logging"
	"unbounded-cloud.io/agent/lib/privilege"
)

type cli struct {
	Root string `help:"Resolve every host path under this directory (tests, offline roots)." default:"/" type:"path"`
}

// Main runs lifecycle with args (without the program name) and returns the
// exit code.
func Main(args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	return run(ctx, args, os.Stdout, os.Stderr)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var c cli
	if code, done := concern.Parse("lifecycle", "Before the daemon: resume an installation or a repave that was interrupted (its unit is queued), and make the running node's lifecycle hooks current without restarting it. Exit 0: done; 1: failed.", &c, args, stdout, stderr); done {
		return code
	}
	paths := hostpaths.New(c.Root)
	if err := privilege.Check(paths.HostRoot()); err != nil {
		fmt.Fprintln(stderr, "lifecycle:", err)
		return exitcode.For(err)
	}
	log := logging.New(stderr, slog.LevelInfo)
	l := &lifecycle.Lifecycle{Paths: paths, Mode: bootstrap.ModeFor(paths, log), Log: log}
	err := l.Run(ctx)
	code := exitcode.For(err)
	if code != exitcode.OK {
		log.Error("lifecycle: "+err.Error(), "exit", code)
	}
	return code
}
