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
	"os"
	"path/filepath"
	"slices"
	"strings"

	"unbounded-cloud.io/agent/cmd/daemon"
	"unbounded-cloud.io/agent/cmd/fence"
)

// concerns maps a concern's name to its Main. One line per concern.
var concerns = map[string]func(args []string) int{
	"daemon": daemon.Main,
	"fence":  fence.Main,
}

func main() {
	os.Exit(run(os.Args))
}

// run dispatches argv and returns the exit code.
func run(argv []string) int {
	name := filepath.Base(argv[0])
	args := argv[1:]
	if main, ok := concerns[name]; ok {
		return main(args)
	}
	if len(args) > 0 {
		if main, ok := concerns[args[0]]; ok {
			return main(args[1:])
		}
	}
	names := make([]string, 0, len(concerns))
	for n := range concerns {
		names = append(names, n)
	}
	slices.Sort(names)
	fmt.Fprintf(os.Stderr, "usage: unbounded-agent CONCERN [ARGS...], or start it as one of its names\nconcerns: %s\n", strings.Join(names, ", "))
	return 1
}
