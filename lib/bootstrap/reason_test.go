package bootstrap

import (
	"errors"
	"fmt"
	"testing"

	"unbounded-cloud.io/agent/lib/artifacts"
	"unbounded-cloud.io/agent/lib/exitcode"
	"unbounded-cloud.io/agent/lib/modes/bluegreen/tree"
	"unbounded-cloud.io/agent/lib/steps"
)

// The Machine's status.bootstrap reason names the cause where one is
// known, else the phase.
func TestFailureReasonNamesTheCauseBeforeThePhase(t *testing.T) {
	for _, tc := range []struct {
		phase string
		err   error
		want  string
	}{
		{PhaseFence, fmt.Errorf("%w: exited 77", exitcode.ErrRefused), "AllocationLaunchRefused"},
		{PhaseArtifacts, errors.Join(&artifacts.MismatchError{Artifact: "kubelet"}), "ArtifactChecksumMismatch"},
		{PhaseSlot, fmt.Errorf("prepare slot kube1: node image r/x:1: %w: MANIFEST_UNKNOWN", tree.ErrImageNotFound), "NodeImageNotFound"},
		{PhaseSlot, errors.New("prepare slot kube1: node image r/x:1: not an image manifest"), "SlotPreparationFailed"},
		{PhaseArtifacts, artifacts.ErrNoChecksum, "ArtifactsFailed"},
		{PhaseConfig, fmt.Errorf("%w: agent.toml:3: key", exitcode.ErrConfigInvalid), "ConfigurationInvalid"},
	} {
		if got := reason(tc.phase, &steps.Error{Label: "phase", Step: tc.phase, Err: tc.err}); got != tc.want {
			t.Errorf("reason(%s, %v) = %s, want %s", tc.phase, tc.err, got, tc.want)
		}
	}
}
