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

// DryParse parses args (without the program name) with the parser build
// makes, given these options: output discarded, and kong's exits (after
// --help, --version) turned into a return. It runs nothing. An unknown
// command or flag, a missing argument or a value outside its enum is the
// error the command would print; a command line that exits non-zero
// before it runs is an error too. For checks of command lines a document
// shows (tests/docs).
func DryParse(build func(opts ...kong.Option) (*kong.Kong, error), args []string) (err error) {
	type exited int
	defer func() {
		if r := recover(); r != nil {
			code, ok := r.(exited)
			if !ok {
				panic(r)
			}
			err = nil
			if code != 0 {
				err = fmt.Errorf("the command line exits %d before it runs", int(code))
			}
		}
	}()
	parser, err := build(kong.Writers(io.Discard, io.Discard), kong.Exit(func(code int) { panic(exited(code)) }))
	if err != nil {
		return err
	}
	_, err = parser.Parse(args)
	return err
}
