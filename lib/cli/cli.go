// Package cli is the operator command `unbounded` (ARCHITECTURE section 3):
// status, config check, supports-isolation, manifests, version, reset. The
// command only reads the host; everything that changes it is a unit's
// program (`unbounded reset` runs the one unbounded-reset.service runs).
//
// Main is the whole program, so that tests run it in-process with any
// arguments and check its output and exit code exactly as a shell would.
package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
	"github.com/alecthomas/kong"

	"unbounded-cloud.io/agent/lib/api/manifests"
	"unbounded-cloud.io/agent/lib/concern"
	"unbounded-cloud.io/agent/lib/config"
	"unbounded-cloud.io/agent/lib/exitcode"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/modes"
	"unbounded-cloud.io/agent/lib/privilege"
	"unbounded-cloud.io/agent/lib/status"
	"unbounded-cloud.io/agent/lib/version"
)

// Usage is the exit code of a command line that does not parse (the
// shell convention; not one of the one-shots' codes, which a command line
// error never reaches).
const Usage = 2

// Summary is what the CLI is, in --help and in unbounded(1).
const Summary = "Operator command of unbounded-agent. It reads the host; units change it."

// ExitCodes are the exit codes of every command, in --help and in
// unbounded(1).
var ExitCodes = []struct {
	Code    int
	Meaning string
}{
	{exitcode.OK, "done"},
	{exitcode.Failed, "failed (status: the state is corrupt; supports-isolation: the mode is not supported; reset: not confirmed, or failed)"},
	{Usage, "the command line does not parse"},
	{exitcode.NeedsRoot, "needs root: run without root, the command cannot read what only root may (the host root /var/lib/unbounded, the bootstrap token)"},
	{exitcode.Deferred, "reset: another installation (a bootstrap or a reprovision that is running) owns the host"},
	{exitcode.ConfigInvalid, "the configuration is invalid"},
}

// Description is the CLI's --help text after the usage line.
var Description = func() string {
	var codes []string
	for _, c := range ExitCodes {
		codes = append(codes, fmt.Sprintf("%d %s", c.Code, c.Meaning))
	}
	return Summary + "\n\nExit status: " + strings.Join(codes, "; ") + "."
}()

// Env is what commands write to and probe. The zero Host is the real host.
type Env struct {
	Stdout, Stderr io.Writer
	// Stdin answers `unbounded reset`'s confirmation; nil is os.Stdin.
	Stdin io.Reader
	Host  modes.Host
	// RunConcern runs a one-shot concern (path, args) with the command's
	// outputs and returns its exit code; nil runs the executable.
	RunConcern func(path string, args []string, stdout, stderr io.Writer) (int, error)
	// RunTool runs a system tool (journalctl, systemd-run) for logs and
	// exec with the command's streams and environment (nil: this
	// process's) and returns its exit code; nil runs it.
	RunTool func(argv, environ []string, stdin io.Reader, stdout, stderr io.Writer) (int, error)
}

type cli struct {
	// VersionFlag is --version, the flag every operator tries first; the
	// version command stays for --json.
	VersionFlag       kong.VersionFlag `name:"version" help:"Print the agent version and exit."`
	Version           versionCmd       `cmd:"" help:"Print the agent version."`
	Config            configCmd        `cmd:"" help:"Validate and show the operator configuration."`
	SupportsIsolation supportsCmd      `cmd:"" name:"supports-isolation" help:"Exit 0 if this build can operate MODE (nspawn, container, none) on this host, else say why not."`
	Status            statusCmd        `cmd:"" help:"One-screen summary of the node: mode, slot, applied configs, ownership, journals."`
	Manifests         manifestsCmd     `cmd:"" help:"Print the CRDs, RBAC and admission policies the cluster needs (the same for every machine), and with --controller-image the cluster side, for kubectl apply -f -."`
	Reset             resetCmd         `cmd:"" help:"Remove the node and the agent's state from this host (asks first; /etc/unbounded stays). Runs the reset that unbounded-reset.service runs."`
	Prepare           prepareCmd       `cmd:"" help:"For image builders: bake into the OS image at --root DIR the verified artifacts and the unpacked node image every host booted from it would otherwise build alike at its first boot. Runs the image's own agent; nothing host-specific is written."`
	Logs              logsCmd          `cmd:"" help:"Show the journal of the active node's kubelet or containerd, whatever the mode and slot (in the node machine in mode nspawn, on the host in mode none)."`
	Exec              execCmd          `cmd:"" help:"Run a command in the active node: in its machine in mode nspawn (systemd-run -M SLOT), on the host with the running version's tools on PATH in mode none. Exits with the command's status."`
	Completion        completionCmd    `cmd:"" help:"Print the completion script for SHELL (bash, zsh, fish). The packages install them; this is for a shell or a host without them."`
	Man               manCmd           `cmd:"" name:"__man" hidden:"" help:"Write a man page as markdown (for the build)."`
}

// rootFlag is --root, shared by the commands that read host state.
type rootFlag struct {
	Root string `help:"Resolve every host path under DIR, as systemctl --root does." placeholder:"DIR" type:"path"`
}

func (r rootFlag) paths() hostpaths.Paths { return hostpaths.New(r.Root) }

// exitPanic carries kong's exit (after --help) out of the parser without
// ending the process, so Main stays testable.
type exitPanic int

// Main runs the command line args (without the program name) and returns
// the exit code.
func Main(args []string, env Env) (code int) {
	if env.Stdout == nil {
		env.Stdout = os.Stdout
	}
	if env.Stderr == nil {
		env.Stderr = os.Stderr
	}
	defer func() {
		if r := recover(); r != nil {
			c, ok := r.(exitPanic)
			if !ok {
				panic(r)
			}
			code = int(c)
		}
	}()
	var c cli
	parser, err := newParser(&c,
		kong.Writers(env.Stdout, env.Stderr),
		kong.Exit(func(code int) { panic(exitPanic(code)) }),
	)
	if err != nil {
		fmt.Fprintf(env.Stderr, "unbounded: %v\n", err)
		return exitcode.Failed
	}
	ctx, err := parser.Parse(args)
	if err != nil {
		fmt.Fprintf(env.Stderr, "unbounded: %v\n", err)
		return Usage
	}
	err = ctx.Run(&env)
	if err == nil {
		return exitcode.OK
	}
	var silent silentError
	if !errors.As(err, &silent) {
		fmt.Fprintf(env.Stderr, "unbounded: %v\n", err)
	}
	var child childExit
	if errors.As(err, &child) {
		return int(child)
	}
	return exitcode.For(err)
}

// newParser is the kong parser of the command line, the one model that
// --help, the completion scripts and the man page are made from.
func newParser(c *cli, options ...kong.Option) (*kong.Kong, error) {
	return kong.New(c, append([]kong.Option{
		kong.Name("unbounded"),
		kong.Description(Description),
		kong.UsageOnError(),
		kong.ConfigureHelp(kong.HelpOptions{Compact: true}),
		kong.Vars{"version": "unbounded " + version.Version},
	}, options...)...)
}

// Model is the command line's model (commands, flags, arguments), for the
// completion scripts and the man page.
func Model() *kong.Application {
	var c cli
	parser, err := newParser(&c)
	if err != nil {
		panic(err) // the grammar is fixed at build time; TestHelpExitsZero fails first
	}
	return parser.Model
}

// Parse parses the command line args (without the program name) as Main
// does and runs nothing: an unknown command or flag, a missing argument
// or a value outside its enum is the error Main would print. --help and
// --version parse (they would print and exit 0). For the check of the
// command lines the README shows (tests/docs).
func Parse(args []string) error {
	var c cli
	return concern.DryParse(func(opts ...kong.Option) (*kong.Kong, error) { return newParser(&c, opts...) }, args)
}

// silentError is an outcome the command has already explained on its own
// output; Main only turns it into an exit code.
type silentError struct{ err error }

func (s silentError) Error() string { return s.err.Error() }
func (s silentError) Unwrap() error { return s.err }

type versionCmd struct {
	JSON bool `name:"json" help:"Print as JSON."`
}

func (v *versionCmd) Run(env *Env) error {
	if v.JSON {
		return json.NewEncoder(env.Stdout).Encode(map[string]string{"version": version.Version, "go": runtime.Version()})
	}
	_, err := fmt.Fprintf(env.Stdout, "unbounded %s\n", version.Version)
	return err
}

type configCmd struct {
	Check configCheckCmd `cmd:"" help:"Validate the configuration without touching the host and print the effective merged configuration (secrets are never printed: only the token file's path). Exit 78 when invalid."`
}

type configCheckCmd struct {
	rootFlag
	File      string `help:"Config file to check instead of /etc/unbounded/agent.toml; its drop-ins are FILE.d/*.toml. Used as given, not under --root." placeholder:"FILE" type:"path"`
	Reference bool   `help:"Print the commented reference configuration (every key, its default, the drop-in rule) and exit."`
	Quiet     bool   `short:"q" help:"Only validate; print nothing when valid."`
}

func (c *configCheckCmd) Run(env *Env) error {
	if c.Reference {
		_, err := io.WriteString(env.Stdout, config.Reference)
		return err
	}
	p := c.paths()
	file := c.File
	if file == "" {
		file = p.ConfigFile()
	}
	cfg, err := config.LoadFile(p, file)
	if err != nil {
		if es := config.AsErrors(err); es != nil {
			fmt.Fprintf(env.Stderr, "unbounded: configuration invalid (%d %s):\n", len(es), plural(len(es), "problem", "problems"))
			for _, e := range es {
				fmt.Fprintf(env.Stderr, "  %s\n", e)
			}
			return silentError{err}
		}
		return err
	}
	if c.Quiet {
		return nil
	}
	return WriteEffective(env.Stdout, cfg)
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// WriteEffective prints cfg as TOML with a header naming the files it was
// merged from. cfg holds no secret: the bootstrap token stays in its file,
// and only that file's path is printed.
func WriteEffective(w io.Writer, cfg *config.Config) error {
	var b strings.Builder
	b.WriteString("# Effective configuration: reference defaults")
	for _, f := range cfg.Files {
		b.WriteString("\n#   + " + f)
	}
	b.WriteString("\n")
	if err := toml.NewEncoder(&b).Encode(cfg); err != nil {
		return err
	}
	_, err := io.WriteString(w, b.String())
	return err
}

type supportsCmd struct {
	Mode string `arg:"" enum:"nspawn,container,none" help:"Isolation mode: nspawn, container or none."`
	JSON bool   `name:"json" help:"Print as JSON."`
}

func (s *supportsCmd) Run(env *Env) error {
	sup := env.Host.Check(s.Mode)
	if s.JSON {
		if err := json.NewEncoder(env.Stdout).Encode(struct {
			modes.Support
			Supported bool `json:"supported"`
		}{sup, sup.Err() == nil}); err != nil {
			return err
		}
		if err := sup.Err(); err != nil {
			return silentError{err}
		}
		return nil
	}
	if err := sup.Err(); err != nil {
		fmt.Fprintf(env.Stderr, "%s: not supported on this host:\n", s.Mode)
		for _, m := range sup.Missing {
			fmt.Fprintf(env.Stderr, "  - %s\n", m)
		}
		return silentError{err}
	}
	msg := s.Mode + ": supported"
	if sup.Cgroup != "" {
		msg += " (cgroup hierarchy: " + sup.Cgroup + ")"
	}
	if sup.Experimental {
		msg += "; experimental: not for production nodes yet"
	}
	_, err := fmt.Fprintln(env.Stdout, msg)
	return err
}

type statusCmd struct {
	rootFlag
	JSON   bool `name:"json" help:"Print as JSON (a stable shape for scripts)."`
	Follow bool `short:"f" help:"After the report, follow the operation that runs now (first boot, repave, restart, upgrade, reset): each step as it begins, with its time, until the run ends; its failure is the command's."`
}

// errCorrupt makes `unbounded status` exit 1 on a corrupt host after it
// has printed the report, so that scripts notice.
var errCorrupt = errors.New("state corrupt")

func (s *statusCmd) Run(env *Env) error {
	if s.Follow && s.JSON {
		return errors.New("--follow shows steps as text: it does not go with --json")
	}
	// Without root the host root reads as "permission denied", which
	// the report would show as corrupt state and an unknown owner.
	if err := privilege.Check(s.paths().HostRoot()); err != nil {
		return err
	}
	r := status.Gather(s.paths())
	if err := r.NeedsRoot(); err != nil {
		return err
	}
	if s.JSON {
		enc := json.NewEncoder(env.Stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(r); err != nil {
			return fmt.Errorf("writing the status: %w", err)
		}
	} else if err := r.Text(env.Stdout); err != nil {
		return fmt.Errorf("writing the status: %w", err)
	}
	if r.State == status.Corrupt {
		return silentError{errCorrupt}
	}
	if s.Follow {
		fmt.Fprintln(env.Stdout)
		return env.follow(env.Stdout, 5*time.Second, 200*time.Millisecond, time.Now)
	}
	return nil
}

// manifestsCmd prints the CRDs, RBAC and admission policies. They are the
// same for every machine: there is nothing per machine to print (the
// policies find the caller's machine in its identity).
type manifestsCmd struct {
	ControllerImage string `help:"Also print the cluster side, unbounded-controller, running this image (REPOSITORY[:TAG]@sha256:DIGEST): its namespace, service account, least-privilege RBAC, Deployment, PodDisruptionBudget and metrics Service." placeholder:"REF@DIGEST"`
}

func (m *manifestsCmd) Run(env *Env) error {
	out, err := manifests.All()
	if err != nil {
		return err
	}
	if m.ControllerImage != "" {
		c, err := manifests.Controller(m.ControllerImage)
		if err != nil {
			return err
		}
		out = append(out, c...)
	}
	_, err = env.Stdout.Write(out)
	return err
}
