package state

import (
	"errors"
	"os"
	"strings"

	"unbounded-cloud.io/agent/lib/hostpaths"
)

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
