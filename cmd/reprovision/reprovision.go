// Package reprovision is the unbounded-reprovision program, run by
// unbounded-reprovision.service from the handoff directory's own copy of
// the executable (/var/lib/unbounded-agent-reprovision/unbounded-agent
// reprovision): it continues the reprovision handoff an isolation change
// staged, from its journal: the host reset with the handoff kept, then
// bootstrapped in the target mode. The logic is in lib/reprovision; this
// wires the real reset and bootstrap and maps the outcome to the exit
// code: 0 the handoff ended (Succeeded, or given up at its deadline:
// Failed, in its journal) or there is none, 75 this attempt failed (the
// unit's Restart= and the handoff's own growing delay bring the next),
// 1 the handoff itself could not be read or written.
package reprovision

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"time"

	"unbounded-cloud.io/agent/lib/bootstrap"
	"unbounded-cloud.io/agent/lib/concern"
	"unbounded-cloud.io/agent/lib/config"
	"unbounded-cloud.io/agent/lib/exitcode"
	"unbounded-cloud.io/agent/lib/logging"
	"unbounded-cloud.io/agent/lib/reprovision"
	"unbounded-cloud.io/agent/lib/reset"
	"unbounded-cloud.io/agent/lib/steps"
)

type cli struct {
	concern.Root
	FirstDelay   time.Duration `help:"The delay after the first failed attempt; it doubles after each, up to --max-delay (systemd's RestartSec= comes on top)." default:"30s"`
	MaxDelay     time.Duration `help:"The longest delay between two attempts." default:"10m"`
	ReadyTimeout time.Duration `help:"How long the bootstrap of the target mode waits for the Node to be Ready before the attempt fails." default:"10m"`
}

// Main runs reprovision with args (without the program name) and returns
// the exit code.
func Main(args []string) int {
	return concern.Main(args, run)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var c cli
	paths, code, done := concern.Start("reprovision", "Continue the reprovision handoff of an isolation change (/var/lib/unbounded-agent-reprovision): reset the host keeping the handoff, then bootstrap the target mode; a failed attempt is tried again after a growing delay, and the handoff gives up at its deadline. Exit 0: ended (Succeeded or given up, said in its journal) or no handoff; 75: this attempt failed; 1: the handoff could not be read or written.", &c, args, stdout, stderr)
	if done {
		return code
	}
	log := logging.New(stderr, slog.LevelInfo)
	host := steps.Host{Paths: paths, Log: log}
	r := &reprovision.Reprovision{
		Host: host,
		Reset: func(ctx context.Context) error {
			return (&reset.Reset{Host: host, KeepHandoff: true}).Run(ctx)
		},
		Bootstrap: func(ctx context.Context, cfg *config.Config) error {
			b := &bootstrap.Bootstrap{Host: host, Config: func() (*config.Config, error) { return cfg, nil },
				ReadyTimeout: c.ReadyTimeout, Backoff: -1}
			return b.Run(ctx)
		},
		HandOver:   (&bootstrap.Bootstrap{Host: host}).HandOver,
		FirstDelay: c.FirstDelay, MaxDelay: c.MaxDelay,
	}
	err := r.Run(ctx)
	if errors.Is(err, reprovision.ErrNoHandoff) {
		log.Info("reprovision: " + err.Error())
		return exitcode.OK
	}
	code = exitcode.For(err)
	if code != exitcode.OK {
		log.Error("reprovision: "+err.Error(), "exit", code)
	}
	return code
}
