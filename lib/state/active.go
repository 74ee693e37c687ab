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

// InPlaceJournal is the part of the isolation change's in-place journal
// that says which of two applied records is the running one. While an
// isolation change runs in place both slots can have a record; the journal
// breaks the tie.
type InPlaceJournal struct {
	RunningSlot string `json:"running-slot"`
	// The change it carries out (lib/repave's isolation journal), for
	// the daemon's report while it runs.
	FromMode  string    `json:"from-mode,omitempty"`
	Mode      string    `json:"mode,omitempty"`
	Method    string    `json:"method,omitempty"`
	StartedAt time.Time `json:"started-at,omitzero"`
}

// ReadInPlaceJournal reads the in-place journal; a missing journal wraps
// os.ErrNotExist.
func ReadInPlaceJournal(p hostpaths.Paths) (*InPlaceJournal, error) {
	file := p.Journal("isolation")
	data, err := readState(file, maxJournalSize)
	if err != nil {
		return nil, err
	}
	var j InPlaceJournal
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&j); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrCorrupt, file, err)
	}
	return &j, nil
}

// ReadActive returns the applied config of the active slot, or nil when the
// host has none (not bootstrapped). Exactly one record is active; with two,
// the in-place journal must name the running one. Anything else wraps
// ErrCorrupt. It only reads.
func ReadActive(p hostpaths.Paths) (*AppliedConfig, error) {
	var found []*AppliedConfig
	for _, slot := range hostpaths.Slots {
		a, err := ReadApplied(p, slot)
		switch {
		case err == nil:
			found = append(found, a)
		case errors.Is(err, os.ErrNotExist):
		default:
			return nil, err
		}
	}
	switch len(found) {
	case 0:
		return nil, nil
	case 1:
		return found[0], nil
	}
	j, err := ReadInPlaceJournal(p)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("%w: both slots have an applied config and no in-place journal (%s) says which runs", ErrCorrupt, p.Journal("isolation"))
		}
		return nil, err
	}
	for _, a := range found {
		if a.Slot == j.RunningSlot {
			return a, nil
		}
	}
	return nil, fmt.Errorf("%w: in-place journal %s names running slot %q, which has no applied config", ErrCorrupt, p.Journal("isolation"), j.RunningSlot)
}
