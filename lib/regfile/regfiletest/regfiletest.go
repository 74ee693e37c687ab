// Package regfiletest makes the files lib/regfile refuses, so that every
// reader of state or configuration can be tested against each of them:
// files a corrupt disk, a bad restore or a mistaken operator can leave
// where a regular file belongs.
package regfiletest

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// Kind is a kind of file that is not a regular file, as found at a path
// after following symlinks.
type Kind int

const (
	// FIFO is a named pipe: opening it for reading blocks until a writer
	// comes, without O_NONBLOCK.
	FIFO Kind = iota
	// DevZero is a symlink to /dev/zero: reading it never ends.
	DevZero
	// Directory is a directory where a file belongs.
	Directory
	// Socket is a Unix socket file: open(2) fails on it with ENXIO.
	Socket
)

// Kinds are all the kinds, for tables.
var Kinds = []Kind{FIFO, DevZero, Directory, Socket}

// String names the kind for a test name.
func (k Kind) String() string {
	switch k {
	case FIFO:
		return "fifo"
	case DevZero:
		return "symlink to /dev/zero"
	case Directory:
		return "directory"
	case Socket:
		return "socket"
	}
	return "unknown"
}

// Describes is what lib/regfile says the kind is, in its error.
func (k Kind) Describes() string {
	switch k {
	case FIFO:
		return "is a named pipe (FIFO)"
	case DevZero:
		return "is a character device"
	case Directory:
		return "is a directory"
	case Socket:
		return "is a socket"
	}
	return ""
}

// Make replaces whatever is at path with a file of kind k, creating the
// parent directories. None of this needs privileges: mknod(2) makes FIFOs
// and sockets for any user, and a socket made so has no bind(2) path
// length limit.
func Make(t testing.TB, path string, k Kind) {
	t.Helper()
	if err := make1(path, k); err != nil {
		t.Fatalf("making a %v at %s: %v", k, path, err)
	}
}

func make1(path string, k Kind) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	if err := os.RemoveAll(path); err != nil {
		return err
	}
	switch k {
	case FIFO:
		return unix.Mkfifo(path, 0o600)
	case DevZero:
		return os.Symlink("/dev/zero", path)
	case Directory:
		return os.Mkdir(path, 0o755)
	case Socket:
		return unix.Mknod(path, unix.S_IFSOCK|0o600, 0)
	}
	return os.ErrInvalid
}

// Sparse replaces whatever is at path with a regular file of size bytes
// that takes no space on disk: a file over a reader's limit at no cost.
func Sparse(t testing.TB, path string, size int64) {
	t.Helper()
	os.MkdirAll(filepath.Dir(path), 0o755)
	os.RemoveAll(path)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
}
