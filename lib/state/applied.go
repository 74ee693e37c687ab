package state

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"unbounded-cloud.io/agent/lib/crashpoint"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/modes/facts"
	"unbounded-cloud.io/agent/lib/regfile"
)

// ErrCorrupt means a state file exists but cannot be trusted: not a
// regular file, larger than its kind's limit, not the expected JSON, or its
// SHA-256 sidecar is missing or does not match. Callers never silently accept it: the generator writes its safe
// state, one-shots fail (exit 1) so that recovery starts.
var ErrCorrupt = errors.New("corrupt state")

// Limits on what a reader loads of each kind of state file. Every state
// file is read through lib/regfile: only a regular file, never blocking, at
// most its limit. The writers of this package never make a larger file, so
// one over the limit is corrupt (ErrCorrupt), and the generator, which
// reads at every boot, spends no more than one bounded read on it.
const (
	// MaxRecordSize bounds a record that embeds an effective config
	// (applied configs, lib/request's requests). lib/config reads at most
	// 1 MiB per file; a record is one merged config plus a few fields,
	// and WriteApplied refuses to write more than this.
	MaxRecordSize = 4 << 20
	// maxSidecarSize bounds a SHA-256 sidecar: one sha256sum line is 64
	// hex digits, two separators and a file name of at most NAME_MAX
	// (255) bytes.
	maxSidecarSize = 4 << 10
	// maxOwnershipSize bounds the ownership record: an owner, a unit
	// name (at most 255 bytes, systemd's limit), a PID and a time, with
	// room for fields to come.
	maxOwnershipSize = 64 << 10
	// maxJournalSize bounds a journal: the step reached and what to undo,
	// which names paths and units, not contents.
	maxJournalSize = 1 << 20
)

// readState reads a state file of at most limit bytes through lib/regfile.
// Something that is not a regular file, or is over the limit, is corrupt
// state; a missing file stays an *fs.PathError (os.IsNotExist), and other
// errors (permission denied) stay what they are: they are not corruption.
func readState(file string, limit int64) ([]byte, error) {
	data, err := regfile.Read(file, limit)
	if errors.Is(err, regfile.ErrNotRegular) || errors.Is(err, regfile.ErrTooLarge) {
		return nil, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	return data, err
}

// AppliedConfig is the record of what was applied to one slot. It is
// written only once the node it describes is healthy, so its presence means
// "this slot ran, with this config".
type AppliedConfig struct {
	Slot              string    `json:"slot"`
	Mode              string    `json:"mode"`
	Machine           string    `json:"machine,omitempty"`
	KubernetesVersion string    `json:"kubernetes-version,omitempty"`
	AgentVersion      string    `json:"agent-version,omitempty"`
	AppliedAt         time.Time `json:"applied-at,omitzero"`
	// Config is the effective operator configuration (lib/config) as JSON,
	// with secrets referenced by file, never inlined.
	Config json.RawMessage `json:"config,omitempty"`
}

// LocalDNS says whether the recorded node runs the node-local DNS cache
// (its config's node.local-dns; lib/config's JSON names it Node.LocalDNS).
// A record from before the cache, or one whose config does not decode,
// says no: its node has none to ask.
func (a *AppliedConfig) LocalDNS() bool {
	var c struct{ Node struct{ LocalDNS bool } }
	if json.Unmarshal(a.Config, &c) != nil {
		return false
	}
	return c.Node.LocalDNS
}

func (a *AppliedConfig) validate(slot string) error {
	if !hostpaths.ValidSlot(a.Slot) {
		return fmt.Errorf("slot %q is not kube1 or kube2", a.Slot)
	}
	if a.Slot != slot {
		return fmt.Errorf("record names slot %q but is stored as %s", a.Slot, slot)
	}
	if !facts.Valid(a.Mode) {
		return fmt.Errorf("mode %q is not nspawn, container or none", a.Mode)
	}
	return nil
}

// pending is where a new record is staged before it replaces the current
// one. Two files (record and sidecar) cannot be replaced in one rename, so a
// write goes: stage record, stage sidecar (the commit point), then rename
// both into place. A reader that finds a complete staged pair takes it; a
// half-staged pair is ignored. A crash at any point leaves either the old
// or the new record readable, never a checksum mismatch.
func pending(file string) string { return file + ".next" }

// ChecksumLine is the sidecar content for data, in sha256sum's format.
func ChecksumLine(data []byte, name string) []byte {
	sum := sha256.Sum256(data)
	return []byte(hex.EncodeToString(sum[:]) + "  " + name + "\n")
}

// checksumMatches accepts "HEX", "HEX  NAME" and "HEX *NAME" (the legacy
// agent wrote the bare hex digest).
func checksumMatches(sidecar, data []byte) error {
	fields := strings.Fields(string(sidecar))
	if len(fields) == 0 {
		return errors.New("empty checksum sidecar")
	}
	sum := sha256.Sum256(data)
	if !strings.EqualFold(fields[0], hex.EncodeToString(sum[:])) {
		return errors.New("SHA-256 does not match its sidecar")
	}
	return nil
}

// readPair reads file and its sidecar and checks them.
func readPair(file, sidecar string) ([]byte, error) {
	data, err := readState(file, MaxRecordSize)
	if err != nil {
		return nil, err
	}
	sum, err := readState(sidecar, maxSidecarSize)
	if err != nil {
		if os.IsNotExist(err) {
			return nil, fmt.Errorf("%w: %s: checksum sidecar %s is missing", ErrCorrupt, file, sidecar)
		}
		return nil, err
	}
	if err := checksumMatches(sum, data); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrCorrupt, file, err)
	}
	return data, nil
}

// ReadVerified returns the content of a state file whose SHA-256 sidecar
// matches, taking a completely staged replacement into account (see
// pending). It returns an error wrapping os.ErrNotExist when there is no
// record, and ErrCorrupt when there is one that cannot be trusted. It never
// changes the host (the generator calls it).
func ReadVerified(file string) ([]byte, error) {
	side := hostpaths.Checksum(file)
	next := pending(file)
	// A complete staged pair is the newest committed state.
	if data, err := readPair(next, hostpaths.Checksum(next)); err == nil {
		return data, nil
	}
	// Crash between the two final renames: the record is already the new
	// one and only the staged sidecar is left to move.
	if sum, err := readState(hostpaths.Checksum(next), maxSidecarSize); err == nil {
		if data, err := readState(file, MaxRecordSize); err == nil && checksumMatches(sum, data) == nil {
			return data, nil
		}
	}
	data, err := readPair(file, side)
	if err != nil && os.IsNotExist(err) {
		if _, serr := os.Stat(side); serr == nil {
			return nil, fmt.Errorf("%w: %s is missing but its checksum sidecar exists", ErrCorrupt, file)
		}
	}
	return data, err
}

// WriteVerified atomically replaces file and its SHA-256 sidecar (see
// pending for why this takes more than one rename). perm applies to both.
func WriteVerified(file string, data []byte, perm os.FileMode) error {
	if err := stage(file, data, perm); err != nil {
		return err
	}
	return FinishPending(file)
}

// stage writes the staged pair of file: the record, then its sidecar (the
// commit point).
func stage(file string, data []byte, perm os.FileMode) error {
	next := pending(file)
	if err := WriteFileAtomic(next, data, perm); err != nil {
		return err
	}
	return WriteFileAtomic(hostpaths.Checksum(next), ChecksumLine(data, filepath.Base(file)), perm)
}

// CrashAfterStagedApplied is the crash point (lib/crashpoint) between an
// applied record's staging and its renames: a power cut there leaves
// only the staged pair, which readers take and the next writer moves.
const CrashAfterStagedApplied = "applied/after-staged"

// FinishPending moves a completely staged pair into place, or drops a
// half-staged one (see pending). It is idempotent. Readers never need it
// (ReadVerified takes a complete staged pair as the record, and the
// generator must not write); the first writer after a boot calls it so
// that the record is under its own name again: WriteVerified after its
// own staging, lifecycle at every boot (FinishApplied), recovery before
// it moves a record. Call it only under the installation lock, or where
// no installation holds it: a writer between its two staging writes has
// a half-staged pair that this drops.
func FinishPending(file string) error {
	next := pending(file)
	nextSide := hostpaths.Checksum(next)
	if _, err := readPair(next, nextSide); err == nil {
		if err := os.Rename(next, file); err != nil {
			return err
		}
	} else if _, err := os.Stat(next); err == nil {
		// Staged record without a valid sidecar: the write never committed.
		if err := os.Remove(next); err != nil {
			return err
		}
		if err := os.Remove(nextSide); err != nil && !os.IsNotExist(err) {
			return err
		}
		return SyncDir(filepath.Dir(file))
	}
	if sum, err := readState(nextSide, maxSidecarSize); err == nil {
		data, rerr := readState(file, MaxRecordSize)
		if rerr == nil && checksumMatches(sum, data) == nil {
			if err := os.Rename(nextSide, hostpaths.Checksum(file)); err != nil {
				return err
			}
		} else if err := os.Remove(nextSide); err != nil {
			return err
		}
	}
	return SyncDir(filepath.Dir(file))
}

// RemoveVerified removes a state file with its sidecar and any staged
// pair, in an order that leaves a reader at every moment of it (the
// generator run by another unit's daemon-reload, the next boot after a
// power cut) either the whole record or none, never "missing but its
// checksum sidecar exists", which reads as corrupt and puts the host into
// its safe state: a staged pair is finished first (FinishPending), then
// the sidecar moves to the staged sidecar's name (the record still reads
// through it, as after a crash between a write's two renames), then the
// record goes, then that sidecar. The same rules as FinishPending's apply
// to the caller.
func RemoveVerified(file string) error {
	if err := FinishPending(file); err != nil {
		return err
	}
	dir := filepath.Dir(file)
	nextSide := hostpaths.Checksum(pending(file))
	if err := os.Rename(hostpaths.Checksum(file), nextSide); err != nil && !os.IsNotExist(err) {
		return err
	}
	if err := SyncDir(dir); err != nil {
		return err
	}
	for _, f := range []string{file, nextSide} {
		if err := os.Remove(f); err != nil && !os.IsNotExist(err) {
			return err
		}
	}
	return SyncDir(dir)
}

// ReadApplied reads the applied config of slot. A missing record is an
// error wrapping os.ErrNotExist; an untrustworthy one wraps ErrCorrupt.
func ReadApplied(p hostpaths.Paths, slot string) (*AppliedConfig, error) {
	file := p.AppliedConfig(slot)
	data, err := ReadVerified(file)
	if err != nil {
		return nil, err
	}
	return decodeApplied(file, slot, data)
}

func decodeApplied(file, slot string, data []byte) (*AppliedConfig, error) {
	var a AppliedConfig
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&a); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrCorrupt, file, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%w: %s: trailing data after the record", ErrCorrupt, file)
	}
	if err := a.validate(slot); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrCorrupt, file, err)
	}
	return &a, nil
}

// WriteApplied records the config applied to a.Slot. Call it only once the
// node it describes is healthy.
func WriteApplied(p hostpaths.Paths, a *AppliedConfig) error {
	if err := a.validate(a.Slot); err != nil {
		return err
	}
	data, err := json.MarshalIndent(a, "", "  ")
	if err != nil {
		return err
	}
	if len(data)+1 > MaxRecordSize {
		// Written, it would read as corrupt at the next boot.
		return fmt.Errorf("applied config of %s would be %d bytes, more than the %d a reader accepts", a.Slot, len(data)+1, MaxRecordSize)
	}
	// 0600: the effective config names the token file and may carry
	// cluster details an unprivileged user has no business reading.
	file := p.AppliedConfig(a.Slot)
	if err := stage(file, append(data, '\n'), 0o600); err != nil {
		return err
	}
	crashpoint.Hit(CrashAfterStagedApplied)
	return FinishPending(file)
}

// FinishApplied finishes a staged replacement of each slot's applied
// record (FinishPending): after a power cut between the staging and the
// renames, the record is under its real name again.
func FinishApplied(p hostpaths.Paths) error {
	for _, slot := range hostpaths.Slots {
		if err := FinishPending(p.AppliedConfig(slot)); err != nil {
			return fmt.Errorf("finish the staged applied config of %s: %w", slot, err)
		}
	}
	return nil
}

// RemoveApplied forgets the applied config of slot.
func RemoveApplied(p hostpaths.Paths, slot string) error {
	return RemoveVerified(p.AppliedConfig(slot))
}
