package state

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/regfile"
)

// TmpfilesConfHost is the tmpfiles.d(5) entry, shipped by the package, that
// declares /run/unbounded (mode 0755, owner root:root).
const TmpfilesConfHost = "/usr/lib/tmpfiles.d/unbounded-agent.conf"

// RunDir returns /run/unbounded once it exists, and an error naming the
// tmpfiles.d entry when it does not.
//
// The agent does not create the directory itself: its mode and owner are
// declared once, in the package's tmpfiles.d entry, which
// systemd-tmpfiles-setup.service applies at every boot before any service
// starts, and the units' sandboxes need it to exist before their process
// runs (ReadWritePaths=/run/unbounded), so a directory the code made later
// would come too late anyway. Subdirectories (requests/) are the code's
// own layout and are created on use, inside it.
func RunDir(p hostpaths.Paths) (string, error) {
	dir := p.RunDir()
	fi, err := os.Stat(dir)
	if err != nil {
		return "", fmt.Errorf("runtime directory %s: %w (it is created at boot from %s; run `systemd-tmpfiles --create unbounded-agent.conf`)", dir, err, TmpfilesConfHost)
	}
	if !fi.IsDir() {
		return "", fmt.Errorf("runtime directory %s is not a directory (it is declared in %s)", dir, TmpfilesConfHost)
	}
	return dir, nil
}

// maxRunRecord bounds a read of a run record: they are a few hundred bytes.
const maxRunRecord = 64 << 10

// RunRecordFile is the run record name: /run/unbounded/<name>.
func RunRecordFile(p hostpaths.Paths, name string) string {
	return filepath.Join(p.RunDir(), name)
}

// WriteRunRecord replaces the run record name, a small JSON file about
// this boot that units read without a Kubernetes client (fence.json,
// node.json), with v: atomically, mode 0644 (a record holds no secret).
func WriteRunRecord(p hostpaths.Paths, name string, v any) error {
	if _, err := RunDir(p); err != nil {
		return err
	}
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return WriteFileAtomic(RunRecordFile(p, name), append(data, '\n'), 0o644)
}

// ReadRunRecord decodes the run record name into v and reports whether
// there was one. A record that does not decode is an error naming the
// file.
func ReadRunRecord(p hostpaths.Paths, name string, v any) (bool, error) {
	return ReadRecord(RunRecordFile(p, name), maxRunRecord, v)
}

// ReadRecord decodes the JSON record file (a regular file of at most max
// bytes, read without blocking) into v and reports whether there was one.
// A record that does not decode is an error naming the file.
func ReadRecord(file string, max int64, v any) (bool, error) {
	data, err := regfile.Read(file, max)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if err := json.Unmarshal(data, v); err != nil {
		return false, fmt.Errorf("%s: %w", file, err)
	}
	return true, nil
}
