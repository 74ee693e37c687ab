package state

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"unbounded-cloud.io/agent/lib/hostpaths"
)

// IsolationOutcome is how the last isolation change carried out on this
// host ended (unbounded-isolation.service writes it, in place or when it
// failed before a handoff), until the daemon has reported it on the
// Machine (status.isolationChange) and removed it. A reprovision's
// outcome is its handoff's journal instead (lib/reprovision).
type IsolationOutcome struct {
	From      string    `json:"from"`
	To        string    `json:"to"`
	Method    string    `json:"method,omitempty"`
	State     string    `json:"state"` // Succeeded or Failed
	StartedAt time.Time `json:"started-at,omitzero"`
	EndedAt   time.Time `json:"ended-at"`
	Message   string    `json:"message,omitempty"`
}

// IsolationOutcomeFile is where the outcome waits for the daemon.
func IsolationOutcomeFile(p hostpaths.Paths) string {
	return p.IsolationOutcome()
}

// WriteIsolationOutcome records o (atomically, 0600, with its sidecar).
func WriteIsolationOutcome(p hostpaths.Paths, o IsolationOutcome) error {
	data, err := json.MarshalIndent(o, "", "  ")
	if err != nil {
		return err
	}
	return WriteVerified(IsolationOutcomeFile(p), append(data, '\n'), 0o600)
}

// ReadIsolationOutcome returns the recorded outcome, nil when there is
// none.
func ReadIsolationOutcome(p hostpaths.Paths) (*IsolationOutcome, error) {
	data, err := ReadVerified(IsolationOutcomeFile(p))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var o IsolationOutcome
	if err := json.Unmarshal(data, &o); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrCorrupt, IsolationOutcomeFile(p), err)
	}
	return &o, nil
}

// RemoveIsolationOutcome removes the outcome and its sidecar (reported).
func RemoveIsolationOutcome(p hostpaths.Paths) error {
	return RemoveVerified(IsolationOutcomeFile(p))
}

// IsolationSpecFile holds the Machine's spec.isolation.mode as the daemon
// last acted on it (or first saw it): the daemon changes the mode on a
// change of the spec, never on a spec that differed from the running mode
// before it looked (the CRD defaults an unset mode to nspawn, so a Machine
// an allocation controller created says nspawn for any host).
func IsolationSpecFile(p hostpaths.Paths) string {
	return p.IsolationSpec()
}

// ReadIsolationSpecSeen returns the mode recorded, and whether there is a
// record.
func ReadIsolationSpecSeen(p hostpaths.Paths) (string, bool, error) {
	data, err := readState(IsolationSpecFile(p), 64)
	if errors.Is(err, os.ErrNotExist) {
		return "", false, nil
	}
	if err != nil {
		return "", false, err
	}
	return strings.TrimSpace(string(data)), true, nil
}

// WriteIsolationSpecSeen records mode (atomically).
func WriteIsolationSpecSeen(p hostpaths.Paths, mode string) error {
	return WriteFileAtomic(IsolationSpecFile(p), []byte(mode+"\n"), 0o600)
}
