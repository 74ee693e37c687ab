// Package isolation is the unbounded-isolation one-shot, run by
// unbounded-isolation.service: it changes the node's isolation mode to
// the desired one (the daemon's request, carrying the Machine's
// spec.isolation.mode, else /etc/unbounded/agent.toml's mode), in place:
// the new mode's node built into the other slot beside the running one,
// the Node drained, the old node stopped, the new one started behind the
// fence, waited healthy and recorded, the old mode's files and record
// removed; rolled back to the old mode when the new node does not come
// up. An interrupted change is resumed from its journal. It is
// lib/isolation, which carries the change out on lib/repave's steps: one
// step runner, one journal format, the same drain, fence and readiness
// wait as a repave.
//
// Exit codes: 0 changed (or the desired mode runs already), 1 failed
// (the message says whether it rolled back; a bootstrap token the API
// server refuses fails before the host is touched), 69 an installation
// owns the host, 75 the cluster could not be asked (nothing was changed),
// 77 refused by the allocation fence, 78 configuration invalid.
package isolation

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"unbounded-cloud.io/agent/lib/concern"
	"unbounded-cloud.io/agent/lib/exitcode"
	"unbounded-cloud.io/agent/lib/isolation"
	"unbounded-cloud.io/agent/lib/logging"
	"unbounded-cloud.io/agent/lib/repave"
	"unbounded-cloud.io/agent/lib/steps"
)

type cli struct {
	concern.Root
	DrainTimeout    time.Duration `help:"How long the drain (evictions, PodDisruptionBudgets, grace periods) may take; the request's drainTimeout parameter wins." default:"5m"`
	Force           bool          `help:"Go on when the drain times out or the cluster cannot be asked (not past pods without a controller: --delete-unmanaged)."`
	DeleteUnmanaged bool          `help:"Let the drain evict the pods without a controller (nothing creates them again: they are lost)."`
	ReadyTimeout    time.Duration `help:"How long to wait for the node in the new mode to be Ready before rolling back to the old mode." default:"10m"`
	Method          string        `help:"The method: InPlace or Reprovision (reset, then bootstrap in the new mode, from a handoff that survives the reset); empty: the one the modes allow (the request's method parameter wins)." enum:",InPlace,Reprovision" default:""`
	GiveUpAfter     time.Duration `help:"How long after the handoff began a reprovision gives up and reports Failed." default:"90m"`
}

// Main runs isolation with args (without the program name) and returns
// the exit code.
func Main(args []string) int {
	return concern.Main(args, run)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var c cli
	paths, code, done := concern.Start("isolation", "Change the node's isolation mode to the desired one (the daemon's request, else /etc/unbounded/agent.toml), in place: build the new mode's node in the other slot while the node serves, check the bootstrap token, cordon and drain the Node, stop the old node, start the new one behind the allocation fence, wait until the Node is Ready, record it, remove the old mode; roll back to the old mode when the new node does not come up. An interrupted change is resumed. Exit 0: changed or nothing to do; 1: failed (the message says whether it rolled back); 69: an installation owns the host; 75: the cluster could not be asked, nothing changed; 77: refused by the allocation fence; 78: configuration invalid.\n\n"+steps.Help("step", isolation.StepDocs), &c, args, stdout, stderr)
	if done {
		return code
	}
	log := logging.New(stderr, slog.LevelInfo)
	r := &isolation.Change{Repave: repave.Repave{Host: steps.Host{Paths: paths, Log: log}, Force: c.Force, DrainTimeout: c.DrainTimeout,
		DeleteUnmanaged: c.DeleteUnmanaged, ReadyTimeout: c.ReadyTimeout}, Method: c.Method, GiveUpAfter: c.GiveUpAfter}
	err := r.Run(ctx)
	switch {
	case errors.Is(err, repave.ErrNothingToDo):
		log.Info("isolation: the desired isolation mode is the running one: nothing to change")
		return exitcode.OK
	case errors.Is(err, isolation.ErrHandedOff):
		log.Info("isolation: handed off to unbounded-reprovision.service, which resets the host and bootstraps the new mode; the change is in progress")
		return exitcode.OK
	}
	code = exitcode.For(err)
	switch code {
	case exitcode.OK, exitcode.Deferred:
	case exitcode.ConfigInvalid:
		fmt.Fprintln(stderr, "isolation: configuration invalid; the node was left as it is:", err)
	default:
		log.Error("isolation: "+err.Error(), "exit", code)
	}
	return code
}
