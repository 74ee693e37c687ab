package outcome

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/state"
)

// The files a record replaced, read (and removed with the record) for one
// release: an older build's one-shot, or the daemon of an older build
// after a rollback, still writes or reads them.
var legacy = map[string][]func(hostpaths.Paths, string) (*Record, error){
	Upgrade:   {readUpgradeFailed, readUpgraded},
	Isolation: {readIsolationOutcome},
}

// removeLegacy removes what an older build left for concern.
func removeLegacy(p hostpaths.Paths, concern string) []error {
	switch concern {
	case Upgrade:
		return []error{removeFile(p.UpgradeFailed()), removeFile(p.UpgradeSucceeded())}
	case Isolation:
		return []error{state.RemoveVerified(p.LegacyIsolationOutcome())}
	}
	return nil
}

// UpgradeFailed is the failure signal (upgrade/failed.json) of builds
// before this record, which the upgrade still writes for them.
type UpgradeFailed struct {
	UID        string    `json:"uid,omitempty"`
	Operation  string    `json:"operation,omitempty"`
	From       string    `json:"from,omitempty"`
	To         string    `json:"to,omitempty"`
	Step       string    `json:"step"`
	Message    string    `json:"message"`
	RolledBack bool      `json:"rolledBack"`
	At         time.Time `json:"at"`
}

// UpgradeSucceeded is the success signal (upgrade/upgraded.json) of
// builds before this record, which the upgrade still writes for them.
type UpgradeSucceeded struct {
	UID       string    `json:"uid,omitempty"`
	Operation string    `json:"operation,omitempty"`
	From      string    `json:"from"`
	To        string    `json:"to"`
	At        time.Time `json:"at"`
}

// WriteLegacyUpgrade writes r as the signal a daemon of a build before
// this record reads (failed.json or upgraded.json), and removes the
// other one: a daemon of such a build started by a rollback knows only
// these. It goes with the release after the one that added the record.
func WriteLegacyUpgrade(p hostpaths.Paths, r Record) error {
	file, other := p.UpgradeFailed(), p.UpgradeSucceeded()
	var v any
	failed, succeeded := r.UpgradeSignals()
	if succeeded != nil {
		file, other, v = other, file, succeeded
	} else {
		v = failed
	}
	if err := removeFile(other); err != nil {
		return err
	}
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(p.UpgradeDir(), 0o700); err != nil {
		return err
	}
	return state.WriteFileAtomic(file, append(data, '\n'), 0o600)
}

// UpgradeSignals is an upgrade's record as the signal of builds before
// it: failed for a failure, succeeded for a success.
func (r Record) UpgradeSignals() (failed *UpgradeFailed, succeeded *UpgradeSucceeded) {
	if r.State == Succeeded {
		return nil, &UpgradeSucceeded{UID: r.UID, Operation: r.Operation, From: r.From, To: r.To, At: r.Time.UTC()}
	}
	return &UpgradeFailed{UID: r.UID, Operation: r.Operation, From: r.From, To: r.To, Step: r.Step,
		Message: truncate(r.Message, MaxMessage), RolledBack: r.RolledBack(), At: r.Time.UTC()}, nil
}

func readUpgradeFailed(p hostpaths.Paths, _ string) (*Record, error) {
	var f UpgradeFailed
	if ok, err := state.ReadRecord(p.UpgradeFailed(), maxRecord, &f); !ok || err != nil {
		return nil, err
	}
	r := &Record{Concern: Upgrade, Operation: f.Operation, UID: f.UID, State: Failed, Reason: "UpgradeFailed",
		Step: f.Step, Message: f.Message, From: f.From, To: f.To, Time: f.At}
	if f.RolledBack {
		r.Reason = ReasonRolledBack
	}
	return r, nil
}

func readUpgraded(p hostpaths.Paths, _ string) (*Record, error) {
	var u UpgradeSucceeded
	if ok, err := state.ReadRecord(p.UpgradeSucceeded(), maxRecord, &u); !ok || err != nil {
		return nil, err
	}
	return &Record{Concern: Upgrade, Operation: u.Operation, UID: u.UID, State: Succeeded, Reason: "Upgraded",
		From: u.From, To: u.To, Time: u.At}, nil
}

// isolationOutcome is isolation-outcome.json of builds before this
// record (with a SHA-256 sidecar).
type isolationOutcome struct {
	From      string    `json:"from"`
	To        string    `json:"to"`
	Method    string    `json:"method,omitempty"`
	State     string    `json:"state"`
	StartedAt time.Time `json:"started-at,omitzero"`
	EndedAt   time.Time `json:"ended-at"`
	Message   string    `json:"message,omitempty"`
}

func readIsolationOutcome(p hostpaths.Paths, _ string) (*Record, error) {
	file := p.LegacyIsolationOutcome()
	data, err := state.ReadVerified(file)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var o isolationOutcome
	if err := json.Unmarshal(data, &o); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", state.ErrCorrupt, file, err)
	}
	return &Record{Concern: Isolation, State: State(o.State), Message: o.Message, From: o.From, To: o.To, Method: o.Method,
		StartedAt: o.StartedAt, Time: o.EndedAt}, nil
}
