package upgrade

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
)

// A package dpkg-deb built (xz, gzip and zstd data) reads without dpkg:
// its control fields, and the files and links of one directory.
func TestDebReaderReadsWhatDpkgDebBuilds(t *testing.T) {
	if _, err := exec.LookPath("dpkg-deb"); err != nil {
		t.Skip("dpkg-deb not on this machine: it builds the packages this test reads")
	}
	tree := t.TempDir()
	lib := filepath.Join(tree, "usr/libexec/unbounded")
	os.MkdirAll(lib, 0o755)
	os.MkdirAll(filepath.Join(tree, "DEBIAN"), 0o755)
	os.WriteFile(filepath.Join(tree, "DEBIAN/control"), []byte("Package: unbounded-agent\nVersion: 1.2.0~rc.1\nArchitecture: amd64\nMaintainer: m <m@example.com>\nDescription: d\n"), 0o644)
	os.WriteFile(filepath.Join(lib, "unbounded-agent"), []byte("#!/bin/sh\necho agent\n"), 0o755)
	os.Symlink("unbounded-agent", filepath.Join(lib, "daemon"))
	os.MkdirAll(filepath.Join(tree, "usr/bin"), 0o755)
	os.WriteFile(filepath.Join(tree, "usr/bin/unbounded"), []byte("cli"), 0o755)
	for _, z := range []string{"xz", "gzip", "zstd"} {
		deb := filepath.Join(t.TempDir(), "p.deb")
		if out, err := exec.Command("dpkg-deb", "--root-owner-group", "-Z"+z, "--build", tree, deb).CombinedOutput(); err != nil {
			t.Fatalf("dpkg-deb -Z%s: %v\n%s", z, err, out)
		}
		m, err := DebMeta(deb)
		if err != nil || m != (Meta{Package, "1.2.0~rc.1", "amd64"}) {
			t.Errorf("-Z%s: meta %+v %v", z, m, err)
		}
		dst := t.TempDir()
		names, err := extractDir(deb, "usr/libexec/unbounded", dst)
		slices.Sort(names)
		if err != nil || !slices.Equal(names, []string{"daemon", "unbounded-agent"}) {
			t.Errorf("-Z%s: extracted %v %v", z, names, err)
			continue
		}
		if l, _ := os.Readlink(filepath.Join(dst, "daemon")); l != "unbounded-agent" {
			t.Errorf("-Z%s: link %q", z, l)
		}
		if fi, err := os.Stat(filepath.Join(dst, "unbounded-agent")); err != nil || fi.Mode().Perm() != 0o755 {
			t.Errorf("-Z%s: executable %v %v", z, fi, err)
		}
	}
	bad := filepath.Join(t.TempDir(), "x.deb")
	os.WriteFile(bad, []byte("not an archive"), 0o644)
	if _, err := DebMeta(bad); err == nil {
		t.Error("a file that is not a package read as one")
	}
}
