// Package fence is the unbounded-fence one-shot: the allocation launch
// check run by unbounded-fence.service before every start of the node
// stack. The logic is in lib/fence; this is flags, config, one call, and the
// exit code (0 allowed, 75 interrupted by a signal before a decision, 77
// refused, 78 config invalid).
package fence

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"unbounded-cloud.io/agent/lib/concern"

	"unbounded-cloud.io/agent/lib/config"
	"unbounded-cloud.io/agent/lib/exitcode"
	"unbounded-cloud.io/agent/lib/fence"
	"unbounded-cloud.io/agent/lib/fence/record"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/kube"
	"unbounded-cloud.io/agent/lib/logging"
	"unbounded-cloud.io/agent/lib/privilege"
	"unbounded-cloud.io/agent/lib/state"
)

type cli struct {
	concern.Root
}

// Main runs the fence with args (without the program name) and returns the
// exit code.
func Main(args []string) int {
	var c cli
	if code, done := concern.Parse("fence", "Check with the cluster that this host may still start the node of its allocation. Exit 0: allowed; 75: interrupted (SIGTERM) before a decision; 77: refused (the kind, explicit or for lack of an answer, is recorded in /run/unbounded/fence.json); 78: configuration invalid.", &c, args, os.Stdout, os.Stderr); done {
		return code
	}

	log := logging.New(os.Stderr, slog.LevelInfo)
	paths := hostpaths.New(c.Root.Root)
	// Run by hand without root, the host root (certificates) and the
	// bootstrap token are unreadable: say that in one line (exit 4)
	// rather than refuse for a reason the host does not have.
	err := privilege.Check(paths.HostRoot())
	var cfg *config.Config
	if err == nil {
		cfg, err = config.Load(paths)
	}
	if errors.Is(err, exitcode.ErrNeedsRoot) {
		fmt.Fprintln(os.Stderr, "fence:", err)
		return exitcode.For(err)
	}
	if err != nil {
		// Fail closed: without a config the fence cannot know the
		// allocation, so the node does not start (78, no restart).
		log.Error("fence: configuration invalid; node start refused", "error", err.Error())
		return exitcode.For(err)
	}
	if cfg.Daemon.LogLevel != "" {
		log = logging.New(os.Stderr, concern.Level(cfg.Daemon.LogLevel))
	}

	ctx, stop := concern.Context()
	defer stop()
	check := &fence.Check{
		Machine:       cfg.Machine,
		AllocationUID: cfg.Allocation.UID,
		Budget:        cfg.Fence.RetryBudget.D(),
		Credentials:   kube.CredentialsFor(cfg, paths.PKIDir()),
		Log:           log,
	}
	err = check.Run(ctx)
	// The record tells the health timer and the daemon which kind of
	// "no" keeps the node down (lib/fence/record). Best effort: the exit
	// code is the decision, and the node unit acts on it alone. A root
	// without /run/unbounded (an offline root, not a booted host) has
	// nobody to read it.
	if _, rerr := state.RunDir(paths); rerr == nil {
		if werr := record.Write(paths, recordOf(err, cfg.Allocation.UID, check.Via())); werr != nil {
			log.Warn("cannot record the fence's outcome", "file", record.File(paths), "error", werr.Error())
		}
	}
	return exitcode.For(err)
}

// recordOf is the record of the check's outcome err, decided by a read
// with the credential via.
func recordOf(err error, allocation string, via fence.Credential) record.Record {
	r := record.Record{Outcome: record.Allowed, AllocationUID: allocation, Via: string(via), At: time.Now().UTC()}
	var refusal *fence.Refusal
	switch {
	case err == nil:
	case errors.As(err, &refusal) && refusal.NoAnswer:
		r.Outcome, r.Reason, r.Message = record.NoAnswer, refusal.Reason, refusal.Message
	case errors.As(err, &refusal):
		r.Outcome, r.Reason, r.Message = record.Refused, refusal.Reason, refusal.Message
	default:
		r.Outcome, r.Message = record.Interrupted, err.Error()
	}
	return r
}
