// Package reset is the unbounded-reset one-shot, run by
// unbounded-reset.service and by `unbounded reset`: it removes the node and
// the agent's state from the host (lib/reset). Exit 0 done, 1 failed, 69
// another installation owns the host.
package reset

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"unbounded-cloud.io/agent/lib/concern"
	"unbounded-cloud.io/agent/lib/steps"

	"unbounded-cloud.io/agent/lib/exitcode"
	"unbounded-cloud.io/agent/lib/logging"
	"unbounded-cloud.io/agent/lib/reset"
)

type cli struct {
	concern.Root
	KeepHandoff bool `name:"keep-handoff" help:"Keep the reprovision handoff directory /var/lib/unbounded-agent-reprovision."`
}

// Main runs reset with args (without the program name) and returns the
// exit code.
func Main(args []string) int {
	return concern.Main(args, run)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var c cli
	paths, code, done := concern.Start("reset", "Remove the node (both slots), the host preparation, the artifacts and every file under /var/lib/unbounded; /etc/unbounded stays. Exit 0: done; 1: failed; 69: another installation owns the host.\n\n"+steps.Help("step", reset.StepDocs), &c, args, stdout, stderr)
	if done {
		return code
	}
	log := logging.New(stderr, slog.LevelInfo)
	r := &reset.Reset{Host: steps.Host{Paths: paths, Log: log}, KeepHandoff: c.KeepHandoff}
	err := r.Run(ctx)
	code = exitcode.For(err)
	if code != exitcode.OK && code != exitcode.Deferred {
		log.Error("reset: "+err.Error(), "exit", code)
	}
	if code == exitcode.Deferred {
		fmt.Fprintln(stderr, "reset: another installation owns the host:", err)
	}
	return code
}
