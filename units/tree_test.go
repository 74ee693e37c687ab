// Package units_test is tier 2 of ARCHITECTURE section 9: the shipped
// units, checked by systemd's own tools over a tree laid out as the
// package installs it, and by a Go reading of the unit graph for the
// orderings that matter.
package units_test

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/coreos/go-systemd/v22/unit"

	"unbounded-cloud.io/agent/lib/hostpaths"

	"unbounded-cloud.io/agent/tests/tiers"
)

// unitSuffixes are the files of units/ that the package installs into
// /usr/lib/systemd/system. Everything else here (tests, the preset) is not
// a unit.
var unitSuffixes = []string{".service", ".target", ".path", ".timer", ".socket", ".mount", ".slice"}

func isUnitFile(name string) bool {
	for _, s := range unitSuffixes {
		if strings.HasSuffix(name, s) {
			return true
		}
	}
	return false
}

// shippedUnits lists the unit files of units/, sorted.
func shippedUnits(t testing.TB) []string {
	t.Helper()
	ents, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		if e.Type().IsRegular() && isUnitFile(e.Name()) {
			names = append(names, e.Name())
		}
	}
	if len(names) == 0 {
		t.Fatal("no unit files in units/")
	}
	sort.Strings(names)
	return names
}

func presets(t testing.TB) []string {
	t.Helper()
	m, err := filepath.Glob("*.preset")
	if err != nil || len(m) == 0 {
		t.Fatalf("no preset file in units/ (%v)", err)
	}
	return m
}

func copyFile(t testing.TB, src, dst string, mode fs.FileMode) {
	t.Helper()
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, data, mode); err != nil {
		t.Fatal(err)
	}
}

// installTree lays out a root as the package installs the units: units
// into /usr/lib/systemd/system, the preset into
// /usr/lib/systemd/system-preset. The host's own /usr/lib/systemd/system is
// copied in first (when withHost), so that systemd resolves the targets and
// services the units depend on (sysinit.target, systemd-nspawn@.service)
// and reports what is really missing.
func installTree(t testing.TB, withHost bool) string {
	t.Helper()
	tree := t.TempDir()
	p := hostpaths.New(tree)
	if err := os.MkdirAll(filepath.Dir(p.UnitDir()), 0o755); err != nil {
		t.Fatal(err)
	}
	if withHost {
		if _, err := os.Stat(hostpaths.UnitDirHost); err != nil {
			tiers.Skip(t, tiers.Lint, "the host has no %s to resolve dependencies against: %v", hostpaths.UnitDirHost, err)
		}
		if out, err := exec.Command("cp", "-a", hostpaths.UnitDirHost, filepath.Dir(p.UnitDir())).CombinedOutput(); err != nil {
			t.Fatalf("copying the host's units: %v\n%s", err, out)
		}
	}
	for _, u := range shippedUnits(t) {
		copyFile(t, u, filepath.Join(p.UnitDir(), u), 0o644)
	}
	for _, pr := range presets(t) {
		copyFile(t, pr, filepath.Join(filepath.Dir(p.Join(hostpaths.PresetHost)), pr), 0o644)
	}
	return tree
}

// parsed is a unit file with its drop-ins merged, as systemd reads it.
type parsed struct {
	name string
	opts []*unit.UnitOption
}

// parseUnit reads file and then each drop-in, in order. An empty
// assignment resets the list, as in systemd.
func parseUnit(t testing.TB, name, file string, dropIns ...string) *parsed {
	t.Helper()
	u := &parsed{name: name}
	for _, f := range append([]string{file}, dropIns...) {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		opts, err := unit.DeserializeOptions(bytes.NewReader(data))
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, o := range opts {
			if o.Value == "" {
				u.reset(o.Section, o.Name)
				continue
			}
			u.opts = append(u.opts, o)
		}
	}
	return u
}

func (u *parsed) reset(section, name string) {
	kept := u.opts[:0]
	for _, o := range u.opts {
		if o.Section != section || o.Name != name {
			kept = append(kept, o)
		}
	}
	u.opts = kept
}

// values returns every value of section.name, list settings split on
// white space.
func (u *parsed) values(section, name string) []string {
	var v []string
	for _, o := range u.opts {
		if o.Section == section && o.Name == name {
			v = append(v, strings.Fields(o.Value)...)
		}
	}
	return v
}

func (u *parsed) has(section, name, value string) bool {
	for _, v := range u.values(section, name) {
		if v == value {
			return true
		}
	}
	return false
}

func (u *parsed) hasSection(section string) bool {
	for _, o := range u.opts {
		if o.Section == section {
			return true
		}
	}
	return false
}

// execPaths are the executables a unit's Exec*= lines start.
func (u *parsed) execPaths() []string {
	var paths []string
	for _, o := range u.opts {
		if o.Section != "Service" || !strings.HasPrefix(o.Name, "Exec") {
			continue
		}
		f := strings.Fields(o.Value)
		if len(f) == 0 {
			continue
		}
		p := strings.TrimLeft(f[0], "@-:+!|")
		if !filepath.IsAbs(p) {
			// systemd looks a bare name up in its fixed search path.
			for _, dir := range []string{"/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin"} {
				if _, err := os.Stat(filepath.Join(dir, p)); err == nil {
					p = filepath.Join(dir, p)
					break
				}
			}
		}
		if filepath.IsAbs(p) {
			paths = append(paths, p)
		}
	}
	return paths
}

// provideExecutables makes the executables u starts exist in tree, as they
// do on an installed host, so that systemd-analyze verify checks the
// unit rather than the test's tree. The host's own binaries (e.g.
// /usr/bin/systemd-nspawn) are copied; the agent's binaries are the
// packaging tier's concern, so a missing one is a stub and is logged.
func provideExecutables(t testing.TB, tree string, u *parsed) {
	t.Helper()
	for _, p := range u.execPaths() {
		dst := filepath.Join(tree, p)
		if _, err := os.Stat(dst); err == nil {
			continue
		}
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			copyFile(t, p, dst, 0o755)
			continue
		} else if !errors.Is(err, fs.ErrNotExist) && err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(p, "unbounded") {
			t.Errorf("%s starts %s, which is neither on this host nor one of the agent's binaries", u.name, p)
			continue
		}
		t.Logf("%s: %s is a stub in the lint tree (its file is checked by the packaging tier)", u.name, p)
		copyStub(t, dst)
	}
}

func copyStub(t testing.TB, dst string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
}

// isTemplate reports whether name is a template (foo@.service).
func isTemplate(name string) bool { return strings.Contains(name, "@.") }

// instance names an instance of template for checks that need one.
func instance(template, inst string) string {
	return strings.Replace(template, "@.", "@"+inst+".", 1)
}
