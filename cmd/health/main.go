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
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"unbounded-cloud.io/agent/lib/exitcode"
	"unbounded-cloud.io/agent/lib/health"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/logging"
	"unbounded-cloud.io/agent/lib/units"
	"unbounded-cloud.io/agent/lib/version"
)

func main() { os.Exit(run(os.Args[1:])) }

func run(args []string) int {
	fs := flag.NewFlagSet("health", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), "Usage: health [flags]\n\nOne health check of the node stack (unbounded-health.service).\n\nFlags:\n")
		fs.PrintDefaults()
	}
	root := fs.String("root", "/", "resolve every host path under this directory")
	failures := fs.Int("failures", health.DefaultFailures, "consecutive unhealthy checks before a restart of the node stack")
	maxRestarts := fs.Int("max-restarts", health.DefaultMaxRestarts, "restarts without a healthy check in between before giving up")
	bootWait := fs.Duration("boot-wait", health.DefaultBootWait, "how long the first check of a boot waits for the node to become healthy")
	showVersion := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *showVersion {
		fmt.Println("unbounded-health", version.Version)
		return 0
	}
	if *failures < 1 || *maxRestarts < 0 || *bootWait < 0 {
		fmt.Fprintln(os.Stderr, "health: --failures must be at least 1, --max-restarts and --boot-wait not negative")
		return 2
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "health: needs root (it reads the agent's state and starts units)")
		return exitcode.NeedsRoot
	}
	log := logging.New(os.Stderr, slog.LevelInfo)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	// The connection lives as long as the context it is dialled with
	// (godbus closes it when that ends): the run's own.
	sd, err := units.Dial(ctx)
	if err != nil {
		log.Error("health: " + err.Error())
		return exitcode.Failed
	}
	defer sd.Close()
	c := &health.Check{
		Paths:       hostpaths.New(*root),
		Failures:    *failures,
		MaxRestarts: *maxRestarts,
		BootWait:    *bootWait,
		Units:       sd,
		Log:         log,
	}
	if err := c.Run(ctx); err != nil {
		log.Error("health: " + err.Error())
		return exitcode.For(err)
	}
	return 0
}
