package nspawn

import (
	"context"

	"unbounded-cloud.io/agent/lib/modes"
	"unbounded-cloud.io/agent/lib/modes/bluegreen"
)

// DefaultStopTimeout bounds the stop of the old machine in a repave
// (bluegreen.DefaultStopTimeout).
const DefaultStopTimeout = bluegreen.DefaultStopTimeout

// writeStamp records that slot was prepared from s (bluegreen.WriteStamp).
func (m *Mode) writeStamp(s modes.Slot) error { return bluegreen.WriteStamp(m.Paths, m.Name(), s) }

// prepared reports whether slot s.Name exists and was prepared from s.
func (m *Mode) prepared(s modes.Slot) bool { return bluegreen.Prepared(m.Paths, m, s) }

// CleanNetwork cleans what the stopped node stack of slot left in the
// host's network namespace (bluegreen.CleanHostNetwork, with the iptables
// tools of the slot's machine); bluegreen.Slots.
func (m *Mode) CleanNetwork(ctx context.Context, slot string) {
	if m.NetworkCleaner != nil {
		m.NetworkCleaner(ctx, slot)
		return
	}
	bluegreen.CleanHostNetwork(ctx, m.log(), m.Paths.MachineDir, slot)
}

// Repave replaces the node stack of slot running by s, blue/green
// (modes.Mode): lib/modes/bluegreen.Repave's steps, with the machine of
// each slot as its node (systemd-nspawn@<slot>.service's stop powers the
// machine off; its systemd stops the node's units in reverse order).
func (m *Mode) Repave(ctx context.Context, running string, s modes.Slot, h modes.RepaveHooks) error {
	sd, err := m.systemd(ctx)
	if err != nil {
		return err
	}
	defer sd.Close()
	return bluegreen.Repave(ctx, m.Paths, m, sd, m.log(), running, s, h)
}

// Stop stops the slot's machine, bounded, and cleans the host networking
// it left (bluegreen.Stop); the slot's files stay.
func (m *Mode) Stop(ctx context.Context, slot string) error {
	sd, err := m.systemd(ctx)
	if err != nil {
		return err
	}
	defer sd.Close()
	return bluegreen.Stop(ctx, m, sd, slot)
}
