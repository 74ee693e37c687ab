package packages_test

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"unbounded-cloud.io/agent/tests/tiers"
)

// TestPackagesBuildReproducibly builds the .deb and the .rpm again from this
// tree (the binaries and docs `make packages` left in bin/) with another
// temporary directory, umask, time zone and locale, and wants the same
// bytes as the packages `make packages` made (make test passes their
// VERSION; SOURCE_DATE_EPOCH is the last commit's, as there): an image
// builder or a distribution can then check a published package against its
// own build of the same commit. Without VERSION (a plain go test) it
// builds twice, the first time as make does. The .rpm goes through nfpm and
// rpmbuild (deb/build-packages.sh), so this also holds rpmbuild to
// SOURCE_DATE_EPOCH.
func TestPackagesBuildReproducibly(t *testing.T) {
	// The packages tier runs after `make packages`, which also leaves in
	// bin/ what this test builds from.
	deb, rpm := packageFile(t, "UNBOUNDED_TEST_DEB"), packageFile(t, "UNBOUNDED_TEST_RPM")
	requireTools(t, "rpmbuild", "rpm2archive", "go")
	root := repoRoot(t)
	for _, f := range []string{"bin/unbounded", "bin/unbounded-generator", "bin/doc/unbounded.1.gz"} {
		if _, err := os.Stat(filepath.Join(root, f)); err != nil {
			tiers.Skip(t, tiers.Packages, "%s: %v (run make packages first)", f, err)
		}
	}
	t.Parallel()

	build := func(version, umask string, env ...string) (map[string][]byte, error) {
		dist, tmp := t.TempDir(), t.TempDir()
		cmd := exec.Command("sh", "-c", "umask "+umask+" && exec deb/build-packages.sh")
		cmd.Dir = root
		cmd.Env = append(os.Environ(), append([]string{
			"VERSION=" + version,
			"DIST=" + dist,
			"TMPDIR=" + tmp,
		}, env...)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("deb/build-packages.sh (umask %s, %v): %v\n%s", umask, env, err, out)
		}
		return readDir(dist)
	}
	var first map[string][]byte
	version := os.Getenv("VERSION")
	fromMake := version != ""
	if fromMake {
		// make's: the files the other tiers install.
		first = map[string][]byte{}
		for _, f := range []string{deb, rpm} {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			first[filepath.Base(f)] = b
		}
	} else {
		var err error
		version = "0.1.0-dev.1.greproduce"
		if first, err = build(version, "022", "TZ=UTC", "LC_ALL=C", "SOURCE_DATE_EPOCH=1700000000"); err != nil {
			t.Fatal(err)
		}
		t.Logf("VERSION is not set (make test sets it): compared two builds of the test's own, not make's")
	}
	// The last commit's time, as make's build takes it, unless the first
	// build was the test's own.
	env := []string{"TZ=Pacific/Auckland", "LC_ALL=C.UTF-8"}
	if !fromMake {
		env = append(env, "SOURCE_DATE_EPOCH=1700000000")
	}
	second, err := build(version, "077", env...)
	if err != nil {
		t.Fatal(err)
	}

	for _, ext := range []string{".deb", ".rpm"} {
		n := 0
		for name := range second {
			if filepath.Ext(name) == ext {
				n++
			}
		}
		if n != 1 {
			t.Errorf("the build made %d %s files, want 1: %v", n, ext, sortedKeys(second))
		}
	}
	for _, name := range sortedKeys(first) {
		if !bytes.Equal(first[name], second[name]) {
			t.Errorf("%s differs between two builds of the same tree: sha256 %x, then %x",
				name, sha256.Sum256(first[name]), sha256.Sum256(second[name]))
		}
	}
	if len(second) != len(first) {
		t.Errorf("the two builds made %v, then %v", sortedKeys(first), sortedKeys(second))
	}
}

// readDir is every file of dir by name.
func readDir(dir string) (map[string][]byte, error) {
	got := map[string][]byte{}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		got[e.Name()] = b
	}
	return got, nil
}
