package cli

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"

	"unbounded-cloud.io/agent/lib/exitcode"
	"unbounded-cloud.io/agent/lib/state"
)

// resetCmd is `unbounded reset`. The CLI changes nothing on the host
// itself and links no D-Bus client (size budget): after the confirmation
// it runs the reset concern, /usr/libexec/unbounded/reset (the multicall
// agent), in the foreground, so that its progress shows on the terminal.
// That is the same program unbounded-reset.service runs, and the ownership
// record it writes names that unit: a reset cut short (a lost SSH
// session, a power cut) is resumed by the unit at the next boot, with the
// handoff kept if this run asked for it (lib/reset's journal).
type resetCmd struct {
	rootFlag
	Yes         bool `name:"yes" short:"y" help:"Do not ask for confirmation."`
	KeepHandoff bool `name:"keep-handoff" help:"Keep the reprovision handoff directory /var/lib/unbounded-agent-reprovision."`
}

// errNotConfirmed is the answer to anything but "yes".
var errNotConfirmed = errors.New("reset not confirmed; nothing was changed")

func (r *resetCmd) Run(env *Env) error {
	if !r.Yes {
		fmt.Fprint(env.Stderr, "This stops the node and the daemon, removes both node slots, the artifacts\n"+
			"and everything under /var/lib/unbounded, and undoes the host preparation.\n"+
			"/etc/unbounded stays. Type yes to reset this host: ")
		in := env.Stdin
		if in == nil {
			in = os.Stdin
		}
		line, _ := bufio.NewReader(in).ReadString('\n')
		if strings.TrimSpace(line) != "yes" {
			fmt.Fprintln(env.Stderr)
			return errNotConfirmed
		}
	}
	p := r.paths()
	args := []string{}
	if r.Root != "" {
		args = append(args, "--root", r.Root)
	}
	if r.KeepHandoff {
		args = append(args, "--keep-handoff")
	}
	run := env.RunConcern
	if run == nil {
		run = runConcern
	}
	code, err := run(p.Libexec("reset"), args, env.Stdout, env.Stderr)
	if err != nil {
		return fmt.Errorf("run %s: %w", p.Libexec("reset"), err)
	}
	if code != exitcode.OK {
		// The concern said why on stderr.
		return silentError{exitStatus(code)}
	}
	return nil
}

// exitStatus carries a concern's exit code through exitcode.For's
// classification.
type exitStatus int

func (e exitStatus) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

func (e exitStatus) Is(target error) bool {
	switch int(e) {
	case exitcode.NeedsRoot:
		return target == exitcode.ErrNeedsRoot
	case exitcode.ConfigInvalid:
		return target == exitcode.ErrConfigInvalid
	case exitcode.Deferred:
		return target == state.ErrOwned
	case exitcode.TempFail:
		return target == exitcode.ErrTemporary
	}
	return false
}

func runConcern(path string, args []string, stdout, stderr io.Writer) (int, error) {
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = stdout, stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode(), nil
	}
	return 0, err
}
