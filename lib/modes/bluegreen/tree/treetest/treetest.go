// Package treetest makes node images for the tests of the slot tree's
// builder (lib/modes/bluegreen/tree) and of the modes that build with it:
// layers of given tar entries, images of them for this host's platform, a
// small node image, a registry on loopback that serves one.
package treetest

import (
	"archive/tar"
	"bytes"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Entry is one tar entry of a test layer: a regular file unless Typ
// says otherwise, mode 0644 (a directory 0755) unless Mode says.
type Entry struct {
	Name, Body, Link string
	Typ              byte
	Mode             int64
	UID, GID         int
	Xattrs           map[string]string
}

// MTime is every entry's modification time.
var MTime = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// Layer is a layer of entries, in order.
func Layer(t testing.TB, entries ...Entry) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.Name, Linkname: e.Link, Typeflag: e.Typ, Mode: e.Mode, Uid: e.UID, Gid: e.GID,
			ModTime: MTime, Size: int64(len(e.Body)), Format: tar.FormatPAX}
		if h.Typeflag == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Mode == 0 {
			h.Mode = 0o644
			if h.Typeflag == tar.TypeDir {
				h.Mode = 0o755
			}
		}
		if h.Typeflag != tar.TypeReg {
			h.Size = 0
		}
		if len(e.Xattrs) > 0 {
			h.PAXRecords = map[string]string{}
			for k, v := range e.Xattrs {
				h.PAXRecords["SCHILY.xattr."+k] = v
			}
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			tw.Write([]byte(e.Body))
		}
	}
	tw.Close()
	data := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// Image is an image of layers for this host's platform (linux, GOARCH).
func Image(t testing.TB, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// NodeImage is a small rootfs with what a node image has (an OS tree,
// merged /usr links, a setuid binary, hard links, file capabilities) and
// what unpacking must get right: a file and a directory's content deleted
// by an upper layer's whiteouts.
func NodeImage(t testing.TB) v1.Image {
	t.Helper()
	base := Layer(t,
		Entry{Name: "usr/", Typ: tar.TypeDir},
		Entry{Name: "usr/bin/", Typ: tar.TypeDir},
		Entry{Name: "usr/bin/sh", Body: "#!shell", Mode: 0o755},
		Entry{Name: "usr/bin/su", Body: "su", Mode: 0o4755},
		Entry{Name: "usr/bin/ping", Body: "ping", Mode: 0o755, Xattrs: map[string]string{"user.unbounded-test": "cap"}},
		Entry{Name: "bin", Typ: tar.TypeSymlink, Link: "usr/bin"},
		Entry{Name: "etc/", Typ: tar.TypeDir},
		Entry{Name: "etc/os-release", Body: "ID=debian\n"},
		Entry{Name: "etc/removed-by-upper", Body: "old"},
		Entry{Name: "etc/localtime", Typ: tar.TypeSymlink, Link: "/usr/share/zoneinfo/UTC"},
		Entry{Name: "etc/resolv.conf", Typ: tar.TypeSymlink, Link: "../run/systemd/resolve/stub-resolv.conf"},
		Entry{Name: "srv/", Typ: tar.TypeDir, Mode: 0o750, UID: 1234, GID: 5678},
		Entry{Name: "srv/owned", Body: "x", UID: 1234, GID: 5678},
		Entry{Name: "opt/", Typ: tar.TypeDir},
		Entry{Name: "opt/opaque/", Typ: tar.TypeDir},
		Entry{Name: "opt/opaque/lower", Body: "hidden by the upper layer"},
		Entry{Name: "var/", Typ: tar.TypeDir},
		Entry{Name: "var/lib/", Typ: tar.TypeDir},
		Entry{Name: "var/lib/dbus/", Typ: tar.TypeDir},
		Entry{Name: "var/lib/dbus/machine-id", Body: "0123456789abcdef0123456789abcdef\n"},
	)
	upper := Layer(t,
		Entry{Name: "etc/.wh.removed-by-upper", Typ: tar.TypeReg},
		Entry{Name: "opt/opaque/.wh..wh..opq", Typ: tar.TypeReg},
		Entry{Name: "opt/opaque/upper", Body: "kept"},
		Entry{Name: "usr/bin/sh.hardlink", Typ: tar.TypeLink, Link: "usr/bin/sh"},
		Entry{Name: "etc/machine-id", Body: "fedcba9876543210fedcba9876543210\n"},
	)
	return Image(t, base, upper)
}

// ServeRegistry runs go-containerregistry's registry on loopback and
// pushes img as repo:tag; it returns the reference.
func ServeRegistry(t testing.TB, repoTag string, img v1.Image) string {
	t.Helper()
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	ref := strings.TrimPrefix(srv.URL, "http://") + "/" + repoTag
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img); err != nil {
		t.Fatal(err)
	}
	return ref
}

// RequireRoot skips a test that unpacks a rootfs when not run as root.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: unpacking a rootfs restores its owners (chown)")
	}
}
