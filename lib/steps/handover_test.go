package steps_test

import (
	"context"
	"slices"
	"testing"

	"unbounded-cloud.io/agent/lib/steps"
	"unbounded-cloud.io/agent/lib/unitnames"
	"unbounded-cloud.io/agent/lib/units/unitstest"
)

// A hand-over reloads first (the generator wires the node from the
// record), then starts the node target, then the daemon, waiting for the
// one the caller's ordering allows and queueing the other.
func TestHandOverReloadsThenStartsTheNodeThenTheDaemonWaitingAsAsked(t *testing.T) {
	for _, c := range []struct {
		wait steps.Waited
		want []string
	}{
		{steps.WaitNeither, []string{"reload", "crash", "enqueue " + unitnames.NodeTarget, "enqueue " + unitnames.Daemon}},
		{steps.WaitNode, []string{"reload", "crash", "start " + unitnames.NodeTarget, "enqueue " + unitnames.Daemon}},
		{steps.WaitDaemon, []string{"reload", "crash", "enqueue " + unitnames.NodeTarget, "start " + unitnames.Daemon}},
	} {
		sd := &unitstest.Fake{}
		var calls []string
		if err := steps.HandOver(context.Background(), sd, c.wait, func() { sd.Calls = append(sd.Calls, "crash") }); err != nil {
			t.Fatal(err)
		}
		calls = sd.CallList()
		if !slices.Equal(calls, c.want) {
			t.Errorf("wait %d: %q, want %q", c.wait, calls, c.want)
		}
	}
}
