// Package bluegreen is the one blue/green repave of the isolation modes
// whose node stack runs in a slot of its own, supervised by one unit per
// slot (nspawn: systemd-nspawn@<slot>.service; container:
// unbounded-container@<slot>.service): build the other slot beside the
// running one, stop the old, fence, start the new, wait for it, roll back
// if it does not come up. Each such mode implements modes.Mode itself and
// calls Repave and Stop here with what differs (Slots): the step runner is
// written once. Both modes also clean the host networking a stopped node
// left with CleanHostNetwork (netclean.go), and build a slot's tree, the
// node's rootfs, with lib/modes/bluegreen/tree.
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
	"unbounded-cloud.io/agent/lib/modes/facts"
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

// Unit is the supervising unit of mode's slot (facts.Supervising:
// one unit per slot in a blue/green mode).
func Unit(mode, slot string) string { return facts.KubeletHost(mode, slot) }

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
// (modes.Mode.Repave), for mode m whose paths are p, on the one
// modes.Switch (which says the order, the crash points "repave/after-
// <step>", the rollback and how a rerun goes on):
//
//   - build: slot s.Name is built from s unless it is already (lib/repave
//     built it while the old node served; the stamp says from which
//     input), and systemd reloads its settings while the old node serves:
//     the switch then only stops and starts;
//   - the old node's stop is its supervising unit's stop, bounded: it
//     powers the node's systemd off, which stops the node's units in
//     reverse order (kubelet, which is After= containerd, first, then
//     containerd; pods' processes get the node's stop bound);
//   - the old node's cleaning is of the host networking its stack left
//     (CNI bridge, KUBE-* and CNI-* iptables chains: the node shares the
//     host's network namespace);
//   - the new node is started by its supervising unit; a rollback's
//     Destroy removes its slot and checks the unit is no longer running.
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
	newUnit := Unit(mode, s.Name)
	w := modes.Switch{
		What:      mode + " repave",
		Operation: "repave",
		Paths:     p,
		Old: modes.Side{
			Desc:  "slot " + running,
			Slot:  running,
			Stop:  func(ctx context.Context) error { return stopUnit(ctx, sd, Unit(mode, running)) },
			Clean: func(ctx context.Context) { m.CleanNetwork(ctx, running) },
			Start: func(ctx context.Context) error { return m.Start(ctx, running) },
		},
		New: modes.Side{
			Desc:  "slot " + s.Name,
			Slot:  s.Name,
			Start: func(ctx context.Context) error { return sd.StartUnit(ctx, newUnit) },
			Clean: func(ctx context.Context) { m.CleanNetwork(ctx, s.Name) },
			Destroy: func(ctx context.Context) error {
				if err := m.Destroy(ctx, s.Name); err != nil {
					return err
				}
				if st, err := sd.ActiveState(ctx, newUnit); err != nil || unitnames.Running(st) {
					return fmt.Errorf("%s is still %s after its removal (%v)", newUnit, st, err)
				}
				return nil
			},
		},
		Build: func(ctx context.Context) error {
			if !Prepared(p, m, s) {
				log.Info("building the new slot", "slot", s.Name)
				if err := m.Prepare(ctx, s); err != nil {
					return fmt.Errorf("%s repave: build slot %s: %w (slot %s still runs)", mode, s.Name, err, running)
				}
			}
			return sd.Reload(ctx)
		},
		NewRunning: func(ctx context.Context) (bool, error) {
			st, err := sd.ActiveState(ctx, newUnit)
			return unitnames.Running(st), err
		},
		Hooks: h,
		Log:   log,
	}
	return w.Run(ctx)
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
