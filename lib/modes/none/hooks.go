package none

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/state"
)

// versionFiles are what a complete version directory holds for the
// shipped units to run (ExecStart= and EnvironmentFile= of both).
var versionFiles = []string{"bin/kubelet", "bin/containerd", "etc/kubelet/kubelet.env", "etc/containerd/config.toml"}

// EnsureHooks makes what the running node's units are run from current
// without restarting anything. The none mode's hooks are the shipped
// units (unbounded-containerd.service, unbounded-kubelet.service), the
// generator's drop-ins on them (the fence) and the `current` version they
// run through; so it:
//   - removes what an interrupted build left in versions/ (temporary and
//     swapped-aside directories, a half-made link);
//   - checks that `current` points at a complete version directory (an
//     error naming what is missing otherwise, and nothing changed: the
//     units could not start again, it is no hook to make up, and
//     lifecycle's failure is what recovery reports);
//   - sets the live bridge CNI configuration from the version's copy when
//     it has one (a crash between the two writes of a flip);
//   - daemon-reloads, so that systemd runs the units and drop-ins as
//     installed now (a package upgrade, the generator's output).
//
// While a repave is unfinished (its journal, JournalName) only the reload
// is done: `current` and the CNI configuration are the repave's to finish
// or roll back. Otherwise, when the applied record of slot names the
// current version (the caller of a repave recorded it), the versions it
// superseded are removed (RemoveSuperseded), should the caller not have
// done it.
func (m *Mode) EnsureHooks(ctx context.Context, slot string) error {
	if !hostpaths.ValidSlot(slot) {
		return fmt.Errorf("slot %q: must be one of %v", slot, hostpaths.Slots)
	}
	var j repaveJournal
	open, err := state.ReadJournal(m.Paths, JournalName, &j)
	if err != nil {
		return fmt.Errorf("none lifecycle hooks of %s: %w", slot, err)
	}
	if open && j.unfinished() {
		m.log().Info("a repave is unfinished: current is left to it", "mode", "none", "step", j.Step, "old", j.Old, "new", j.New)
	} else {
		if err := m.ensureCurrent(); err != nil {
			return fmt.Errorf("none lifecycle hooks of %s: %w", slot, err)
		}
		// The caller recorded the current version: the ones it
		// superseded go (if the caller has not removed them).
		if cur, err := m.CurrentVersion(); err == nil && cur != "" {
			a, err := state.ReadApplied(m.Paths, slot)
			v, _, _ := strings.Cut(cur, "_")
			if err == nil && strings.TrimPrefix(a.KubernetesVersion, "v") == strings.TrimPrefix(v, "v") {
				if err := m.RemoveSuperseded(ctx); err != nil {
					return fmt.Errorf("none lifecycle hooks of %s: %w", slot, err)
				}
			}
		}
	}
	sd, err := m.systemd(ctx)
	if err != nil {
		return err
	}
	defer sd.Close()
	return sd.Reload(ctx)
}

func (m *Mode) ensureCurrent() error {
	versions := m.Paths.VersionsDir()
	if err := removeLeftovers(versions); err != nil {
		return err
	}
	cur, err := m.CurrentVersion()
	if err != nil {
		return err
	}
	if cur == "" {
		return fmt.Errorf("%s does not exist: no version of the node stack is installed, and the node cannot start from this record (a repave needs the running version; `unbounded reset --yes` and a new bootstrap install one)", filepath.Join(versions, "current"))
	}
	var missing []string
	for _, f := range versionFiles {
		if _, err := os.Stat(filepath.Join(m.VersionDir(cur), f)); err != nil {
			missing = append(missing, f)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("current points at version %s, which lacks %v", cur, missing)
	}
	if _, err := os.Stat(filepath.Join(m.VersionDir(cur), cniCopy)); err == nil {
		return m.setCNIConf(cur)
	} else if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}
