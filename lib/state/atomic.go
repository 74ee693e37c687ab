// Package state reads and writes what the agent keeps on the host between
// runs (ARCHITECTURE section 5): applied configs with their SHA-256
// sidecars, the installation (ownership) lock, and the detection of hosts
// installed by the older agent.
//
// Every write is atomic: a reader sees the old file or the new one, never
// half of either, also after a power cut.
package state

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// WriteFileAtomic writes data to path so that a reader, or the next boot
// after a power cut, sees either the old content or the new one: temporary
// file in the same directory, fsync, rename over path, fsync of the
// directory (without the last step the rename itself may be lost).
// Missing parent directories are created 0755.
func WriteFileAtomic(path string, data []byte, perm os.FileMode) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	ok := false
	defer func() {
		if !ok {
			f.Close()
			os.Remove(tmp)
		}
	}()
	// CreateTemp makes the file 0600; set the final mode before any byte is
	// written so a secret is never readable by others, not even briefly.
	if err := f.Chmod(perm); err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	ok = true
	return SyncDir(dir)
}

// SyncDir fsyncs a directory so that renames and removals in it are durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}

// SyncTree makes everything written under dir durable: one syncfs(2) of
// the filesystem that holds it. A tree built file by file without a sync
// each (a slot's rootfs, a version directory) is synced once by this
// before the rename that publishes it, so that a power cut after the
// rename never leaves a published tree of empty or short files.
func SyncTree(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := unix.Syncfs(int(d.Fd())); err != nil {
		return fmt.Errorf("syncfs %s: %w", dir, err)
	}
	return nil
}

// RemoveDurable removes path (missing is fine) and syncs its directory.
func RemoveDurable(path string) error {
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		return err
	}
	return SyncDir(filepath.Dir(path))
}
