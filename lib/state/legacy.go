package state

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"unbounded-cloud.io/agent/lib/hostpaths"
)

// Legacy describes what the older agent left on a host (ARCHITECTURE
// section 4). Adoption (lib/adopt) moves it into the host root; this
// only detects.
type Legacy struct {
	AppliedConfigs []string // host paths of legacy applied configs found
	Binary         bool
	Unit           bool
}

// Found reports whether anything of the legacy agent is on the host.
func (l Legacy) Found() bool { return len(l.AppliedConfigs) > 0 || l.Binary || l.Unit }

// DetectLegacy looks for the legacy root's files.
func DetectLegacy(p hostpaths.Paths) Legacy {
	var l Legacy
	l.AppliedConfigs = LegacyAppliedConfigs(p)
	if _, err := os.Lstat(p.Join(hostpaths.LegacyBinaryHost)); err == nil {
		l.Binary = true
	}
	if _, err := os.Lstat(p.Join(hostpaths.LegacyUnitHost)); err == nil {
		l.Unit = true
	}
	return l
}

// LegacyAppliedConfigs lists the host paths of the older agent's applied
// configs on the host: an older agent's node that is not adopted yet.
func LegacyAppliedConfigs(p hostpaths.Paths) []string {
	var out []string
	for _, slot := range hostpaths.Slots {
		if _, err := os.Lstat(p.LegacyAppliedConfig(slot)); err == nil {
			out = append(out, p.Rel(p.LegacyAppliedConfig(slot)))
		}
	}
	return out
}

// ErrNotAdopted means the host runs an older agent's node that this agent
// has not adopted yet (lib/adopt). It is a kind of ErrOwned: a command
// that cannot adopt the host itself defers (exit 69) to
// unbounded-lifecycle.service, which adopts it before the daemon starts.
var ErrNotAdopted = fmt.Errorf("the older agent's node is not adopted yet (unbounded-lifecycle.service adopts it): %w", ErrOwned)

// CheckAdopted returns an error wrapping ErrNotAdopted, naming the older
// agent's records, while there are any; nil otherwise. It only stats.
func CheckAdopted(p hostpaths.Paths) error {
	if files := LegacyAppliedConfigs(p); len(files) > 0 {
		return fmt.Errorf("%w: %v", ErrNotAdopted, files)
	}
	return nil
}

// ReadLegacyApplied reads the older agent's applied config of slot and
// checks it against its sidecar, which held the bare hex digest. The
// older agent accepted a record without a sidecar (one it wrote before
// it wrote sidecars, or cut between the two writes); so does this, and
// says so in noSidecar. A sidecar that does not match is ErrCorrupt. A
// missing record wraps os.ErrNotExist.
func ReadLegacyApplied(p hostpaths.Paths, slot string) (data []byte, noSidecar bool, err error) {
	file := p.LegacyAppliedConfig(slot)
	data, err = readState(file, MaxRecordSize)
	if err != nil {
		return nil, false, err
	}
	sum, err := readState(hostpaths.Checksum(file), maxSidecarSize)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return data, true, nil
	case err != nil:
		return nil, false, err
	}
	if err := checksumMatches(sum, data); err != nil {
		return nil, false, fmt.Errorf("%w: %s: %v", ErrCorrupt, file, err)
	}
	return data, false, nil
}

// Adopted is the record of an adoption (hostpaths' Adopted): the slot
// whose node was adopted, the older agent's records it came from (host
// paths), and when.
type Adopted struct {
	Slot    string    `json:"slot"`
	Machine string    `json:"machine,omitempty"`
	From    []string  `json:"from"`
	At      time.Time `json:"at"`
}

// maxAdoptedSize bounds the adoption record: a slot, a name, two paths
// and a time.
const maxAdoptedSize = 64 << 10

// WriteAdopted records an adoption, atomically.
func WriteAdopted(p hostpaths.Paths, a *Adopted) error {
	data, err := json.MarshalIndent(a, "", "  ")
	if err != nil {
		return err
	}
	return WriteFileAtomic(p.Adopted(), append(data, '\n'), 0o600)
}

// ReadAdopted returns the adoption record, nil when the host was never
// adopted (or was reset since).
func ReadAdopted(p hostpaths.Paths) (*Adopted, error) {
	data, err := readState(p.Adopted(), maxAdoptedSize)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var a Adopted
	if err := json.NewDecoder(bytes.NewReader(data)).Decode(&a); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrCorrupt, p.Adopted(), err)
	}
	return &a, nil
}
