// Command restart is unbounded-restart, run by unbounded-restart.service:
// the soft reboot of the node stack in the active mode, never of the host
// (lib/restart). Started by an operator (`systemctl start
// unbounded-restart.service`), by the daemon for a Restart
// MachineOperation, or by unbounded-health after repeated failures.
//
// Its own small binary: no Kubernetes client, under 5 MB (ARCHITECTURE
// section 3), hence the standard library's flag package rather than kong.
// Exit 0: restarted and healthy; 1: failed (recovery reports it); 4: not
// root; 69: an installation owns the host; 77: the allocation fence
// refused the restarted node.
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
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/logging"
	"unbounded-cloud.io/agent/lib/restart"
	"unbounded-cloud.io/agent/lib/units"
	"unbounded-cloud.io/agent/lib/version"
)

func main() { os.Exit(run(os.Args[1:])) }

func run(args []string) int {
	fs := flag.NewFlagSet("restart", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), "Usage: restart [flags]\n\nSoft reboot of the node stack in the active mode; never the host (unbounded-restart.service).\n\nFlags:\n")
		fs.PrintDefaults()
	}
	root := fs.String("root", "/", "resolve every host path under this directory")
	timeout := fs.Duration("timeout", restart.DefaultTimeout, "how long to wait for the node to be healthy after the restart")
	showVersion := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *showVersion {
		fmt.Println("unbounded-restart", version.Version)
		return 0
	}
	if *timeout <= 0 {
		fmt.Fprintln(os.Stderr, "restart: --timeout must be positive")
		return 2
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "restart: needs root (it reads the agent's state and restarts units)")
		return exitcode.NeedsRoot
	}
	log := logging.New(os.Stderr, slog.LevelInfo)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	// The connection lives as long as the context it is dialled with
	// (godbus closes it when that ends): the run's own.
	sd, err := units.Dial(ctx)
	if err != nil {
		log.Error("restart: " + err.Error())
		return exitcode.Failed
	}
	defer sd.Close()
	r := &restart.Restart{Paths: hostpaths.New(*root), Timeout: *timeout, Units: sd, Log: log}
	if err := r.Run(ctx); err != nil {
		if code := exitcode.For(err); code == exitcode.Deferred {
			return code
		}
		log.Error("restart: " + err.Error())
		return exitcode.For(err)
	}
	return 0
}
