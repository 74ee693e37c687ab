package state

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"unbounded-cloud.io/agent/lib/hostpaths"
)

// WriteJournal records the journal of a multi-step operation
// (/var/lib/unbounded/journal/<operation>.json, ARCHITECTURE section 5):
// atomically, with a SHA-256 sidecar, mode 0600. An operation writes it
// after every step, so that the next run (after a crash or a reboot)
// knows which steps are done.
func WriteJournal(p hostpaths.Paths, operation string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	if len(data)+1 > maxJournalSize {
		return fmt.Errorf("journal %s would be %d bytes, more than the %d a reader accepts", operation, len(data)+1, maxJournalSize)
	}
	return WriteVerified(p.Journal(operation), append(data, '\n'), 0o600)
}

// ReadJournal decodes the journal of operation into v and reports whether
// there was one. A journal that does not verify, or does not decode into
// v, wraps ErrCorrupt: an operation never resumes from a journal it cannot
// trust.
func ReadJournal(p hostpaths.Paths, operation string, v any) (bool, error) {
	file := p.Journal(operation)
	data, err := ReadVerified(file)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return false, fmt.Errorf("%w: %s: %v", ErrCorrupt, file, err)
	}
	return true, nil
}

// RemoveJournal removes the journal of operation (done, or undone). No
// journal directory at all is nothing to remove.
func RemoveJournal(p hostpaths.Paths, operation string) error {
	if _, err := os.Stat(p.JournalDir()); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return RemoveVerified(p.Journal(operation))
}
