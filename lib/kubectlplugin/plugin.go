// Package kubectlplugin is the command kubectl-unbounded, the operator's
// workstation side of the agent, a kubectl plugin (`kubectl unbounded
// ...`, or run on its own): join a host (a bootstrap token for its machine
// and the files the host needs), see the fleet (get, describe), and roll an
// operation across it (repave, restart, reboot, upgrade). It loads the
// kubeconfig as kubectl does (KUBECONFIG, ~/.kube/config, --kubeconfig,
// --context). Shipped apart from the host packages (ARCHITECTURE section
// 3); lib/fleet does the work.
//
// Main is the whole program (cmd/kubectl-unbounded calls it); Parse
// checks a command line against the same kong model and runs nothing.
package kubectlplugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"reflect"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/alecthomas/kong"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"unbounded-cloud.io/agent/lib/concern"
	"unbounded-cloud.io/agent/lib/fleet"
	"unbounded-cloud.io/agent/lib/kube"
	"unbounded-cloud.io/agent/lib/version"
)

type globals struct {
	Kubeconfig string `help:"Path to the kubeconfig file (default: KUBECONFIG, then ~/.kube/config)." type:"path"`
	Context    string `help:"The kubeconfig context to use."`
	Namespace  string `short:"n" help:"Accepted for kubectl's sake: every object of the agent is cluster-scoped."`
}

type cli struct {
	globals
	Join     joinCmd     `cmd:"" help:"Create a bootstrap token for a machine and the host's agent.toml, token and CA files."`
	Get      getCmd      `cmd:"" help:"The fleet: each Machine, its node and its last operation."`
	Describe describeCmd `cmd:"" help:"One Machine: its state, conditions, recent operations and Events."`
	Repave   repaveCmd   `cmd:"" help:"Repave machines one window at a time: a MachineRollout the cluster runs (--local: from here)."`
	Restart  restartCmd  `cmd:"" help:"Restart the node stack of machines (never the host), one window at a time: a MachineRollout (--local: from here)."`
	Reboot   rebootCmd   `cmd:"" help:"Reboot machines, one window at a time: a MachineRollout (--local: from here)."`
	Upgrade  upgradeCmd  `cmd:"" help:"Upgrade the agent of machines to a package (--version, --url, --sha256), one window at a time: a MachineRollout (--local: from here)."`
	Version  versionCmd  `cmd:"" help:"Print the plugin's version."`
}

// versionCmd is a command, not kong's --version flag: upgrade's --version
// names the package, and kong refuses a flag twice on one command line.
// A lone --version is still taken as this command (see main).
type versionCmd struct{}

func (versionCmd) Run(*globals) error {
	fmt.Println(version.Version)
	return nil
}

type env struct {
	cfg  *rest.Config
	raw  clientcmd.ClientConfig
	kube kubernetes.Interface
	out  io.Writer
}

func (g *globals) env() (*env, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if g.Kubeconfig != "" {
		rules.ExplicitPath = g.Kubeconfig
	}
	raw := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: g.Context})
	cfg, err := raw.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	cfg.UserAgent = "kubectl-unbounded/" + version.Version
	k, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return &env{cfg: cfg, raw: raw, kube: k, out: os.Stdout}, nil
}

type joinCmd struct {
	Machine      string        `arg:"" optional:"" help:"The machine's name (a DNS label: also its Node's name)."`
	TTL          time.Duration `default:"24h" help:"How long the token joins; the cluster's token cleaner deletes it after."`
	Mode         string        `default:"nspawn" enum:"nspawn,container,none" help:"The host's isolation mode."`
	Image        string        `help:"The node image (modes nspawn and container)."`
	APIServer    string        `name:"api-server" help:"The API server's URL as the host reaches it (default: the kubeconfig's)."`
	CAFile       string        `name:"ca-file" type:"existingfile" help:"The cluster CA (default: the kubeconfig's)."`
	Kubernetes   string        `help:"The kubelet's version (default: the API server's)."`
	ArtifactsURL string        `name:"artifacts-url" help:"[artifacts] base-url of the host (default: offline-dir only)."`
	Output       string        `short:"o" type:"path" help:"Write agent.toml, ca.crt and bootstrap-token (0600) into this directory instead of printing them."`
	List         bool          `help:"List the tokens join created, and stop."`
	Revoke       string        `placeholder:"MACHINE" help:"Delete every token join created for MACHINE, and stop."`
}

func (c *joinCmd) Run(g *globals) error {
	e, err := g.env()
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	switch {
	case c.List:
		ts, err := fleet.ListJoins(ctx, e.kube)
		if err != nil {
			return err
		}
		tw := tabwriter.NewWriter(e.out, 0, 0, 3, ' ', 0)
		fmt.Fprintln(tw, "MACHINE\tTOKEN ID\tEXPIRES\tAGE")
		for _, t := range ts {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", t.Machine, t.TokenID, t.Expires.Format(time.RFC3339), duration.HumanDuration(time.Since(t.Created)))
		}
		return tw.Flush()
	case c.Revoke != "":
		n, err := fleet.Revoke(ctx, e.kube, c.Revoke)
		if err != nil {
			return err
		}
		fmt.Fprintf(e.out, "revoked %d bootstrap token(s) of machine %s\n", n, c.Revoke)
		return nil
	case c.Machine == "":
		return errors.New("join: name the MACHINE (or --list, --revoke MACHINE)")
	}
	if err := fleet.CheckInstalled(ctx, e.kube.Discovery(), e.kube); err != nil {
		return err
	}
	o := fleet.JoinOptions{Machine: c.Machine, TTL: c.TTL, Mode: c.Mode, Image: c.Image, APIServer: c.APIServer,
		KubernetesVersion: c.Kubernetes, ArtifactsURL: c.ArtifactsURL}
	if o.APIServer == "" {
		o.APIServer = e.cfg.Host
	}
	switch {
	case c.CAFile != "":
		if o.CA, err = os.ReadFile(c.CAFile); err != nil {
			return err
		}
	case len(e.cfg.CAData) > 0:
		o.CA = e.cfg.CAData
	case e.cfg.CAFile != "":
		if o.CA, err = os.ReadFile(e.cfg.CAFile); err != nil {
			return err
		}
	}
	if o.KubernetesVersion == "" {
		v, err := e.kube.Discovery().ServerVersion()
		if err != nil {
			return fmt.Errorf("the API server's version (give --kubernetes): %w", err)
		}
		o.KubernetesVersion = strings.TrimPrefix(strings.SplitN(v.GitVersion, "+", 2)[0], "v")
	}
	j, err := fleet.Join(ctx, e.kube, o)
	if err != nil {
		return err
	}
	if c.Output != "" {
		if err := j.WriteFiles(c.Output); err != nil {
			return err
		}
		fmt.Fprintf(e.out, "machine %s: bootstrap token %s, expires %s\n", j.Machine, j.TokenID, j.Expires.Format(time.RFC3339))
		for _, f := range j.Files() {
			fmt.Fprintf(e.out, "  %s/%s -> %s on the host (mode %04o)\n", c.Output, f.Name, f.Host, f.Mode)
		}
		return nil
	}
	for _, f := range j.Files() {
		fmt.Fprintf(e.out, "# %s (mode %04o)\n%s", f.Host, f.Mode, f.Data)
		if !strings.HasSuffix(string(f.Data), "\n") {
			fmt.Fprintln(e.out)
		}
	}
	return nil
}

type getCmd struct {
	Kind   string `arg:"" optional:"" enum:"machines,rollouts" default:"machines" help:"What to list: machines (the default) or rollouts (MachineRollouts, run by unbounded-controller)."`
	Output string `short:"o" enum:",wide,json,yaml" default:"" help:"Output format: wide, json or yaml (default: the table)."`
}

func (c *getCmd) Run(g *globals) error {
	e, err := g.env()
	if err != nil {
		return err
	}
	if c.Kind == "rollouts" {
		dyn, err := dynamic.NewForConfig(e.cfg)
		if err != nil {
			return err
		}
		rows, err := fleet.RolloutRows(context.Background(), dyn)
		if err != nil {
			return err
		}
		if c.Output == "json" || c.Output == "yaml" {
			return c.print(e.out, rows)
		}
		return fleet.PrintRolloutRows(e.out, rows, c.Output == "wide", time.Now())
	}
	m, err := kube.NewMachines(e.cfg)
	if err != nil {
		return err
	}
	rows, err := fleet.Rows(context.Background(), m, e.kube)
	if err != nil {
		return err
	}
	if c.Output == "json" || c.Output == "yaml" {
		return c.print(e.out, rows)
	}
	return fleet.PrintRows(e.out, rows, c.Output == "wide", time.Now())
}

// print writes rows (a slice, never null) as {"items": rows} in JSON or
// YAML.
func (c *getCmd) print(w io.Writer, rows any) error {
	if v := reflect.ValueOf(rows); v.Kind() == reflect.Slice && v.IsNil() {
		rows = []any{}
	}
	b, err := json.MarshalIndent(map[string]any{"items": rows}, "", "  ")
	if err != nil {
		return err
	}
	if c.Output == "yaml" {
		if b, err = yaml.JSONToYAML(b); err != nil {
			return err
		}
	}
	_, err = fmt.Fprintf(w, "%s\n", strings.TrimRight(string(b), "\n"))
	return err
}

type describeCmd struct {
	Machine string `arg:"" help:"The machine."`
}

func (c *describeCmd) Run(g *globals) error {
	e, err := g.env()
	if err != nil {
		return err
	}
	m, err := kube.NewMachines(e.cfg)
	if err != nil {
		return err
	}
	return fleet.Describe(context.Background(), e.out, m, e.kube, c.Machine, time.Now())
}

// newParser is the kong parser of the command line, the one model that
// Main runs and Parse checks.
func newParser(c *cli, options ...kong.Option) (*kong.Kong, error) {
	return kong.New(c, append([]kong.Option{kong.Name("kubectl-unbounded"),
		kong.Description("The operator's side of unbounded-agent: join hosts, see the fleet, roll operations across it."),
		kong.UsageOnError()}, options...)...)
}

// versionAlias takes a lone --version as the version command (see
// versionCmd).
func versionAlias(args []string) []string {
	if len(args) == 1 && args[0] == "--version" {
		return []string{"version"}
	}
	return args
}

// Main runs the command line args (without the program name) and returns
// the exit code; a command line that does not parse exits as kong exits.
func Main(args []string) int {
	var c cli
	parser, err := newParser(&c)
	if err != nil {
		panic(err) // the grammar is fixed at build time; TestParse fails first
	}
	k, err := parser.Parse(versionAlias(args))
	parser.FatalIfErrorf(err)
	if err := k.Run(&c.globals); err != nil {
		fmt.Fprintln(os.Stderr, "kubectl-unbounded: "+err.Error())
		return 1
	}
	return 0
}

// Parse parses the command line args (without the program name) as Main
// does and runs nothing: an unknown command or flag, a missing argument
// or a value outside its enum is the error Main would print; --help
// parses. For the check of the command lines the README shows
// (tests/docs).
func Parse(args []string) error {
	var c cli
	return concern.DryParse(func(opts ...kong.Option) (*kong.Kong, error) { return newParser(&c, opts...) }, versionAlias(args))
}
