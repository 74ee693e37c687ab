// Package upgrade is the agent's self-upgrade on a package-managed host
// (unbounded-upgrade.service; ARCHITECTURE sections 4-6): fetch and verify
// the package, keep the running one, install the new one with the package
// manager, restart the daemon and wait until the new executable runs and
// stays up; on any failure after the install, reinstall the kept package
// and wait the same way. The node stack is never touched: containerd, the
// kubelet and the nspawn machine keep running.
//
// Its input is the daemon's request (an AgentUpgrade MachineOperation:
// parameters version, url, sha256) or, without one, a package an operator
// dropped into the staging directory with its .sha256 (which
// unbounded-upgrade.path watches for). Every end leaves its outcome
// record (lib/outcome, with the signal failed.json or upgraded.json that
// a daemon of an older build reads), which the daemon reports on the
// Machine (AgentUpgraded) and removes.
package upgrade

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"unbounded-cloud.io/agent/lib/crashpoint"
	"unbounded-cloud.io/agent/lib/exitcode"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/request"
	"unbounded-cloud.io/agent/lib/sdstatus"
	"unbounded-cloud.io/agent/lib/state"
	"unbounded-cloud.io/agent/lib/steps"
	"unbounded-cloud.io/agent/lib/unitnames"
)

// Operation names the journal and the crash points; Concern the request.
const (
	Operation = state.OwnerUpgrade
	Concern   = "upgrade"
	// Package is the agent's package name.
	Package = "unbounded-agent"
)

// The steps, in order.
const (
	StepFetch    = "fetch"
	StepVerify   = "verify"
	StepPrevious = "previous"
	StepInstall  = "install"
	StepActivate = "activate"
	StepRecord   = "record"
)

// StepDocs are the steps in the order they run, each with what it does:
// the one list of them (--help shows them).
var StepDocs = []steps.Doc{
	{Name: StepFetch, Does: "the package fetched (https or a file) or taken from upgrade/staged"},
	{Name: StepVerify, Does: "its SHA-256, name, architecture and version checked"},
	{Name: StepPrevious, Does: "the installed package kept in upgrade/previous"},
	{Name: StepInstall, Does: "installed by the package manager that installed the agent (or staged as an override on an image-based host)"},
	{Name: StepActivate, Does: "the daemon restarted on the new executable and waited for until it stays up; a failure reinstalls the previous"},
	{Name: StepRecord, Does: "the package kept in upgrade/installed, the outcome left for the daemon"},
}

// The upgrade's named crash points besides its steps' ("upgrade/after-
// <step>", lib/steps) and CrashAfterUnpack (inside dpkg's install); see
// CrashPoints.
const (
	// CrashAfterDaemonRestart: inside the activation (the rollback's
	// too), the daemon restarted on the new executable and not judged
	// yet: where a new daemon that takes the host down with it cuts the
	// run.
	CrashAfterDaemonRestart = Operation + "/after-daemon-restart"
	// CrashAfterRequestTaken: the record's last write done (the package
	// in installed/, the outcome recorded, the request taken), its journal not
	// removed yet.
	CrashAfterRequestTaken = Operation + "/after-request-taken"
	// CrashRollingBack: a rollback journaled, nothing of it done yet.
	CrashRollingBack = Operation + "/rolling-back"
	// CrashBeforeRelease: the run over (its journal removed, or kept for
	// the next run), the installation lock not released yet.
	CrashBeforeRelease = Operation + "/before-release"
)

// CrashPoints are the crash points of a successful upgrade on a dpkg host
// in the order it reaches them (a rollback adds CrashRollingBack, and
// reaches CrashAfterUnpack and CrashAfterDaemonRestart again).
var CrashPoints = []string{
	steps.CrashPoint(Operation, StepFetch), steps.CrashPoint(Operation, StepVerify), steps.CrashPoint(Operation, StepPrevious),
	CrashAfterUnpack, steps.CrashPoint(Operation, StepInstall),
	CrashAfterDaemonRestart, steps.CrashPoint(Operation, StepActivate),
	CrashAfterRequestTaken, steps.CrashPoint(Operation, StepRecord),
	CrashBeforeRelease,
}

// MaxResumes bounds how often one upgrade (its journal: one target
// version and package sum) is resumed after a run of it was cut: a new
// agent whose daemon takes the host down after its start would otherwise
// be resumed (at boot, by every new daemon) again and again. The run
// after that many resumes rolls back instead and leaves the failure
// signal, as any failure after the install does.
const MaxResumes = 3

// ErrNothingToDo: no request and nothing staged, or the package asked for
// is the one installed.
var ErrNothingToDo = errors.New("nothing to upgrade")

// ErrResumedTooOften: the upgrade was resumed MaxResumes times and not
// finished (see MaxResumes).
var ErrResumedTooOften = errors.New("the upgrade was resumed too often")

// ErrUnsupportedHost: a host the upgrade does not serve (an image-based
// host whose agent rpm installed). It exits 78, as a configuration no
// rerun changes does (errors.Is matches exitcode.ErrConfigInvalid): no
// restart, no recovery; the failure signal says why.
var ErrUnsupportedHost error = unsupportedHost{}

type unsupportedHost struct{}

func (unsupportedHost) Error() string { return "the agent upgrade does not support this host" }

func (unsupportedHost) Is(target error) bool { return target == exitcode.ErrConfigInvalid }

// Journal is the upgrade's journal (journal/upgrade.json).
type Journal struct {
	steps.Record
	// UID and OperationName are the request's, "" for a staged package.
	UID           string `json:"uid,omitempty"`
	OperationName string `json:"operation,omitempty"`
	// Generation is the Machine's generation a spec.agent upgrade was
	// asked at (lib/outcome's record carries it), 0 otherwise.
	Generation int64 `json:"generation,omitempty"`
	// From is the version installed when the upgrade began; To the one
	// asked for (or, for a staged package, the package's).
	From string `json:"from,omitempty"`
	To   string `json:"to,omitempty"`
	// Source and SHA256 are where the package comes from and its sum.
	Source string `json:"source,omitempty"`
	SHA256 string `json:"sha256"`
	// Staged is the package file in the staging directory; Previous the
	// package a rollback reinstalls.
	Staged   string `json:"staged"`
	Previous string `json:"previous,omitempty"`
	// Image is an image-based host (/usr read-only, or the agent not
	// installed by the package manager): the upgrade stages an override
	// (override.go) instead of installing the package. PreviousOverride
	// is the override's version it replaces, "" for the image's agent.
	Image            bool   `json:"image,omitempty"`
	PreviousOverride string `json:"previousOverride,omitempty"`
	// RollingBack is written before a rollback begins: a run resumed
	// after a cut in it rolls back again (the installed executable may
	// be either package's by then), never on to the record.
	RollingBack bool `json:"rollingBack,omitempty"`
	// Recording is written before the record changes anything: a run
	// resumed after a cut in it finishes the record (each of its writes
	// done again), never verifies or activates again (the staged
	// package has moved into installed/) nor rolls back.
	Recording bool `json:"recording,omitempty"`
	// Resumes counts the runs that resumed this journal after a cut
	// (written before such a run does anything else); MaxResumes bounds
	// it. A run that ends itself and keeps the journal (a download to
	// retry) sets it back to 0.
	Resumes int `json:"resumes,omitempty"`
}

// SameVersion says whether a package's version is the executable's
// version stamp. nfpm writes a semver pre-release "1.2.0-rc.1" as
// "1.2.0~rc.1" (which sorts before 1.2.0) in both formats, and an rpm's
// version has a release too ("1.2.0~rc.1-1"): the release is the
// packaging's, not the agent's, so it is not compared.
func SameVersion(pkg, stamp string) bool {
	v, _ := splitRelease(pkg)
	return pkg == stamp || pkg == DebVersion(stamp) || v == DebVersion(stamp)
}

// InProgress says whether an upgrade's journal exists: one runs, or was
// cut and is resumed by the next run.
func InProgress(p hostpaths.Paths) bool {
	_, err := os.Lstat(p.Journal(Operation))
	return err == nil
}

// Upgrade is one run of the upgrade.
type Upgrade struct {
	Paths    hostpaths.Paths
	Packages Packages
	// Systemd connects to the service manager.
	Systemd func(ctx context.Context) (Manager, error)
	// Wait is how the new daemon is judged up.
	Wait Wait
	// CAFile is the cluster CA, trusted besides the system's roots for an
	// https package URL.
	CAFile     string
	HTTP       *http.Client
	Notify     func(string)
	CrashPoint func(string)
	Log        *slog.Logger
	Now        func() time.Time
	// ImageBased says whether /usr is read-only; nil asks statfs.
	ImageBased func() bool
	// LockWait is how long a run waits for another installation (a
	// bootstrap, a repave, a reset) to release the host before it gives
	// up with 69, polling every LockPoll (default 5 s). 0 does not wait.
	// A staged package waits: unbounded-upgrade.path would start a run
	// that gives up at once again and again while the files are there.
	LockWait, LockPoll time.Duration

	// restarted: this run restarted the daemon (activate).
	restarted bool
}

func (u *Upgrade) log() *slog.Logger {
	if u.Log != nil {
		return u.Log
	}
	return slog.Default()
}

func (u *Upgrade) now() time.Time {
	if u.Now != nil {
		return u.Now()
	}
	return time.Now()
}

// Run carries out the upgrade asked for, or resumes the one journaled.
func (u *Upgrade) Run(ctx context.Context) error {
	// The older agent's node, not adopted yet: unbounded-lifecycle.service
	// adopts it before this agent's daemon asks for any upgrade.
	if err := state.CheckAdopted(u.Paths); err != nil {
		return err
	}
	// A record of the upgrade's own before the lock takes it over: a run
	// cut before its release left it, and at boot the generator started
	// no daemon (the upgrade's end starts it).
	own, _ := state.ReadOwnership(u.Paths)
	cut := own != nil && own.Owner == Operation
	lock, err := u.acquire(ctx)
	if err != nil {
		return err
	}
	err = func() error {
		defer func() {
			crashpoint.Via(u.CrashPoint, CrashBeforeRelease)
			lock.Release()
		}()
		return u.run(ctx)
	}()
	if cut && !u.restarted {
		// Nothing left to do (the cut came after the journal's
		// removal), or a run that restarted no daemon: the host goes
		// back to systemd, and the daemon starts as at the end of an
		// upgrade. After the release: it finds the host free.
		if herr := u.handBack(ctx); herr != nil {
			if err == nil || errors.Is(err, ErrNothingToDo) {
				return fmt.Errorf("the upgrade is over but the daemon was not started: %w", herr)
			}
			return fmt.Errorf("%w; and the daemon was not started: %v", err, herr)
		}
	}
	return err
}

// handBack starts the daemon on a host that a cut run of the upgrade
// owned until this run released it.
func (u *Upgrade) handBack(ctx context.Context) error {
	sdstatus.Show(u.log(), u.Notify, "a cut run of the upgrade owned the host: starting %s", unitnames.Daemon)
	sd, err := u.Systemd(ctx)
	if err != nil {
		return err
	}
	defer sd.Close()
	return sd.StartUnit(ctx, unitnames.Daemon)
}

// run is Run under the installation lock.
func (u *Upgrade) run(ctx context.Context) error {
	// Before anything reads the package database: a package a cut run of
	// the package manager left half-installed is finished first.
	if err := u.repair(ctx); err != nil {
		return err
	}
	j := &Journal{}
	found, err := state.ReadJournal(u.Paths, Operation, j)
	if err != nil {
		return err
	}
	if !found {
		if j, err = u.plan(ctx); err != nil {
			return err
		}
	} else {
		u.log().Info("resuming the upgrade", "from", j.From, "to", j.To, "step", j.Step, "rollingBack", j.RollingBack,
			"recording", j.Recording, "resumes", j.Resumes)
		switch {
		case j.RollingBack:
			return u.fail(ctx, j, &steps.Error{Step: StepActivate, Err: fmt.Errorf("cut during the rollback to %s (was: %s)", j.From, j.Step)})
		case j.Recording:
			// Finished below: the record alone.
		case j.Resumes >= MaxResumes:
			return u.fail(ctx, j, &steps.Error{Step: resumedStep(j), Err: fmt.Errorf("%w: resumed %d times, each run cut before its end (last: %s); not resumed again",
				ErrResumedTooOften, j.Resumes, j.Step)})
		default:
			j.Resumes++
			if err := state.WriteJournal(u.Paths, Operation, j); err != nil {
				return err
			}
		}
	}
	run := &steps.Runner{Paths: u.Paths, Operation: Operation, Journal: j, Notify: u.Notify, CrashPoint: u.CrashPoint, Log: u.log()}
	all := []steps.Step{
		{Name: StepFetch, Status: "fetching " + j.Source, Run: func(ctx context.Context) error { return u.fetch(ctx, j) }},
		{Name: StepVerify, Always: true, Run: func(ctx context.Context) error { return u.verify(ctx, j) }},
		{Name: StepPrevious, Status: "keeping the package of " + j.From + " for a rollback", Run: func(ctx context.Context) error { return u.keepPrevious(ctx, j) }},
		// (The version is known once verify read the package: these
		// steps say it themselves.)
		{Name: StepInstall, Run: func(ctx context.Context) error {
			if j.Image {
				sdstatus.Show(u.log(), u.Notify, "step %s: staging %s %s as an override of the image's agent %s", StepInstall, Package, j.To, j.From)
				_, err := writeOverride(u.Paths, j.Staged, j.To, u.now())
				return err
			}
			sdstatus.Show(u.log(), u.Notify, "step %s: installing %s %s (from %s)", StepInstall, Package, j.To, j.From)
			return u.Packages.Install(ctx, j.Staged)
		}},
		{Name: StepActivate, Always: true, Run: func(ctx context.Context) error {
			sdstatus.Show(u.log(), u.Notify, "step %s: restarting %s on %s", StepActivate, unitnames.Daemon, j.To)
			return u.activate(ctx, u.agentExe(j, j.To))
		}},
		{Name: StepRecord, Always: true, Final: true, Run: func(ctx context.Context) error { return u.record(ctx, j) }},
	}
	if j.Recording {
		// The staged package is in installed/ by now: verify would not
		// find it, and the new daemon passed its activation.
		all = all[len(all)-1:]
	}
	err = run.Run(ctx, all)
	if err == nil {
		u.log().Info("agent upgraded", "from", j.From, "to", j.To)
		return nil
	}
	if errors.Is(err, ErrNothingToDo) {
		// Not a failure: the staged files go, the request is carried out.
		for _, f := range []string{j.Staged, j.Staged + ".sha256"} {
			os.Remove(f)
		}
		request.MarkTaken(u.Paths, Concern, j.UID)
		state.RemoveJournal(u.Paths, Operation)
		return err
	}
	if errors.Is(err, exitcode.ErrTemporary) && !j.IsDone(StepInstall) {
		// Nothing changed and the source may answer later: the journal
		// stays for the next run (a resumed download), which resumes
		// no cut run.
		j.Resumes = 0
		state.WriteJournal(u.Paths, Operation, j)
		return err
	}
	return u.fail(ctx, j, err)
}

// resumedStep is the step a resumed run of j carries on with: the first
// not done, the activation (always run again) once installed.
func resumedStep(j *Journal) string {
	for _, s := range []string{StepFetch, StepVerify, StepPrevious, StepInstall} {
		if !j.IsDone(s) {
			return s
		}
	}
	return StepActivate
}

// repair finishes an installation of the agent's package that a cut run
// of the package manager left half done (a power cut inside the
// install's dpkg, or the rollback's): Packages.Repair (dpkg --configure
// -a, dpkg --audit), after which the package must be installed; what that
// does not finish (an unpack cut midway) is installed again from a
// package file of that version the upgrade keeps (staged, installed/,
// previous/). Then the files are verified, as the record does.
func (u *Upgrade) repair(ctx context.Context) error {
	m, st, err := u.Packages.Installed(ctx, Package)
	if err != nil || st != HalfInstalled {
		return err
	}
	sdstatus.Show(u.log(), u.Notify, "repairing %s %s, which a cut run of %s left %s", Package, m.Version, u.Packages.Format(), st)
	rerr := u.Packages.Repair(ctx, Package)
	if rerr == nil {
		rerr = u.installedAs(ctx, m)
	}
	if rerr != nil {
		file := u.keptPackage(ctx, m, u.Paths.UpgradeStaged(), filepath.Join(u.Paths.UpgradeDir(), "installed"), filepath.Join(u.Paths.UpgradeDir(), "previous"))
		if file == "" {
			return fmt.Errorf("%s %s is %s and its repair did not finish it (%w), and no package file of that version is kept to install it again", Package, m.Version, st, rerr)
		}
		u.log().Warn("the repair did not finish the package; installing it again", "package", file, "error", rerr)
		if err := u.Packages.Install(ctx, file); err != nil {
			return fmt.Errorf("%s %s is %s; installing %s again: %w", Package, m.Version, st, file, err)
		}
		if err := u.installedAs(ctx, m); err != nil {
			return err
		}
	}
	if err := u.Packages.Verify(ctx, Package); err != nil {
		u.log().Warn("the repaired package does not verify clean", "error", err)
	}
	u.log().Info("repaired the half-installed package", "package", Package, "version", m.Version)
	return nil
}

// installedAs checks that the package manager says m is installed.
func (u *Upgrade) installedAs(ctx context.Context, m Meta) error {
	got, st, err := u.Packages.Installed(ctx, Package)
	switch {
	case err != nil:
		return err
	case st != Installed:
		return fmt.Errorf("%s is still %s", Package, st)
	case got != m:
		return fmt.Errorf("%s %s is installed, not %s", Package, got.Version, m.Version)
	}
	return nil
}

// acquire takes the installation lock, waiting up to LockWait for
// another owner to release it.
func (u *Upgrade) acquire(ctx context.Context) (*state.Lock, error) {
	poll := u.LockPoll
	if poll <= 0 {
		poll = 5 * time.Second
	}
	deadline := time.Now().Add(u.LockWait)
	said := false
	for {
		lock, err := state.AcquireOwnership(u.Paths, Operation, unitnames.Upgrade)
		if !errors.Is(err, state.ErrOwned) || !time.Now().Before(deadline) {
			return lock, err
		}
		if !said {
			sdstatus.Show(u.log(), u.Notify, "waiting (at most %s) for the host: %v", u.LockWait, err)
			said = true
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(poll):
		}
	}
}
