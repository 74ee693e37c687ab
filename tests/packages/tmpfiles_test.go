package packages_test

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// tmpfilesConf is the package's tmpfiles.d entry: /run/unbounded comes from
// it, not from the agent's code (ARCHITECTURE section 6, "Sandboxing").
const tmpfilesConf = "/usr/lib/tmpfiles.d/unbounded-agent.conf"

// TestTmpfilesEntryCreatesTheRunDir applies the .deb's tmpfiles.d entry with
// the real systemd-tmpfiles to the package's files, as
// systemd-tmpfiles-setup.service does at boot: /run/unbounded appears as a
// directory 0755 owned by root:root, and a second run (every boot, the
// postinst after it) leaves it so. The rpm holds the same file
// (TestRPMHoldsExactlyTheExpectedFiles).
func TestTmpfilesEntryCreatesTheRunDir(t *testing.T) {
	deb := packageFile(t, "UNBOUNDED_TEST_DEB")
	requireRoot(t, "systemd-tmpfiles creates the directory owned by root")
	requireTools(t, "dpkg-deb", "systemd-tmpfiles")
	t.Parallel()

	root := t.TempDir()
	run(t, nil, "dpkg-deb", "-x", deb, root)
	if _, err := os.Stat(filepath.Join(root, tmpfilesConf)); err != nil {
		t.Fatalf("the package does not hold %s: %v", tmpfilesConf, err)
	}
	dir := filepath.Join(root, "run/unbounded")
	if _, err := os.Lstat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("%s is in the package itself (%v): /run is a tmpfs, the entry must make it", dir, err)
	}
	for i := range 2 {
		// The entry by its name, as the postinst applies it: only this
		// package's entry, resolved under --root.
		out, err := exec.Command("systemd-tmpfiles", "--root="+root, "--create", filepath.Base(tmpfilesConf)).CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != "" {
			t.Fatalf("systemd-tmpfiles --create (run %d): %v\n%s", i+1, err, out)
		}
		fi, err := os.Lstat(dir)
		if err != nil {
			t.Fatalf("after systemd-tmpfiles --create (run %d): %v", i+1, err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if !fi.IsDir() || fi.Mode().Perm() != 0o755 || st.Uid != 0 || st.Gid != 0 {
			t.Fatalf("after systemd-tmpfiles --create (run %d): /run/unbounded is %v owned by %d:%d, want a directory 0755 owned by 0:0", i+1, fi.Mode(), st.Uid, st.Gid)
		}
	}
	// A directory left with a wrong mode (by hand, or by an older agent
	// that made it itself) is put right by the next boot.
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("systemd-tmpfiles", "--root="+root, "--create", filepath.Base(tmpfilesConf)).CombinedOutput(); err != nil {
		t.Fatalf("systemd-tmpfiles --create over a 0777 directory: %v\n%s", err, out)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("systemd-tmpfiles left /run/unbounded %v (%v), want 0755", fi.Mode(), err)
	}
}

// TestInstallAppliesTheTmpfilesEntryWhereSystemdRuns: on a host where
// systemd runs, the .deb's postinst and the rpm's %post create
// /run/unbounded at once (systemd-tmpfiles --create with the entry's
// name), so that the daemon can start before the next boot; on an image
// being built (no systemd running) they leave it to the image's boot. The
// scripts run chrooted in a scratch root whose systemd-tmpfiles logs its
// calls.
func TestInstallAppliesTheTmpfilesEntryWhereSystemdRuns(t *testing.T) {
	requireRoot(t, "dpkg --root and rpm --root chroot into the scratch root to run the scripts")
	for _, format := range []string{"deb", "rpm"} {
		for _, running := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s systemd running=%v", format, running), func(t *testing.T) {
				var pkg string
				if format == "deb" {
					pkg = packageFile(t, "UNBOUNDED_TEST_DEB")
					requireTools(t, "dpkg", "dpkg-deb")
				} else {
					pkg = packageFile(t, "UNBOUNDED_TEST_RPM")
					requireTools(t, "rpm")
				}
				busybox := staticBusybox(t)
				t.Parallel()
				root, _ := newRoot(t, busybox, running)
				log := filepath.Join(root, "tmp/systemd-tmpfiles.log")
				script := "#!/bin/sh\necho \"$*\" >>/tmp/systemd-tmpfiles.log\n"
				if err := os.WriteFile(filepath.Join(root, "usr/bin/systemd-tmpfiles"), []byte(script), 0o755); err != nil {
					t.Fatal(err)
				}
				if format == "deb" {
					newDpkgDatabase(t, root)
					run(t, nil, "dpkg", "--root="+root, "--force-depends", "-i", pkg)
				} else {
					run(t, nil, "rpm", "--root", root, "--define", "_dbpath /var/lib/rpm", "-i", "--nodeps", pkg)
				}
				b, err := os.ReadFile(log)
				if err != nil && !errors.Is(err, fs.ErrNotExist) {
					t.Fatal(err)
				}
				got := strings.TrimSpace(string(b))
				want := ""
				if running {
					want = "--create " + filepath.Base(tmpfilesConf)
				}
				if got != want {
					t.Errorf("systemd-tmpfiles calls at install: %q, want %q", got, want)
				}
			})
		}
	}
}
