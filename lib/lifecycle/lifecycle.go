// Package lifecycle is what runs before the daemon on every start of it
// (unbounded-lifecycle.service, ARCHITECTURE section 6): it brings the
// host's agent-side state to where the daemon may act on it, an older
// agent's host adopted first. Lifecycle.Run
// holds the steps and why each is done here.
package lifecycle

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strings"

	"unbounded-cloud.io/agent/lib/adopt"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/modes"
	"unbounded-cloud.io/agent/lib/state"
	"unbounded-cloud.io/agent/lib/steps"
	"unbounded-cloud.io/agent/lib/unitnames"
	"unbounded-cloud.io/agent/lib/units"
	"unbounded-cloud.io/agent/lib/upgrade"
)

// RepaveJournal is the repave's journal's name (lib/repave's Operation,
// named here so that this package does not link lib/repave's cluster
// client); IsolationJournal the isolation change's (lib/isolation's
// Operation).
const (
	RepaveJournal    = "repave"
	IsolationJournal = "isolation"
)

// resumedByJournal are the operations whose journal, left on a host no
// installation owns, queues their unit again (a crash between the lock's
// release and the journal's removal): the unit only hands the node over.
var resumedByJournal = []struct{ journal, unit, what string }{
	{RepaveJournal, unitnames.Repave, "an interrupted repave left its journal"},
	{IsolationJournal, unitnames.Isolation, "an interrupted isolation change left its journal"},
}

// Lifecycle runs on one host; the zero value of each field but Paths is
// the real host.
type Lifecycle struct {
	// Host is the host's seams (paths, service manager, notify, crash
	// point, clock, logger); its zero value but Paths is the real host.
	steps.Host
	// Mode returns the isolation mode of name; required.
	Mode func(name string) (modes.Mode, error)
	// ImageVersion is the version of the agent /usr holds (the image's,
	// whatever an upgrade's override makes the units run); nil asks
	// /usr/bin/unbounded, which no override replaces.
	ImageVersion func(ctx context.Context) (string, error)
}

// Run does, in order:
//
//  1. An installation that owns the host (bootstrap, repave, reset) and
//     whose unit is not running is resumed: its unit (the one the
//     ownership record names) is queued. The generator does the same at
//     boot; this covers a host root the generator saw unmounted (a
//     separate /var) and a reload that found the host owned.
//  2. A repave (or isolation change) journal on a host no installation
//     owns (one that crashed after it released the lock, or failed after
//     its switch) is finished or rolled back: unbounded-repave.service
//     (unbounded-isolation.service) is queued, which resumes from the
//     journal. lifecycle links no Kubernetes client and
//     never decides itself which node runs: the repave does, with the
//     cluster (uncordon, the new Node's readiness) in reach.
//  3. The running node's lifecycle hooks are made current (Mode.
//     EnsureHooks: the mode's host-side files of the active slot, as this
//     release writes them, then daemon-reload; the node is not
//     restarted).
//
// Units are queued, never waited for: the daemon is ordered after this
// unit, and a repave it queued runs in its own unit. Between 1 and 2, an
// agent upgrade's override on an image-based host that a newer image has
// caught up with is removed (supersede). An unfinished agent upgrade holds
// the lock and is resumed by step 1. ARCHITECTURE section 6 gives this
// unit one more step, the host-root migration: before all of these, a
// host the older agent installed is adopted (lib/adopt), or its
// interrupted adoption finished, so that every step after it reads this
// agent's state. An adoption another installation defers to that
// installation, which step 1 resumes.
func (l *Lifecycle) Run(ctx context.Context) error {
	ad := &adopt.Adopt{Host: l.Host}
	if err := ad.Run(ctx); err != nil && !errors.Is(err, state.ErrOwned) {
		return fmt.Errorf("adopting the older agent's node: %w", err)
	}
	own, err := state.ReadOwnership(l.Paths)
	if own != nil {
		if err != nil {
			// Unreadable: still owned (fail closed); recovery is the
			// generator's answer to that, not this unit's.
			l.Logger().Warn("the ownership record is unreadable; nothing done while the host reads as owned", "error", err.Error())
			return nil
		}
		return l.resume(ctx, own.Unit, fmt.Sprintf("the installation %q owns the host", own.Owner))
	}
	if err := l.supersede(ctx); err != nil {
		return err
	}
	for _, r := range resumedByJournal {
		found, jerr := journalExists(l.Paths, r.journal)
		if jerr != nil {
			return fmt.Errorf("%s journal: %w", r.journal, jerr)
		}
		if found {
			return l.resume(ctx, r.unit, r.what)
		}
	}
	// The first writer after a boot: an applied record whose staged
	// replacement a power cut left unrenamed goes under its own name
	// (readers took it already). No installation owns the host, and
	// only installations write records.
	if err := state.FinishApplied(l.Paths); err != nil {
		return err
	}
	active, err := state.ReadActive(l.Paths)
	if err != nil {
		return fmt.Errorf("applied state: %w", err)
	}
	if active == nil {
		l.Logger().Info("no applied config: no node whose hooks to keep current")
		return nil
	}
	m, err := l.Mode(active.Mode)
	if err != nil {
		return err
	}
	err = m.EnsureHooks(ctx, active.Slot)
	if errors.Is(err, modes.ErrNotImplemented) {
		l.Logger().Info("the mode keeps no lifecycle hooks in this release", "mode", active.Mode)
		return nil
	}
	return err
}

// resume queues unit unless it runs (or is queued) already.
func (l *Lifecycle) resume(ctx context.Context, unit, why string) error {
	if !resumable(unit) {
		l.Logger().Info(why+"; it names no unit to resume", "unit", unit)
		return nil
	}
	sd, err := l.Manager(ctx)
	if err != nil {
		return err
	}
	defer sd.Close()
	return Resume(ctx, sd, l.Logger(), unit, why)
}

func resumable(unit string) bool {
	return strings.HasPrefix(unit, "unbounded-") && strings.HasSuffix(unit, ".service")
}

// Resume queues unit, the unit that resumes the installation owning the
// host (the one its ownership record names), unless it runs or is queued
// already; why says what owns the host, for the log. It never waits for
// the unit. Shared by lifecycle and by bootstrap, which finds the host
// owned when a generator that ran before a separate /var was mounted
// took the host for a fresh one: the owner's run goes on (a repave
// resumes from its journal) instead of waiting for the next boot.
func Resume(ctx context.Context, sd units.Manager, log *slog.Logger, unit, why string) error {
	if !resumable(unit) {
		log.Info(why+"; it names no unit to resume", "unit", unit)
		return nil
	}
	st, err := sd.ActiveState(ctx, unit)
	if err != nil {
		return err
	}
	if unitnames.Running(st) {
		log.Info(why+"; its unit runs already", "unit", unit, "state", st)
		return nil
	}
	log.Info(why+"; resuming it", "unit", unit)
	return sd.EnqueueStart(ctx, unit)
}

// journalExists says whether operation's journal exists (and verifies),
// whatever its fields: this package only needs to know that a run is
// unfinished; the run itself reads it.
func journalExists(p hostpaths.Paths, operation string) (bool, error) {
	_, err := state.ReadVerified(p.Journal(operation))
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return true, nil
}

// supersede removes an agent upgrade's override (lib/upgrade) when the
// image's agent is as new or newer: the units run the image's agent from
// the next start on (the daemon's comes after this unit).
func (l *Lifecycle) supersede(ctx context.Context) error {
	o, err := state.ReadAgentOverride(l.Paths)
	if err != nil || o == nil {
		return err
	}
	image, err := l.imageVersion(ctx)
	if err != nil {
		l.Logger().Warn("the image's agent version is unknown; the upgrade's override stays", "override", o.Version, "error", err.Error())
		return nil
	}
	removed, err := upgrade.Supersede(l.Paths, image)
	if err != nil || removed == nil {
		return err
	}
	l.Logger().Info("the image's agent supersedes the upgrade's override; the units run the image's again", "image", image, "override", removed.Version)
	sd, err := l.Manager(ctx)
	if err != nil {
		return err
	}
	defer sd.Close()
	return sd.Reload(ctx)
}

func (l *Lifecycle) imageVersion(ctx context.Context) (string, error) {
	if l.ImageVersion != nil {
		return l.ImageVersion(ctx)
	}
	out, err := exec.CommandContext(ctx, l.Paths.Join("/usr/bin/unbounded"), "version", "--json").Output()
	if err != nil {
		return "", err
	}
	var v struct {
		Version string `json:"version"`
	}
	if err := json.Unmarshal(out, &v); err != nil || v.Version == "" {
		return "", fmt.Errorf("/usr/bin/unbounded version --json: %q", out)
	}
	return v.Version, nil
}
