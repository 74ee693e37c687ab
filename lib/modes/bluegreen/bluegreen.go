// Package bluegreen is the one blue/green repave of the isolation modes
// whose node stack runs in a slot of its own, supervised by one unit per
// slot (nspawn: systemd-nspawn@<slot>.service; container:
// unbounded-container@<slot>.service): build the other slot beside the
// running one, stop the old, fence, start the new, wait for it, roll back
// if it does not come up. Each such mode implements modes.Mode itself and
// calls Repave and Stop here with what differs (Slots): the step runner is
// written once.
package bluegreen

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/modes"
	"unbounded-cloud.io/agent/lib/state"
	"unbounded-cloud.io/agent/lib/unitnames"
)

// Slots is what a blue/green mode gives the repave: its own operations
// (modes.Mode's) and what differs between such modes.
type Slots interface {
	Name() string
	Prepare(ctx context.Context, s modes.Slot) error
	Start(ctx context.Context, slot string) error
	Destroy(ctx context.Context, slot string) error
	// SlotPaths lists everything Prepare writes for slot: a slot is
	// prepared only while each exists.
	SlotPaths(slot string) []string
	// CleanNetwork cleans what the stopped node stack of slot left in
	// the host's network namespace (best effort, logged).
	CleanNetwork(ctx context.Context, slot string)
}

// Unit is the supervising unit of mode's slot (unitnames.Supervising:
// one unit per slot in a blue/green mode).
func Unit(mode, slot string) string { return unitnames.KubeletHost(mode, slot) }

// StampName is the file in the slot's state directory
// (/var/lib/unbounded/slots/<slot>/) that says which input the slot was
// prepared from: Repave skips the build of a slot that lib/repave built
// already while the old node served.
const StampName = "prepared.sha256"

// inputSum is the SHA-256 of everything Prepare builds a slot from. The
// bootstrap token's bytes go into the sum, never into a file.
func inputSum(mode string, s modes.Slot) (string, error) {
	h := sha256.New()
	n := s.Node
	tok := sha256.Sum256([]byte(n.BootstrapToken.Reveal()))
	// The token marshals as "[redacted]"; its hash stands for it.
	data, err := json.Marshal(struct {
		Mode  string
		Name  string
		Node  modes.Node
		Image modes.Image
		Token string
	}{mode, s.Name, n, s.Image, hex.EncodeToString(tok[:])})
	if err != nil {
		return "", err
	}
	h.Write(data)
	for _, f := range []string{s.Artifacts.Kubelet, s.Artifacts.Containerd, s.Artifacts.Runc, s.Artifacts.CNIPlugins, s.Artifacts.CoreDNS} {
		if f == "" {
			continue
		}
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

func stamp(p hostpaths.Paths, slot string) string { return filepath.Join(p.SlotDir(slot), StampName) }

// WriteStamp records that slot s.Name of mode was prepared from s: the
// last step of a Prepare.
func WriteStamp(p hostpaths.Paths, mode string, s modes.Slot) error {
	sum, err := inputSum(mode, s)
	if err != nil {
		return err
	}
	return state.WriteFileAtomic(stamp(p, s.Name), []byte(sum+"\n"), 0o600)
}

// Prepared reports whether slot s.Name of m exists and was prepared from s.
func Prepared(p hostpaths.Paths, m Slots, s modes.Slot) bool {
	want, err := inputSum(m.Name(), s)
	if err != nil {
		return false
	}
	got, err := os.ReadFile(stamp(p, s.Name))
	if err != nil || strings.TrimSpace(string(got)) != want {
		return false
	}
	for _, f := range m.SlotPaths(s.Name) {
		if _, err := os.Stat(f); err != nil {
			return false
		}
	}
	return true
}

// DefaultStopTimeout bounds the stop of the old node in a repave. The
// node's own stop bound (10 s per unit in its systemd) ends a pod that
// ignores SIGTERM; this ends a stop that hangs anyway.
const DefaultStopTimeout = 3 * time.Minute

// Repave replaces the node stack of slot running by s, blue/green
// (modes.Mode.Repave), for mode m whose paths are p. Each step is
// idempotent and decided from what runs, so a call with the same
// arguments after a crash anywhere goes on from there:
//
//  1. slot s.Name is built from s unless it is already (lib/repave built
//     it while the old node served; the stamp says from which input);
//     "repave/after-new-built"
//  2. the old node is stopped: its supervising unit's stop powers the
//     node's systemd off, which stops the node's units in reverse order
//     (kubelet, which is After= containerd, first, then containerd; pods'
//     processes get the node's stop bound) before it ends;
//     "repave/after-old-stopped"
//  3. the host networking the old stack left (CNI bridge, KUBE-* and CNI-*
//     iptables chains: the node shares the host's network namespace) is
//     cleaned; "repave/after-network-cleaned"
//  4. h.Fence: the caller's step between the stacks (lib/repave deletes
//     the Node, then runs the allocation fence); a refusal stops here
//     with no node running (nothing starts without a fence that allowed
//     it); "repave/after-fence"
//  5. the new node is started (systemd reloaded its settings in step 1,
//     while the old node served); "repave/after-new-started"
//  6. h.Healthy waits for it, bounded; "repave/after-healthy".
//
// A new node that does not start or get healthy is rolled back: its unit
// stopped and its slot removed (Destroy, which checks every path gone),
// the networking cleaned again, the fence run again, the old node started
// and waited for; the error says each of these and wraps
// modes.ErrRolledBack. A rollback that itself fails returns an error that
// does not wrap it and says what is left.
//
// A rerun finds: the new node running (crash after 5): it goes on at 6;
// the new slot built and not running: from 2 (stopping a stopped unit is
// a no-op); no new slot (crash mid-build or mid-rollback): from 1.
func Repave(ctx context.Context, p hostpaths.Paths, m Slots, sd modes.Systemd, log *slog.Logger, running string, s modes.Slot, h modes.RepaveHooks) error {
	mode := m.Name()
	if !hostpaths.ValidSlot(running) {
		return fmt.Errorf("%s repave: running slot %q: must be one of %v", mode, running, hostpaths.Slots)
	}
	if s.Name == running {
		return fmt.Errorf("%s repave: the new slot must be the other one than %s (blue/green)", mode, running)
	}
	if err := h.Check(); err != nil {
		return fmt.Errorf("%s repave: %w", mode, err)
	}
	if err := s.Check(); err != nil {
		return err
	}
	crash := h.Crash
	if crash == nil {
		crash = func(string) {}
	}
	newUnit := Unit(mode, s.Name)
	st, err := sd.ActiveState(ctx, newUnit)
	if err != nil {
		return err
	}
	if !unitnames.Running(st) {
		if !Prepared(p, m, s) {
			log.Info("building the new slot", "slot", s.Name)
			if err := m.Prepare(ctx, s); err != nil {
				return fmt.Errorf("%s repave: build slot %s: %w (slot %s still runs)", mode, s.Name, err, running)
			}
		}
		// systemd loads the new slot's settings now, while the old node
		// serves: the switch below only stops and starts.
		if err := sd.Reload(ctx); err != nil {
			return err
		}
		crash("repave/after-new-built")
		stopStart := time.Now()
		if err := stopUnit(ctx, sd, Unit(mode, running)); err != nil {
			return fmt.Errorf("%s repave: stop the old node: %w", mode, err)
		}
		log.Info("old node stopped", "slot", running, "took", time.Since(stopStart).Round(time.Millisecond).String())
		crash("repave/after-old-stopped")
		m.CleanNetwork(ctx, running)
		crash("repave/after-network-cleaned")
		if err := h.Fence(ctx); err != nil {
			return fmt.Errorf("%s repave: before starting slot %s: %w; no node runs (slot %s stopped, slot %s built; a rerun tries again)", mode, s.Name, err, running, s.Name)
		}
		crash("repave/after-fence")
		if err := sd.StartUnit(ctx, newUnit); err != nil {
			return rollback(ctx, m, sd, log, running, s.Name, h, fmt.Errorf("start of slot %s failed: %w", s.Name, err))
		}
		log.Info("new node started", "slot", s.Name, "old_stopped_ago", time.Since(stopStart).Round(time.Millisecond).String())
		crash("repave/after-new-started")
	} else {
		// A rerun after the new node started: the old one was stopped
		// before it (step 2), but make sure.
		if err := stopUnit(ctx, sd, Unit(mode, running)); err != nil {
			return fmt.Errorf("%s repave: stop the old node: %w", mode, err)
		}
	}
	if err := h.Healthy(ctx, s.Name); err != nil {
		return rollback(ctx, m, sd, log, running, s.Name, h, fmt.Errorf("slot %s did not become healthy: %w", s.Name, err))
	}
	crash("repave/after-healthy")
	return nil
}

// Stop stops the slot's node, bounded, and cleans the host networking it
// left (see Repave, steps 2 and 3); the slot's files stay.
func Stop(ctx context.Context, m Slots, sd modes.Systemd, slot string) error {
	if !hostpaths.ValidSlot(slot) {
		return fmt.Errorf("slot %q: must be one of %v", slot, hostpaths.Slots)
	}
	if err := stopUnit(ctx, sd, Unit(m.Name(), slot)); err != nil {
		return fmt.Errorf("stop slot %s: %w", slot, err)
	}
	m.CleanNetwork(ctx, slot)
	return nil
}

// stopUnit stops a slot's supervising unit (see Repave, step 2), bounded.
func stopUnit(ctx context.Context, sd modes.Systemd, unit string) error {
	st, err := sd.ActiveState(ctx, unit)
	if err != nil {
		return err
	}
	if st == "inactive" || st == "failed" || st == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, DefaultStopTimeout)
	defer cancel()
	return sd.StopUnit(ctx, unit)
}

// rollback undoes a switch that failed at cause (see Repave).
func rollback(ctx context.Context, m Slots, sd modes.Systemd, log *slog.Logger, old, newSlot string, h modes.RepaveHooks, cause error) error {
	mode := m.Name()
	// A context that a SIGTERM or a timeout ended must still let the
	// rollback through.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Minute)
	defer cancel()
	log.Error("new node failed; rolling back", "new", newSlot, "old", old, "error", cause.Error())
	start := time.Now()
	if err := m.Destroy(ctx, newSlot); err != nil {
		return fmt.Errorf("%s repave: %w; rollback failed: slot %s not removed: %v (slot %s is stopped)", mode, cause, newSlot, err, old)
	}
	if st, err := sd.ActiveState(ctx, Unit(mode, newSlot)); err != nil || unitnames.Running(st) {
		return fmt.Errorf("%s repave: %w; rollback failed: %s is still %s after its removal (%v)", mode, cause, Unit(mode, newSlot), st, err)
	}
	m.CleanNetwork(ctx, newSlot)
	if err := h.Fence(ctx); err != nil {
		return fmt.Errorf("%s repave: %w; slot %s stopped and removed; rollback stopped before starting slot %s again: %v; no node runs", mode, cause, newSlot, old, err)
	}
	if err := m.Start(ctx, old); err != nil {
		return fmt.Errorf("%s repave: %w; slot %s stopped and removed; rollback failed: slot %s did not start again: %v", mode, cause, newSlot, old, err)
	}
	if err := h.Healthy(ctx, old); err != nil {
		return fmt.Errorf("%s repave: %w; slot %s stopped and removed; slot %s started again but is not healthy: %v", mode, cause, newSlot, old, err)
	}
	log.Info("rolled back", "running", old, "removed", newSlot, "took", time.Since(start).Round(time.Millisecond).String())
	return fmt.Errorf("%s repave: %w; rolled back: slot %s stopped and removed (checked gone), slot %s started again and healthy: %w", mode, cause, newSlot, old, modes.ErrRolledBack)
}
