// Package recovery is unbounded-recover, run by unbounded-recover@.service
// when an agent unit fails (the instance is the failed unit's name) and when
// the generator finds the host's state unusable at boot (GeneratorInstance).
// The unit file says what it does and ARCHITECTURE section 6 its limits;
// Recovery.Run holds the order and its reasons, stale.go the host with two
// applied configs, limit.go the rate limit.
package recovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"unbounded-cloud.io/agent/lib/generator"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/modes/facts"
	"unbounded-cloud.io/agent/lib/state"
	"unbounded-cloud.io/agent/lib/unitjournal"
	"unbounded-cloud.io/agent/lib/unitnames"
)

// GeneratorInstance is the instance the generator pulls in on unusable
// state (unitnames.RecoverGenerator): no unit failed; the generator's own
// decision says what is wrong.
const GeneratorInstance = "generator"

// DaemonUnit is the unit recovery repairs.
const DaemonUnit = unitnames.Daemon

// Owner is recovery's name in the ownership record.
const Owner = "recover"

// JournalLines is how many of the failed run's last journal lines the
// report carries.
const JournalLines = 20

// ErrUnrepaired: recovery found something it cannot repair (the daemon's
// executable or unit file gone, state it must not guess about). It is
// reported; the recovery unit fails (exit 1) so that `systemctl --failed`
// shows it too.
var ErrUnrepaired = errors.New("recovery could not repair everything")

// Failure is what systemd says about the failed unit: the $MONITOR_*
// variables it passes to units started by OnFailure= (systemd.exec(5),
// "Environment Variables in Spawned Processes"; systemd 252 has them).
type Failure struct {
	// Unit is the failed unit (the template's instance), or
	// GeneratorInstance.
	Unit string
	// Result is $MONITOR_SERVICE_RESULT: "exit-code", "signal",
	// "core-dump", "timeout", "watchdog", "start-limit-hit", ...
	Result string
	// ExitCode is $MONITOR_EXIT_CODE: "exited", "killed" or "dumped".
	ExitCode string
	// ExitStatus is $MONITOR_EXIT_STATUS: the exit status ("1") or the
	// signal's name ("KILL").
	ExitStatus string
	// Invocation is $MONITOR_INVOCATION_ID, the failed run's.
	Invocation string
}

// FailureFromEnv reads the failure of unit from getenv ($MONITOR_*). A
// recovery started by hand or by the generator has none of them; Run
// then reads what it needs from systemd.
func FailureFromEnv(unit string, getenv func(string) string) Failure {
	return Failure{
		Unit:       unit,
		Result:     getenv("MONITOR_SERVICE_RESULT"),
		ExitCode:   getenv("MONITOR_EXIT_CODE"),
		ExitStatus: getenv("MONITOR_EXIT_STATUS"),
		Invocation: getenv("MONITOR_INVOCATION_ID"),
	}
}

// fill completes f from the unit's state as systemd keeps it, for a
// recovery that got no $MONITOR_* variables.
func (f *Failure) fill(st UnitStatus) {
	if f.Result == "" {
		f.Result = st.Result
	}
	if f.ExitCode == "" {
		switch st.ExecMainCode {
		case 1:
			f.ExitCode = "exited"
		case 2:
			f.ExitCode = "killed"
		case 3:
			f.ExitCode = "dumped"
		}
	}
	if f.ExitStatus == "" && f.ExitCode != "" {
		if f.ExitCode == "exited" {
			f.ExitStatus = strconv.Itoa(st.ExecMainStatus)
		} else {
			f.ExitStatus = signalName(st.ExecMainStatus)
		}
	}
	if f.Invocation == "" {
		f.Invocation = st.InvocationID
	}
}

func signalName(n int) string {
	switch n {
	case 9:
		return "KILL"
	case 15:
		return "TERM"
	case 6:
		return "ABRT"
	case 11:
		return "SEGV"
	}
	return strconv.Itoa(n)
}

// Describe says how the run ended, in words for a person.
func (f Failure) Describe() string {
	var parts []string
	if f.Result != "" {
		parts = append(parts, "result "+f.Result)
	}
	switch f.ExitCode {
	case "exited":
		parts = append(parts, "exit status "+f.ExitStatus)
	case "killed", "dumped":
		s := "killed by SIG" + f.ExitStatus
		if f.ExitStatus == "KILL" {
			s += " (a crash point, the OOM killer or kill -9: its next run finishes or rolls back its work)"
		}
		parts = append(parts, s)
	}
	if len(parts) == 0 {
		return "result unknown"
	}
	return strings.Join(parts, ", ")
}

// notAFailure says why a run that started recovery is left alone, or ""
// when it is a failure to recover. retrying reports whether the unit is
// being restarted by systemd (auto-restart). systemd starts OnFailure=
// units after any failed run: also after exit 77 (the fence refused,
// final, and the fence reports it on the Machine), 78 (configuration
// invalid: the message names the file, and recovery could not even read
// the credentials to report it), a 69 of a unit that does not list it as a
// success, and a 75 that the unit retries itself (Restart=on-failure).
func (f Failure) notAFailure(retrying bool) string {
	if f.ExitCode != "exited" {
		return ""
	}
	switch f.ExitStatus {
	case "69":
		return "exit 69: deferred, an installation owns the host (not a failure)"
	case "77":
		return "exit 77: refused by the allocation fence, final; the fence reports the refusal on the Machine (AllocationLaunchRefused)"
	case "78":
		return "exit 78: configuration invalid; the unit's journal names the file, line and key, and nothing was changed (`unbounded config check` says it again)"
	case "75":
		if retrying {
			return "exit 75: temporary failure, and the unit retries it (auto-restart)"
		}
	}
	return ""
}

// Host holds the steps that touch the host besides files under Paths.
// The zero value is the real host; tests replace single fields.
type Host struct {
	// Systemd connects to the service manager; nil is the system bus.
	Systemd func(ctx context.Context) (Systemd, error)
	// Journal returns a unit run's last lines; nil is lib/unitjournal.
	Journal func(ctx context.Context, q unitjournal.Query) ([]string, error)
	// Report writes the report on the Machine; nil is MachineReporter
	// with the host's config.
	Report func(ctx context.Context, r Report) error
	// Now is the clock; nil is time.Now.
	Now func() time.Time
	// Crash is called at each crash point; nil is lib/crashpoint.Hit
	// (UNBOUNDED_CRASHPOINT).
	Crash func(name string)
}

func (h Host) now() time.Time {
	if h.Now != nil {
		return h.Now()
	}
	return time.Now()
}

// Recovery is one run of unbounded-recover.
type Recovery struct {
	Paths   hostpaths.Paths
	Failure Failure
	// Limit is the rate limit; the zero value is DefaultLimit.
	Limit Limit
	// StartTimeout bounds the start of the daemon; 0 is 2 minutes.
	StartTimeout time.Duration
	Host         Host
	Log          *slog.Logger
}

// Run recovers from r.Failure, in order: it tells a failure from what is
// not one (Failure.notAFailure: one journal line, exit 0); leaves a host
// that an installation owns to that installation, which resumes or
// finishes it (owned: report only); applies the rate limit (Limit: past
// Burst recoveries of one unit per Window it says so and does nothing);
// repairs the daemon (repair); and reports, on the Machine (condition
// Recovered and an Event with the failed unit, its result and its last
// journal lines) when the cluster answers, and always in the journal.
//
// It never starts the failed unit again: a unit that failed for a reason
// (a repave that rolled back, a bootstrap whose artifact checksum did not
// match) would fail the same way, and one that was killed (SIGKILL: a
// crash point, the OOM killer, kill -9) finishes or rolls back its own
// journal at its next run (unbounded-lifecycle at the next boot, or the
// daemon resuming its operation); restarting it from here could loop a
// unit the OOM killer keeps killing.
//
// It returns nil when there was nothing to do or everything was repaired,
// state.ErrOwned (exit 69) when an installation owns the host,
// ErrUnrepaired (exit 1) when something could not be repaired. Either way
// the failure is reported.
func (r *Recovery) Run(ctx context.Context) error {
	log := r.Log
	if log == nil {
		log = slog.Default()
	}
	limit := r.Limit
	if limit.Burst <= 0 || limit.Window <= 0 {
		limit = DefaultLimit
	}
	f := r.Failure
	log = log.With("failed-unit", f.Unit)
	dial := r.Host.Systemd
	if dial == nil {
		dial = Dial
	}
	sd, err := dial(ctx)
	if err != nil {
		return err
	}
	defer sd.Close()

	// 1. What happened.
	var lines []string
	var what string
	if f.Unit == GeneratorInstance {
		problem := generator.Decide(generator.Host{}.Read(r.Paths)).Problem
		if problem == "" {
			problem = "the generator held the node back at boot; its reason is on /dev/kmsg (journalctl -k -g unbounded-generator), and the state reads sound now"
		}
		what = "the generator found this host's state unusable and started neither the node nor the daemon: " + rel(r.Paths, problem)
	} else {
		st, err := sd.UnitStatus(ctx, f.Unit)
		if err != nil {
			log.Warn("cannot read the failed unit's state", "error", err)
		}
		f.fill(st)
		retrying := st.SubState == "auto-restart" || st.ActiveState == "activating"
		if why := f.notAFailure(retrying); why != "" {
			log.Info("recovery: " + f.Unit + " ended with " + why + ": nothing to recover")
			return nil
		}
		what = fmt.Sprintf("%s failed: %s", f.Unit, f.Describe())
		lines = r.journal(ctx, log, f, st)
	}

	// 2. An installation owns the host: report only.
	o, owned, tookOver := r.owned()
	if !owned {
		// 3. The rate limit.
		if held, err := r.admit(ctx, log, limit, f, what, lines); held || err != nil {
			return err
		}
		log.Info("recovering: " + what)
		// 4. The repair.
		o = r.repair(ctx, log, sd, tookOver)
	}

	// 5. The report.
	rep := Report{Unit: f.Unit, Lines: lines, Repaired: len(o.problems) == 0 && !o.owned}
	var b strings.Builder
	b.WriteString(what + ".")
	for _, a := range o.actions {
		b.WriteString(" " + a + ".")
	}
	for _, p := range o.problems {
		b.WriteString(" NOT REPAIRED: " + p + ".")
	}
	rep.Message = b.String()
	switch {
	case o.owned:
		rep.Reason = ReasonDeferred
	case len(o.problems) > 0:
		rep.Reason = ReasonRepairFailed
	default:
		rep.Reason = ReasonUnitFailed
	}
	if len(o.problems) > 0 {
		log.Error("recovery: " + rep.Message)
	} else {
		log.Info("recovery: " + rep.Message)
	}
	r.report(ctx, log, rep)
	switch {
	case o.owned:
		return state.ErrOwned
	case len(o.problems) > 0:
		return ErrUnrepaired
	}
	return nil
}

// admit applies the rate limit to this recovery of f.Unit and records it;
// held reports that recovery holds back (said in the journal, and on the
// Machine once per window).
func (r *Recovery) admit(ctx context.Context, log *slog.Logger, limit Limit, f Failure, what string, lines []string) (held bool, err error) {
	now := r.Host.now()
	file, err := historyFile(r.Paths, f.Unit)
	if err != nil {
		return false, err
	}
	h, err := readHistory(file)
	if err != nil {
		log.Warn("recovery history unreadable; starting it afresh", "file", r.Paths.Rel(file), "error", err)
	}
	if held, next := limit.admit(&h, now); held {
		say := limit.sayHeldBack(&h, now)
		if err := writeHistory(file, h); err != nil {
			log.Warn("cannot record the recovery history", "error", err)
		}
		msg := fmt.Sprintf("%s. Recovery held back: %d recoveries of %s within the last %v already (at most %d per %v); the next can run after %s. Its failures stay in `journalctl -u %s`.",
			what, len(h.Runs), f.Unit, limit.Window, limit.Burst, limit.Window, next.UTC().Format(time.RFC3339), f.Unit)
		log.Warn(msg)
		if say {
			r.report(ctx, log, Report{Unit: f.Unit, Reason: ReasonHeldBack, Message: msg, Lines: lines})
		}
		return true, nil
	}
	if err := writeHistory(file, h); err != nil {
		log.Warn("cannot record the recovery history", "error", err)
	}
	return false, nil
}

// journal returns the failed run's last lines.
func (r *Recovery) journal(ctx context.Context, log *slog.Logger, f Failure, st UnitStatus) []string {
	read := r.Host.Journal
	if read == nil {
		read = unitjournal.Read
	}
	q := unitjournal.Query{Unit: f.Unit, Invocation: f.Invocation, StartedAt: st.StartedAt, PID: st.MainPID, Lines: JournalLines}
	lines, err := read(ctx, q)
	if err != nil {
		log.Warn("cannot read the failed unit's journal", "error", err)
		return []string{"(journal unreadable: " + err.Error() + ")"}
	}
	return lines
}

// outcome is what a repair did and what it could not do.
type outcome struct {
	actions  []string
	problems []string
	// owned: an installation owns the host; nothing was touched.
	owned bool
}

func (o *outcome) did(format string, args ...any) {
	o.actions = append(o.actions, fmt.Sprintf(format, args...))
}
func (o *outcome) cannot(format string, args ...any) {
	o.problems = append(o.problems, fmt.Sprintf(format, args...))
}

// owned looks at the ownership record before anything is touched: a host
// that an installation owns (also one that crashed and left its record)
// is only reported on, and recovery writes nothing on it, not even its
// history. tookOver reports a record of an earlier recovery, which this
// one takes over.
func (r *Recovery) owned() (o outcome, owned, tookOver bool) {
	p := r.Paths
	own, err := state.ReadOwnership(p)
	switch {
	case own == nil && state.CheckAdopted(p) != nil:
		// unbounded-lifecycle.service adopts the older agent's node
		// (or said why it cannot): nothing of this agent's to repair.
		o.owned = true
		o.did("Nothing repaired: %v", state.CheckAdopted(p))
		return o, true, false
	case own == nil:
		// A live reprovision handoff holds no lock (its reset and
		// bootstrap take it in turn) but owns the host all the same:
		// the generator pulls in its unit and nothing else of the node,
		// and the daemon comes with the node it bootstraps.
		if live, herr := state.HandoffLive(p); herr != nil {
			o.owned = true
			o.cannot("the reprovision handoff %s is unreadable (%v), so the host is treated as handed off and nothing else starts; `unbounded status` shows it, `unbounded reset` removes it", p.Rel(p.ReprovisionDir()), herr)
			return o, true, false
		} else if live {
			o.owned = true
			o.did("Nothing repaired: the reprovision handoff of an isolation change owns the host (%s resets the host and bootstraps the new mode, then starts the node and the daemon; %s)",
				unitnames.Reprovision, p.ReprovisionDir())
			return o, true, false
		}
		return o, false, false
	case err != nil:
		o.owned = true
		o.cannot("the ownership record %s is unreadable (%v), so the host is treated as owned by an installation and nothing else starts; if no installation runs (`systemctl list-jobs`, `unbounded status`), remove it and run `systemctl daemon-reload`", p.Rel(p.Ownership()), err)
		return o, true, false
	case own.Owner != Owner:
		o.owned = true
		o.did("Nothing repaired: the installation %q owns the host since %s (%s resumes it and starts the node and the daemon when it is done)",
			own.Owner, own.Since.UTC().Format(time.RFC3339), orNone(own.Unit))
		return o, true, false
	}
	// An earlier recovery was killed while it held the lock; the
	// generator held the node and the daemon back for it at boot.
	return o, false, true
}

// repair repairs the daemon from the current applied config (the active
// slot's record, never the bootstrap input, which may name a slot a repave
// has retired): a host with two valid applied configs is first brought
// back to one (retireStale); then the daemon's executable and unit file are
// verified, a mask removed, the generator's link checked (checkDaemon), and
// the daemon started if it does not run. Why the installation lock is held
// only around the unmask is said where it is taken.
func (r *Recovery) repair(ctx context.Context, log *slog.Logger, sd Systemd, tookOver bool) outcome {
	var o outcome
	p := r.Paths
	if tookOver {
		// The record is recovery's own: take it over, release it, and
		// start what the generator held back for it (the node behind
		// its fence; the daemon below).
		l, err := state.AcquireOwnership(p, Owner, "unbounded-recover@"+r.Failure.Unit+".service")
		if err == nil {
			err = l.Release()
		}
		switch {
		case errors.Is(err, state.ErrOwned):
			o.owned = true
			o.did("Nothing repaired: an installation took the host meanwhile (%v)", err)
			return o
		case err != nil:
			o.cannot("remove the ownership record an interrupted recovery left: %v", err)
			return o
		}
		if err := sd.Reload(ctx); err != nil {
			o.cannot("daemon-reload after the ownership record of an interrupted recovery was removed: %v", err)
		} else if err := sd.EnqueueStart(ctx, unitnames.NodeTarget); err != nil {
			o.cannot("start %s: %v", unitnames.NodeTarget, err)
		} else {
			o.did("Removed the ownership record an interrupted recovery left, and started %s (behind the allocation fence)", unitnames.NodeTarget)
		}
	}
	// The lock is taken only for what changes the host's files (an
	// unmask), and released before the daemon-reload and the start: a
	// generator run while recovery's ownership record exists would hold
	// the node and the daemon back, and the daemon exits 69 while any
	// record exists. Checks that find nothing to change take no lock: an
	// installation that starts at the same moment (a rerun of bootstrap
	// after its crash) would otherwise find the host owned by recovery
	// and defer (69).
	note, startNode := r.retireStale(ctx, log, sd, &o)
	if o.owned || len(o.problems) > 0 {
		return o
	}
	d := r.checkDaemon(ctx, log, sd, &o, note)
	if d.unmask {
		lock, err := state.AcquireOwnership(p, Owner, "unbounded-recover@"+r.Failure.Unit+".service")
		if errors.Is(err, state.ErrOwned) {
			o.owned = true
			o.did("Nothing repaired: an installation took the host meanwhile (%v)", err)
			return o
		}
		if err != nil {
			o.cannot("take the installation lock: %v", err)
			return o
		}
		err = sd.Unmask(ctx, DaemonUnit)
		if rerr := lock.Release(); rerr != nil {
			o.cannot("release the installation lock: %v", rerr)
			return o
		}
		if err != nil {
			o.cannot("%s is masked and the unmask failed: %v", DaemonUnit, err)
			return o
		}
		o.did("%s was masked: unmasked it (the daemon must run on a bootstrapped host; reset the host to retire it)", DaemonUnit)
	}
	if d.reload {
		if err := sd.Reload(ctx); err != nil {
			o.cannot("daemon-reload: %v", err)
			return o
		}
		if st, err := sd.UnitStatus(ctx, DaemonUnit); err != nil || st.LoadState != "loaded" {
			o.cannot("%s is %s after a daemon-reload (%v)", DaemonUnit, st.LoadState, err)
			return o
		}
		if !r.generatorWantsDaemon() {
			o.cannot("the generator's output does not pull %s in after a daemon-reload", DaemonUnit)
			return o
		}
		if !d.unmask {
			o.did("The generator had not pulled %s in: reloaded, it does now", DaemonUnit)
		}
	}
	if startNode && d.start {
		// The generator held the node back at boot while the state was
		// unusable (a move that an earlier recovery did not finish):
		// start it, behind its fence, now that the reload pulls it in.
		// A start of an active target still starts what it requires.
		if err := sd.EnqueueStart(ctx, unitnames.NodeTarget); err != nil {
			o.cannot("start %s: %v", unitnames.NodeTarget, err)
		} else {
			o.did("The node of the remaining record did not run: started %s (behind the allocation fence)", unitnames.NodeTarget)
		}
	}
	startDaemon := d.start
	if startDaemon {
		r.startDaemon(ctx, sd, &o)
	}
	return o
}

func orNone(s string) string {
	if s == "" {
		return "no unit"
	}
	return s
}

// daemonRepair is what checkDaemon found to do.
type daemonRepair struct {
	// start: the daemon can run; start it if it does not.
	start bool
	// unmask: its unit is masked (a change under /etc: under the lock).
	unmask bool
	// reload: the generator's output does not pull it in (a reload,
	// after the lock is released: a generator run while recovery's
	// ownership record exists would hold the node and the daemon back).
	reload bool
}

// checkDaemon verifies what the daemon needs, from the current applied
// config, and says what to repair. It changes nothing.
// note, when not empty, says why the two applied configs of the host were
// left alone (retireStale).
func (r *Recovery) checkDaemon(ctx context.Context, log *slog.Logger, sd Systemd, o *outcome, note string) daemonRepair {
	p := r.Paths
	var d daemonRepair
	active, err := state.ReadActive(p)
	if err != nil {
		msg := fmt.Sprintf("the applied state is not usable (%v), and the daemon reads it too, so it is not started", err)
		if note != "" {
			o.cannot("%s: %s", rel(p, msg), rel(p, note))
			return d
		}
		if slot, units, n := r.runningSlot(ctx, sd); n == 1 {
			msg += fmt.Sprintf("; the node that runs is slot %s (%s active)", slot, strings.Join(units, ", "))
		}
		o.cannot("%s: unbounded-lifecycle.service finishes or rolls back an interrupted repave at the next boot; otherwise remove the record that does not describe the running node", rel(p, msg))
		return d
	}
	if active == nil {
		o.did("No daemon to repair: the host has no applied config (not bootstrapped)")
		return d
	}
	d.start = true
	bin := p.Libexec("daemon")
	if fi, err := os.Stat(bin); err != nil {
		d.start = false
		o.cannot("the daemon's executable %s is gone (%v): recovery cannot reinstall it; reinstall the unbounded-agent package", p.Rel(bin), err)
	} else if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
		d.start = false
		o.cannot("the daemon's executable %s is not an executable file (%v): reinstall the unbounded-agent package", p.Rel(bin), fi.Mode())
	}
	st, err := sd.UnitStatus(ctx, DaemonUnit)
	if err != nil {
		o.cannot("read the state of %s: %v", DaemonUnit, err)
		return daemonRepair{}
	}
	switch st.LoadState {
	case "loaded":
	case "masked":
		d.unmask = true
	default:
		o.cannot("%s is %s (its unit file %s is gone or broken): reinstall the unbounded-agent package", DaemonUnit, st.LoadState, filepath.Join(hostpaths.UnitDirHost, DaemonUnit))
		return daemonRepair{}
	}
	// The daemon is pulled in at boot by the generator's link, not by
	// enablement (the preset disables it: see units/80-unbounded.preset).
	// The generator's decision wins: when it holds the daemon back (a
	// missing fence or node unit, say), recovery does not start it
	// either, and says why. When it would pull the daemon in but its
	// output has no link (it last ran while the state was unusable), a
	// reload re-runs it. Recovery decides from the same code in-process
	// first, so that a reload (which makes the generator report on kmsg
	// again) happens only when it changes something.
	plan := generator.Decide(generatorAfterLock.Read(p))
	if !wantsDaemon(plan) {
		o.cannot("the generator holds %s back: %s", DaemonUnit, orNone(rel(p, plan.Problem)))
		return daemonRepair{}
	}
	d.reload = d.unmask || !r.generatorWantsDaemon()
	log.Debug("daemon checked", "active-slot", active.Slot, "mode", active.Mode, "state", st.ActiveState, "unit-file", st.UnitFileState)
	return d
}

// generatorAfterLock reads the host as the generator will once recovery
// has released the installation lock: recovery's own record (one it took
// over) is not one that holds the node back.
var generatorAfterLock = generator.Host{
	ReadOwnership: func(hostpaths.Paths) (*state.Ownership, error) { return nil, nil },
}

// wantsDaemon reports whether plan pulls the daemon in at boot.
func wantsDaemon(plan generator.Plan) bool {
	for _, l := range plan.Links {
		if l.Path == "multi-user.target.wants/"+DaemonUnit {
			return true
		}
	}
	return false
}

// generatorWantsDaemon reports whether the generator's output pulls the
// daemon into multi-user.target.
func (r *Recovery) generatorWantsDaemon() bool {
	_, err := os.Lstat(r.Paths.Join(filepath.Join("/run/systemd/generator", "multi-user.target.wants", DaemonUnit)))
	return err == nil
}

// runningSlot asks the modes which node runs when the applied state does
// not say: the slot with a record whose supervising units are all active.
// n is how many slots qualify; slot and units are the last one's.
func (r *Recovery) runningSlot(ctx context.Context, sd Systemd) (slot string, units []string, n int) {
	for _, s := range hostpaths.Slots {
		a, err := state.ReadApplied(r.Paths, s)
		if err != nil {
			continue
		}
		us := facts.Supervising(a.Mode, a.Slot)
		all := len(us) > 0
		for _, u := range us {
			st, err := sd.ActiveState(ctx, u)
			all = all && err == nil && st == "active"
		}
		if all {
			n++
			slot, units = s, us
		}
	}
	return slot, units, n
}

// startDaemon starts the daemon when it does not run: a failed one is
// reset first (its start limit may be what failed it), then started and
// waited for (Type=notify: READY=1 comes once its host side is set up).
func (r *Recovery) startDaemon(ctx context.Context, sd Systemd, o *outcome) {
	st, err := sd.UnitStatus(ctx, DaemonUnit)
	if err != nil {
		o.cannot("read the state of %s: %v", DaemonUnit, err)
		return
	}
	if st.ActiveState == "active" || st.ActiveState == "activating" || st.ActiveState == "reloading" {
		o.did("%s runs", DaemonUnit)
		return
	}
	if st.ActiveState == "failed" {
		if err := sd.ResetFailed(ctx, DaemonUnit); err != nil {
			o.cannot("reset-failed %s: %v", DaemonUnit, err)
			return
		}
	}
	timeout := r.StartTimeout
	if timeout <= 0 {
		timeout = 2 * time.Minute
	}
	sctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := sd.StartUnit(sctx, DaemonUnit); err != nil {
		o.cannot("%s was %s and did not start: %v", DaemonUnit, st.ActiveState, err)
		return
	}
	o.did("%s was %s: started it", DaemonUnit, st.ActiveState)
}
