package kubectlplugin

import (
	"context"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/fleet"
	"unbounded-cloud.io/agent/lib/kube"
)

// rollFlags are every roll's: which machines, how wide, which roll.
type rollFlags struct {
	Machines       []string      `arg:"" optional:"" name:"machine" help:"The machines, in the order to take them."`
	Selector       string        `short:"l" placeholder:"SELECTOR" help:"A label selector on Machines (taken in name order) instead of names."`
	MaxUnavailable int           `name:"max-unavailable" default:"1" help:"Hosts at most with an operation in flight, or a Node not Ready again after it."`
	Roll           string        `placeholder:"ID" help:"The roll's id (the label unbounded-cloud.io/roll on its operations; default: a new one, printed)."`
	Resume         bool          `help:"Continue the roll --roll ID: skip the hosts it completed, wait for one still running, retry a failed one."`
	DryRun         bool          `name:"dry-run" help:"Print the plan (the hosts in order, in batches) and create nothing."`
	ReadyTimeout   time.Duration `name:"ready-timeout" default:"10m" help:"With --local: how long a host's Node may take to be Ready again after its operation completed."`
	Local          bool          `help:"Roll from this workstation: create the operations here, one window at a time, until every host is done (the roll stops when this command stops; --resume continues it). Default: create a MachineRollout that unbounded-controller runs in the cluster."`
	Watch          *bool         `negatable:"" help:"Follow the MachineRollout until it completes or stops (default: when the output is a terminal); Ctrl-C stops following, not the rollout."`
}

type repaveCmd struct {
	rollFlags `embed:""`
}

func (c *repaveCmd) Run(g *globals) error { return c.roll(g, c.options(v1alpha3.OperationRepave)) }

type restartCmd struct {
	rollFlags `embed:""`
}

func (c *restartCmd) Run(g *globals) error { return c.roll(g, c.options(v1alpha3.OperationRestart)) }

type rebootCmd struct {
	rollFlags `embed:""`
}

func (c *rebootCmd) Run(g *globals) error { return c.roll(g, c.options(v1alpha3.OperationReboot)) }

type upgradeCmd struct {
	rollFlags `embed:""`
	Version   string `placeholder:"V" help:"The package's version, Debian's form (0.2.0~rc.1)."`
	URL       string `name:"url" placeholder:"U" help:"Where the host fetches the package: https://... or file:///... on the host."`
	SHA256    string `name:"sha256" placeholder:"S" help:"The package's SHA-256 (64 hex digits)."`
}

func (c *upgradeCmd) Run(g *globals) error {
	o := c.options(v1alpha3.OperationAgentUpgrade)
	o.Version, o.URL, o.SHA256 = c.Version, c.URL, c.SHA256
	return c.roll(g, o)
}

func (f *rollFlags) options(op v1alpha3.OperationType) fleet.RollOptions {
	return fleet.RollOptions{Operation: op, Machines: f.Machines, Selector: f.Selector, MaxUnavailable: f.MaxUnavailable,
		ID: f.Roll, Resume: f.Resume, DryRun: f.DryRun, ReadyTimeout: f.ReadyTimeout}
}

// roll creates the MachineRollout that runs o in the cluster and follows
// it (--watch), or with --local runs the roll from here (rollLocal).
func (f *rollFlags) roll(g *globals, o fleet.RollOptions) error {
	if f.Local {
		return f.rollLocal(g, o)
	}
	ro, err := fleet.NewRollout(o, time.Now())
	if err != nil {
		return err
	}
	e, err := g.env()
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(e.cfg)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := fleet.CreateRollout(ctx, dyn, ro, o.DryRun, e.out); err != nil || o.DryRun {
		return err
	}
	follow := isTerminal(e.out)
	if f.Watch != nil {
		follow = *f.Watch
	}
	if !follow {
		return nil
	}
	cfg := rest.CopyConfig(e.cfg)
	cfg.Timeout = 0 // a watch lasts as long as the rollout
	if dyn, err = dynamic.NewForConfig(cfg); err != nil {
		return err
	}
	return fleet.FollowRollout(ctx, dyn, ro.Name, e.out)
}

// isTerminal says whether w is a terminal (a character device).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// rollLocal runs the roll with clients that count their requests (the
// summary's "requests: N"). SIGINT and SIGTERM end its context: it starts
// no more operations and names those still running.
func (f *rollFlags) rollLocal(g *globals, o fleet.RollOptions) error {
	if err := o.Validate(); err != nil {
		return err
	}
	e, err := g.env()
	if err != nil {
		return err
	}
	cfg := rest.CopyConfig(e.cfg)
	// A roll waits on watches for as long as its hosts take: a request
	// timeout from the kubeconfig would cut every one of them.
	cfg.Timeout = 0
	var counter fleet.RequestCounter
	counter.Wrap(cfg)
	machines, err := kube.NewMachines(cfg)
	if err != nil {
		return err
	}
	core, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	o.Out, o.Requests = e.out, counter.Count
	return fleet.Roll(ctx, machines, core, o)
}
