package tree

import (
	"archive/tar"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"unbounded-cloud.io/agent/lib/modes/bluegreen/tree/treetest"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"
)

func TestUnpackAppliesWhiteoutsAndRestoresOwnersModesAndLinks(t *testing.T) {
	treetest.RequireRoot(t)
	dir := t.TempDir()
	st, err := Unpack(treetest.NodeImage(t), dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("unpacked: %+v", st)
	p := func(n string) string { return filepath.Join(dir, n) }

	// Whiteouts: the file and the opaque directory's lower content are
	// gone, the upper content is there, and no whiteout marker is left.
	for _, gone := range []string{"etc/removed-by-upper", "opt/opaque/lower", "etc/.wh.removed-by-upper", "opt/opaque/.wh..wh..opq"} {
		if _, err := os.Lstat(p(gone)); !os.IsNotExist(err) {
			t.Errorf("%s exists after the upper layer removed it (%v)", gone, err)
		}
	}
	if b, err := os.ReadFile(p("opt/opaque/upper")); err != nil || string(b) != "kept" {
		t.Errorf("opt/opaque/upper: %q %v", b, err)
	}

	fi, err := os.Stat(p("usr/bin/su"))
	if err != nil || fi.Mode()&os.ModeSetuid == 0 || fi.Mode().Perm() != 0o755 {
		t.Errorf("usr/bin/su: setuid lost: %v %v", fi, err)
	}
	for n, want := range map[string][2]uint32{"srv": {1234, 5678}, "srv/owned": {1234, 5678}, "usr/bin/sh": {0, 0}} {
		fi, err := os.Lstat(p(n))
		if err != nil {
			t.Fatal(err)
		}
		s := fi.Sys().(*syscall.Stat_t)
		if s.Uid != want[0] || s.Gid != want[1] {
			t.Errorf("%s owned by %d:%d, want %d:%d", n, s.Uid, s.Gid, want[0], want[1])
		}
	}
	if fi, _ := os.Stat(p("srv")); fi.Mode().Perm() != 0o750 || !fi.ModTime().Equal(treetest.MTime) {
		t.Errorf("srv: mode %v treetest.MTime %v, want 0750 and %v (set after its content)", fi.Mode(), fi.ModTime(), treetest.MTime)
	}
	for link, target := range map[string]string{"bin": "usr/bin", "etc/localtime": "/usr/share/zoneinfo/UTC"} {
		if got, err := os.Readlink(p(link)); err != nil || got != target {
			t.Errorf("%s -> %q (%v), want %q", link, got, err, target)
		}
	}
	a, _ := os.Stat(p("usr/bin/sh"))
	b, err := os.Stat(p("usr/bin/sh.hardlink"))
	if err != nil || !os.SameFile(a, b) {
		t.Errorf("usr/bin/sh.hardlink is not a hard link of usr/bin/sh: %v", err)
	}
	buf := make([]byte, 16)
	if n, err := unix.Getxattr(p("usr/bin/ping"), "user.unbounded-test", buf); err != nil || string(buf[:n]) != "cap" {
		t.Errorf("usr/bin/ping lost its extended attribute: %q %v", buf[:n], err)
	}
}

// A layer that plants a symlink to a host directory and a later entry that
// writes through it: the write must fail, and nothing may land outside.
func TestUnpackRefusesToWriteThroughASymlinkOutOfTheRootfs(t *testing.T) {
	treetest.RequireRoot(t)
	outside := t.TempDir()
	for _, tc := range []struct {
		name   string
		layers [][]treetest.Entry
	}{
		{"absolute symlink, then a file through it", [][]treetest.Entry{
			{{Name: "etc/", Typ: tar.TypeDir}, {Name: "etc/evil", Typ: tar.TypeSymlink, Link: outside}, {Name: "etc/evil/pwned", Body: "x"}},
		}},
		{"relative symlink climbing out, then a file through it", [][]treetest.Entry{
			{{Name: "a/", Typ: tar.TypeDir}, {Name: "a/up", Typ: tar.TypeSymlink, Link: "../../../../../../../../" + outside}, {Name: "a/up/pwned", Body: "x"}},
		}},
		{"a lower layer's symlink, an upper layer's file through it", [][]treetest.Entry{
			{{Name: "etc/", Typ: tar.TypeDir}, {Name: "etc/evil", Typ: tar.TypeSymlink, Link: outside}},
			{{Name: "etc/evil/pwned", Body: "x"}},
		}},
		{"hard link to a host file", [][]treetest.Entry{
			{{Name: "x", Typ: tar.TypeLink, Link: "../../../../../../../../etc/passwd"}},
		}},
		{"dot-dot name", [][]treetest.Entry{
			{{Name: "../../../../../../../../" + outside + "/pwned", Body: "x"}},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ls []v1.Layer
			for _, es := range tc.layers {
				ls = append(ls, treetest.Layer(t, es...))
			}
			dir := t.TempDir()
			_, err := Unpack(treetest.Image(t, ls...), dir)
			if ents, _ := os.ReadDir(outside); len(ents) != 0 {
				t.Fatalf("the image wrote outside the rootfs: %v (Unpack: %v)", ents, err)
			}
			// Refused, or dropped (go-containerregistry drops relative
			// links that climb out, and entries below a non-directory):
			// either way the check above is what matters.
			t.Logf("Unpack: %v", err)
		})
	}
}

// The same attacks as a flattened stream that go-containerregistry's
// filter did not see (its checks are the first line; os.Root is the
// second, and must hold alone).
func TestUnpackTarAloneNeverWritesOutsideTheRootfs(t *testing.T) {
	treetest.RequireRoot(t)
	outside := t.TempDir()
	for _, tc := range []struct {
		name    string
		entries []treetest.Entry
	}{
		{"absolute symlink, then a file through it", []treetest.Entry{{Name: "etc/evil", Typ: tar.TypeSymlink, Link: outside}, {Name: "etc/evil/pwned", Body: "x"}}},
		{"relative symlink climbing out", []treetest.Entry{{Name: "up", Typ: tar.TypeSymlink, Link: "../../../../../../../.." + outside}, {Name: "up/pwned", Body: "x"}}},
		{"symlink, then a directory through it", []treetest.Entry{{Name: "d", Typ: tar.TypeSymlink, Link: outside}, {Name: "d/sub/", Typ: tar.TypeDir}}},
		{"a directory written into, replaced by a symlink, then a file through it", []treetest.Entry{
			{Name: "e/", Typ: tar.TypeDir}, {Name: "e/sub/", Typ: tar.TypeDir}, {Name: "e/sub/x/", Typ: tar.TypeDir},
			{Name: "e/sub/x", Typ: tar.TypeSymlink, Link: outside}, {Name: "e/sub/x/pwned", Body: "x"}}},
		{"hard link out", []treetest.Entry{{Name: "x", Typ: tar.TypeLink, Link: "../../../../../../../etc/passwd"}}},
		{"dot-dot name", []treetest.Entry{{Name: "../../../../../../../.." + outside + "/pwned", Body: "x"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rc, err := treetest.Layer(t, tc.entries...).Uncompressed()
			if err != nil {
				t.Fatal(err)
			}
			defer rc.Close()
			_, err = unpackTar(rc, t.TempDir())
			if ents, _ := os.ReadDir(outside); len(ents) != 0 {
				t.Fatalf("the stream wrote outside the rootfs: %v (unpack: %v)", ents, err)
			}
			if err == nil {
				t.Fatal("unpack accepted an entry that leaves the rootfs")
			}
			t.Logf("refused: %v", err)
		})
	}
}

// An entry below a symlink that stays inside the rootfs but leaves its own
// directory (usr/lib/alt -> ../../opt/alt) lands where the symlink points,
// as a path resolved from the rootfs does; so does one below a name that
// an earlier entry made a file and a later one such a symlink.
func TestUnpackTarFollowsSymlinksInsideTheRootfs(t *testing.T) {
	treetest.RequireRoot(t)
	rc, err := treetest.Layer(t,
		treetest.Entry{Name: "usr/lib/", Typ: tar.TypeDir}, treetest.Entry{Name: "opt/alt/", Typ: tar.TypeDir},
		treetest.Entry{Name: "usr/lib/alt", Typ: tar.TypeSymlink, Link: "../../opt/alt"},
		treetest.Entry{Name: "usr/lib/alt/f", Body: "through"},
		treetest.Entry{Name: "v/w/", Typ: tar.TypeDir}, treetest.Entry{Name: "v/w/old", Body: "x"},
		treetest.Entry{Name: "v/w/old", Typ: tar.TypeSymlink, Link: "../../opt/alt"},
		treetest.Entry{Name: "v/w/old/g", Body: "moved"},
	).Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	dir := t.TempDir()
	if _, err := unpackTar(rc, dir); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"opt/alt/f": "through", "opt/alt/g": "moved"} {
		if got, err := os.ReadFile(filepath.Join(dir, name)); err != nil || string(got) != want {
			t.Errorf("%s = %q, %v; want %q", name, got, err, want)
		}
	}
}
