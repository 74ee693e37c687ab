// Package reprovision is the isolation change's second method
// (ARCHITECTURE sections 4 and 6, unbounded-reprovision.service): the
// host is reset and bootstrapped again in the target mode, from a handoff
// that survives the reset.
//
// The handoff directory, /var/lib/unbounded-agent-reprovision/ (0700):
//
//	journal.json    where the handoff is (Journal), with a SHA-256
//	                sidecar; kept until the daemon reported the outcome
//	config.json     the target configuration (the effective config, as
//	                an applied record holds it), 0600
//	unbounded-agent a copy of the executable that staged it, which the
//	                unit runs: the package may change under a reset, the
//	                handoff runs on regardless
//
// Decided: the handoff holds no copy of the bootstrap token. The target
// configuration names the token file (under /etc/unbounded, which a reset
// keeps); every reader of the token reads it there, as on every other
// path, and a host the handoff gave up on keeps no second copy of it.
//
// Stage (run by unbounded-isolation.service) writes the three files,
// the journal last: a handoff exists once its journal does. Run (the
// unit's program, started again by systemd on failure) continues from the
// journal:
//
//	reset      lib/reset with KeepHandoff (the handoff's files stay)
//	bootstrap  lib/bootstrap of the target configuration
//
// A failed attempt sets the next one after a growing delay of its own
// (FirstDelay, doubling, at most MaxDelay; systemd's RestartSec= comes on
// top) and exits 75. Past the deadline (GiveUpAfter after the handoff
// began) it gives up: the journal says Failed with the last error, the
// staged executable and configuration are removed, and the unit ends
// without a failure (the generator no longer pulls it in). Succeeded
// removes them too. The journal stays for the daemon, which reports the
// outcome on the Machine and then removes the directory.
package reprovision

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"unbounded-cloud.io/agent/lib/backoff"
	"unbounded-cloud.io/agent/lib/config"
	"unbounded-cloud.io/agent/lib/crashpoint"
	"unbounded-cloud.io/agent/lib/exitcode"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/state"
	"unbounded-cloud.io/agent/lib/steps"
)

// Files of the handoff directory.
const (
	JournalFile = "journal.json"
	ConfigFile  = "config.json"
	Executable  = "unbounded-agent"
)

// Defaults of the deadline and the delays (ARCHITECTURE section 6).
const (
	DefaultGiveUpAfter = 90 * time.Minute
	DefaultFirstDelay  = 30 * time.Second
	DefaultMaxDelay    = 10 * time.Minute
)

// States of a handoff.
const (
	StateInProgress = state.HandoffInProgress
	StateSucceeded  = "Succeeded"
	StateFailed     = "Failed"
)

// Steps of a handoff, in order.
const (
	StepReset     = "reset"
	StepBootstrap = "bootstrap"
)

// Journal is the handoff's record.
type Journal struct {
	FromMode string `json:"from-mode"`
	ToMode   string `json:"to-mode"`
	Machine  string `json:"machine"`
	// Request is the daemon's request the handoff carries out ("" by
	// hand).
	Request   string    `json:"request,omitempty"`
	StartedAt time.Time `json:"started-at"`
	Deadline  time.Time `json:"deadline"`
	State     string    `json:"state"`
	// Done are the steps done.
	Done        []string  `json:"done,omitempty"`
	Attempts    int       `json:"attempts"`
	NextAttempt time.Time `json:"next-attempt,omitzero"`
	LastError   string    `json:"last-error,omitempty"`
	// Message says the outcome (Succeeded, Failed).
	Message string    `json:"message,omitempty"`
	EndedAt time.Time `json:"ended-at,omitzero"`
}

func (j *Journal) done(step string) bool {
	for _, s := range j.Done {
		if s == step {
			return true
		}
	}
	return false
}

// Live says whether the handoff still runs (the generator pulls its unit
// in).
func (j *Journal) Live() bool { return j.State == StateInProgress }

// Dir is the handoff directory of p.
func Dir(p hostpaths.Paths) string { return p.ReprovisionDir() }

// ReadJournal reads the handoff's journal; a missing one wraps
// os.ErrNotExist. It only reads (the generator calls it).
func ReadJournal(p hostpaths.Paths) (*Journal, error) {
	file := state.HandoffJournal(p)
	data, err := state.ReadVerified(file)
	if err != nil {
		return nil, err
	}
	var j Journal
	if err := json.Unmarshal(data, &j); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", state.ErrCorrupt, file, err)
	}
	return &j, nil
}

func writeJournal(p hostpaths.Paths, j *Journal) error {
	data, err := json.MarshalIndent(j, "", "  ")
	if err != nil {
		return err
	}
	return state.WriteVerified(state.HandoffJournal(p), append(data, '\n'), 0o600)
}

// Stage writes a handoff: the target configuration (the effective config
// as JSON), a copy of the executable at self, then the journal, which
// makes it a handoff. A handoff that exists already is refused.
func Stage(p hostpaths.Paths, j Journal, target json.RawMessage, self string) error {
	if _, err := ReadJournal(p); err == nil || !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("a reprovision handoff exists already in %s (%v): one change at a time; `unbounded status` shows it, `unbounded reset` removes it", Dir(p), err)
	}
	if err := os.MkdirAll(Dir(p), 0o700); err != nil {
		return err
	}
	if err := os.Chmod(Dir(p), 0o700); err != nil {
		return err
	}
	if err := state.WriteFileAtomic(filepath.Join(Dir(p), ConfigFile), target, 0o600); err != nil {
		return err
	}
	exe, err := os.ReadFile(self)
	if err != nil {
		return fmt.Errorf("copy the executable into the handoff: %w", err)
	}
	if err := state.WriteFileAtomic(filepath.Join(Dir(p), Executable), exe, 0o700); err != nil {
		return err
	}
	j.State = StateInProgress
	return writeJournal(p, &j)
}

// Remove removes the handoff (the daemon, once it reported the outcome):
// its journal (state.RemoveVerified), then everything else in its
// directory, then the directory itself unless the caller may not write
// its parent (the daemon's sandbox makes /var/lib read-only but for its
// own directories: the empty directory stays, as no handoff).
func Remove(p hostpaths.Paths) error {
	ents, err := os.ReadDir(Dir(p))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	// The journal first, and as a verified record: the generator (any
	// unit's daemon-reload) may read it at any moment of this, and a
	// journal gone with its sidecar left reads as corrupt: nothing of the
	// node wired at the next reload (CI, after a handoff that ended).
	if err := state.RemoveVerified(state.HandoffJournal(p)); err != nil {
		return err
	}
	for _, e := range ents {
		if err := os.RemoveAll(filepath.Join(Dir(p), e.Name())); err != nil {
			return err
		}
	}
	if err := state.SyncDir(Dir(p)); err != nil {
		return err
	}
	if err := os.Remove(Dir(p)); err != nil && !errors.Is(err, syscall.EROFS) && !errors.Is(err, os.ErrPermission) {
		return err
	}
	return nil
}

// Reprovision runs the handoff on one host. The zero value of each
// function field is an error: cmd/reprovision wires the real reset and
// bootstrap.
type Reprovision struct {
	// Host is the host's seams (paths, service manager, notify, crash
	// point, clock, logger); its zero value but Paths is the real host.
	steps.Host
	// Reset resets the host, keeping the handoff.
	Reset func(ctx context.Context) error
	// Bootstrap bootstraps the target configuration.
	Bootstrap func(ctx context.Context, cfg *config.Config) error
	// HandOver hands the new node to systemd once the handoff has ended
	// (the generator wires no node while a handoff is in progress, so
	// the bootstrap's own hand-over found nothing wired); nil: none.
	HandOver func(ctx context.Context) error
	// FirstDelay and MaxDelay bound the delay between attempts; 0: the
	// defaults.
	FirstDelay, MaxDelay time.Duration
	Sleep                func(ctx context.Context, d time.Duration) error
}

func (r *Reprovision) sleep(ctx context.Context, d time.Duration) error {
	if r.Sleep != nil {
		return r.Sleep(ctx, d)
	}
	return backoff.Sleep(ctx, d)
}

// ErrNoHandoff: nothing to run (no journal, or one that ended).
var ErrNoHandoff = errors.New("no reprovision handoff in progress")

// Run continues the handoff from its journal. nil: it ended (Succeeded,
// or given up: Failed, said in the journal); an error wrapping
// exitcode.ErrTemporary: this attempt failed, the next one is due after
// the journal's next-attempt.
func (r *Reprovision) Run(ctx context.Context) error {
	j, err := ReadJournal(r.Paths)
	if errors.Is(err, os.ErrNotExist) {
		return ErrNoHandoff
	}
	if err != nil {
		return err
	}
	if !j.Live() {
		r.Logger().Info("the reprovision handoff has ended; nothing to do", "state", j.State, "message", j.Message)
		return ErrNoHandoff
	}
	first, max := r.FirstDelay, r.MaxDelay
	if first <= 0 {
		first = DefaultFirstDelay
	}
	if max <= 0 {
		max = DefaultMaxDelay
	}
	if !r.Time().Before(j.Deadline) {
		return r.giveUp(j)
	}
	if wait := j.NextAttempt.Sub(r.Time()); wait > 0 {
		wait = min(wait, j.Deadline.Sub(r.Time()))
		r.Status("attempt %d of the reprovision %s -> %s: waiting %s (growing delay after: %s); gives up at %s",
			j.Attempts+1, j.FromMode, j.ToMode, wait.Round(time.Second), j.LastError, j.Deadline.UTC().Format(time.RFC3339))
		if err := r.sleep(ctx, wait); err != nil {
			return fmt.Errorf("%w: %w", exitcode.ErrTemporary, err)
		}
		if !r.Time().Before(j.Deadline) {
			return r.giveUp(j)
		}
	}
	j.Attempts++
	if err := writeJournal(r.Paths, j); err != nil {
		return err
	}
	r.Status("attempt %d of the reprovision %s -> %s (machine %s); gives up at %s", j.Attempts, j.FromMode, j.ToMode, j.Machine, j.Deadline.UTC().Format(time.RFC3339))
	if err := r.attempt(ctx, j); err != nil {
		delay := backoff.Doubling(first, max, j.Attempts)
		j.NextAttempt = r.Time().Add(delay)
		j.LastError = err.Error()
		if werr := writeJournal(r.Paths, j); werr != nil {
			return werr
		}
		r.Logger().Error("reprovision attempt failed; the next one after a growing delay", "attempt", j.Attempts, "delay", delay.String(),
			"next", j.NextAttempt.UTC().Format(time.RFC3339), "deadline", j.Deadline.UTC().Format(time.RFC3339), "error", err.Error())
		return fmt.Errorf("%w: attempt %d: %w", exitcode.ErrTemporary, j.Attempts, err)
	}
	j.State, j.EndedAt = StateSucceeded, r.Time().UTC()
	j.Message = fmt.Sprintf("reprovisioned from mode %s to %s in %d attempt(s)", j.FromMode, j.ToMode, j.Attempts)
	j.LastError, j.NextAttempt = "", time.Time{}
	if err := r.removeStaged(); err != nil {
		return err
	}
	if err := writeJournal(r.Paths, j); err != nil {
		return err
	}
	if r.HandOver != nil {
		if err := r.HandOver(ctx); err != nil {
			return fmt.Errorf("%s; the hand-over of the node to systemd failed (the next boot does it): %w", j.Message, err)
		}
	}
	r.Status("%s", j.Message)
	return nil
}

// attempt runs the steps not done yet.
func (r *Reprovision) attempt(ctx context.Context, j *Journal) error {
	if !j.done(StepReset) {
		if r.Reset == nil {
			return errors.New("reprovision: no reset")
		}
		r.Status("step %s: resetting the host, the handoff kept", StepReset)
		if err := r.Reset(ctx); err != nil {
			return fmt.Errorf("step %s: %w", StepReset, err)
		}
		crashpoint.Via(r.CrashPoint, "reprovision/after-reset")
		j.Done = append(j.Done, StepReset)
		if err := writeJournal(r.Paths, j); err != nil {
			return err
		}
	}
	data, err := os.ReadFile(filepath.Join(Dir(r.Paths), ConfigFile))
	if err != nil {
		return fmt.Errorf("the target configuration: %w", err)
	}
	cfg, err := config.LoadEffective(r.Paths, data)
	if err != nil {
		return fmt.Errorf("the target configuration: %w", err)
	}
	if r.Bootstrap == nil {
		return errors.New("reprovision: no bootstrap")
	}
	r.Status("step %s: bootstrapping the host in mode %s", StepBootstrap, cfg.Mode)
	if err := r.Bootstrap(ctx, cfg); err != nil {
		return fmt.Errorf("step %s: %w", StepBootstrap, err)
	}
	crashpoint.Via(r.CrashPoint, "reprovision/after-bootstrap")
	j.Done = append(j.Done, StepBootstrap)
	return nil
}

// giveUp ends a handoff past its deadline as Failed: the staged
// executable and configuration go, the journal stays for the daemon.
func (r *Reprovision) giveUp(j *Journal) error {
	j.State, j.EndedAt = StateFailed, r.Time().UTC()
	j.Message = fmt.Sprintf("reprovision from mode %s to %s given up at its deadline %s after %d attempt(s): %s",
		j.FromMode, j.ToMode, j.Deadline.UTC().Format(time.RFC3339), j.Attempts, orNone(j.LastError))
	if err := r.removeStaged(); err != nil {
		return err
	}
	if err := writeJournal(r.Paths, j); err != nil {
		return err
	}
	r.Logger().Error(j.Message)
	return nil
}

func orNone(s string) string {
	if s == "" {
		return "no attempt ran"
	}
	return s
}

// removeStaged removes the staged configuration and executable.
func (r *Reprovision) removeStaged() error {
	for _, f := range []string{ConfigFile, Executable} {
		if err := state.RemoveDurable(filepath.Join(Dir(r.Paths), f)); err != nil {
			return err
		}
	}
	return nil
}
