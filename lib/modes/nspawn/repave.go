package nspawn

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/modes"
	"unbounded-cloud.io/agent/lib/state"
	"unbounded-cloud.io/agent/lib/unitnames"
)

// stampName is the file in the slot's state directory
// (/var/lib/unbounded/slots/<slot>/) that says which input the slot was
// prepared from: Repave skips the build of a slot that lib/repave built
// already while the old node served.
const stampName = "prepared.sha256"

// inputSum is the SHA-256 of everything Prepare builds a slot from. The
// bootstrap token's bytes go into the sum, never into a file.
func inputSum(s modes.Slot) (string, error) {
	h := sha256.New()
	n := s.Node
	tok := sha256.Sum256([]byte(n.BootstrapToken.Reveal()))
	// The token marshals as "[redacted]"; its hash stands for it.
	data, err := json.Marshal(struct {
		Name  string
		Node  modes.Node
		Image modes.Image
		Token string
	}{s.Name, n, s.Image, hex.EncodeToString(tok[:])})
	if err != nil {
		return "", err
	}
	h.Write(data)
	for _, f := range []string{s.Artifacts.Kubelet, s.Artifacts.Containerd, s.Artifacts.Runc, s.Artifacts.CNIPlugins} {
		fi, err := os.Stat(f)
		if err != nil {
			return "", err
		}
		// The verified cache names files by their content; path, size
		// and time tell a different artifact without reading it again.
		fmt.Fprintf(h, "%s %d %d\n", f, fi.Size(), fi.ModTime().UnixNano())
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func (m *Mode) stamp(slot string) string { return filepath.Join(m.Paths.SlotDir(slot), stampName) }

// writeStamp records that slot was prepared from s.
func (m *Mode) writeStamp(s modes.Slot) error {
	sum, err := inputSum(s)
	if err != nil {
		return err
	}
	return state.WriteFileAtomic(m.stamp(s.Name), []byte(sum+"\n"), 0o600)
}

// prepared reports whether slot s.Name exists and was prepared from s.
func (m *Mode) prepared(s modes.Slot) bool {
	want, err := inputSum(s)
	if err != nil {
		return false
	}
	got, err := os.ReadFile(m.stamp(s.Name))
	if err != nil || strings.TrimSpace(string(got)) != want {
		return false
	}
	for _, p := range m.SlotPaths(s.Name) {
		if _, err := os.Stat(p); err != nil {
			return false
		}
	}
	return true
}

// DefaultStopTimeout bounds the stop of the old machine in a repave. The
// machine's own stop bound (StopConf, 10 s per unit) ends a pod that
// ignores SIGTERM; this ends a stop that hangs anyway.
const DefaultStopTimeout = 3 * time.Minute

// Repave replaces the node stack of slot running by s, blue/green
// (modes.Mode). Each step is idempotent and decided from what runs, so a
// call with the same arguments after a crash anywhere goes on from there:
//
//  1. slot s.Name is built from s unless it is already (lib/repave built
//     it while the old node served; the stamp says from which input);
//     "repave/after-new-built"
//  2. the old machine is stopped: systemd-nspawn@<running>.service's
//     stop powers the machine off, and its systemd stops the node's units
//     in reverse order (kubelet, which is After= containerd, first, then
//     containerd; pods' processes get the machine's stop bound) before
//     the machine ends; "repave/after-old-stopped"
//  3. the host networking the old stack left (CNI bridge, KUBE-* and CNI-*
//     iptables chains: the machine shares the host's network namespace)
//     is cleaned; "repave/after-network-cleaned"
//  4. h.Fence: the caller's step between the stacks (lib/repave deletes
//     the Node, then runs the allocation fence); a refusal stops here
//     with no node running (nothing starts without a fence that allowed
//     it); "repave/after-fence"
//  5. the new machine is started (systemd reloaded its settings in step
//     1, while the old node served); "repave/after-new-started"
//  6. h.Healthy waits for it, bounded; "repave/after-healthy".
//
// A new node that does not start or get healthy is rolled back: its
// machine stopped and its slot removed (Destroy, which checks every path
// gone), the networking cleaned again, the fence run again, the old
// machine started and waited for; the error says each of these and wraps
// modes.ErrRolledBack. A rollback that itself fails returns an error that
// does not wrap it and says what is left.
//
// A rerun finds: the new machine running (crash after 5): it goes on at
// 6; the new slot built and not running: from 2 (stopping a stopped
// machine is a no-op); no new slot (crash mid-build or mid-rollback): from 1.
func (m *Mode) Repave(ctx context.Context, running string, s modes.Slot, h modes.RepaveHooks) error {
	if !hostpaths.ValidSlot(running) {
		return fmt.Errorf("nspawn repave: running slot %q: must be one of %v", running, hostpaths.Slots)
	}
	if s.Name == running {
		return fmt.Errorf("nspawn repave: the new slot must be the other one than %s (blue/green)", running)
	}
	if err := h.Check(); err != nil {
		return fmt.Errorf("nspawn repave: %w", err)
	}
	if err := s.Check(); err != nil {
		return err
	}
	crash := h.Crash
	if crash == nil {
		crash = func(string) {}
	}
	sd, err := m.systemd(ctx)
	if err != nil {
		return err
	}
	defer sd.Close()
	newUnit := Unit(s.Name)
	st, err := sd.ActiveState(ctx, newUnit)
	if err != nil {
		return err
	}
	if !unitnames.Running(st) {
		if !m.prepared(s) {
			m.log().Info("building the new slot", "slot", s.Name)
			if err := m.Prepare(ctx, s); err != nil {
				return fmt.Errorf("nspawn repave: build slot %s: %w (slot %s still runs)", s.Name, err, running)
			}
		}
		// systemd loads the new slot's settings and drop-in now, while
		// the old node serves: the switch below only stops and starts.
		if err := sd.Reload(ctx); err != nil {
			return err
		}
		crash("repave/after-new-built")
		stopStart := time.Now()
		if err := m.stopMachine(ctx, sd, running); err != nil {
			return fmt.Errorf("nspawn repave: stop the old node: %w", err)
		}
		m.log().Info("old node stopped", "slot", running, "took", time.Since(stopStart).Round(time.Millisecond).String())
		crash("repave/after-old-stopped")
		m.cleanNetwork(ctx, running)
		crash("repave/after-network-cleaned")
		if err := h.Fence(ctx); err != nil {
			return fmt.Errorf("nspawn repave: before starting slot %s: %w; no node runs (slot %s stopped, slot %s built; a rerun tries again)", s.Name, err, running, s.Name)
		}
		crash("repave/after-fence")
		if err := sd.StartUnit(ctx, newUnit); err != nil {
			return m.rollback(ctx, sd, running, s.Name, h, fmt.Errorf("start of slot %s failed: %w", s.Name, err))
		}
		m.log().Info("new node started", "slot", s.Name, "old_stopped_ago", time.Since(stopStart).Round(time.Millisecond).String())
		crash("repave/after-new-started")
	} else {
		// A rerun after the new machine started: the old one was
		// stopped before it (step 2), but make sure.
		if err := m.stopMachine(ctx, sd, running); err != nil {
			return fmt.Errorf("nspawn repave: stop the old node: %w", err)
		}
	}
	if err := h.Healthy(ctx, s.Name); err != nil {
		return m.rollback(ctx, sd, running, s.Name, h, fmt.Errorf("slot %s did not become healthy: %w", s.Name, err))
	}
	crash("repave/after-healthy")
	return nil
}

// Stop stops the slot's machine, bounded, and cleans the host networking
// it left (see Repave, steps 2 and 3); the slot's files stay.
func (m *Mode) Stop(ctx context.Context, slot string) error {
	if !hostpaths.ValidSlot(slot) {
		return fmt.Errorf("slot %q: must be one of %v", slot, hostpaths.Slots)
	}
	sd, err := m.systemd(ctx)
	if err != nil {
		return err
	}
	defer sd.Close()
	if err := m.stopMachine(ctx, sd, slot); err != nil {
		return fmt.Errorf("stop slot %s: %w", slot, err)
	}
	m.cleanNetwork(ctx, slot)
	return nil
}

// stopMachine stops the slot's machine (see Repave, step 2), bounded.
func (m *Mode) stopMachine(ctx context.Context, sd modes.Systemd, slot string) error {
	st, err := sd.ActiveState(ctx, Unit(slot))
	if err != nil {
		return err
	}
	if st == "inactive" || st == "failed" || st == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, DefaultStopTimeout)
	defer cancel()
	return sd.StopUnit(ctx, Unit(slot))
}

// rollback undoes a switch that failed at cause (see Repave).
func (m *Mode) rollback(ctx context.Context, sd modes.Systemd, old, newSlot string, h modes.RepaveHooks, cause error) error {
	// A context that a SIGTERM or a timeout ended must still let the
	// rollback through.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Minute)
	defer cancel()
	m.log().Error("new node failed; rolling back", "new", newSlot, "old", old, "error", cause.Error())
	start := time.Now()
	if err := m.Destroy(ctx, newSlot); err != nil {
		return fmt.Errorf("nspawn repave: %w; rollback failed: slot %s not removed: %v (slot %s is stopped)", cause, newSlot, err, old)
	}
	if st, err := sd.ActiveState(ctx, Unit(newSlot)); err != nil || unitnames.Running(st) {
		return fmt.Errorf("nspawn repave: %w; rollback failed: %s is still %s after its removal (%v)", cause, Unit(newSlot), st, err)
	}
	m.cleanNetwork(ctx, newSlot)
	if err := h.Fence(ctx); err != nil {
		return fmt.Errorf("nspawn repave: %w; slot %s stopped and removed; rollback stopped before starting slot %s again: %v; no node runs", cause, newSlot, old, err)
	}
	if err := m.Start(ctx, old); err != nil {
		return fmt.Errorf("nspawn repave: %w; slot %s stopped and removed; rollback failed: slot %s did not start again: %v", cause, newSlot, old, err)
	}
	if err := h.Healthy(ctx, old); err != nil {
		return fmt.Errorf("nspawn repave: %w; slot %s stopped and removed; slot %s started again but is not healthy: %v", cause, newSlot, old, err)
	}
	m.log().Info("rolled back", "running", old, "removed", newSlot, "took", time.Since(start).Round(time.Millisecond).String())
	return fmt.Errorf("nspawn repave: %w; rolled back: slot %s stopped and removed (checked gone), slot %s started again and healthy: %w", cause, newSlot, old, modes.ErrRolledBack)
}
