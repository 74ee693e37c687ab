package state

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"unbounded-cloud.io/agent/lib/hostpaths"
)

// HandoffJournal is the reprovision handoff's journal (lib/reprovision
// writes it; its SHA-256 sidecar beside it). It is named here, a leaf the
// generator links, so that the generator can tell a live handoff without
// linking lib/reprovision.
func HandoffJournal(p hostpaths.Paths) string {
	return filepath.Join(p.ReprovisionDir(), "journal.json")
}

// HandoffInProgress is the state of a handoff that still runs.
const HandoffInProgress = "InProgress"

// HandoffLive says whether a reprovision handoff is in progress: its
// journal verifies and says InProgress. A missing journal is not live; an
// unreadable one is an error (wrapping ErrCorrupt). It only reads.
func HandoffLive(p hostpaths.Paths) (bool, error) {
	data, err := ReadVerified(HandoffJournal(p))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return false, nil
		}
		return false, err
	}
	var j struct {
		State string `json:"state"`
	}
	if err := json.Unmarshal(data, &j); err != nil {
		return false, fmt.Errorf("%w: %s: %v", ErrCorrupt, HandoffJournal(p), err)
	}
	return j.State == HandoffInProgress, nil
}
