// Package upgrade is the unbounded-upgrade one-shot, run by
// unbounded-upgrade.service (started by the daemon for an AgentUpgrade
// MachineOperation, or by unbounded-upgrade.path when an operator stages a
// package): the agent's self-upgrade on a package-managed host
// (lib/upgrade), through the package manager that installed the agent
// (upgrade.HostPackages). Exit 0 upgraded (or nothing to do), 1 failed
// (rolled back, or refused before anything changed: the message says
// which), 69 an installation owns the host, 75 the package's source did
// not answer (nothing changed; the next run resumes the download), 78 a
// host the upgrade does not serve (an image-based rpm host).
//
// A run cut anywhere is resumed by the next (at boot: the upgrade owns the
// host, and the generator leaves the daemon to it): a package a cut dpkg
// left half-installed is repaired first, a cut record finished, a run that
// finds nothing left to do on a host a cut run owned releases it and
// starts the daemon (exit 0; 1 when the daemon does not start), and one
// upgrade is resumed at most upgrade.MaxResumes times before it is rolled
// back.
package upgrade

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"unbounded-cloud.io/agent/lib/steps"

	"unbounded-cloud.io/agent/lib/concern"
	"unbounded-cloud.io/agent/lib/config"
	"unbounded-cloud.io/agent/lib/exitcode"
	"unbounded-cloud.io/agent/lib/logging"
	"unbounded-cloud.io/agent/lib/units"
	"unbounded-cloud.io/agent/lib/upgrade"
)

type cli struct {
	concern.Root
	Timeout  time.Duration `help:"How long the restarted daemon may take to run the new executable and stay up for --settle." default:"60s"`
	Settle   time.Duration `help:"How long the restarted daemon's main process must stay the same for the upgrade to count." default:"5s"`
	LockWait time.Duration `name:"lock-wait" help:"How long to wait for another installation (first boot, repave, reset) to release the host before giving up with 69." default:"20m"`
}

// Main runs upgrade with args (without the program name) and returns the
// exit code.
func Main(args []string) int {
	return concern.Main(args, run)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var c cli
	paths, code, done := concern.Start("upgrade", "Upgrade the agent on this package-managed host (dpkg or rpm): fetch and verify the package the daemon's request names (else the one staged in /var/lib/unbounded/upgrade/staged with its .sha256), keep the installed one, install the new one, restart the daemon and wait until it runs the new executable; roll back on failure. The node keeps running. Exit 0: upgraded or nothing to do; 1: failed (the message says whether it rolled back); 69: an installation owns the host; 75: the package's source did not answer, nothing changed; 78: a host the upgrade does not serve (image-based, its agent installed by rpm).\n\n"+steps.Help("step", upgrade.StepDocs), &c, args, stdout, stderr)
	if done {
		return code
	}
	log := logging.New(stderr, slog.LevelInfo)
	packages, err := upgrade.HostPackages(ctx, paths.Root)
	if err != nil {
		log.Error("upgrade: " + err.Error())
		return exitcode.For(err)
	}
	u := &upgrade.Upgrade{
		Paths: paths, Packages: packages, Log: log,
		Wait: upgrade.Wait{Timeout: c.Timeout, Settle: c.Settle}, LockWait: c.LockWait,
		Systemd: func(ctx context.Context) (upgrade.Manager, error) {
			sd, err := units.Dial(ctx)
			if err != nil {
				return nil, err
			}
			m, ok := sd.(upgrade.Manager)
			if !ok {
				sd.Close()
				return nil, errors.New("the service manager connection cannot read a unit's main process")
			}
			return m, nil
		},
	}
	if cfg, err := config.Load(paths); err == nil && cfg.Cluster.CAFile != "" {
		u.CAFile = cfg.Resolve(cfg.Cluster.CAFile)
	}
	err = u.Run(ctx)
	if errors.Is(err, upgrade.ErrNothingToDo) {
		log.Info("upgrade: " + err.Error())
		return exitcode.OK
	}
	code = exitcode.For(err)
	switch code {
	case exitcode.OK:
	case exitcode.Deferred:
		fmt.Fprintln(stderr, "upgrade: an installation owns the host:", err)
	default:
		log.Error("upgrade: "+err.Error(), "exit", code)
	}
	return code
}
