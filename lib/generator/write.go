package generator

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/modes/facts"
	"unbounded-cloud.io/agent/lib/regfile"
	"unbounded-cloud.io/agent/lib/unitnames"
)

// ownedDepDirs are the dependency directories of the generator's own
// targets, which the generator alone fills in its output directory:
// anything in them that the plan does not name is a leftover of an earlier
// run. The .wants directories are no longer written (the targets' links
// are Requires=) but are still emptied, so that a rerun over the output of
// an older generator converges too.
func ownedDepDirs() []string {
	var dirs []string
	for _, t := range append([]string{unitnames.NodeTarget}, modeTargets()...) {
		dirs = append(dirs, t+".requires", t+".wants")
	}
	return dirs
}

func modeTargets() []string {
	var s []string
	for _, m := range facts.Names() {
		s = append(s, unitnames.ModeTarget(m))
	}
	return s
}

// possibleDropIns are every fence drop-in any state could produce.
func possibleDropIns() []string {
	var files []string
	seen := map[string]bool{}
	for _, m := range facts.Names() {
		for _, s := range hostpaths.Slots {
			for _, u := range facts.Supervising(m, s) {
				if f := u + ".d/" + FenceDropIn; !seen[f] {
					seen[f] = true
					files = append(files, f)
				}
			}
		}
	}
	return files
}

// Write makes dir contain exactly the plan's part of the generator output.
//
// systemd empties the output directories before it runs generators, but
// Write does not rely on it: a second run (by hand, by a test, after a
// state change) converges to the same content. Only what the generator
// could have written is removed: links named unbounded-* in
// multi-user.target.wants (other generators share the directory), anything
// in the generator's own targets' .requires and .wants directories, and
// fence drop-ins.
//
// Directories are listed and files compared through lib/regfile, so that
// whatever a manual run or a test left in the output directory (a FIFO
// where a .wants directory or a drop-in belongs) cannot block the
// generator.
//
// Files are not fsynced: the output lives in /run (tmpfs), is rebuilt at
// every boot and reload, and systemd reads it only after the generator
// exited. Replacements still go through rename so that a reader never
// sees half a drop-in.
func Write(dir string, plan Plan) error {
	want := map[string]bool{}
	for _, l := range plan.Links {
		want[l.Path] = true
	}
	for _, f := range plan.Files {
		want[f.Path] = true
	}
	var errs []error
	prune := func(rel string) {
		if want[rel] {
			return
		}
		err := os.Remove(filepath.Join(dir, rel))
		switch {
		case err == nil:
			// Drop a directory this emptied; fails harmlessly when
			// something else is still in it.
			os.Remove(filepath.Join(dir, filepath.Dir(rel)))
		case !errors.Is(err, fs.ErrNotExist):
			errs = append(errs, err)
		}
	}
	if ents, err := regfile.ReadDir(filepath.Join(dir, multiUserWants)); err == nil {
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), "unbounded-") && e.Type()&fs.ModeSymlink != 0 {
				prune(multiUserWants + "/" + e.Name())
			}
		}
	}
	for _, d := range ownedDepDirs() {
		if ents, err := regfile.ReadDir(filepath.Join(dir, d)); err == nil {
			for _, e := range ents {
				prune(d + "/" + e.Name())
			}
		}
	}
	for _, f := range possibleDropIns() {
		prune(f)
	}

	for _, l := range plan.Links {
		if err := writeLink(filepath.Join(dir, l.Path), l.Target); err != nil {
			errs = append(errs, err)
		}
	}
	for _, f := range plan.Files {
		if err := writeFile(filepath.Join(dir, f.Path), []byte(f.Content)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// writeLink and writeFile try the common case (a fresh directory from
// systemd) first, in as few system calls as possible: the generator runs at
// every boot and reload, and systemd waits for it.
func writeLink(path, target string) error {
	err := os.Symlink(target, path)
	if errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		err = os.Symlink(target, path)
	}
	if !errors.Is(err, fs.ErrExist) {
		return err
	}
	if cur, rerr := os.Readlink(path); rerr == nil && cur == target {
		return nil
	}
	// A stale link or file from an earlier run: replace it.
	if err := os.RemoveAll(path); err != nil {
		return err
	}
	return os.Symlink(target, path)
}

func writeFile(path string, data []byte) error {
	err := createFile(path, data)
	if errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		err = createFile(path, data)
	}
	if !errors.Is(err, fs.ErrExist) {
		return err
	}
	// Through regfile: whatever sits there (a FIFO left by hand in a
	// directory that systemd did not empty) must not block the read.
	if cur, rerr := regfile.Read(path, int64(len(data))); rerr == nil && bytes.Equal(cur, data) {
		return nil
	}
	// Replace a stale file through rename, so that the file is never seen
	// half written, even by a reload racing a manual run.
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// createFile creates path, which must not exist, with data. A file that
// exists is fs.ErrExist. A failed write removes the partial file.
func createFile(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
	}
	return err
}
