package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/term"

	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/modes/facts"
	"unbounded-cloud.io/agent/lib/privilege"
	"unbounded-cloud.io/agent/lib/state"
)

// activeNode is the node stack that runs, from the applied records as the
// daemon reads them (state.ReadActive): none on a host not bootstrapped,
// and a clear refusal while two records exist and no journal says which
// one runs.
func activeNode(p hostpaths.Paths) (*state.AppliedConfig, error) {
	if err := privilege.Check(p.HostRoot()); err != nil {
		return nil, err
	}
	a, err := state.ReadActive(p)
	if err != nil {
		return nil, fmt.Errorf("which node runs is not known: %w (see unbounded status)", err)
	}
	if a == nil {
		return nil, errors.New("the host is not bootstrapped: there is no node")
	}
	return a, nil
}

// childExit is the exit status of the tool a command ran, which becomes
// the command's own (Main).
type childExit int

func (c childExit) Error() string { return fmt.Sprintf("exit status %d", int(c)) }

// runTool runs argv with the terminal's standard streams and returns its
// exit status. A nil environ is this process's environment.
func runTool(argv, environ []string, stdin io.Reader, stdout, stderr io.Writer) (int, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = environ
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, stdout, stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode(), nil
	}
	return 0, err
}

func (env *Env) tool(argv, environ []string) error {
	run := env.RunTool
	if run == nil {
		run = runTool
	}
	in := env.Stdin
	if in == nil {
		in = os.Stdin
	}
	code, err := run(argv, environ, in, env.Stdout, env.Stderr)
	if err != nil {
		return fmt.Errorf("run %s: %w", argv[0], err)
	}
	if code != 0 {
		return silentError{childExit(code)}
	}
	return nil
}

// lookPath is the executable name finds in path, as a shell would find it;
// a name with a slash, or one found nowhere, stays as it is (the run then
// says it is not found).
func lookPath(name, path string) string {
	if strings.Contains(name, "/") {
		return name
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = "."
		}
		file := filepath.Join(dir, name)
		if fi, err := os.Stat(file); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
			return file
		}
	}
	return name
}

// logsCmd shows the journal of the active node's kubelet or containerd.
type logsCmd struct {
	rootFlag
	Component string `arg:"" optional:"" default:"kubelet" enum:"kubelet,containerd" help:"kubelet (the default) or containerd."`
	Follow    bool   `short:"f" help:"Follow the journal as it grows."`
	Lines     int    `short:"n" default:"100" help:"How many of the last lines to show."`
}

func (l *logsCmd) Run(env *Env) error {
	a, err := activeNode(l.paths())
	if err != nil {
		return err
	}
	machine, unit, ok := facts.NodeUnit(a.Mode, a.Slot, l.Component)
	if !ok {
		return fmt.Errorf("mode %s has no %s of its own", a.Mode, l.Component)
	}
	if l.Lines < 0 {
		return errors.New("--lines must be 0 or more")
	}
	argv := []string{"journalctl", "--no-pager", "-u", unit, "-n", fmt.Sprint(l.Lines)}
	if machine != "" {
		argv = append(argv, "-M", machine)
	}
	if l.Follow {
		argv = append(argv, "-f")
	}
	return env.tool(argv, nil)
}

// execCmd runs a command in the active node.
type execCmd struct {
	rootFlag
	Command []string `arg:"" passthrough:"" help:"The command and its arguments (after --)."`
}

func (e *execCmd) Run(env *Env) error {
	a, err := activeNode(e.paths())
	if err != nil {
		return err
	}
	argv := e.Command
	if len(argv) > 0 && argv[0] == "--" {
		argv = argv[1:]
	}
	if len(argv) == 0 {
		return errors.New("exec: name the command to run (unbounded exec -- CMD ...)")
	}
	m, _ := facts.Lookup(a.Mode)
	switch {
	case m.InMachine:
		// In the node machine, as one transient unit: its exit status is
		// the command's; a terminal gets a pseudo-terminal.
		// (/dev/null is a character device too: only a terminal on
		// both ends gets one.)
		stream := "--pipe"
		if env.Stdin == nil && term.IsTerminal(int(os.Stdin.Fd())) && term.IsTerminal(int(os.Stdout.Fd())) {
			stream = "--pty"
		}
		return env.tool(append([]string{"systemd-run", "-M", a.Slot, "--wait", "--collect", "--quiet", stream, "--"}, argv...), nil)
	case m.InPlace:
		// On the host, with the running version's tools first on PATH
		// (for the command and for what it runs).
		path := filepath.Join(e.paths().Join(hostpaths.VersionsCurrentHost), "bin") + ":" + os.Getenv("PATH")
		environ := append(slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "PATH=") }), "PATH="+path)
		return env.tool(append([]string{lookPath(argv[0], path)}, argv[1:]...), environ)
	}
	return fmt.Errorf("mode %s: exec does not know where its node runs", a.Mode)
}
