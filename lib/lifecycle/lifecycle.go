// Package lifecycle is what runs before the daemon on every start of it
// (unbounded-lifecycle.service, ARCHITECTURE section 6): it brings the
// host's agent-side state to where the daemon may act on it. Lifecycle.Run
// holds the steps and why each is done here.
package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/modes"
	"unbounded-cloud.io/agent/lib/state"
	"unbounded-cloud.io/agent/lib/unitnames"
	"unbounded-cloud.io/agent/lib/units"
)

// RepaveJournal is the repave's journal's name (lib/repave's Operation,
// named here so that this package does not link lib/repave's cluster
// client).
const RepaveJournal = "repave"

// Lifecycle runs on one host; the zero value of each field but Paths is
// the real host.
type Lifecycle struct {
	Paths hostpaths.Paths
	// Mode returns the isolation mode of name; required.
	Mode func(name string) (modes.Mode, error)
	// Systemd connects to the service manager; nil: the system bus.
	Systemd func(ctx context.Context) (units.Manager, error)
	Log     *slog.Logger
}

func (l *Lifecycle) log() *slog.Logger {
	if l.Log != nil {
		return l.Log
	}
	return slog.Default()
}

func (l *Lifecycle) systemd(ctx context.Context) (units.Manager, error) {
	if l.Systemd != nil {
		return l.Systemd(ctx)
	}
	return units.Dial(ctx)
}

// Run does, in order:
//
//  1. An installation that owns the host (bootstrap, repave, reset) and
//     whose unit is not running is resumed: its unit (the one the
//     ownership record names) is queued. The generator does the same at
//     boot; this covers a host root the generator saw unmounted (a
//     separate /var) and a reload that found the host owned.
//  2. A repave journal on a host no installation owns (a repave that
//     crashed after it released the lock, or failed after its switch) is
//     finished or rolled back: unbounded-repave.service is queued, which
//     resumes from the journal. lifecycle links no Kubernetes client and
//     never decides itself which node runs: the repave does, with the
//     cluster (uncordon, the new Node's readiness) in reach.
//  3. The running node's lifecycle hooks are made current (Mode.
//     EnsureHooks: the mode's host-side files of the active slot, as this
//     release writes them, then daemon-reload; the node is not
//     restarted).
//
// Units are queued, never waited for: the daemon is ordered after this
// unit, and a repave it queued runs in its own unit. ARCHITECTURE section 6
// gives this unit two more steps, the host-root migration and finishing an
// unfinished agent upgrade; this release does neither.
func (l *Lifecycle) Run(ctx context.Context) error {
	own, err := state.ReadOwnership(l.Paths)
	if own != nil {
		if err != nil {
			// Unreadable: still owned (fail closed); recovery is the
			// generator's answer to that, not this unit's.
			l.log().Warn("the ownership record is unreadable; nothing done while the host reads as owned", "error", err.Error())
			return nil
		}
		return l.resume(ctx, own.Unit, fmt.Sprintf("the installation %q owns the host", own.Owner))
	}
	found, jerr := journalExists(l.Paths, RepaveJournal)
	if jerr != nil {
		return fmt.Errorf("repave journal: %w", jerr)
	}
	if found {
		return l.resume(ctx, unitnames.Repave, "an interrupted repave left its journal")
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
		l.log().Info("no applied config: no node whose hooks to keep current")
		return nil
	}
	m, err := l.Mode(active.Mode)
	if err != nil {
		return err
	}
	err = m.EnsureHooks(ctx, active.Slot)
	if errors.Is(err, modes.ErrNotImplemented) {
		l.log().Info("the mode keeps no lifecycle hooks in this release", "mode", active.Mode)
		return nil
	}
	return err
}

// resume queues unit unless it runs (or is queued) already.
func (l *Lifecycle) resume(ctx context.Context, unit, why string) error {
	if !resumable(unit) {
		l.log().Info(why+"; it names no unit to resume", "unit", unit)
		return nil
	}
	sd, err := l.systemd(ctx)
	if err != nil {
		return err
	}
	defer sd.Close()
	return Resume(ctx, sd, l.log(), unit, why)
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
