// Package bootstrap is the unbounded-bootstrap one-shot: the first boot of
// a host, run by unbounded-bootstrap.service. The logic is in
// lib/bootstrap; this is flags, one call, and the exit code: 0 bootstrapped
// (or handed over), 1 failed, 69 another installation owns the host, 75
// temporary (the unit retries), 77 refused by the allocation fence, 78
// configuration invalid.
package bootstrap

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

	"unbounded-cloud.io/agent/lib/concern"
	"unbounded-cloud.io/agent/lib/steps"

	"unbounded-cloud.io/agent/lib/bootstrap"
	"unbounded-cloud.io/agent/lib/exitcode"
	"unbounded-cloud.io/agent/lib/logging"
)

type cli struct {
	concern.Root
	ReadyTimeout time.Duration `help:"How long to wait for the Node to be Ready once the node stack is started." default:"10m"`
}

// Main runs bootstrap with args (without the program name) and returns the
// exit code.
func Main(args []string) int {
	return concern.Main(args, run)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var c cli
	paths, code, done := concern.Start("bootstrap", "First boot: prepare the host, fetch the node stack, build slot kube1, run the fence, start the node, wait until its Node is Ready, record the applied config, then start unbounded-node.target and the daemon. A host bootstrapped already is only handed over. Exit 0: done; 1: failed; 69: another installation owns the host; 75: temporary (retried); 77: refused by the allocation fence; 78: configuration invalid.\n\n"+steps.Help("phase", bootstrap.PhaseDocs), &c, args, stdout, stderr)
	if done {
		return code
	}
	log := logging.New(stderr, slog.LevelInfo)
	b := &bootstrap.Bootstrap{Host: steps.Host{Paths: paths, Log: log}, ReadyTimeout: c.ReadyTimeout}
	err := b.Run(ctx)
	code = exitcode.For(err)
	switch code {
	case exitcode.OK, exitcode.Deferred:
		// Deferred is not a failure and says nothing (ARCHITECTURE
		// section 6).
	case exitcode.ConfigInvalid:
		// The config's errors name the file, line and key.
		fmt.Fprintln(stderr, "bootstrap: configuration invalid; nothing was changed on the host:", err)
	default:
		log.Error("bootstrap: "+err.Error(), "exit", code)
	}
	return code
}
