// Package prepare is the unbounded-prepare one-shot, run by an image
// builder (`unbounded prepare --root DIR`, no unit): it bakes into an OS
// image's root what every host booted from the image would otherwise
// build identically at its first boot (lib/prepare). Exit 0 prepared, 1
// failed, 75 an artifact or the node image cannot be had now (try
// again), 78 the image's config is not valid or DIR is no OS tree.
package prepare

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"unbounded-cloud.io/agent/lib/concern"
	"unbounded-cloud.io/agent/lib/exitcode"
	"unbounded-cloud.io/agent/lib/logging"
	"unbounded-cloud.io/agent/lib/prepare"
)

type cli struct {
	concern.Root
}

// Main runs prepare with args (without the program name) and returns the
// exit code.
func Main(args []string) int {
	return concern.Main(args, run)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var c cli
	paths, code, done := concern.Start("prepare", "Bake into the OS image at --root what every host booted from it would build identically at its first boot: "+
		"the artifacts fetched and verified into the image's cache and, in modes nspawn and container, the node image unpacked with them "+
		"(/var/lib/unbounded/prepared). Reads the image's /etc/unbounded/agent.toml; the machine's name and the bootstrap token are each host's and may be absent. "+
		"Needs no systemd, no cluster and no identity; nothing host-specific is written. Exit 0: prepared; 1: failed; 75: an artifact or the node image cannot be had now; 78: bad config or no OS tree at --root.",
		&c, args, stdout, stderr)
	if done {
		return code
	}
	log := logging.New(stderr, slog.LevelInfo)
	res, err := (&prepare.Prepare{Paths: paths, Log: log}).Run(ctx)
	code = exitcode.For(err)
	if err != nil {
		log.Error("prepare: "+err.Error(), "exit", code)
		return code
	}
	fmt.Fprintf(stdout, "prepared %s for mode %s: %d artifact(s) verified", paths.Join("/"), res.Mode, len(res.Artifacts))
	if t := res.Tree; t != nil {
		fmt.Fprintf(stdout, ", node image %s (%s) unpacked into %s", t.Image, t.Digest, paths.Rel(paths.PreparedDir()))
	}
	fmt.Fprintln(stdout)
	return exitcode.OK
}
