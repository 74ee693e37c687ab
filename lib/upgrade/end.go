package upgrade

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"unbounded-cloud.io/agent/lib/crashpoint"
	"unbounded-cloud.io/agent/lib/outcome"
	"unbounded-cloud.io/agent/lib/request"
	"unbounded-cloud.io/agent/lib/state"
	"unbounded-cloud.io/agent/lib/steps"
)

// record ends a successful upgrade: the installed package is kept in
// installed/ (the next upgrade's previous), the staged files and an old
// failure signal go, and the request is taken.
//
// It is idempotent: Recording, journaled before its first change, has a
// run resumed after a cut in it do it again, and nothing else.
func (u *Upgrade) record(ctx context.Context, j *Journal) error {
	if !j.Recording {
		j.Recording = true
		if err := state.WriteJournal(u.Paths, Operation, j); err != nil {
			return err
		}
	}
	if j.Image {
		pruneStaged(u.Paths, j.To)
	} else if err := u.Packages.Verify(ctx, Package); err != nil {
		u.log().Warn("the installed package does not verify clean", "error", err)
	}
	dir := filepath.Join(u.Paths.UpgradeDir(), "installed")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	dst := filepath.Join(dir, filepath.Base(j.Staged))
	if err := os.Rename(j.Staged, dst); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := removeOthers(dir, dst); err != nil {
		return err
	}
	os.Remove(j.Staged + ".sha256")
	if err := u.writeOutcome(j, outcome.Record{State: outcome.Succeeded, Reason: "Upgraded"}); err != nil {
		return err
	}
	if err := request.MarkTaken(u.Paths, Concern, j.UID); err != nil {
		return err
	}
	crashpoint.Via(u.CrashPoint, CrashAfterRequestTaken)
	return nil
}

// fail ends a failed upgrade: after the install, the kept package goes
// back and the daemon is restarted on it; then the failure signal is
// written, the staged files are moved to rejected/ and the request is
// taken. The error says whether it rolled back.
func (u *Upgrade) fail(ctx context.Context, j *Journal, err error) error {
	step, cause := steps.Failed(err)
	rolledBack := false
	if j.IsDone(StepInstall) || step == StepInstall || j.RollingBack {
		u.log().Error("upgrade failed after the install; rolling back", "step", step, "to", j.From, "error", cause)
		j.RollingBack = true
		if werr := state.WriteJournal(u.Paths, Operation, j); werr != nil {
			u.log().Warn("the rollback is not journaled", "error", werr)
		}
		crashpoint.Via(u.CrashPoint, CrashRollingBack)
		if rerr := u.rollback(ctx, j); rerr != nil {
			// The journal stays: the next run (lifecycle at boot, or by
			// hand) rolls back again.
			j.SetFailed(step, cause.Error()+"; rollback to "+j.From+" failed: "+rerr.Error())
			state.WriteJournal(u.Paths, Operation, j)
			return fmt.Errorf("%w; rollback to %s failed: %w", err, j.From, rerr)
		}
		rolledBack = true
		err = fmt.Errorf("%w; rolled back to %s", err, j.From)
	}
	return u.refuseAfter(j, step, err, rolledBack)
}

func (u *Upgrade) rollback(ctx context.Context, j *Journal) error {
	if j.Image {
		// Back to the override it replaced, or to the image's agent.
		var o *state.AgentOverride
		if v := j.PreviousOverride; v != "" {
			units, err := overriddenUnits(u.Paths)
			if err != nil {
				return err
			}
			o = &state.AgentOverride{Version: v, Dir: u.Paths.Rel(stagedLibexec(u.Paths, v)), Units: units, At: u.now().UTC()}
		}
		if err := pointUnits(u.Paths, o); err != nil {
			return err
		}
		if err := u.activate(ctx, u.agentExe(j, j.PreviousOverride)); err != nil {
			return err
		}
		pruneStaged(u.Paths, j.PreviousOverride)
		return nil
	}
	if j.Previous == "" {
		return errors.New("no previous package was kept")
	}
	if err := u.Packages.Install(ctx, j.Previous); err != nil {
		return err
	}
	return u.activate(ctx, u.agentExe(j, ""))
}

// refuse ends an upgrade that changed nothing.
func (u *Upgrade) refuse(j *Journal, step string, err error) error {
	return u.refuseAfter(j, step, &steps.Error{Step: step, Err: err}, false)
}

func (u *Upgrade) refuseAfter(j *Journal, step string, err error, rolledBack bool) error {
	r := outcome.Record{State: outcome.Failed, Reason: "UpgradeFailed", Step: step, Message: err.Error()}
	if rolledBack {
		r.Reason = outcome.ReasonRolledBack
	}
	if werr := u.writeOutcome(j, r); werr != nil {
		u.log().Error("the upgrade's outcome was not recorded", "error", werr)
	}
	u.reject(j)
	if terr := request.MarkTaken(u.Paths, Concern, j.UID); terr != nil {
		u.log().Warn("request not marked taken", "error", terr)
	}
	if rerr := state.RemoveJournal(u.Paths, Operation); rerr != nil {
		u.log().Warn("journal not removed", "error", rerr)
	}
	return err
}

// writeOutcome records how j ended (r, with j's names filled in): the
// record the daemon reports (lib/outcome), and, for one release, the
// signal a daemon of an older build reads, which a rollback may start.
func (u *Upgrade) writeOutcome(j *Journal, r outcome.Record) error {
	r.Concern, r.Operation, r.UID, r.Generation = outcome.Upgrade, j.OperationName, j.UID, j.Generation
	r.From, r.To, r.Time = j.From, j.To, u.now().UTC()
	if err := outcome.WriteLegacyUpgrade(u.Paths, r); err != nil {
		return err
	}
	return outcome.Write(u.Paths, r)
}

// reject moves what the upgrade staged into rejected/ (the .sha256 that
// triggers unbounded-upgrade.path with it), so that it neither triggers
// the path unit again nor is lost to an operator who looks.
func (u *Upgrade) reject(j *Journal) {
	if j.Staged == "" {
		return
	}
	dir := filepath.Join(u.Paths.UpgradeDir(), "rejected")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return
	}
	for _, f := range []string{j.Staged, j.Staged + ".sha256", j.Staged + ".part"} {
		if err := os.Rename(f, filepath.Join(dir, filepath.Base(f))); err != nil && !errors.Is(err, fs.ErrNotExist) {
			os.Remove(f)
		}
	}
}

func removeOthers(dir, keep string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if f := filepath.Join(dir, e.Name()); f != keep {
			if err := os.RemoveAll(f); err != nil {
				return err
			}
		}
	}
	return nil
}

// safeName keeps a version usable in a file name.
func safeName(v string) string {
	return strings.Map(func(r rune) rune {
		if r == '/' || r == 0 || r == ' ' {
			return '_'
		}
		return r
	}, v)
}
