// Package record is the outcome of the last allocation fence check, as a
// small file that the units which act on it read without a Kubernetes
// client: unbounded-health (retries a check that got no answer) and the
// daemon (starts the node once the Machine no longer refuses). The fence
// (lib/fence, cmd/fence) writes it after every decision.
//
// It lives in /run/unbounded/fence.json: it is about this boot only. A
// new boot runs the fence again before the node starts and writes a new
// one; a record from an earlier boot would describe a check that no
// longer holds anything down.
package record

import (
	"fmt"
	"time"

	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/state"
)

// Outcome of a fence check.
type Outcome string

const (
	// Allowed: the node may start (and did, unless something else failed).
	Allowed Outcome = "allowed"
	// Refused: the cluster said no (fenced, deleting, another allocation,
	// token revoked or rejected, RBAC), or the host cannot ask (no usable
	// credential, an API server its CA does not trust). Final until
	// something changes: the daemon starts the node again once the
	// Machine no longer refuses; nothing retries it on a timer.
	Refused Outcome = "refused"
	// NoAnswer: the check ran out of its retry budget without a decision
	// (API server unreachable, or a TLS certificate that is not valid at
	// this host's time: a clock far off). unbounded-health retries it
	// with a growing delay.
	NoAnswer Outcome = "no-answer"
	// Interrupted: stopped (SIGTERM) before a decision. Nothing decided,
	// nothing to retry: whoever stopped it decides.
	Interrupted Outcome = "interrupted"
)

// Record is the file's content.
type Record struct {
	Outcome Outcome `json:"outcome"`
	// Reason is the refusal's reason (a Machine condition reason), "" when
	// allowed.
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
	// AllocationUID is the allocation the check was made for ("" when the
	// host has none: allowed without asking).
	AllocationUID string `json:"allocationUID,omitempty"`
	// Via is the credential whose read the outcome rests on
	// ("certificate" or "bootstrap-token", lib/fence's Check.Via), ""
	// when no read decided (no allocation, interrupted). Optional:
	// readers must not require it.
	Via string    `json:"via,omitempty"`
	At  time.Time `json:"at"`
}

// name is the record's file under /run/unbounded.
const name = "fence.json"

// File is where the record lives.
func File(p hostpaths.Paths) string { return state.RunRecordFile(p, name) }

// Write replaces the record atomically (mode 0644: it holds no secret).
func Write(p hostpaths.Paths, r Record) error { return state.WriteRunRecord(p, name, r) }

// Read returns the record, or nil when there is none (no check ran in this
// boot). A record that does not decode is an error naming the file.
func Read(p hostpaths.Paths) (*Record, error) {
	var r Record
	if ok, err := state.ReadRunRecord(p, name, &r); !ok {
		return nil, err
	}
	switch r.Outcome {
	case Allowed, Refused, NoAnswer, Interrupted:
	default:
		return nil, fmt.Errorf("%s: unknown outcome %q", File(p), r.Outcome)
	}
	return &r, nil
}
