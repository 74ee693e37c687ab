package recovery

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"unbounded-cloud.io/agent/lib/crashpoint"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/modes/facts"
	"unbounded-cloud.io/agent/lib/regfile"
	"unbounded-cloud.io/agent/lib/state"
)

// Two applied configs.
//
// A host whose two slots both have a valid applied record and no in-place
// journal (ARCHITECTURE section 5: only an isolation change in place may
// have two) cannot run its daemon: the daemon, the generator and health
// read the active config through state.ReadActive, which refuses to
// guess. A repave that was interrupted leaves such a host with its
// journal, and the repave (or unbounded-lifecycle at the next boot)
// finishes or rolls it back: recovery leaves that decision to it. Without
// a repave journal (a record restored by hand, a repave of an older
// release killed between its last two steps) recovery asks the modes
// which node runs (facts.Supervising: all active), and when
// exactly one does, moves the other slot's record and its SHA-256 sidecar
// aside (never deleted) into StaleDir, under the installation lock. Then
// the repair goes on as on any host.
//
// The move is two renames: the sidecar first, then the record. A crash
// between them leaves the record without its sidecar, which every reader
// takes for corrupt (no node, no daemon; the generator pulls recovery in
// at the next boot), and a sidecar in StaleDir whose checksum matches
// that record: the next recovery finishes the move (the decision was
// taken, and the record is no longer trusted by anyone anyway). A record
// without a sidecar that no sidecar in StaleDir vouches for is not
// recovery's to move.

// StaleDir is where recovery moves an applied record (and its sidecar)
// that did not describe the running node:
// /var/lib/unbounded/recover/stale, 0700.
func StaleDir(p hostpaths.Paths) string { return p.RecoverStale() }

// RepaveJournals are the journals of a repave: lib/repave's (Operation,
// "repave") and the none mode's in-place one (lib/modes/none JournalName,
// "repave-none"). Named here so that recovery does not link the repave's
// cluster client; a unit test checks that they match.
var RepaveJournals = []string{"repave", "repave-none"}

// InPlaceJournal is the isolation change's in-place journal
// (state.ReadInPlaceJournal): with it, two records are expected.
const InPlaceJournal = "isolation"

// CrashAfterSidecarMoved is the crash point between the two renames
// (UNBOUNDED_CRASHPOINT=recover/after-sidecar-moved).
const CrashAfterSidecarMoved = "recover/after-sidecar-moved"

// staleTimeFormat is the UTC time in a moved record's name.
const staleTimeFormat = "20060102T150405Z"

// retirement is what recovery decided about two applied records.
type retirement struct {
	// slot's record goes to StaleDir; keep's stays.
	slot, keep string
	// running: keep's supervising units, all active ("" when finishing).
	running []string
	// others: what the retired slot's units were.
	others []string
	// sidecar: a move interrupted after its first rename; the sidecar
	// already in StaleDir.
	sidecar string
	// note: why recovery does not move anything, for the message of the
	// unusable state; "" when it moves, or when the state is not two
	// records.
	note string
}

// exists reports whether path exists (a dangling link too).
func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

// verifiedExists reports whether any file of a verified state file exists:
// the file, its sidecar, a staged pair (lib/state WriteVerified).
func verifiedExists(file string) (string, bool) {
	for _, f := range []string{file, hostpaths.Checksum(file), file + ".next", hostpaths.Checksum(file + ".next")} {
		if exists(f) {
			return f, true
		}
	}
	return "", false
}

// planRetirement reads the records and asks the modes which node runs. It
// changes nothing. ok is false when the host does not have two records
// (nothing to do here: the rest of the repair says what is wrong).
func (r *Recovery) planRetirement(ctx context.Context, sd Systemd) (rt retirement, ok bool) {
	p := r.Paths
	if _, err := state.ReadActive(p); err == nil || !errors.Is(err, state.ErrCorrupt) {
		return rt, false
	}
	if _, found := verifiedExists(p.Journal(InPlaceJournal)); found {
		return rt, false
	}
	valid := map[string]bool{}
	half := map[string]string{}
	for _, s := range hostpaths.Slots {
		if _, err := state.ReadApplied(p, s); err == nil {
			valid[s] = true
		} else if side := halfMoved(p, s); side != "" {
			half[s] = side
		}
	}
	switch {
	case len(valid) == 2:
	case len(valid) == 1 && len(half) == 1:
	default:
		return rt, false
	}
	for _, j := range RepaveJournals {
		if f, found := verifiedExists(p.Journal(j)); found {
			rt.note = fmt.Sprintf("a repave journal (%s) is there, so the repave decides which record stays: `systemctl start unbounded-repave.service` finishes or rolls it back now, unbounded-lifecycle.service at the next boot", f)
			if slot, units, n := r.runningSlot(ctx, sd); n == 1 {
				rt.note = fmt.Sprintf("the node that runs is slot %s (%s active); ", slot, strings.Join(units, ", ")) + rt.note
			}
			return rt, true
		}
	}
	for s, side := range half {
		// An earlier recovery moved the sidecar and was killed before
		// the record: finish it.
		rt.slot, rt.sidecar = s, side
		for k := range valid {
			rt.keep = k
		}
		return rt, true
	}
	slot, units, n := r.runningSlot(ctx, sd)
	if n != 1 {
		var seen []string
		for _, s := range hostpaths.Slots {
			a, err := state.ReadApplied(p, s)
			if err != nil {
				continue
			}
			for _, u := range facts.Supervising(a.Mode, a.Slot) {
				st, err := sd.ActiveState(ctx, u)
				if err != nil {
					st = "unknown (" + err.Error() + ")"
				}
				seen = append(seen, u+" "+st)
			}
		}
		which := "no slot's node runs"
		if n > 1 {
			which = "both slots' nodes run"
			a1, _ := state.ReadApplied(p, hostpaths.Slots[0])
			a2, _ := state.ReadApplied(p, hostpaths.Slots[1])
			if a1 != nil && a2 != nil && slices.Equal(facts.Supervising(a1.Mode, a1.Slot), facts.Supervising(a2.Mode, a2.Slot)) {
				// Both records name one set of units (mode none's slots):
				// that they run says nothing about which record
				// describes them.
				which = fmt.Sprintf("in mode %s both slots' records name the same units, which run", a1.Mode)
				seen = seen[:len(seen)/2]
			}
		}
		rt.note = fmt.Sprintf("%s (%s), so recovery cannot tell which record describes the node and moves neither: move the record that does not describe the node that should run (with its .sha256 sidecar) out of %s, then `systemctl daemon-reload` and `systemctl start unbounded-node.target unbounded-daemon.service`", which, strings.Join(seen, ", "), p.HostRoot())
		return rt, true
	}
	rt.keep, rt.running = slot, units
	for _, s := range hostpaths.Slots {
		if s != slot {
			rt.slot = s
		}
	}
	if a, err := state.ReadApplied(p, rt.slot); err == nil {
		for _, u := range facts.Supervising(a.Mode, a.Slot) {
			st, _ := sd.ActiveState(ctx, u)
			rt.others = append(rt.others, u+" "+st)
		}
	}
	return rt, true
}

// halfMoved returns the sidecar in StaleDir that an interrupted move of
// slot's record left: slot's record is there without its sidecar or a
// staged pair, and a sidecar in StaleDir without its record matches it.
// "" when there is none.
func halfMoved(p hostpaths.Paths, slot string) string {
	rec := p.AppliedConfig(slot)
	for _, f := range []string{hostpaths.Checksum(rec), rec + ".next", hostpaths.Checksum(rec + ".next")} {
		if exists(f) {
			return ""
		}
	}
	data, err := regfile.Read(rec, state.MaxRecordSize)
	if err != nil {
		return ""
	}
	sum := sha256.Sum256(data)
	matches, _ := filepath.Glob(filepath.Join(StaleDir(p), filepath.Base(rec)+".*.sha256"))
	sort.Sort(sort.Reverse(sort.StringSlice(matches)))
	for _, m := range matches {
		if exists(strings.TrimSuffix(m, ".sha256")) {
			continue
		}
		side, err := regfile.Read(m, 4<<10)
		if err != nil {
			continue
		}
		if f := strings.Fields(string(side)); len(f) > 0 && strings.EqualFold(f[0], hex.EncodeToString(sum[:])) {
			return m
		}
	}
	return ""
}

// retireStale moves the record of a slot whose node does not run aside
// when the host has two (see the comment at the top of this file). It
// returns the note for the message of an unusable state when it moves
// nothing; startNode when it moved a record and the node of the one that
// remains does not run (the generator held it back at boot).
func (r *Recovery) retireStale(ctx context.Context, log *slog.Logger, sd Systemd, o *outcome) (note string, startNode bool) {
	p := r.Paths
	rt, ok := r.planRetirement(ctx, sd)
	if !ok || rt.slot == "" {
		return rt.note, false
	}
	unit := "unbounded-recover@" + r.Failure.Unit + ".service"
	lock, err := state.AcquireOwnership(p, Owner, unit)
	if errors.Is(err, state.ErrOwned) {
		o.owned = true
		o.did("Nothing repaired: an installation took the host meanwhile (%v)", err)
		return "", false
	}
	if err != nil {
		o.cannot("take the installation lock: %v", err)
		return "", false
	}
	// A staged replacement of a record goes under its own name first:
	// moving the record aside would leave the staged pair to be read as
	// the record.
	if err := state.FinishApplied(p); err != nil {
		if rerr := lock.Release(); rerr != nil {
			o.cannot("release the installation lock: %v", rerr)
		}
		o.cannot("%v", err)
		return "", false
	}
	// Decided again under the lock: a repave may have ended meanwhile.
	again, ok := r.planRetirement(ctx, sd)
	if !ok || again.slot != rt.slot || again.keep != rt.keep || again.sidecar != rt.sidecar {
		if rerr := lock.Release(); rerr != nil {
			o.cannot("release the installation lock: %v", rerr)
		}
		return again.note, false
	}
	dest, err := r.moveAside(rt)
	if rerr := lock.Release(); rerr != nil {
		o.cannot("release the installation lock: %v", rerr)
	}
	rec := p.AppliedConfig(rt.slot)
	if err != nil {
		o.cannot("move %s (the record of slot %s, whose node does not run) aside to %s: %v", p.Rel(rec), rt.slot, p.Rel(StaleDir(p)), err)
		return "", false
	}
	if rt.sidecar != "" {
		o.did("An earlier recovery was interrupted while it moved %s's record aside (its sidecar was moved already, to %s): moved %s to %s, and slot %s's record is the applied config",
			rt.slot, p.Rel(rt.sidecar), p.Rel(rec), p.Rel(dest), rt.keep)
	} else {
		o.did("Both slots had an applied config and no journal said which runs: %s's node runs (%s active); %s's record did not describe a running node (%s): moved %s and its sidecar to %s and %s",
			rt.keep, strings.Join(rt.running, ", "), rt.slot, strings.Join(rt.others, ", "), p.Rel(rec), p.Rel(dest), p.Rel(hostpaths.Checksum(dest)))
	}
	log.Info("recovery: moved a stale applied record aside", "slot", rt.slot, "to", p.Rel(dest), "kept", rt.keep)
	if len(rt.running) > 0 {
		return "", false
	}
	a, err := state.ReadApplied(p, rt.keep)
	if err != nil {
		return "", false
	}
	for _, u := range facts.Supervising(a.Mode, a.Slot) {
		if st, err := sd.ActiveState(ctx, u); err != nil || st != "active" {
			return "", true
		}
	}
	return "", false
}

// moveAside does the two renames (sidecar, then record) into StaleDir,
// each made durable in both directories, or the record's rename alone
// when rt.sidecar says the first one happened already. It returns the
// record's new name.
func (r *Recovery) moveAside(rt retirement) (string, error) {
	p := r.Paths
	dir := StaleDir(p)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return "", err
	}
	for _, d := range []string{filepath.Dir(dir), p.HostRoot()} {
		if err := state.SyncDir(d); err != nil {
			return "", err
		}
	}
	rec := p.AppliedConfig(rt.slot)
	var dest string
	if rt.sidecar != "" {
		dest = strings.TrimSuffix(rt.sidecar, ".sha256")
	} else {
		base := filepath.Join(dir, filepath.Base(rec)+"."+r.Host.now().UTC().Format(staleTimeFormat))
		dest = base
		// A record moved aside within the same second already: -2, -3...
		for n := 2; exists(dest) || exists(hostpaths.Checksum(dest)); n++ {
			if n > 100 {
				return "", fmt.Errorf("%s and 99 more names exist already", p.Rel(base))
			}
			dest = fmt.Sprintf("%s-%d", base, n)
		}
		if err := renameDurable(hostpaths.Checksum(rec), hostpaths.Checksum(dest)); err != nil {
			return "", err
		}
		crashpoint.Via(r.Host.Crash, CrashAfterSidecarMoved)
	}
	if exists(dest) {
		return "", fmt.Errorf("%s exists already", p.Rel(dest))
	}
	return dest, renameDurable(rec, dest)
}

// renameDurable renames from to to and fsyncs both directories (see
// state.WriteFileAtomic: without that the rename itself may be lost).
func renameDurable(from, to string) error {
	if err := os.Rename(from, to); err != nil {
		return err
	}
	if err := state.SyncDir(filepath.Dir(to)); err != nil {
		return err
	}
	return state.SyncDir(filepath.Dir(from))
}
