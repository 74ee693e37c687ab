// Package outcome is the one record of how a one-shot's last run of a
// concern ended: the upgrade, the isolation change, the bootstrap and the
// repave each write one (outcome/<concern>.json in the host root, 0600,
// written atomically) when they end, the daemon's reporter puts the
// upgrade's and the isolation change's on the Machine and removes them
// once reported, and `unbounded status` shows them all.
//
// A record replaces the channels each concern had: the upgrade's
// upgrade/failed.json and upgrade/upgraded.json, the isolation change's
// isolation-outcome.json. Read looks at those too, for one release: an
// upgrade from an older build leaves them (its one-shot writes the
// signal the new daemon reports), and the newest of what it finds is the
// outcome. The upgrade keeps writing its old signal beside its record for
// that release, because a rollback restarts the daemon of the version
// rolled back to, which may know only the old files.
//
// What is not here, on purpose: reset (it removes the host root, this
// record with it; its end is the unit's result), the reprovision handoff
// (its journal, outside the host root, is its outcome until the daemon
// of the target configuration reports it), and the operations' status on
// their MachineOperation (the daemon follows their units, and owes a
// write it could not make: lib/owed).
package outcome

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/state"
)

// State is how a run ended.
type State string

const (
	Succeeded State = "Succeeded"
	Failed    State = "Failed"
)

// Concerns that write a record. A record's concern is one of these or
// another lower-case name (the file's name is the concern's).
const (
	Upgrade   = "upgrade"
	Isolation = "isolation"
	Bootstrap = "bootstrap"
	Repave    = "repave"
)

// Reasons the readers give a meaning to; a concern may use others
// (CamelCase words, a Machine condition's reason syntax).
const (
	// ReasonRolledBack: the run failed after it changed the host and
	// put the host back as it was.
	ReasonRolledBack = "RolledBack"
)

// MaxMessage bounds a record's message (a condition's message is at most
// 32 KiB; the reporter truncates further).
const MaxMessage = 2048

// Record is one run's end.
type Record struct {
	// Concern is the one-shot's concern (Upgrade, Isolation, ...).
	Concern string `json:"concern"`
	// Generation is the Machine's generation the run was asked at, when
	// the daemon asked for it from the Machine's spec; 0 otherwise.
	Generation int64 `json:"generation,omitempty"`
	// Operation and UID name the MachineOperation (or the daemon's own
	// job) the run carried out; empty for a run started by hand.
	Operation string `json:"operation,omitempty"`
	UID       string `json:"uid,omitempty"`
	State     State  `json:"state"`
	// Reason is a CamelCase word (for a failure: which kind, for example
	// RolledBack); Step is the step that failed, Message says what
	// happened.
	Reason  string `json:"reason,omitempty"`
	Step    string `json:"step,omitempty"`
	Message string `json:"message,omitempty"`
	// From and To are what the run changed (versions, modes); Method how
	// (an isolation change's).
	From   string `json:"from,omitempty"`
	To     string `json:"to,omitempty"`
	Method string `json:"method,omitempty"`
	// StartedAt is when the run (or the change it resumed) began, Time
	// when it ended.
	StartedAt time.Time `json:"started-at,omitzero"`
	Time      time.Time `json:"time"`
}

// RolledBack says whether the run failed and put the host back.
func (r Record) RolledBack() bool { return r.State == Failed && r.Reason == ReasonRolledBack }

var concernRE = regexp.MustCompile(`^[a-z][a-z0-9-]{0,39}$`)

// maxRecord bounds a record read (a message is at most MaxMessage bytes).
const maxRecord = 64 << 10

// Write records r as its concern's outcome, replacing the last one. The
// message is cut to MaxMessage bytes.
func Write(p hostpaths.Paths, r Record) error {
	if !concernRE.MatchString(r.Concern) {
		return fmt.Errorf("outcome: %q is not a concern's name", r.Concern)
	}
	if r.State != Succeeded && r.State != Failed {
		return fmt.Errorf("outcome of %s: state %q is neither %s nor %s", r.Concern, r.State, Succeeded, Failed)
	}
	r.Message = truncate(r.Message, MaxMessage)
	r.Time = r.Time.UTC()
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	// Only outcome/: the host root is bootstrap's to create (0700), and a
	// run that never made it (a config refused) leaves the host as it was.
	if err := os.Mkdir(p.OutcomeDir(), 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	return state.WriteFileAtomic(p.Outcome(r.Concern), append(data, '\n'), 0o600)
}

// Read returns concern's outcome, nil when it has none: the newest of its
// record and what an older build left in the files this record replaced.
// A record that cannot be read is an error naming its file.
func Read(p hostpaths.Paths, concern string) (*Record, error) {
	var newest *Record
	var errs []error
	for _, read := range append([]func(hostpaths.Paths, string) (*Record, error){readRecord}, legacy[concern]...) {
		r, err := read(p, concern)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if r != nil && (newest == nil || r.Time.After(newest.Time)) {
			newest = r
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return newest, nil
}

// Remove removes concern's outcome (reported), and what an older build
// left for it.
func Remove(p hostpaths.Paths, concern string) error {
	errs := []error{removeFile(p.Outcome(concern))}
	return errors.Join(append(errs, removeLegacy(p, concern)...)...)
}

// List returns every concern's outcome, by concern. Files in the
// directory that are not records are reported as errors and skipped; the
// records that were read are returned with them.
func List(p hostpaths.Paths) ([]Record, error) {
	concerns := map[string]bool{}
	ents, err := os.ReadDir(p.OutcomeDir())
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	for _, e := range ents {
		if c, ok := strings.CutSuffix(e.Name(), ".json"); ok && concernRE.MatchString(c) {
			concerns[c] = true
		}
	}
	for c := range legacy {
		concerns[c] = true
	}
	names := make([]string, 0, len(concerns))
	for c := range concerns {
		names = append(names, c)
	}
	sort.Strings(names)
	var out []Record
	var errs []error
	for _, c := range names {
		r, err := Read(p, c)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if r != nil {
			out = append(out, *r)
		}
	}
	return out, errors.Join(errs...)
}

func readRecord(p hostpaths.Paths, concern string) (*Record, error) {
	var r Record
	ok, err := state.ReadRecord(p.Outcome(concern), maxRecord, &r)
	if !ok || err != nil {
		return nil, err
	}
	if r.Concern != concern {
		return nil, fmt.Errorf("%s: the record is %q's, not %q's", p.Outcome(concern), r.Concern, concern)
	}
	return &r, nil
}

func removeFile(f string) error {
	if err := state.RemoveDurable(f); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n - len("…")
	for cut > 0 && !utf8Start(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

func utf8Start(b byte) bool { return b&0xC0 != 0x80 }

// ParamGeneration is the request parameter by which the daemon tells a
// one-shot the Machine's generation it asks at (a job of the Machine's
// spec), for the record's Generation.
const ParamGeneration = "generation"

// GenerationOf is the generation params carry (ParamGeneration), 0 when
// they carry none or a bad one.
func GenerationOf(params map[string]string) int64 {
	g, err := strconv.ParseInt(params[ParamGeneration], 10, 64)
	if err != nil || g < 0 {
		return 0
	}
	return g
}
