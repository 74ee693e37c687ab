// Package owed keeps the cluster writes that an operation on the host owes
// the cluster and could not make when its own budget ended (an uncordon
// after a failed repave while the API server did not answer, the final
// status of a MachineOperation): one small record a write under
// /var/lib/unbounded/owed, written before the write is tried and removed
// once it is made, so that a crash or a power cut in between loses
// nothing. The daemon carries them out once the API server answers;
// `unbounded status` lists them.
package owed

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/regfile"
	"unbounded-cloud.io/agent/lib/state"
)

// Kinds of owed writes.
const (
	// Uncordon: the Node is to be made schedulable again (a repave that
	// cordoned it did not replace it).
	Uncordon = "uncordon"
	// OperationStatus: a MachineOperation's final status (one record an
	// operation, by its UID).
	OperationStatus = "operation-status"
)

// Write is one write owed to the cluster.
type Write struct {
	Kind string `json:"kind"`
	// Node is the Node it is about (an uncordon).
	Node string `json:"node,omitempty"`
	// Operation and UID name the MachineOperation it is about (its final
	// status); the UID also tells the records of two operations apart.
	Operation string `json:"operation,omitempty"`
	UID       string `json:"uid,omitempty"`
	// State, Reason and Message are the status to write (an operation's).
	State   string `json:"state,omitempty"`
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
	// By is the operation that owes it ("repave").
	By string `json:"by"`
	// Why says why it is owed, for an operator.
	Why   string    `json:"why"`
	Since time.Time `json:"since"`
}

// String is the write in words.
func (w Write) String() string {
	what := "Node " + w.Node
	if w.Kind == OperationStatus {
		what = fmt.Sprintf("MachineOperation %s: %s %s", w.Operation, w.State, w.Reason)
	}
	return fmt.Sprintf("%s %s (owed by %s since %s: %s)", w.Kind, what, w.By, w.Since.UTC().Format(time.RFC3339), w.Why)
}

// ID names the record: its kind, and for a write about one operation its
// UID too (a later write of the same ID replaces it).
func (w Write) ID() string {
	if w.UID == "" {
		return w.Kind
	}
	return w.Kind + "-" + w.UID
}

// validID: an ID is one file name in the owed directory.
func validID(id string) bool {
	return id != "" && !strings.ContainsAny(id, "/.\x00")
}

func file(p hostpaths.Paths, id string) string {
	return filepath.Join(p.OwedDir(), id+".json")
}

// Owe records w (one record an ID: a later one replaces it), durably.
func Owe(p hostpaths.Paths, w Write) error {
	if w.Kind == "" || !validID(w.ID()) {
		return fmt.Errorf("owed write %q", w.ID())
	}
	if err := os.MkdirAll(p.OwedDir(), 0o700); err != nil {
		return err
	}
	data, err := json.Marshal(w)
	if err != nil {
		return err
	}
	return state.WriteFileAtomic(file(p, w.ID()), append(data, '\n'), 0o600)
}

// Settle removes the record id (Write.ID): the write was made, or is no
// longer owed.
func Settle(p hostpaths.Paths, id string) error {
	if !validID(id) {
		return fmt.Errorf("owed write %q", id)
	}
	if _, err := os.Lstat(file(p, id)); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return state.RemoveDurable(file(p, id))
}

// Find returns the record id, or nil when none is owed.
func Find(p hostpaths.Paths, id string) (*Write, error) {
	if !validID(id) {
		return nil, fmt.Errorf("owed write %q", id)
	}
	data, err := regfile.Read(file(p, id), maxRecord)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var w Write
	if err := json.Unmarshal(data, &w); err != nil {
		return nil, fmt.Errorf("%s: %w", file(p, id), err)
	}
	return &w, nil
}

// maxRecord caps a record a reader accepts (an operation's message is
// at most a few KiB).
const maxRecord = 64 << 10

// List returns the owed writes, by kind. A record that cannot be read is
// returned as an error naming it, with the others.
func List(p hostpaths.Paths) ([]Write, error) {
	names, err := filepath.Glob(filepath.Join(p.OwedDir(), "*.json"))
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	var out []Write
	var errs []error
	for _, n := range names {
		data, err := regfile.Read(n, maxRecord)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var w Write
		if err := json.Unmarshal(data, &w); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", n, err))
			continue
		}
		out = append(out, w)
	}
	return out, errors.Join(errs...)
}
