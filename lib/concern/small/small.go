// Package small is what the small binaries (unbounded-health,
// unbounded-restart) share: the standard library's flag package with --root
// and --version, the root check, the log, the signal context and the
// connection to systemd. Unlike lib/concern it links no kong, no net/http
// and no Kubernetes client (cmd/health's deps_test.go checks), which keeps
// those binaries under 5 MB (ARCHITECTURE section 3).
package small

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
	"unbounded-cloud.io/agent/lib/units"
	"unbounded-cloud.io/agent/lib/version"
)

// Command is one small binary's command line: its flags and what it needs
// root for.
type Command struct {
	// Flags is the command's flag set, with --root and --version; add the
	// command's own flags before Parse.
	Flags   *flag.FlagSet
	name    string
	root    *string
	version *bool
}

// New is the command line of unbounded-<name>; summary is the paragraph of
// its usage.
func New(name, summary string) *Command {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: %s [flags]\n\n%s\n\nFlags:\n", name, summary)
		fs.PrintDefaults()
	}
	return &Command{
		Flags:   fs,
		name:    name,
		root:    fs.String("root", "/", "resolve every host path under this directory"),
		version: fs.Bool("version", false, "print the version and exit"),
	}
}

// Parse parses args (without the program name). done reports that the
// process ends now with code: 0 after -help or after --version (printed on
// stdout), 2 on a command line it cannot parse (said by the flag package).
func (c *Command) Parse(args []string) (code int, done bool) {
	if err := c.Flags.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0, true
		}
		return 2, true
	}
	if *c.version {
		fmt.Println("unbounded-"+c.name, version.Version)
		return 0, true
	}
	return 0, false
}

// Paths are the host's paths under --root.
func (c *Command) Paths() hostpaths.Paths { return hostpaths.New(*c.root) }

// Usage says on stderr that the flags are off (msg) and returns 2.
func (c *Command) Usage(msg string) int {
	fmt.Fprintln(os.Stderr, c.name+":", msg)
	return 2
}

// Run runs run as root under a context cancelled by SIGTERM or SIGINT,
// with a log on stderr and a connection to systemd that lives as long as
// that context, and returns run's exit code. Not root, it says so (why: what
// it needs root for) and returns 4; without systemd, it logs why and
// returns 1.
func (c *Command) Run(why string, run func(ctx context.Context, sd units.Manager, log *slog.Logger) int) int {
	if os.Geteuid() != 0 {
		fmt.Fprintf(os.Stderr, "%s: needs root (%s)\n", c.name, why)
		return exitcode.NeedsRoot
	}
	log := logging.New(os.Stderr, slog.LevelInfo)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	// The connection lives as long as the context it is dialled with
	// (godbus closes it when that ends): the run's own.
	sd, err := units.Dial(ctx)
	if err != nil {
		log.Error(c.name + ": " + err.Error())
		return exitcode.Failed
	}
	defer sd.Close()
	return run(ctx, sd, log)
}
