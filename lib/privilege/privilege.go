// Package privilege tells "run this as root" apart from "this is broken".
//
// The agent runs as root; its state (/var/lib/unbounded, 0700) and the
// bootstrap token (0600) are root's alone. An operator who runs a command
// without root gets "permission denied" from those files, and a reader that
// took that at face value would report a false problem: a corrupt state, a
// token owned by the wrong user, a host owned by an unknown installation.
// Commands ask this package first, and say "needs root" (exit 4) instead.
package privilege

import (
	"errors"
	"fmt"
	"io/fs"
	"os"

	"unbounded-cloud.io/agent/lib/exitcode"
)

// Error says that a command needs root: what it could not read.
type Error struct {
	// Path is what could not be read, as shown to the operator.
	Path string
	Err  error
}

func (e *Error) Error() string {
	return fmt.Sprintf("needs root: %s is readable only by root (%v); run it as root", e.Path, reason(e.Err))
}

// Unwrap exposes the permission error.
func (e *Error) Unwrap() error { return e.Err }

// Is makes an Error an exitcode.ErrNeedsRoot (exit 4).
func (e *Error) Is(target error) bool { return target == exitcode.ErrNeedsRoot }

func reason(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err // the path is named already
	}
	return err
}

// euid is the effective user; tests replace it.
var euid = os.Geteuid

// IsRoot reports whether the process runs as root.
func IsRoot() bool { return euid() == 0 }

// FromErr returns err as an *Error when it is a permission error and the
// process is not root; otherwise it returns nil. Root is never told it needs
// root: a permission error as root is a real problem (a read-only mount, a
// security module), for the caller to report as such.
func FromErr(path string, err error) *Error {
	if err == nil || IsRoot() || !errors.Is(err, fs.ErrPermission) {
		return nil
	}
	return &Error{Path: path, Err: err}
}

// Check opens each of dirs for reading, as the commands that read host
// state are about to, and returns an *Error for the first one that only root
// may read. A directory that does not exist is no problem (a fresh host, or
// a --root tree without it); any other error is left to the reader.
func Check(dirs ...string) error {
	if IsRoot() {
		return nil
	}
	for _, d := range dirs {
		f, err := os.Open(d)
		if err == nil {
			_, err = f.Readdirnames(1)
			f.Close()
		}
		if e := FromErr(d, err); e != nil {
			return e
		}
	}
	return nil
}
