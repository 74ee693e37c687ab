// unbounded-generator is the agent's systemd generator (systemd.generator(7),
// ARCHITECTURE section 6): at every boot and daemon-reload it reads the
// host's local state and links the units that should run into the first
// output directory. The logic is in lib/generator.
//
// It always exits 0, even on wrong arguments: a generator that fails makes
// systemd log an error at every boot, and the state it reports is better
// said once, on /dev/kmsg, by the generator itself.
//
// Why the standard flag package and not kong, the project's CLI library:
// kong links text/template and more reflection, which put this binary
// over its 3 MB budget (TestGeneratorBinaryIsUnder3MB), for one flag.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"unbounded-cloud.io/agent/lib/generator"
	"unbounded-cloud.io/agent/lib/hostpaths"
)

const usage = `usage: unbounded-generator [--root DIR] NORMAL [EARLY LATE]

Choose the unbounded-agent units to start from the host's local state and
link them into NORMAL (systemd.generator(7)). --root resolves every input
path, and /dev/kmsg, under DIR (for tests). Always exits 0.
`

func main() {
	g := generator.Host{}
	fs := flag.NewFlagSet("unbounded-generator", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	root := fs.String("root", "/", "")
	err := fs.Parse(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(os.Stderr, usage)
		return
	}
	// systemd passes three directories; one is accepted too, as
	// systemd-analyze and some test harnesses pass a single directory.
	if n := fs.NArg(); err == nil && n != 1 && n != 3 {
		err = fmt.Errorf("expected 1 or 3 output directories, got %d", n)
	}
	p := hostpaths.New(*root)
	if err != nil {
		g.Report(p, fmt.Sprintf("bad arguments %q: %v; nothing generated", os.Args[1:], err))
		return
	}
	g.Run(p, fs.Arg(0))
}
