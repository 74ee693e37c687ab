// Package adopt takes over a host that the older agent (Azure/unbounded's
// cmd/agent) installed: its node keeps running, without a restart, and
// from then on this agent manages it (ARCHITECTURE sections 4 and 6, the
// host-root migration). unbounded-lifecycle.service runs it before the
// daemon; every one-shot that changes the host and can write where it
// writes (bootstrap, repave, upgrade) runs it before it resolves a path;
// those that cannot (restart, recover, the daemon: their sandboxes keep
// them off /usr/local and /etc/unbounded) defer while it is pending
// (state.CheckAdopted).
//
// The older layout (lib/hostpaths' Legacy*): applied configs
// /etc/unbounded/agent/<slot>-applied-config.json with a bare-hex
// .sha256 sidecar, in the older agent's own format (its AgentConfig, the
// bootstrap token inline); its binary and self-upgrade links under
// /usr/local/bin; its daemon's unit and the recovery unit and script
// that roll that daemon back to its last good binary; `machinectl
// enable` of the node machine. The formats differ, so the record is
// converted (legacy.go: what maps where, and what is refused), never
// linked: the converted record is written into the host root beside the
// older one, and the older one is removed only once nothing can roll back
// to the older agent any more (its units stopped, disabled and removed,
// its binaries gone).
//
// Steps, on lib/steps (journal /var/lib/unbounded/journal/adopt.json,
// crash points adopt/after-<step>), under the installation lock (owner
// "adopt", resumed by unbounded-lifecycle.service):
//
//	lock         the lock, journaled with the plan (slot, machine, the
//	             older records) before anything changes
//	record       this agent's applied config of the slot, converted
//	             (atomic, SHA-256 sidecar, 0600)
//	older-units  the older units' files and enablement links removed,
//	             daemon-reload, then the recovery unit and the daemon
//	             stopped (in that order, and after their files went: a
//	             daemon that fails as it stops can start no rollback)
//	older-files  the older binaries and links, the machine's enablement,
//	             then the older state directory, its applied configs last
//	adopted      the adoption record (hostpaths' Adopted, for `unbounded
//	             status`); the journal goes
//
// then the lock is released (adopt/after-release) and the node handed
// over as a bootstrap does: daemon-reload (the generator now sees this
// agent's record and wires the node target and the fence), the node
// target and the daemon queued. The node machine is never stopped or
// restarted: starting the node target over a running slot starts nothing
// that runs.
//
// Before the lock nothing is changed: an older record this agent cannot
// take over (a key it does not know, an exec credential, another Node
// name, another cluster than the configuration's) is an error naming the
// file and the key (exit 78), and the older agent keeps its node.
package adopt

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"unbounded-cloud.io/agent/lib/config"
	"unbounded-cloud.io/agent/lib/crashpoint"
	"unbounded-cloud.io/agent/lib/exitcode"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/modes/facts"
	"unbounded-cloud.io/agent/lib/state"
	"unbounded-cloud.io/agent/lib/steps"
	"unbounded-cloud.io/agent/lib/unitnames"
	"unbounded-cloud.io/agent/lib/units"
)

// Operation names the journal, the crash points and the lock's owner.
const Operation = "adopt"

// Unit resumes an interrupted adoption: the ownership record names it,
// and the generator pulls it in at boot while the lock is held.
const Unit = unitnames.Lifecycle

// The steps, in order.
const (
	StepLock       = "lock"
	StepRecord     = "record"
	StepOlderUnits = "older-units"
	StepOlderFiles = "older-files"
	StepAdopted    = "adopted"
)

// CrashAfterRelease is the crash point between the lock's release and
// the handover.
const CrashAfterRelease = Operation + "/after-release"

// CrashPoints are the adoption's crash points in the order a run reaches
// them.
var CrashPoints = func() []string {
	var out []string
	for _, s := range []string{StepLock, StepRecord, StepOlderUnits, StepOlderFiles, StepAdopted} {
		out = append(out, steps.CrashPoint(Operation, s))
	}
	return append(out, CrashAfterRelease)
}()

// Journal is what an adoption keeps between runs: the plan, fixed at the
// lock, and the steps done.
type Journal struct {
	Slot    string   `json:"slot"`
	Machine string   `json:"machine"`
	From    []string `json:"from"`
	steps.Record
}

// Adopt adopts an older agent's host. The zero value of every field but
// Paths is the real host.
type Adopt struct {
	// Host is the host's seams (paths, service manager, notify, crash
	// point, clock, logger); its zero value but Paths is the real host.
	steps.Host
}

// Pending says whether there is anything to adopt or to finish: an older
// agent's applied config, an adoption's journal, or its lock. It only
// reads; commands call Run, which starts with it.
func Pending(p hostpaths.Paths) (bool, error) {
	if len(state.LegacyAppliedConfigs(p)) > 0 {
		return true, nil
	}
	if _, err := os.Lstat(p.Journal(Operation)); err == nil {
		return true, nil
	}
	own, err := state.ReadOwnership(p)
	if own != nil && err == nil && own.Owner == Operation {
		return true, nil
	}
	return false, nil
}

// Run adopts the host, resumes an interrupted adoption, or returns nil at
// once on a host with nothing to adopt. Its error maps to the exit code
// with exitcode.For: 78 for an older record it cannot take over (nothing
// changed), 69 when another installation owns the host.
func (a *Adopt) Run(ctx context.Context) error {
	if pending, err := Pending(a.Paths); err != nil || !pending {
		return err
	}
	var j Journal
	resumed, err := state.ReadJournal(a.Paths, Operation, &j)
	if err != nil {
		return fmt.Errorf("adoption journal: %w", err)
	}
	var rec *state.AppliedConfig
	if !resumed || !j.IsDone(StepRecord) {
		if len(state.LegacyAppliedConfigs(a.Paths)) > 0 {
			a.Status("adopting the older agent's node: reading %s", strings.Join(state.LegacyAppliedConfigs(a.Paths), ", "))
			var from []string
			if rec, from, err = a.plan(ctx, resumed); err != nil {
				// Nothing of this run changed the host.
				return err
			}
			j.Slot, j.Machine, j.From = rec.Slot, rec.Machine, from
		} else if resumed {
			return fmt.Errorf("%w: adoption journal %s: step %s is not done and the older agent's applied config is gone", state.ErrCorrupt, a.Paths.Journal(Operation), StepRecord)
		}
	}
	lock, err := state.AcquireOwnership(a.Paths, Operation, Unit)
	if err != nil {
		return err
	}
	if j.Slot != "" {
		if err := a.steps(ctx, &j, rec); err != nil {
			if werr := state.WriteJournal(a.Paths, Operation, &j); werr != nil {
				a.Logger().Error("adoption journal not written", "error", werr.Error())
			}
			lock.Release()
			return err
		}
	}
	// Else a run cut after its journal went and before the lock's
	// release: what is left is the release and the handover.
	if err := lock.Release(); err != nil {
		return fmt.Errorf("release the ownership lock: %w", err)
	}
	crashpoint.Via(a.CrashPoint, CrashAfterRelease)
	return a.handOver(ctx)
}

// plan reads the older agent's records and the operator's configuration,
// checks that the node can be taken over, and returns this agent's
// record of it and the older records it comes from (host paths). It
// changes nothing. resumed: an adoption of this host is journaled, so a
// record of this agent's is the adoption's own, not a second layout.
func (a *Adopt) plan(ctx context.Context, resumed bool) (*state.AppliedConfig, []string, error) {
	p := a.Paths
	type found struct {
		slot, file string
		data       []byte
		mtime      time.Time
	}
	var recs []found
	for _, slot := range hostpaths.Slots {
		data, noSidecar, err := state.ReadLegacyApplied(p, slot)
		file := p.Rel(p.LegacyAppliedConfig(slot))
		switch {
		case errors.Is(err, os.ErrNotExist):
			continue
		case err != nil:
			return nil, nil, fmt.Errorf("the older agent's applied config: %w", err)
		}
		if noSidecar {
			a.Logger().Warn("the older agent's applied config has no checksum sidecar (the older agent accepted that too); taken as it is", "file", file)
		}
		fi, err := os.Stat(p.LegacyAppliedConfig(slot))
		if err != nil {
			return nil, nil, err
		}
		recs = append(recs, found{slot: slot, file: file, data: data, mtime: fi.ModTime().UTC()})
	}
	var from []string
	for _, r := range recs {
		from = append(from, r.file)
	}
	if len(recs) == 0 {
		return nil, nil, errors.New("no older agent's applied config left to adopt")
	}
	pick := recs[0]
	if len(recs) > 1 {
		slot, err := a.runningSlot(ctx, from)
		if err != nil {
			return nil, nil, err
		}
		pick = recs[slices.IndexFunc(recs, func(r found) bool { return r.slot == slot })]
	}
	lc, err := decodeLegacy(pick.file, pick.data)
	if err != nil {
		return nil, nil, err
	}
	if _, err := os.Stat(p.MachineDir(pick.slot)); err != nil {
		return nil, nil, fmt.Errorf("%s names slot %s, whose machine is not on this host: %w", pick.file, pick.slot, err)
	}
	cfg, err := config.Load(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil, fmt.Errorf("%w: adopting the older agent's node (%s) needs this agent's configuration, and %s is missing: nothing was changed, the older agent keeps the node",
			exitcode.ErrConfigInvalid, pick.file, hostpaths.ConfigFileHost)
	}
	if err != nil {
		return nil, nil, err
	}
	if err := check(pick.file, lc, cfg, hostpaths.ConfigFileHost); err != nil {
		return nil, nil, err
	}
	if !resumed {
		for _, slot := range hostpaths.Slots {
			if _, err := state.ReadApplied(p, slot); !errors.Is(err, os.ErrNotExist) {
				return nil, nil, fmt.Errorf("this agent's applied config %s is on the host beside the older agent's %s: both layouts hold a node, and neither is taken for the other's (reset the host with unbounded reset, then bootstrap it)",
					p.Rel(p.AppliedConfig(slot)), strings.Join(from, ", "))
			}
		}
	}
	data, version := effective(lc, cfg)
	return &state.AppliedConfig{
		Slot: pick.slot, Mode: "nspawn", Machine: lc.MachineName, KubernetesVersion: version,
		AppliedAt: pick.mtime, Config: data,
	}, from, nil
}

// runningSlot is the slot whose machine runs when the older agent left a
// record for each (it recorded the new slot of its repave before it
// removed the old one's).
func (a *Adopt) runningSlot(ctx context.Context, files []string) (string, error) {
	sd, err := a.Manager(ctx)
	if err != nil {
		return "", err
	}
	defer sd.Close()
	var running []string
	for _, slot := range hostpaths.Slots {
		st, err := sd.ActiveState(ctx, facts.Supervising("nspawn", slot)[0])
		if err != nil {
			return "", err
		}
		if unitnames.Running(st) {
			running = append(running, slot)
		}
	}
	if len(running) != 1 {
		return "", fmt.Errorf("the older agent left an applied config for both slots (%s) and %d of their machines run: cannot tell which node to adopt (reset the host, or stop the machine that is not the node)",
			strings.Join(files, ", "), len(running))
	}
	return running[0], nil
}

// steps runs the steps not done yet.
func (a *Adopt) steps(ctx context.Context, j *Journal, rec *state.AppliedConfig) error {
	var sd units.Manager
	manager := func(ctx context.Context) (units.Manager, error) {
		if sd != nil {
			return sd, nil
		}
		var err error
		sd, err = a.Manager(ctx)
		return sd, err
	}
	defer func() {
		if sd != nil {
			sd.Close()
		}
	}()
	run := a.Runner(Operation, j)
	return run.Run(ctx, []steps.Step{
		// Taken in Run; journaled with the plan before anything changes.
		{Name: StepLock},
		{Name: StepRecord, Status: fmt.Sprintf("recording slot %s (machine %s) as this agent's applied config", j.Slot, j.Machine),
			Run: func(context.Context) error { return state.WriteApplied(a.Paths, rec) }},
		{Name: StepOlderUnits, Status: "stopping, disabling and removing " + strings.Join(unitnames.Legacy, " and "),
			Run: func(ctx context.Context) error {
				sd, err := manager(ctx)
				if err != nil {
					return err
				}
				return RetireOlderUnits(ctx, a.Paths, sd, a.Logger())
			}},
		{Name: StepOlderFiles, Status: "removing the older agent's binaries and its state directory " + hostpaths.LegacyStateDirHost,
			Run: func(context.Context) error { return RemoveOlderFiles(a.Paths, a.Logger()) }},
		{Name: StepAdopted, Final: true, Status: "recording the adoption",
			Run: func(context.Context) error {
				return state.WriteAdopted(a.Paths, &state.Adopted{Slot: j.Slot, Machine: j.Machine, From: j.From, At: a.Time().UTC()})
			}},
	})
}

// handOver hands the adopted node to systemd as bootstrap does, without
// waiting for anything: this may run in unbounded-lifecycle.service,
// which the daemon's start waits for.
func (a *Adopt) handOver(ctx context.Context) error {
	a.Status("adopted: daemon-reload, queueing %s and %s (the node keeps running)", unitnames.NodeTarget, unitnames.Daemon)
	sd, err := a.Manager(ctx)
	if err != nil {
		return err
	}
	defer sd.Close()
	return steps.HandOver(ctx, sd, steps.WaitNeither, nil)
}

// RetireOlderUnits stops, disables and removes the older agent's units:
// their files, drop-in directories and enablement links go first and
// systemd reloads, then the recovery unit and the daemon are stopped and
// their failed state forgotten. In this order a daemon that fails as it
// stops finds no recovery unit to roll it back and restart it. Each part
// is idempotent; reset calls it too.
func RetireOlderUnits(ctx context.Context, p hostpaths.Paths, sd units.Manager, log *slog.Logger) error {
	etc := p.Join(hostpaths.UnitDirEtcHost)
	var gone []string
	for _, u := range unitnames.Legacy {
		links, err := enablementLinks(etc, u)
		if err != nil {
			return err
		}
		for _, f := range append(links, filepath.Join(etc, u)) {
			if err := os.Remove(f); err == nil {
				gone = append(gone, p.Rel(f))
			} else if !os.IsNotExist(err) {
				return err
			}
		}
		if err := os.RemoveAll(filepath.Join(etc, u+".d")); err != nil {
			return err
		}
	}
	if err := state.SyncDir(etc); err != nil && !os.IsNotExist(err) {
		return err
	}
	if len(gone) > 0 {
		log.Info("the older agent's units disabled and removed", "removed", strings.Join(gone, " "))
	}
	states := map[string]string{}
	for _, u := range unitnames.Legacy {
		st, err := sd.ActiveState(ctx, u)
		if err != nil {
			return err
		}
		states[u] = st
	}
	running := func(u string) bool { return states[u] != "inactive" && states[u] != "failed" }
	// Reloaded before any stop, also in a run that finds the files gone
	// already (one cut before its reload): until systemd reloads, it
	// still knows the recovery unit and would start it. A host with
	// nothing of the older agent's is not reloaded for nothing.
	if len(gone) > 0 || slices.ContainsFunc(unitnames.Legacy, running) {
		if err := sd.Reload(ctx); err != nil {
			return err
		}
	}
	for _, u := range unitnames.Legacy {
		if running(u) {
			if err := sd.StopUnit(ctx, u); err != nil {
				return fmt.Errorf("stop the older agent's %s: %w", u, err)
			}
			log.Info("the older agent's unit stopped", "unit", u)
		}
		if err := sd.ResetFailed(ctx, u); err != nil {
			return err
		}
	}
	return nil
}

// enablementLinks are the links to unit in the .wants, .requires and
// .upholds directories of dir (what `systemctl enable` made of its
// [Install] section).
func enablementLinks(dir, unit string) ([]string, error) {
	var out []string
	for _, kind := range []string{"wants", "requires", "upholds"} {
		m, err := filepath.Glob(filepath.Join(dir, "*."+kind, unit))
		if err != nil {
			return nil, err
		}
		out = append(out, m...)
	}
	return out, nil
}

// RemoveOlderFiles removes the older agent's files but its units
// (RetireOlderUnits): its binaries and links under /usr/local/bin, the
// enablement of its node machines (machines.target wants them: this
// agent's generator starts the node, behind the fence), and its state
// directory, the applied configs last, each before its sidecar, so that
// until the end the host still reads as the older agent's. Idempotent;
// reset calls it too.
func RemoveOlderFiles(p hostpaths.Paths, log *slog.Logger) error {
	var files []string
	for _, b := range hostpaths.LegacyBinaries {
		files = append(files, filepath.Join(p.Join(hostpaths.LegacyBinDirHost), b))
	}
	for _, slot := range hostpaths.Slots {
		files = append(files, p.LegacyMachineWants(slot))
	}
	var gone []string
	remove := func(f string) error {
		if err := os.Remove(f); err == nil {
			gone = append(gone, p.Rel(f))
		} else if !os.IsNotExist(err) {
			return err
		}
		return nil
	}
	for _, f := range files {
		if err := remove(f); err != nil {
			return err
		}
	}
	// Durable before the older state goes: a power cut must not bring a
	// binary back once its record is gone.
	for _, d := range []string{p.Join(hostpaths.LegacyBinDirHost), filepath.Dir(p.LegacyMachineWants(hostpaths.Slots[0]))} {
		if err := state.SyncDir(d); err != nil && !os.IsNotExist(err) {
			return err
		}
	}
	dir := p.LegacyStateDir()
	var records []string
	for _, slot := range hostpaths.Slots {
		records = append(records, p.LegacyAppliedConfig(slot), hostpaths.Checksum(p.LegacyAppliedConfig(slot)))
	}
	entries, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	for _, e := range entries {
		f := filepath.Join(dir, e.Name())
		if slices.Contains(records, f) {
			continue
		}
		if err := os.RemoveAll(f); err != nil {
			return err
		}
		gone = append(gone, p.Rel(f))
	}
	if len(entries) > 0 {
		if err := state.SyncDir(dir); err != nil {
			return err
		}
	}
	for _, f := range records {
		if err := remove(f); err != nil {
			return err
		}
	}
	if err := os.Remove(dir); err != nil && !os.IsNotExist(err) {
		return err
	}
	if err := state.SyncDir(filepath.Dir(dir)); err != nil && !os.IsNotExist(err) {
		return err
	}
	if len(gone) > 0 {
		log.Info("the older agent's files removed", "removed", strings.Join(gone, " "))
	}
	return nil
}
