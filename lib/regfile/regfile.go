// Package regfile reads a state or configuration file that must be a
// regular file of bounded size, and refuses anything else without
// blocking.
//
// Why not os.ReadFile: opening a FIFO for reading blocks until a writer
// appears, and reading /dev/zero (through a symlink, say) never ends. The
// generator runs synchronously in PID 1 at boot and at every daemon-reload,
// and the config loader runs in front of the fence and the daemon, so one
// corrupt file must cost an error, never a hang.
//
// How: stat first, so that a device node is never opened at all (opening
// one can have effects of its own: a watchdog starts counting, a tape
// rewinds, a terminal becomes the controlling one); then open with
// O_NONBLOCK and fstat the opened descriptor, which is what decides: a file
// swapped for a FIFO between the stat and the open is caught there without
// blocking. Symlinks are followed: a symlink to a regular file is that
// file (the host-root migration links legacy state into the host root),
// one to /dev/zero is a character device and refused.
//
// The package has no dependency beyond the standard library and x/sys, so
// that the generator, which links it, stays small.
package regfile

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrNotRegular is wrapped by the error for a path that is not a regular
// file after following symlinks (a FIFO, a socket, a device, a directory).
var ErrNotRegular = errors.New("not a regular file")

// ErrTooLarge is wrapped by the error for a file larger than the limit the
// caller gave.
var ErrTooLarge = errors.New("file too large")

// Read returns the content of the regular file at path, which must hold at
// most limit bytes. Errors are *fs.PathError naming path: a missing file
// (or a dangling symlink) wraps fs.ErrNotExist, anything that is not a
// regular file wraps ErrNotRegular, a larger file ErrTooLarge. It never
// blocks on the file's kind and reads at most limit+1 bytes.
func Read(path string, limit int64) ([]byte, error) {
	var st unix.Stat_t
	if err := ignoringEINTR(func() error { return unix.Stat(path, &st) }); err != nil {
		return nil, &fs.PathError{Op: "stat", Path: path, Err: err}
	}
	if err := check(&st, limit); err != nil {
		return nil, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	var fd int
	err := ignoringEINTR(func() (err error) {
		fd, err = unix.Open(path, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
		return err
	})
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	if err := ignoringEINTR(func() error { return unix.Fstat(fd, &st) }); err != nil {
		return nil, &fs.PathError{Op: "stat", Path: path, Err: err}
	}
	if err := check(&st, limit); err != nil {
		return nil, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	// The size is a hint (a file under /proc says 0, a file can grow
	// while it is read); the limit is enforced on what is read. One byte
	// more than the size lets a file that did not change end in one read
	// plus the read that returns 0.
	buf := make([]byte, st.Size+1)
	n := 0
	for {
		if n == len(buf) {
			if int64(n) > limit {
				return nil, &fs.PathError{Op: "read", Path: path, Err: fmt.Errorf("%w: more than %d bytes", ErrTooLarge, limit)}
			}
			grown := make([]byte, min(int64(2*len(buf)+512), limit+1))
			copy(grown, buf)
			buf = grown
		}
		var r int
		err := ignoringEINTR(func() (err error) {
			r, err = unix.Read(fd, buf[n:])
			return err
		})
		if err != nil {
			return nil, &fs.PathError{Op: "read", Path: path, Err: err}
		}
		if r == 0 {
			break
		}
		n += r
	}
	if int64(n) > limit {
		return nil, &fs.PathError{Op: "read", Path: path, Err: fmt.Errorf("%w: more than %d bytes", ErrTooLarge, limit)}
	}
	return buf[:n], nil
}

// check refuses what Read must not read: anything but a regular file, and
// a regular file whose size is over the limit already.
func check(st *unix.Stat_t, limit int64) error {
	if kind := st.Mode & unix.S_IFMT; kind != unix.S_IFREG {
		return fmt.Errorf("%w: is %s", ErrNotRegular, describe(kind))
	}
	if st.Size > limit {
		return fmt.Errorf("%w: %d bytes, more than the limit of %d", ErrTooLarge, st.Size, limit)
	}
	return nil
}

// describe names a file type for an operator reading a log line.
func describe(kind uint32) string {
	switch kind {
	case unix.S_IFDIR:
		return "a directory"
	case unix.S_IFIFO:
		return "a named pipe (FIFO)"
	case unix.S_IFSOCK:
		return "a socket"
	case unix.S_IFCHR:
		return "a character device"
	case unix.S_IFBLK:
		return "a block device"
	}
	return fmt.Sprintf("of file type %#o", kind)
}

// ignoringEINTR retries a system call that a signal interrupted. Go
// installs its handlers with SA_RESTART, but a call can still return
// EINTR (signal(7) lists the cases), and a generator must not report a
// signal as corrupt state.
func ignoringEINTR(f func() error) error {
	for {
		if err := f(); !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

// ReadDir lists the directory at path (symlinks followed), sorted by name
// as os.ReadDir does. It opens with O_DIRECTORY, so a path that is not a
// directory fails (ENOTDIR) without being opened: a FIFO where a drop-in
// directory belongs would otherwise block os.ReadDir's open until a
// writer comes.
func ReadDir(path string) ([]fs.DirEntry, error) {
	var fd int
	err := ignoringEINTR(func() (err error) {
		fd, err = unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		return err
	})
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	ents, err := f.ReadDir(-1)
	slices.SortFunc(ents, func(a, b fs.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
	return ents, err
}
