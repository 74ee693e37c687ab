// Command restart is unbounded-restart, run by unbounded-restart.service:
// the soft reboot of the node stack in the active mode, never of the host
// (lib/restart). Started by an operator (`systemctl start
// unbounded-restart.service`), by the daemon for a Restart
// MachineOperation, or by unbounded-health after repeated failures.
//
// Its own small binary: no Kubernetes client, under 5 MB (ARCHITECTURE
// section 3), hence the standard library's flag package rather than kong.
// Exit 0: restarted and healthy; 1: failed (recovery reports it); 4: not
// root; 69: an installation owns the host; 77: the allocation fence
// refused the restarted node.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"

	"unbounded-cloud.io/agent/lib/concern/small"
	"unbounded-cloud.io/agent/lib/exitcode"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/modes/container/bundle"
	"unbounded-cloud.io/agent/lib/modes/nspawn/machinefile"
	"unbounded-cloud.io/agent/lib/modes/softreboot"
	"unbounded-cloud.io/agent/lib/restart"
	"unbounded-cloud.io/agent/lib/units"
)

func main() { os.Exit(run(os.Args[1:])) }

func run(args []string) int {
	cmd := small.New("restart", "Soft reboot of the node stack in the active mode; never the host (unbounded-restart.service).")
	timeout := cmd.Flags.Duration("timeout", restart.DefaultTimeout, "how long to wait for the node to be healthy after the restart")
	settle := cmd.Flags.Duration("settle", restart.DefaultSettle, "how long the node must stay healthy, on every check, before the restart counts as done")
	devicesOf := cmd.Flags.String("devices-of", "", "find the host devices of slot `SLOT`'s node again under its rules and rewrite its machine's settings file (or its container's config.json) when they changed, then exit (systemd-nspawn@SLOT.service and unbounded-container@SLOT.service run it before every start)")
	powerOffOf := cmd.Flags.String("poweroff-of", "", "power slot `SLOT`'s node machine off through its own logind, so that its kubelet ends the pods within their grace periods (graceful node shutdown), and wait until the machine's supervisor ($MAINPID) has exited, at most the kubelet's shutdownGracePeriod + 15 s; then exit (the ExecStop= of systemd-nspawn@SLOT.service and unbounded-container@SLOT.service)")
	if code, done := cmd.Parse(args); done {
		return code
	}
	if *powerOffOf != "" {
		if !hostpaths.ValidSlot(*powerOffOf) {
			return cmd.Usage(fmt.Sprintf("--poweroff-of: slot %q: must be one of %v", *powerOffOf, hostpaths.Slots))
		}
		return cmd.Run("it asks the machine's logind to power the machine off", func(ctx context.Context, _ units.Manager, log *slog.Logger) int {
			// The slot's node is an nspawn machine, or a container
			// where the slot holds a bundle (as --devices-of).
			rootfs := cmd.Paths().MachineDir(*powerOffOf)
			if _, err := os.Stat(filepath.Join(bundle.Dir(cmd.Paths(), *powerOffOf), bundle.ConfigFile)); err == nil {
				rootfs = filepath.Join(bundle.Dir(cmd.Paths(), *powerOffOf), bundle.RootfsDir)
			}
			grace, err := softreboot.ShutdownGrace(filepath.Join(rootfs, machinefile.KubeletConfig))
			if err != nil {
				log.Warn("restart: the kubelet's shutdownGracePeriod of slot " + *powerOffOf + " (the unit's stop signal powers the machine off): " + err.Error())
				return exitcode.Failed
			}
			pid, _ := strconv.Atoi(os.Getenv("MAINPID"))
			if err := softreboot.PowerOff(ctx, *powerOffOf, pid, grace, log); err != nil {
				log.Warn("restart: graceful poweroff (the unit's stop signal powers the machine off): " + err.Error())
				return exitcode.Failed
			}
			return 0
		})
	}
	if *devicesOf != "" {
		if !hostpaths.ValidSlot(*devicesOf) {
			return cmd.Usage(fmt.Sprintf("--devices-of: slot %q: must be one of %v", *devicesOf, hostpaths.Slots))
		}
		return cmd.Run("it reads /dev and rewrites the machine's settings file", func(_ context.Context, _ units.Manager, log *slog.Logger) int {
			// The slot's node is an nspawn machine, or a container
			// where the slot holds a bundle.
			refresh := machinefile.Refresh
			if _, err := os.Stat(filepath.Join(bundle.Dir(cmd.Paths(), *devicesOf), bundle.ConfigFile)); err == nil {
				refresh = bundle.Refresh
			}
			if err := refresh(cmd.Paths(), *devicesOf, log); err != nil {
				log.Error("restart: the host devices of slot " + *devicesOf + ": " + err.Error())
				return exitcode.Failed
			}
			return 0
		})
	}
	if *timeout <= 0 {
		return cmd.Usage("--timeout must be positive")
	}
	if *settle < 0 || *settle >= *timeout {
		return cmd.Usage("--settle must be at least 0 and shorter than --timeout")
	}
	if *settle == 0 {
		*settle = -1 // none; restart.Restart reads 0 as the default
	}
	return cmd.Run("it reads the agent's state and restarts units", func(ctx context.Context, sd units.Manager, log *slog.Logger) int {
		r := &restart.Restart{Paths: cmd.Paths(), Timeout: *timeout, Settle: *settle, Units: sd, Log: log}
		if err := r.Run(ctx); err != nil {
			if code := exitcode.For(err); code == exitcode.Deferred {
				return code
			}
			log.Error("restart: " + err.Error())
			return exitcode.For(err)
		}
		return 0
	})
}
