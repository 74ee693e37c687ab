// Command health is unbounded-health, run by unbounded-health.service
// every 30 s (unbounded-health.timer): one check of the node stack, a
// restart after repeated failures, a retry of a fence that got no answer,
// and a give-up that fails the unit once (lib/health says when).
//
// Its own small binary, not a link to the multicall unbounded-agent: it
// links no Kubernetes client, and it stays under 5 MB (ARCHITECTURE
// section 3), which is also why it parses its flags with the standard
// library's flag package rather than kong (lib/concern), which alone adds
// about 1.5 MB. Exit 0: nothing to report (healthy, restarting, waiting,
// or given up earlier); 1: gave up now, or the node did not come up at
// boot (recovery reports it); 4: not run as root.
package main

import (
	"context"
	"log/slog"
	"os"

	"unbounded-cloud.io/agent/lib/concern/small"
	"unbounded-cloud.io/agent/lib/exitcode"
	"unbounded-cloud.io/agent/lib/health"
	"unbounded-cloud.io/agent/lib/units"
)

func main() { os.Exit(run(os.Args[1:])) }

func run(args []string) int {
	cmd := small.New("health", "One health check of the node stack (unbounded-health.service).")
	fs := cmd.Flags
	failures := fs.Int("failures", health.DefaultFailures, "consecutive unhealthy checks before a restart of the node stack")
	maxRestarts := fs.Int("max-restarts", health.DefaultMaxRestarts, "restarts without a healthy check in between before giving up")
	bootWait := fs.Duration("boot-wait", health.DefaultBootWait, "how long the first check of a boot waits for the node to become healthy")
	settle := fs.Duration("settle", health.DefaultSettle, "how long the first check of a boot needs the node healthy on every check")
	if code, done := cmd.Parse(args); done {
		return code
	}
	if *failures < 1 || *maxRestarts < 0 || *bootWait < 0 || *settle < 0 {
		return cmd.Usage("--failures must be at least 1, --max-restarts, --boot-wait and --settle not negative")
	}
	if *settle == 0 {
		*settle = -1 // none; health.Check reads 0 as the default
	}
	return cmd.Run("it reads the agent's state and starts units", func(ctx context.Context, sd units.Manager, log *slog.Logger) int {
		c := &health.Check{
			Paths:       cmd.Paths(),
			Failures:    *failures,
			MaxRestarts: *maxRestarts,
			BootWait:    *bootWait,
			Settle:      *settle,
			Units:       sd,
			Log:         log,
		}
		if err := c.Run(ctx); err != nil {
			log.Error("health: " + err.Error())
			return exitcode.For(err)
		}
		return 0
	})
}
