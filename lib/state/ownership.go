package state

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"unbounded-cloud.io/agent/lib/hostpaths"
)

// ErrOwned means another installation owns the host. One-shots exit 69
// (deferred) on it and print no error; systemd treats that as success.
var ErrOwned = errors.New("an installation owns the host")

// OwnerUpgrade is the agent's self-upgrade (lib/upgrade). Unlike an
// installation it never touches the node: under its lock the node stack
// starts at boot as usual, and the daemon runs (the upgrade restarts it
// and waits for it) but starts no operation until the upgrade ends.
const OwnerUpgrade = "upgrade"

// Ownership is the installation lock record. An installation (bootstrap,
// reprovision, reset) holds it from start to finish, across reboots: the
// record is a file under the host root, so a power cut mid-installation
// leaves the host owned and the generator resumes the named unit at boot
// instead of starting a half-installed node.
type Ownership struct {
	Owner string    `json:"owner"`          // bootstrap, reprovision, reset
	Unit  string    `json:"unit,omitempty"` // the unit that resumes it
	PID   int       `json:"pid,omitempty"`
	Since time.Time `json:"since"`
}

// ReadOwnership returns the current ownership record, nil when the host is
// not owned. A record that cannot be decoded still means "owned": failing
// closed keeps the node and daemon away from a host mid-installation.
func ReadOwnership(p hostpaths.Paths) (*Ownership, error) {
	data, err := readState(p.Ownership(), maxOwnershipSize)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return &Ownership{Owner: "unknown"}, err
	}
	var o Ownership
	if err := json.NewDecoder(bytes.NewReader(data)).Decode(&o); err != nil {
		return &Ownership{Owner: "unknown"}, fmt.Errorf("%w: %s: %v", ErrCorrupt, p.Ownership(), err)
	}
	return &o, nil
}

// Lock is a held installation lock.
type Lock struct {
	p  hostpaths.Paths
	fd int
}

// AcquireOwnership takes the installation lock for owner. A record left by
// the same owner (an installation interrupted by a crash) is taken over, so
// the rerun resumes it; a record of another owner, or a live process holding
// the lock, is ErrOwned. The process-level exclusion is an flock on a file
// under /run/unbounded, released by the kernel when the holder dies.
func AcquireOwnership(p hostpaths.Paths, owner, unit string) (*Lock, error) {
	run, err := RunDir(p)
	if err != nil {
		return nil, err
	}
	fd, err := unix.Open(filepath.Join(run, "ownership.lock"), unix.O_CREAT|unix.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open ownership lock: %w", err)
	}
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		unix.Close(fd)
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, ErrOwned
		}
		return nil, err
	}
	// An unreadable record reads as owner "unknown", which never matches:
	// the lock fails closed.
	cur, _ := ReadOwnership(p)
	if cur != nil && cur.Owner != owner {
		unix.Close(fd)
		return nil, fmt.Errorf("%w (owner %s since %s)", ErrOwned, cur.Owner, cur.Since.Format(time.RFC3339))
	}
	rec := Ownership{Owner: owner, Unit: unit, PID: os.Getpid(), Since: time.Now().UTC()}
	if cur != nil {
		rec.Since = cur.Since
	}
	data, _ := json.Marshal(rec)
	if err := WriteFileAtomic(p.Ownership(), append(data, '\n'), 0o644); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return &Lock{p: p, fd: fd}, nil
}

// Release ends the installation: the record is removed durably, then the
// process lock is dropped.
func (l *Lock) Release() error {
	err := RemoveDurable(l.p.Ownership())
	unix.Close(l.fd)
	return err
}
