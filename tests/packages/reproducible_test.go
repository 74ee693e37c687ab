package packages_test

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"unbounded-cloud.io/agent/tests/tiers"
)

// TestPackagesBuildReproducibly builds the .deb and the .rpm twice from this
// tree (the binaries and docs `make packages` left in bin/), the second time
// with another temporary directory, umask, time zone and locale, and wants
// the same bytes: an image builder or a distribution can then check a
// published package against its own build of the same commit. The .rpm goes
// through nfpm and rpmbuild (deb/build-packages.sh), so this also holds
// rpmbuild to SOURCE_DATE_EPOCH.
func TestPackagesBuildReproducibly(t *testing.T) {
	// The packages tier runs after `make packages`, which also leaves in
	// bin/ what this test builds from.
	packageFile(t, "UNBOUNDED_TEST_RPM")
	requireTools(t, "rpmbuild", "rpm2archive", "go")
	root := repoRoot(t)
	for _, f := range []string{"bin/unbounded", "bin/unbounded-generator", "bin/doc/unbounded.1.gz"} {
		if _, err := os.Stat(filepath.Join(root, f)); err != nil {
			tiers.Skip(t, tiers.Packages, "%s: %v (run make packages first)", f, err)
		}
	}
	t.Parallel()

	build := func(umask string, env ...string) (map[string][]byte, error) {
		dist, tmp := t.TempDir(), t.TempDir()
		cmd := exec.Command("sh", "-c", "umask "+umask+" && exec deb/build-packages.sh")
		cmd.Dir = root
		cmd.Env = append(os.Environ(), append([]string{
			"VERSION=0.1.0-dev.1.greproduce",
			"SOURCE_DATE_EPOCH=1700000000",
			"DIST=" + dist,
			"TMPDIR=" + tmp,
		}, env...)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("deb/build-packages.sh (umask %s, %v): %v\n%s", umask, env, err, out)
		}
		got := map[string][]byte{}
		entries, err := os.ReadDir(dist)
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			b, err := os.ReadFile(filepath.Join(dist, e.Name()))
			if err != nil {
				return nil, err
			}
			got[e.Name()] = b
		}
		return got, nil
	}
	// The two builds at once (each writes only its own DIST and TMPDIR):
	// their compressors take a core each.
	var first, second map[string][]byte
	var errFirst, errSecond error
	var wg sync.WaitGroup
	wg.Go(func() { first, errFirst = build("022", "TZ=UTC", "LC_ALL=C") })
	wg.Go(func() { second, errSecond = build("077", "TZ=Pacific/Auckland", "LC_ALL=C.UTF-8") })
	wg.Wait()
	if err := errors.Join(errFirst, errSecond); err != nil {
		t.Fatal(err)
	}

	for _, ext := range []string{".deb", ".rpm"} {
		n := 0
		for name := range first {
			if filepath.Ext(name) == ext {
				n++
			}
		}
		if n != 1 {
			t.Errorf("the build made %d %s files, want 1: %v", n, ext, sortedKeys(first))
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
