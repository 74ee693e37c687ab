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
// unbounded-upgrade.path watches for). Every outcome but success leaves
// the failure signal failed.json, which the daemon reports on the Machine
// (AgentUpgraded=False) and removes.
package upgrade

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"unbounded-cloud.io/agent/lib/artifacts"
	"unbounded-cloud.io/agent/lib/crashpoint"
	"unbounded-cloud.io/agent/lib/exitcode"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/regfile"
	"unbounded-cloud.io/agent/lib/request"
	"unbounded-cloud.io/agent/lib/sdstatus"
	"unbounded-cloud.io/agent/lib/state"
	"unbounded-cloud.io/agent/lib/steps"
	"unbounded-cloud.io/agent/lib/unitnames"
	"unbounded-cloud.io/agent/lib/version"
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
	// in installed/, upgraded.json, the request taken), its journal not
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

// Failed is the failure signal (failed.json) the next daemon reports.
type Failed struct {
	UID        string    `json:"uid,omitempty"`
	Operation  string    `json:"operation,omitempty"`
	From       string    `json:"from,omitempty"`
	To         string    `json:"to,omitempty"`
	Step       string    `json:"step"`
	Message    string    `json:"message"`
	RolledBack bool      `json:"rolledBack"`
	At         time.Time `json:"at"`
}

// Upgraded is the success signal (upgraded.json) the daemon of the new
// version reports (AgentUpgraded=True) and removes.
type Upgraded struct {
	UID       string    `json:"uid,omitempty"`
	Operation string    `json:"operation,omitempty"`
	From      string    `json:"from"`
	To        string    `json:"to"`
	At        time.Time `json:"at"`
}

// UpgradedFile is the success signal's path.
func UpgradedFile(p hostpaths.Paths) string { return filepath.Join(p.UpgradeDir(), "upgraded.json") }

// ReadFailed returns the failure signal, nil when there is none.
func ReadFailed(p hostpaths.Paths) (*Failed, error) {
	var f Failed
	ok, err := readSignal(p.UpgradeFailed(), &f)
	if !ok {
		return nil, err
	}
	return &f, nil
}

// ReadUpgraded returns the success signal, nil when there is none.
func ReadUpgraded(p hostpaths.Paths) (*Upgraded, error) {
	var u Upgraded
	ok, err := readSignal(UpgradedFile(p), &u)
	if !ok {
		return nil, err
	}
	return &u, nil
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

func readSignal(file string, v any) (bool, error) { return state.ReadRecord(file, 64<<10, v) }

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

// plan reads what to upgrade to: the daemon's request, else a package in
// the staging directory. A request already carried out (Taken), or none,
// and nothing staged, is ErrNothingToDo.
func (u *Upgrade) plan(ctx context.Context) (*Journal, error) {
	from, st, err := u.Packages.Installed(ctx, Package)
	if err != nil {
		return nil, err
	}
	j := &Journal{From: from.Version}
	if st == NotInstalled || u.imageBased() {
		// The agent came with the image: the running one's version.
		j.Image, j.From = true, version.Version
	}
	req, err := request.Read(u.Paths, Concern)
	switch {
	case err == nil && !request.Taken(u.Paths, Concern, req.UID):
		j.UID, j.OperationName = req.UID, req.Operation
		j.To, j.Source, j.SHA256 = req.Parameters["version"], req.Parameters["url"], strings.ToLower(req.Parameters["sha256"])
		var missing []string
		for _, k := range []string{"version", "url", "sha256"} {
			if req.Parameters[k] == "" {
				missing = append(missing, k)
			}
		}
		if len(missing) > 0 {
			return j, u.refuse(j, StepFetch, fmt.Errorf("the AgentUpgrade operation %s lacks the parameter(s) %s", req.Operation, strings.Join(missing, ", ")))
		}
		if !validSHA256(j.SHA256) {
			return j, u.refuse(j, StepFetch, fmt.Errorf("the AgentUpgrade operation %s: sha256 %q is not 64 hex digits", req.Operation, j.SHA256))
		}
		if !validVersion(j.To) {
			return j, u.refuse(j, StepFetch, fmt.Errorf("the AgentUpgrade operation %s: version %q is not a package version (a digit, then letters, digits and .+~:-)", req.Operation, j.To))
		}
		j.Staged = filepath.Join(u.Paths.UpgradeStaged(), Package+"_"+safeName(j.To)+"."+u.Packages.Format())
		return j, u.refuseUnsupported(j, StepFetch)
	case err != nil && !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, request.ErrCorrupt):
		return nil, err
	}
	staged, sum, err := findStaged(u.Paths)
	if err != nil && staged != "" {
		// A .sha256 that says no sum: refused like a wrong one, its
		// files moved out (the path unit must not start this again).
		j.Source, j.Staged = staged, staged
		return j, u.refuse(j, StepVerify, err)
	}
	if err != nil {
		return nil, err
	}
	if staged == "" {
		return nil, ErrNothingToDo
	}
	j.Source, j.Staged, j.SHA256 = staged, staged, sum
	j.Done = append(j.Done, StepFetch) // it is where fetch would put it
	return j, u.refuseUnsupported(j, StepVerify)
}

// refuseUnsupported refuses (78: a rerun finds the same host) the one
// kind of host the upgrade does not serve: an image-based host whose
// agent rpm installed (bootc, rpm-ostree). Its override would read an
// .rpm without rpm, which the image-based path does not (it reads a
// .deb); the agent comes with the next image there.
func (u *Upgrade) refuseUnsupported(j *Journal, step string) error {
	if !j.Image || u.Packages.Format() == "deb" {
		return nil
	}
	return u.refuse(j, step, fmt.Errorf("%w: it is image-based (/usr is read-only) and its agent was installed by %s; "+
		"the agent comes with the host's next image", ErrUnsupportedHost, u.Packages.Format()))
}

// findStaged returns the package an operator staged: the file beside the
// first (by name) NAME.sha256 in the staging directory, and the sum the
// .sha256 file gives (sha256sum's format, or the sum alone).
func findStaged(p hostpaths.Paths) (file, sum string, err error) {
	ents, err := os.ReadDir(p.UpgradeStaged())
	if errors.Is(err, fs.ErrNotExist) {
		return "", "", nil
	}
	if err != nil {
		return "", "", err
	}
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), ".sha256")
		if !ok || !e.Type().IsRegular() {
			continue
		}
		data, err := regfile.Read(filepath.Join(p.UpgradeStaged(), e.Name()), 4096)
		if err != nil {
			return "", "", err
		}
		f := strings.Fields(string(data))
		if len(f) == 0 || !validSHA256(strings.ToLower(f[0])) {
			return filepath.Join(p.UpgradeStaged(), name), "", fmt.Errorf("%s: not a SHA-256 (64 hex digits, as sha256sum writes it)", filepath.Join(p.UpgradeStaged(), e.Name()))
		}
		return filepath.Join(p.UpgradeStaged(), name), strings.ToLower(f[0]), nil
	}
	return "", "", nil
}

func (u *Upgrade) fetch(ctx context.Context, j *Journal) error {
	if err := os.MkdirAll(u.Paths.UpgradeStaged(), 0o700); err != nil {
		return err
	}
	client := u.HTTP
	if client == nil {
		c, err := httpClient(u.CAFile)
		if err != nil {
			return err
		}
		client = c
	}
	return fetch(ctx, client, u.log(), j.To, j.Source, j.SHA256, j.Staged)
}

// verify checks the staged package before anything changes: its sum, and
// that it is this agent's package, for this host's architecture, of the
// version asked for.
func (u *Upgrade) verify(ctx context.Context, j *Journal) error {
	got, err := artifacts.HashFile(j.Staged)
	if err != nil {
		return err
	}
	if got != j.SHA256 {
		return fmt.Errorf("package %s: %w: want sha256 %s, got %s", j.Staged, ErrChecksum, j.SHA256, got)
	}
	var m Meta
	var arch string
	if j.Image {
		// No package manager to ask: the package is read here.
		if m, err = DebMeta(j.Staged); err != nil {
			return err
		}
		arch = debArch()
	} else {
		if m, err = u.Packages.Inspect(ctx, j.Staged); err != nil {
			return err
		}
		if arch, err = u.Packages.Arch(ctx); err != nil {
			return err
		}
	}
	switch {
	case m.Name != Package:
		return fmt.Errorf("package %s is %s, not %s", j.Staged, m.Name, Package)
	case m.Arch != arch:
		return fmt.Errorf("package %s is for architecture %s, this host is %s", j.Staged, m.Arch, arch)
	case j.To != "" && !VersionIs(m.Version, j.To):
		return fmt.Errorf("package %s is version %s, the operation asks for %s", j.Staged, m.Version, j.To)
	}
	if !validVersion(m.Version) {
		return fmt.Errorf("package %s: version %q is not a package version", j.Staged, m.Version)
	}
	if (m.Version == j.From || (j.Image && SameVersion(m.Version, j.From))) && !j.IsDone(StepInstall) {
		return fmt.Errorf("%w: %s %s is installed already", ErrNothingToDo, Package, m.Version)
	}
	j.To = m.Version
	return nil
}

// keepPrevious puts the package of the running version into previous/:
// the one an earlier upgrade installed when it is that version, else the
// installed package repacked.
func (u *Upgrade) keepPrevious(ctx context.Context, j *Journal) error {
	if j.Image {
		// The image's agent stays in /usr; an override it replaces
		// stays staged until the record.
		o, err := ReadOverride(u.Paths)
		if err != nil {
			return err
		}
		if o != nil {
			j.PreviousOverride = o.Version
		}
		return nil
	}
	dir := filepath.Join(u.Paths.UpgradeDir(), "previous")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	m, _, err := u.Packages.Installed(ctx, Package)
	if err != nil {
		return err
	}
	dst := filepath.Join(dir, packageFile(u.Packages.Format(), m))
	if installed := u.keptPackage(ctx, m, filepath.Join(u.Paths.UpgradeDir(), "installed")); installed != "" {
		data, err := os.ReadFile(installed)
		if err != nil {
			return err
		}
		if err := state.WriteFileAtomic(dst, data, 0o600); err != nil {
			return err
		}
	} else if err := u.Packages.Repack(ctx, Package, dst); err != nil {
		return err
	}
	j.Previous = dst
	return removeOthers(dir, dst)
}

// keptPackage is a package file of m in one of dirs (the first found),
// else "".
func (u *Upgrade) keptPackage(ctx context.Context, m Meta, dirs ...string) string {
	for _, dir := range dirs {
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			f := filepath.Join(dir, e.Name())
			if !e.Type().IsRegular() || strings.HasSuffix(e.Name(), ".sha256") || strings.HasSuffix(e.Name(), ".part") {
				continue
			}
			if got, err := u.Packages.Inspect(ctx, f); err == nil && got == m {
				return f
			}
		}
	}
	return ""
}

// agentExe is the multicall executable the units run for version: the
// override's staged one on an image-based host ("" version: the image's),
// else the installed one.
func (u *Upgrade) agentExe(j *Journal, version string) string {
	if j.Image && version != "" {
		return filepath.Join(stagedLibexec(u.Paths, version), "unbounded-agent")
	}
	return u.Paths.Libexec("unbounded-agent")
}

func (u *Upgrade) imageBased() bool {
	if u.ImageBased != nil {
		return u.ImageBased()
	}
	return usrReadOnly(u.Paths)
}

// activate restarts the daemon on exe and waits until it runs it and
// stays up.
func (u *Upgrade) activate(ctx context.Context, exe string) error {
	sd, err := u.Systemd(ctx)
	if err != nil {
		return err
	}
	defer sd.Close()
	if err := sd.Reload(ctx); err != nil {
		return err
	}
	begin := time.Now()
	u.restarted = true
	down, err := u.Wait.restart(ctx, sd, exe, func() { crashpoint.Via(u.CrashPoint, CrashAfterDaemonRestart) })
	if err == nil {
		u.log().Info("daemon restarted on the installed package", "down", down.Round(time.Millisecond).String(),
			"took", time.Since(begin).Round(time.Millisecond).String())
	}
	return err
}

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
	if err := state.RemoveDurable(u.Paths.UpgradeFailed()); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	data, _ := json.Marshal(Upgraded{UID: j.UID, Operation: j.OperationName, From: j.From, To: j.To, At: u.now().UTC()})
	if err := state.WriteFileAtomic(UpgradedFile(u.Paths), append(data, '\n'), 0o600); err != nil {
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
		var o *Override
		if v := j.PreviousOverride; v != "" {
			units, err := overriddenUnits(u.Paths)
			if err != nil {
				return err
			}
			o = &Override{Version: v, Dir: u.Paths.Rel(stagedLibexec(u.Paths, v)), Units: units, At: u.now().UTC()}
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
	f := Failed{UID: j.UID, Operation: j.OperationName, From: j.From, To: j.To, Step: step,
		Message: steps.Truncate(err.Error(), 2048), RolledBack: rolledBack, At: u.now().UTC()}
	data, _ := json.Marshal(f)
	os.Remove(UpgradedFile(u.Paths)) // an earlier success is not this outcome
	if werr := os.MkdirAll(u.Paths.UpgradeDir(), 0o700); werr == nil {
		if werr := state.WriteFileAtomic(u.Paths.UpgradeFailed(), append(data, '\n'), 0o600); werr != nil {
			u.log().Error("the upgrade's failure signal was not written", "error", werr)
		}
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
