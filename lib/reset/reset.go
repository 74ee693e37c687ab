// Package reset removes the agent's node and state from a host
// (unbounded-reset.service, `unbounded reset`, ARCHITECTURE section 6),
// leaving the operator's /etc/unbounded and the package itself.
//
// Steps, in order; each idempotent and done again in every run, each
// followed by a crash point "reset/after-<step>" (lib/crashpoint), so
// that a rerun after a crash or a reboot ends where an uninterrupted run
// does. From the lock on they run on lib/steps: shown as STATUS= and
// journaled, so that `unbounded status` says where a reset got to:
//
//	daemon    unbounded-daemon.service stopped first (it would start
//	          units for the cluster while the node goes away), and a
//	          running bootstrap, the health timer, a restart and
//	          lifecycle with it (stoppedFirst); on a host the older
//	          agent installed, its daemon and recovery units stopped,
//	          disabled and removed (lib/adopt)
//	lock      the ownership lock taken (a record left by an interrupted
//	          bootstrap is superseded: reset is how an operator gets out
//	          of a half-bootstrapped host); the generator then pulls in no
//	          node and no daemon, and resumes this unit after a reboot
//	node      unbounded-node.target stopped, and both slots destroyed in
//	          every mode the host shows evidence of (an applied config, the
//	          bootstrap journal, the mode's own files: modes.Mode.Installed): the mode stops the supervising units,
//	          removes the slot's rootfs or versions, its settings and
//	          drop-ins, and checks that they are gone
//	hostprep  the recorded host preparation undone, exactly (lib/hostprep
//	          Undo: what someone changed since is left and logged)
//	state     the artifact cache, journals, applied configs, certificates
//	          and every other file under /var/lib/unbounded removed (but
//	          the operator's pre-staged offline directory), then
//	          the reprovision handoff directory unless KeepHandoff, and
//	          the older agent's binaries and /etc/unbounded/agent; the
//	          ownership record goes last (the lock's release), then a
//	          daemon-reload so that the generator sees a fresh host
//
// The journal (/var/lib/unbounded/journal/reset.json) also keeps
// KeepHandoff for a resumed run: a reset started with it and interrupted
// must not delete the handoff when the unit resumes it without the flag.
//
// After a reset, a bootstrap under the same machine name joins as the
// same Node: the kubelet's client certificate went with the slot, and its
// TLS bootstrap asks again for system:node:<name> (auto-approved, see the
// manifests); the kubelet re-registers an existing Node object as its own.
package reset

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"unbounded-cloud.io/agent/lib/adopt"
	"unbounded-cloud.io/agent/lib/bootstrap"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/hostprep"
	"unbounded-cloud.io/agent/lib/modes"
	"unbounded-cloud.io/agent/lib/modes/all"
	"unbounded-cloud.io/agent/lib/modes/facts"
	"unbounded-cloud.io/agent/lib/state"
	"unbounded-cloud.io/agent/lib/steps"
	"unbounded-cloud.io/agent/lib/unitnames"
	"unbounded-cloud.io/agent/lib/units"
	"unbounded-cloud.io/agent/lib/upgrade"
)

// Operation is the owner name of the ownership lock and the journal's name.
const Operation = "reset"

// Unit runs reset; the ownership record names it.
const Unit = unitnames.Reset

// Steps, in order, after the daemon's stop.
const (
	StepLock     = "lock"
	StepNode     = "node"
	StepHostPrep = "hostprep"
	StepState    = "state"
)

// StepDocs are the steps in the order they run, each with what it does:
// the one list of them (--help shows them).
var StepDocs = []steps.Doc{
	{Name: StepLock, Does: "the installation lock (the daemon and the upgrade path stopped first)"},
	{Name: StepNode, Does: "the node stopped and removed, in every mode the host shows"},
	{Name: StepHostPrep, Does: "the recorded host preparation undone"},
	{Name: StepState, Does: "the agent's state removed (/etc/unbounded stays)"},
}

// CrashPoints are reset's own named crash points in the order a run
// reaches them; lib/hostprep's "hostprep/after-undo" is reached inside
// the hostprep step.
var CrashPoints = func() []string {
	out := []string{"reset/after-daemon"}
	for _, s := range steps.Names(StepDocs) {
		out = append(out, steps.CrashPoint(Operation, s))
	}
	return out
}()

// Journal is what a reset keeps between runs.
type Journal struct {
	KeepHandoff bool `json:"keep-handoff"`
	// The steps done, and where the last run got to.
	steps.Record
}

// Reset removes the agent's node and state. The zero value of every field
// but Paths is the real host.
type Reset struct {
	// Host is the host's seams (paths, service manager, notify, crash
	// point, clock, logger); its zero value but Paths is the real host.
	steps.Host
	// KeepHandoff keeps /var/lib/unbounded-agent-reprovision (the
	// reprovision handoff runs reset from there).
	KeepHandoff bool
	// Mode returns the mode named; nil: the real modes.
	Mode func(name string) (modes.Mode, error)
	// HostPrep undoes the host preparation; nil: lib/hostprep's Undo.
	HostPrep func(ctx context.Context) ([]string, error)
	// MountInfo reads the mount table; nil: /proc/self/mountinfo.
	MountInfo func() ([]byte, error)
}

func (r *Reset) mode(name string) (modes.Mode, error) {
	if r.Mode != nil {
		return r.Mode(name)
	}
	return all.For(name, r.Paths, r.Logger())
}

// stoppedFirst are the units that would act on the node while it goes
// away, stopped before anything else: the daemon (it starts units for
// the cluster), a running bootstrap, the health timer and check (they
// restart and start the node; the timer hangs on the node target by
// Wants=, which a stop of the target does not follow) and a restart;
// lifecycle too, which stays active (RemainAfterExit=) and keeps its
// PrivateTmp= directory under /var/tmp while it is; and the upgrade's
// path unit, which hangs on the node target like the timer (a running
// upgrade is not stopped: it holds the installation lock, and the reset
// defers to it rather than cut dpkg short).
var stoppedFirst = []string{
	unitnames.Daemon, unitnames.Bootstrap,
	unitnames.HealthTimer, unitnames.Health, unitnames.Restart,
	unitnames.Lifecycle, unitnames.UpgradePath,
}

// Run resets the host. Its error maps to the exit code with exitcode.For:
// 69 when another installation (a live bootstrap that will not stop, a
// reprovision) owns the host.
func (r *Reset) Run(ctx context.Context) error {
	sd, err := r.Manager(ctx)
	if err != nil {
		return err
	}
	defer sd.Close()

	r.Status("stopping %s and the units that act on the node", unitnames.Daemon)
	first := stoppedFirst
	if !r.KeepHandoff {
		// An operator's reset removes the handoff too: a reprovision
		// that runs would reset and bootstrap the host again. (The
		// handoff's own reset keeps it, and runs inside that unit.)
		first = append(slices.Clone(first), unitnames.Reprovision)
	}
	for _, u := range first {
		if err := stop(ctx, sd, u); err != nil {
			return err
		}
	}
	// The older agent's daemon acts on the node too, on a host it
	// installed that was not adopted (or whose adoption was cut): its
	// units go the way an adoption retires them, files first, so that
	// its recovery cannot start it again.
	if err := adopt.RetireOlderUnits(ctx, r.Paths, sd, r.Logger()); err != nil {
		return fmt.Errorf("the older agent's units: %w", err)
	}
	r.Crash("reset/after-daemon")

	lock, err := r.lock()
	if err != nil {
		return err
	}
	var j Journal
	if _, err := state.ReadJournal(r.Paths, Operation, &j); err != nil {
		r.Logger().Warn("reset journal unreadable; going on without it", "error", err.Error())
	}
	j.KeepHandoff = j.KeepHandoff || r.KeepHandoff
	run := r.Runner(Operation, &j)
	err = run.Run(ctx, []steps.Step{
		// Taken above; journaled before anything is removed, so that a
		// resumed run keeps KeepHandoff.
		{Name: StepLock, Always: true},
		{Name: StepNode, Always: true, Status: "stopping " + unitnames.NodeTarget, Run: func(ctx context.Context) error { return r.node(ctx, sd) }},
		{Name: StepHostPrep, Always: true, Status: "undoing the host preparation", Run: func(ctx context.Context) error {
			leftovers, err := r.undo(ctx)
			for _, l := range leftovers {
				r.Logger().Warn("left as is", "what", l)
			}
			return err
		}},
		// The journal went with the state; the release of the lock below
		// removes the ownership record last.
		{Name: StepState, Always: true, Final: true, Status: "removing the agent's state under " + r.Paths.HostRoot(),
			Run: func(context.Context) error { return r.removeState(j.KeepHandoff) }},
	})
	if err != nil {
		if werr := state.WriteJournal(r.Paths, Operation, &j); werr != nil {
			r.Logger().Error("reset journal not written", "error", werr.Error())
		}
		lock.Release()
		return err
	}
	if err := lock.Release(); err != nil {
		return err
	}
	if err := sd.Reload(ctx); err != nil {
		return err
	}
	r.Status("reset done; /etc/unbounded left as it was")
	return nil
}

// stop stops unit; a unit that is not loaded (not installed) is stopped.
func stop(ctx context.Context, sd units.Manager, unit string) error {
	st, err := sd.ActiveState(ctx, unit)
	if err == nil && (st == "inactive" || st == "failed") {
		return nil
	}
	return sd.StopUnit(ctx, unit)
}

// lock takes the ownership lock, superseding the record of a bootstrap
// that no longer runs (stopped above): otherwise a host whose bootstrap
// crashed could never be reset. So is an interrupted adoption's (its
// unit, lifecycle, was stopped above too).
func (r *Reset) lock() (*state.Lock, error) {
	lock, err := state.AcquireOwnership(r.Paths, Operation, Unit)
	if err == nil || !errors.Is(err, state.ErrOwned) {
		return lock, err
	}
	o, rerr := state.ReadOwnership(r.Paths)
	if rerr != nil || o == nil || (o.Owner != bootstrap.Operation && o.Owner != adopt.Operation) {
		return nil, err
	}
	r.Logger().Warn("superseding the ownership of an interrupted "+o.Owner, "since", o.Since.Format(time.RFC3339))
	if err := state.RemoveDurable(r.Paths.Ownership()); err != nil {
		return nil, err
	}
	return state.AcquireOwnership(r.Paths, Operation, Unit)
}

// modesInUse are the modes the host shows evidence of.
func (r *Reset) modesInUse() []string {
	var found []string
	add := func(m string) {
		if m != "" && !slices.Contains(found, m) {
			found = append(found, m)
		}
	}
	for _, s := range hostpaths.Slots {
		if a, err := state.ReadApplied(r.Paths, s); err == nil {
			add(a.Mode)
		}
	}
	var j bootstrap.Journal
	if ok, err := state.ReadJournal(r.Paths, bootstrap.Operation, &j); ok && err == nil {
		add(j.Mode)
	}
	// The older agent ran its nodes in nspawn machines.
	if len(state.LegacyAppliedConfigs(r.Paths)) > 0 {
		add("nspawn")
	}
	for _, name := range all.Names() {
		if m, err := r.mode(name); err == nil && m.Installed() {
			add(name)
		}
	}
	return found
}

// node stops the node target and destroys both slots of every mode in use.
// The mode targets are stopped too: a mode target's stop follows that of
// the machine it requires only where that Requires= was loaded when the
// machine stopped, and one was seen to outlive a reset (the system
// scenario of an adopted host, repaved, then reset): after a reset
// nothing of the agent's may be active.
func (r *Reset) node(ctx context.Context, sd units.Manager) error {
	targets := []string{unitnames.NodeTarget}
	for _, m := range facts.Names() {
		targets = append(targets, unitnames.ModeTarget(m))
	}
	for _, u := range targets {
		if err := stop(ctx, sd, u); err != nil {
			return err
		}
	}
	for _, name := range r.modesInUse() {
		m, err := r.mode(name)
		if err != nil {
			r.Logger().Warn("mode not in this build; nothing of it destroyed", "mode", name, "error", err.Error())
			continue
		}
		for _, slot := range hostpaths.Slots {
			r.Status("destroying slot %s of mode %s", slot, name)
			if err := m.Destroy(ctx, slot); err != nil {
				return fmt.Errorf("destroy slot %s (%s): %w", slot, name, err)
			}
		}
	}
	return nil
}

// mountPoints lists the mount points of the mount table, as paths under
// the host root Paths resolves.
func (r *Reset) mountPoints() ([]string, error) {
	read := r.MountInfo
	if read == nil {
		read = func() ([]byte, error) { return os.ReadFile("/proc/self/mountinfo") }
	}
	data, err := read()
	if err != nil {
		return nil, fmt.Errorf("cannot read the mount table: %w", err)
	}
	var out []string
	for _, p := range modes.MountPoints(data) {
		out = append(out, r.Paths.Join(p))
	}
	return out, nil
}

func (r *Reset) undo(ctx context.Context) ([]string, error) {
	if r.HostPrep != nil {
		return r.HostPrep(ctx)
	}
	h := &hostprep.Host{Paths: r.Paths, CrashPoint: r.Crash, Log: r.Logger()}
	return h.Undo(ctx)
}

// removeState removes everything under the host root but the ownership
// record (the lock's release removes it last) and this run's journal,
// and the handoff directory unless kept.
func (r *Reset) removeState(keepHandoff bool) error {
	// An agent upgrade's override on an image-based host points units in
	// /etc/systemd/system at the staged agent under the host root: both
	// go, and the units run the image's agent again.
	if err := upgrade.RemoveOverride(r.Paths); err != nil {
		return fmt.Errorf("the agent upgrade's override: %w", err)
	}
	// The older agent's files, on a host it installed (its units went
	// first): its binaries, its machines' enablement and its state
	// directory. Reset leaves nothing of either layout.
	if err := adopt.RemoveOlderFiles(r.Paths, r.Logger()); err != nil {
		return fmt.Errorf("the older agent's files: %w", err)
	}
	root := r.Paths.HostRoot()
	entries, err := os.ReadDir(root)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	// The offline directory is the operator's (or the image builder's)
	// input, pre-staged artifacts and images, not the agent's state: a
	// host reset to bootstrap again offline needs it.
	keep := []string{filepath.Base(r.Paths.Ownership()), filepath.Base(r.Paths.JournalDir()), filepath.Base(r.Paths.OfflineDir())}
	var paths []string
	for _, e := range entries {
		if !slices.Contains(keep, e.Name()) {
			paths = append(paths, filepath.Join(root, e.Name()))
		}
	}
	if !keepHandoff {
		paths = append(paths, r.Paths.ReprovisionDir())
	}
	// A directory the operator mounted a file system on (the slots on a
	// disk of their own) cannot be removed, and is not ours to unmount:
	// it is emptied and stays, as the mount point it was.
	points, err := r.mountPoints()
	if err != nil {
		return err
	}
	emptied, err := modes.RemoveVerifiedKeepingMounts(points, paths...)
	for _, p := range emptied {
		r.Logger().Info("emptied, not removed: a file system is mounted on it", "dir", r.Paths.Rel(p))
	}
	if err != nil {
		return err
	}
	// The journal directory last but one: without it a resumed run
	// forgets KeepHandoff, and everything it guarded is gone already.
	return modes.RemoveVerified(r.Paths.JournalDir())
}
