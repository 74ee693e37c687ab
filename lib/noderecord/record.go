// Package noderecord is the Node's Ready condition as the daemon last saw
// it through its watch, as a small file that unbounded-health and
// unbounded-restart read without a Kubernetes client (ARCHITECTURE section
// 3: those binaries stay under 5 MB; a TLS client alone would put them
// over). The daemon (lib/daemon, node.go) writes it.
//
// It lives in /run/unbounded/node.json: about this boot only. The daemon
// writes it only when what it records changes (the Ready condition, its
// heartbeat among it: the kubelet writes that at its start, on a change,
// else every 5 min), and removes it whenever its watch of the Node is
// not live (list or watch failing, Node not followed, daemon starting or
// stopping), so that a present file with Live set is what the cluster says
// now, and an absent one means "not known" (the cluster is not reachable).
package noderecord

import (
	"errors"
	"os"
	"time"

	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/state"
)

// Record is the file's content.
type Record struct {
	// Node is the Node's name.
	Node string `json:"node"`
	// Present: the Node exists. The fields below are about it.
	Present bool `json:"present"`
	// Ready: its Ready condition is True.
	Ready bool `json:"ready"`
	// Status is the Ready condition's status (True, False, Unknown; ""
	// when the Node has no Ready condition yet).
	Status  string `json:"status,omitempty"`
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
	// Transition is the condition's lastTransitionTime.
	Transition time.Time `json:"transition,omitzero"`
	// Heartbeat is the condition's lastHeartbeatTime: when the kubelet
	// last wrote it (at its start, on a change, else every
	// nodeStatusReportFrequency).
	Heartbeat time.Time `json:"heartbeat,omitzero"`
	// Since is when the daemon first saw this value.
	Since time.Time `json:"since"`
}

// Same reports whether r and o record the same value (Since aside): the
// daemon writes only when it changes.
func (r *Record) Same(o *Record) bool {
	if r == nil || o == nil {
		return r == o
	}
	a, b := *r, *o
	a.Since, b.Since = time.Time{}, time.Time{}
	return a.Node == b.Node && a.Present == b.Present && a.Ready == b.Ready && a.Status == b.Status &&
		a.Reason == b.Reason && a.Message == b.Message && a.Transition.Equal(b.Transition) && a.Heartbeat.Equal(b.Heartbeat)
}

// name is the record's file under /run/unbounded.
const name = "node.json"

// File is where the record lives.
func File(p hostpaths.Paths) string { return state.RunRecordFile(p, name) }

// Write replaces the record atomically (0644: it holds no secret).
func Write(p hostpaths.Paths, r Record) error { return state.WriteRunRecord(p, name, r) }

// Remove removes the record (none is fine): the Node's state is not known.
func Remove(p hostpaths.Paths) error {
	if err := os.Remove(File(p)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// Read returns the record, or nil when there is none. A record that does
// not decode is an error naming the file.
func Read(p hostpaths.Paths) (*Record, error) {
	var r Record
	if ok, err := state.ReadRunRecord(p, name, &r); !ok {
		return nil, err
	}
	return &r, nil
}
