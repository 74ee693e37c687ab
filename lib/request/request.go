// Package request is the hand-over from the daemon to a one-shot: a file
// /var/lib/unbounded/requests/<concern>.json that says which
// MachineOperation a run of unbounded-<concern>.service carries out, and
// with what input. It survives a reboot: a run cut by a power cut and
// resumed at boot is still this operation's, and the next boot's daemon
// reports it as such.
//
// Why a file and not a command line or an environment variable: a unit
// started by hand (`systemctl start unbounded-repave.service`) must behave
// the same as one started by the daemon, so its input has to be on disk
// before the unit starts. And the daemon, restarted in the middle of an
// operation, finds in the file which operation it had handed over (and
// when), which is how it avoids starting the same operation twice.
//
// The package has no Kubernetes dependency, so that the small one-shots
// (restart) can read a request without linking client-go.
package request

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/regfile"
	"unbounded-cloud.io/agent/lib/state"
)

// ErrCorrupt means a request file exists but is not a request.
var ErrCorrupt = errors.New("corrupt request file")

// Request is one hand-over. It never carries a secret: the desired config
// references secrets by file, like the operator config does.
type Request struct {
	// Operation is the MachineOperation's name; empty for a run the daemon
	// started on its own (a Machine whose Node is gone).
	Operation string `json:"operation,omitempty"`
	// UID identifies what the run is for: the operation's metadata.uid,
	// or for a repave of a vanished Node "node:<uid of the Node>". The
	// daemon never starts a unit twice for the same UID.
	UID string `json:"uid"`
	// Type is the operation type (Repave, Restart, Reboot, AgentUpgrade).
	Type string `json:"type"`
	// Machine is the Machine's name.
	Machine string `json:"machine"`
	// Unit is the unit the daemon starts for this request.
	Unit string `json:"unit,omitempty"`
	// RequestedAt is when the file was written, before the unit started.
	RequestedAt time.Time `json:"requested-at"`
	// BootID is /proc/sys/kernel/random/boot_id when the file was written:
	// a Reboot request from another boot has been carried out.
	BootID string `json:"boot-id,omitempty"`
	// PreviousInvocation is the unit's InvocationID before the daemon
	// started it ("" when it had none). A different, non-empty ID later
	// means the unit ran for this request.
	PreviousInvocation string `json:"previous-invocation,omitempty"`
	// Parameters are the operation's parameters (for example the agent
	// version of an AgentUpgrade).
	Parameters map[string]string `json:"parameters,omitempty"`
	// Desired is the desired configuration of a repave: the Machine's spec
	// as JSON at the time of the request.
	Desired json.RawMessage `json:"desired,omitempty"`
}

// Write stores r as the request for concern, atomically (a one-shot that
// starts at any moment reads the old request or the new one, never half).
// Mode 0644: requests hold no secret, and `unbounded status` may show them.
// The requests/ directory (0700) is created on first use, inside the host
// root, which must exist.
func Write(p hostpaths.Paths, concern string, r *Request) error {
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if len(data)+1 > state.MaxRecordSize {
		// Written, it would read as corrupt.
		return fmt.Errorf("request for %s would be %d bytes, more than the %d a reader accepts", concern, len(data)+1, state.MaxRecordSize)
	}
	// Only the requests/ directory: the host root is bootstrap's to
	// create (0700), and a host without it has nothing to ask for.
	if err := os.Mkdir(filepath.Dir(p.Request(concern)), 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	return state.WriteFileAtomic(p.Request(concern), append(data, '\n'), 0o644)
}

// Read returns the request for concern; a missing file wraps
// os.ErrNotExist (a unit started by hand with no request), a file that is
// not a request wraps ErrCorrupt and names the file.
func Read(p hostpaths.Paths, concern string) (*Request, error) {
	file := p.Request(concern)
	// Through regfile, with the limit of a state record (a request
	// carries a desired config): a FIFO or a device in its place must not
	// block the one-shot, nor the daemon, which reads it too.
	data, err := regfile.Read(file, state.MaxRecordSize)
	if errors.Is(err, regfile.ErrNotRegular) || errors.Is(err, regfile.ErrTooLarge) {
		return nil, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	if err != nil {
		return nil, err
	}
	var r Request
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrCorrupt, file, err)
	}
	if r.UID == "" {
		return nil, fmt.Errorf("%w: %s: uid: missing", ErrCorrupt, file)
	}
	return &r, nil
}

// takenFile records the UID of the last request a run of concern carried
// out to its end (successfully or not).
func takenFile(p hostpaths.Paths, concern string) string {
	return p.Request(concern) + ".taken"
}

// Taken reports whether a run of concern has carried out the request uid
// to its end. The daemon keeps its request after the run (a restarted
// daemon reads it to report the run), so a later start by hand must not
// take it as its input again.
func Taken(p hostpaths.Paths, concern, uid string) bool {
	data, err := regfile.Read(takenFile(p, concern), 4096)
	return err == nil && strings.TrimSpace(string(data)) == uid
}

// MarkTaken records that a run of concern carried out the request uid to
// its end. A run calls it only once its work is over, never when it takes
// the request: a run cut before its end (a power cut before its own
// journal was written) leaves the request to the next run.
func MarkTaken(p hostpaths.Paths, concern, uid string) error {
	if uid == "" {
		return nil
	}
	return state.WriteFileAtomic(takenFile(p, concern), []byte(uid+"\n"), 0o644)
}
