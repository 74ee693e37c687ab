// Package softreboot is the soft reboot of each mode's node stack, the body
// of the modes' Restart (lib/modes/nspawn, lib/modes/none), kept apart so
// that unbounded-restart (cmd/restart), which needs nothing else of a mode,
// stays a small binary (ARCHITECTURE section 3: under 5 MB without a
// Kubernetes client; the nspawn mode's image code alone would put it over).
// Restart says what a soft reboot does.
package softreboot

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/modes/facts"
)

// Units is the part of the service manager a soft reboot uses
// (lib/modes.Systemd and lib/units.Manager have it).
type Units interface {
	// RestartUnit queues a restart job (mode "replace") and waits for it;
	// an error names the unit and the job's result.
	RestartUnit(ctx context.Context, unit string) error
	// StopUnit queues a stop job and waits for it.
	StopUnit(ctx context.Context, unit string) error
}

// Restart soft-reboots the node stack of mode in slot, never the host: it
// restarts the slot's supervising units (facts.Supervising) in order,
// over D-Bus:
//   - nspawn: systemd-nspawn@<slot>.service. The machine shuts down
//     cleanly and boots again; the restart job finishes once it has booted
//     (NotifyReady=yes).
//   - none: unbounded-containerd.service, then unbounded-kubelet.service.
//     Pods keep running: containerd's unit has KillMode=process, so the
//     shims and their containers outlive it, and the kubelet adopts them.
//
// Each restart job also starts what the unit Requires=: the generator's
// drop-in makes that the allocation fence, which runs again (a oneshot
// without RemainAfterExit), so a soft reboot never starts a node the fence
// refuses.
//
// A unit whose restart fails leaves the whole node stack down: the units
// after it are stopped. Without that, a fence that refuses the restart of
// containerd (its restart job stops it, then the start fails on the fence)
// would leave the kubelet, which only Wants= containerd, running: a node
// the fence refused, half up. Stopping the kubelet stops no pod (they run
// under containerd's shims, as in a restart).
func Restart(ctx context.Context, sd Units, mode, slot string) error {
	if !hostpaths.ValidSlot(slot) {
		return fmt.Errorf("slot %q: must be one of %v", slot, hostpaths.Slots)
	}
	us := facts.Supervising(mode, slot)
	if len(us) == 0 {
		return fmt.Errorf("isolation mode %q has no node stack to restart in this release", mode)
	}
	for i, u := range us {
		if err := sd.RestartUnit(ctx, u); err != nil {
			err = fmt.Errorf("restart of the %s node stack of slot %s: %w", mode, slot, err)
			if ctx.Err() != nil {
				return err // stopped itself: whoever stopped it decides
			}
			for _, rest := range slices.Backward(us[i+1:]) {
				if serr := sd.StopUnit(ctx, rest); serr != nil {
					return fmt.Errorf("%w; and %s, which needs it, could not be stopped: %v", err, rest, serr)
				}
			}
			if len(us[i+1:]) > 0 {
				err = fmt.Errorf("%w; stopped %s too: the node stack stays down", err, strings.Join(us[i+1:], ", "))
			}
			return err
		}
	}
	return nil
}
