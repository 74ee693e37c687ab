// Package concern holds what every one-shot's command line shares: parsing
// its flags with kong into the concern's own struct, with the same exits
// for --help and for a command line it cannot parse.
package concern

import (
	"fmt"
	"io"

	"github.com/alecthomas/kong"

	"unbounded-cloud.io/agent/lib/exitcode"
)

// Parse parses args (without the program name) into target for the
// concern name. done reports that the process ends now with code: 0 after
// --help, exitcode.Failed on a command line it cannot parse (said on
// stderr, prefixed with name).
func Parse(name, description string, target any, args []string, stdout, stderr io.Writer) (code int, done bool) {
	exited := -1
	parser, err := kong.New(target,
		kong.Name(name),
		kong.Description(description),
		kong.Exit(func(code int) { exited = code }),
		kong.Writers(stdout, stderr))
	if err != nil {
		fmt.Fprintln(stderr, name+":", err)
		return exitcode.Failed, true
	}
	if _, err := parser.Parse(args); err != nil {
		fmt.Fprintln(stderr, name+":", err)
		return exitcode.Failed, true
	}
	if exited >= 0 { // --help
		return exited, true
	}
	return 0, false
}
