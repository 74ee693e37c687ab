package cli

import (
	"fmt"

	"unbounded-cloud.io/agent/lib/exitcode"
)

// prepareCmd is `unbounded prepare`, an image builder's step: it runs the
// prepare concern of the image itself, DIR/usr/libexec/unbounded/prepare
// (the agent installed into the image, lib/prepare), in the foreground.
// The CLI changes nothing on its own and links no artifact or image
// client (size budget).
type prepareCmd struct {
	Root string `help:"The OS image's root, with the agent's package installed into it." placeholder:"DIR" type:"path" required:""`
}

func (c *prepareCmd) Run(env *Env) error {
	p := rootFlag{Root: c.Root}.paths()
	run := env.RunConcern
	if run == nil {
		run = runConcern
	}
	code, err := run(p.Libexec("prepare"), []string{"--root", c.Root}, env.Stdout, env.Stderr)
	if err != nil {
		return fmt.Errorf("run %s (is the agent's package installed into %s?): %w", p.Libexec("prepare"), c.Root, err)
	}
	if code != exitcode.OK {
		// The concern said why on stderr.
		return silentError{exitStatus(code)}
	}
	return nil
}
