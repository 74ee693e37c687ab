// Package repave is the unbounded-repave one-shot, run by
// unbounded-repave.service: it replaces the node stack from the desired
// config (blue/green in mode nspawn, in place in mode none), or resumes an
// interrupted repave. The logic is in lib/repave; this is flags, one call,
// and the exit code: 0 repaved (or nothing to do), 1 failed (rolled back,
// or not: the message says which), 69 an installation owns the host, 75
// the cluster could not be asked (nothing was changed), 77 refused by the
// allocation fence, 78 configuration invalid.
package repave

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"unbounded-cloud.io/agent/lib/concern"
	"unbounded-cloud.io/agent/lib/exitcode"
	"unbounded-cloud.io/agent/lib/logging"
	"unbounded-cloud.io/agent/lib/repave"
	"unbounded-cloud.io/agent/lib/steps"
)

type cli struct {
	concern.Root
	Force           bool          `help:"Repave even when the desired config is the applied one, and go on when the drain times out or the cluster cannot be asked (not past pods without a controller: --delete-unmanaged)."`
	DrainTimeout    time.Duration `help:"How long the drain (evictions, PodDisruptionBudgets, grace periods) may take; the request's drainTimeout parameter wins." default:"5m"`
	DeleteUnmanaged bool          `help:"Let the drain evict the pods without a controller (nothing creates them again: they are lost); without it such pods refuse the drain and the repave fails with the node as it was. The request's deleteUnmanaged parameter does the same."`
	ReadyTimeout    time.Duration `help:"How long to wait for the new node to be Ready before rolling back." default:"10m"`
}

// Main runs repave with args (without the program name) and returns the
// exit code.
func Main(args []string) int {
	return concern.Main(args, run)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var c cli
	paths, code, done := concern.Start("repave", "Replace the node stack from the desired config (the daemon's request, else /etc/unbounded/agent.toml): build the other slot while the node serves, cordon and drain the Node, switch, wait until the new Node is Ready, record it; roll back when it does not come up. An interrupted repave is resumed. Exit 0: repaved or nothing to do; 1: failed (the message says whether it rolled back); 69: an installation owns the host; 75: the cluster could not be asked, nothing changed; 77: refused by the allocation fence; 78: configuration invalid.\n\n"+steps.Help("step", repave.StepDocs), &c, args, stdout, stderr)
	if done {
		return code
	}
	log := logging.New(stderr, slog.LevelInfo)
	r := &repave.Repave{Host: steps.Host{Paths: paths, Log: log}, Force: c.Force, DrainTimeout: c.DrainTimeout, DeleteUnmanaged: c.DeleteUnmanaged, ReadyTimeout: c.ReadyTimeout}
	err := r.Run(ctx)
	if errors.Is(err, repave.ErrNothingToDo) {
		log.Info("repave: " + err.Error())
		return exitcode.OK
	}
	code = exitcode.For(err)
	switch code {
	case exitcode.OK, exitcode.Deferred:
	case exitcode.ConfigInvalid:
		fmt.Fprintln(stderr, "repave: configuration invalid; the node was left as it is:", err)
	default:
		log.Error("repave: "+err.Error(), "exit", code)
	}
	return code
}
