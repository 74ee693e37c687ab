// Command unbounded-agent is the one executable of every concern that talks
// to the cluster. client-go is the bulk of a binary that links it; one
// multicall executable keeps the whole installation within the 40 MB budget
// of ARCHITECTURE section 3 (`make bench` prints the sum, "installed
// binaries total") while each concern keeps its own package
// (cmd/<concern>) and its own name on the host: the package installs
// /usr/libexec/unbounded/<concern> as a symlink to this binary, and units
// start the concern by that name, as torcx does with torcx-generator.
//
// It dispatches on the name it was started as (filepath.Base(argv[0])), or
// on its first argument when started as unbounded-agent:
//
//	/usr/libexec/unbounded/fence --root /tmp/r
//	unbounded-agent fence --root /tmp/r
package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"

	"unbounded-cloud.io/agent/cmd/bootstrap"
	"unbounded-cloud.io/agent/cmd/daemon"
	"unbounded-cloud.io/agent/cmd/fence"
	"unbounded-cloud.io/agent/cmd/isolation"
	"unbounded-cloud.io/agent/cmd/lifecycle"
	"unbounded-cloud.io/agent/cmd/prepare"
	"unbounded-cloud.io/agent/cmd/recover"
	"unbounded-cloud.io/agent/cmd/repave"
	"unbounded-cloud.io/agent/cmd/reprovision"
	"unbounded-cloud.io/agent/cmd/reset"
	"unbounded-cloud.io/agent/cmd/upgrade"
	"unbounded-cloud.io/agent/lib/version"
)

// concerns maps a concern's name to its Main and a one-line summary for
// --help. One line per concern.
var concerns = map[string]struct {
	main func(args []string) int
	help string
}{
	"bootstrap":   {bootstrap.Main, "first boot: turn this host into a Ready node of the cluster (unbounded-bootstrap.service)"},
	"daemon":      {daemon.Main, "watch this host's Machine and operations and carry them out (unbounded-daemon.service)"},
	"fence":       {fence.Main, "check with the cluster that the node may start (unbounded-fence.service)"},
	"isolation":   {isolation.Main, "change the node's isolation mode, in place (rolling back on failure) or by a reprovision handoff (unbounded-isolation.service)"},
	"lifecycle":   {lifecycle.Main, "before the daemon: resume an interrupted installation, repave or isolation change, keep the running node's hooks current (unbounded-lifecycle.service)"},
	"prepare":     {prepare.Main, "bake into an OS image's root (--root) the artifacts and the unpacked node image every host booted from it would build alike; run by image builders, no unit"},
	"recover":     {recover.Main, "report a failed agent unit on the Machine and repair the daemon (unbounded-recover@.service)"},
	"repave":      {repave.Main, "replace the node stack from the desired config, blue/green or in place, rolling back on failure (unbounded-repave.service)"},
	"reprovision": {reprovision.Main, "continue an isolation change's reprovision handoff: reset keeping the handoff, bootstrap the target mode (unbounded-reprovision.service)"},
	"reset":       {reset.Main, "remove the node and the agent's state from this host; /etc/unbounded stays (unbounded-reset.service)"},
	"upgrade":     {upgrade.Main, "upgrade the agent through the package manager, rolling back on failure; the node keeps running (unbounded-upgrade.service)"},
}

func main() {
	os.Exit(run(os.Args, os.Stdout, os.Stderr))
}

// run dispatches argv and returns the exit code. Help and version go to
// stdout and exit 0, as every other command's do; a missing or unknown
// concern is a usage error (2, the shell convention, which no concern
// returns for anything else).
func run(argv []string, stdout, stderr io.Writer) int {
	name := filepath.Base(argv[0])
	args := argv[1:]
	if c, ok := concerns[name]; ok {
		return c.main(args)
	}
	if len(args) > 0 {
		if c, ok := concerns[args[0]]; ok {
			return c.main(args[1:])
		}
		switch args[0] {
		case "-h", "--help", "help":
			usage(stdout)
			return 0
		case "--version", "version":
			fmt.Fprintf(stdout, "unbounded-agent %s\n", version.Version)
			return 0
		}
		fmt.Fprintf(stderr, "unbounded-agent: unknown concern %q\n", args[0])
	}
	usage(stderr)
	return usageExit
}

// usageExit is the exit code of a command line that names no concern.
const usageExit = 2

func usage(w io.Writer) {
	names := make([]string, 0, len(concerns))
	for n := range concerns {
		names = append(names, n)
	}
	slices.Sort(names)
	fmt.Fprint(w, "Usage: unbounded-agent CONCERN [ARGS...]\n\n"+
		"The one executable of the agent's concerns that talk to the cluster. Units\n"+
		"start each concern by its own name, /usr/libexec/unbounded/CONCERN (a link\n"+
		"to this executable); `unbounded-agent CONCERN --help` shows its flags.\n\nConcerns:\n")
	for _, n := range names {
		fmt.Fprintf(w, "  %-8s %s\n", n, concerns[n].help)
	}
}
