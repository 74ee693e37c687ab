package fence

import (
	"context"
	"fmt"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/exitcode"
	"unbounded-cloud.io/agent/lib/unitnames"
	"unbounded-cloud.io/agent/lib/units"
)

// RunUnit starts unbounded-fence.service and waits for its verdict, for
// the operations that start a node outside the generator's wiring
// (bootstrap: no applied config yet; repave: the new slot): nil is
// allowed; a refusal wraps exitcode.ErrRefused (77), a config error
// exitcode.ErrConfigInvalid, a fence stopped before deciding
// exitcode.ErrTemporary.
func RunUnit(ctx context.Context, sd units.Manager) error {
	// A fence left failed by an earlier refusal would still start; this
	// only keeps `systemctl status` from showing the old failure as now.
	_ = sd.ResetFailed(ctx, unitnames.Fence)
	serr := sd.StartUnit(ctx, unitnames.Fence)
	if serr == nil {
		return nil
	}
	code, err := sd.ExecMainStatus(ctx, unitnames.Fence)
	if err != nil {
		return fmt.Errorf("%w (and its exit status: %v)", serr, err)
	}
	switch code {
	case exitcode.Refused:
		return fmt.Errorf("%w: %s exited %d (the Machine shows %s; journalctl -u %s says why)",
			exitcode.ErrRefused, unitnames.Fence, code, v1alpha3.ConditionAllocationLaunchRefused, unitnames.Fence)
	case exitcode.ConfigInvalid:
		return fmt.Errorf("%w: %s exited %d (journalctl -u %s names the file and key)",
			exitcode.ErrConfigInvalid, unitnames.Fence, code, unitnames.Fence)
	case exitcode.TempFail:
		return fmt.Errorf("%w: %s was stopped before a decision: %w", exitcode.ErrTemporary, unitnames.Fence, serr)
	}
	return fmt.Errorf("%s exited %d: %w", unitnames.Fence, code, serr)
}
