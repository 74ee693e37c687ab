// Package owed keeps the cluster writes that an operation on the host owes
// the cluster and could not make when its own budget ended (an uncordon
// after a failed repave while the API server did not answer): one small
// record a write under /var/lib/unbounded/owed, written before the write
// is tried and removed once it is made, so that a crash or a power cut
// in between loses nothing. The daemon carries them out once the API
// server answers; `unbounded status` lists them.
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
)

// Write is one write owed to the cluster.
type Write struct {
	Kind string `json:"kind"`
	// Node is the Node it is about.
	Node string `json:"node"`
	// By is the operation that owes it ("repave").
	By string `json:"by"`
	// Why says why it is owed, for an operator.
	Why   string    `json:"why"`
	Since time.Time `json:"since"`
}

// String is the write in words.
func (w Write) String() string {
	return fmt.Sprintf("%s Node %s (owed by %s since %s: %s)", w.Kind, w.Node, w.By, w.Since.UTC().Format(time.RFC3339), w.Why)
}

func file(p hostpaths.Paths, kind string) string {
	return filepath.Join(p.OwedDir(), kind+".json")
}

// Owe records w (one record a kind: a later one replaces it), durably.
func Owe(p hostpaths.Paths, w Write) error {
	if w.Kind == "" || strings.ContainsAny(w.Kind, "/.") {
		return fmt.Errorf("owed write kind %q", w.Kind)
	}
	if err := os.MkdirAll(p.OwedDir(), 0o700); err != nil {
		return err
	}
	data, err := json.Marshal(w)
	if err != nil {
		return err
	}
	return state.WriteFileAtomic(file(p, w.Kind), append(data, '\n'), 0o600)
}

// Settle removes the record of kind: the write was made, or is no longer
// owed.
func Settle(p hostpaths.Paths, kind string) error {
	if _, err := os.Lstat(file(p, kind)); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return state.RemoveDurable(file(p, kind))
}

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
		data, err := regfile.Read(n, 64<<10)
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
