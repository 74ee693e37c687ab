package concern

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"unbounded-cloud.io/agent/lib/exitcode"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/privilege"
)

// Root is the --root flag every concern has. Embed it (first, so --help
// lists it first) in the concern's flags struct.
type Root struct {
	Root string `help:"Resolve every host path under this directory (tests, offline roots)." default:"/" type:"path"`
}

func (r *Root) root() string { return r.Root }

// rooted is a flags struct that embeds Root.
type rooted interface{ root() string }

// Context is the context of a concern's run: cancelled by SIGTERM (systemd
// stopping the unit) or SIGINT. Call stop when the run ends.
func Context() (ctx context.Context, stop context.CancelFunc) {
	return signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
}

// Main runs run with args under Context, writing to the process's stdout
// and stderr, and returns its exit code: what a concern's Main is.
func Main(args []string, run func(ctx context.Context, args []string, stdout, stderr io.Writer) int) int {
	ctx, stop := Context()
	defer stop()
	return run(ctx, args, os.Stdout, os.Stderr)
}

// Start parses args as Parse does, then checks that the host root under
// --root is readable: run by hand without root, it says so on stderr in
// one line (prefixed with name) and the process ends with exit 4, rather
// than with a failure the host does not have. done reports that the
// process ends now with code; otherwise paths are the host's paths under
// --root.
func Start(name, description string, target rooted, args []string, stdout, stderr io.Writer) (paths hostpaths.Paths, code int, done bool) {
	if code, done := Parse(name, description, target, args, stdout, stderr); done {
		return paths, code, true
	}
	paths = hostpaths.New(target.root())
	if err := privilege.Check(paths.HostRoot()); err != nil {
		fmt.Fprintln(stderr, name+":", err)
		return paths, exitcode.For(err), true
	}
	return paths, 0, false
}

// Level is the log level named by name (debug, info, warn or error, from
// a flag or the config's [daemon] log-level); info when name is empty or
// names no level.
func Level(name string) slog.Level {
	level := slog.LevelInfo
	_ = level.UnmarshalText([]byte(name))
	return level
}
