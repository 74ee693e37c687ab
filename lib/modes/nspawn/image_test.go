package nspawn

import (
	"archive/tar"
	"bytes"
	"io"
	"log"
	"net/http/httptest"
	"os"
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

// entry is one tar entry of a test layer.
type entry struct {
	name, body, link string
	typ              byte
	mode             int64
	uid, gid         int
	xattrs           map[string]string
}

var mtime = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func layer(t testing.TB, entries ...entry) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: e.mode, Uid: e.uid, Gid: e.gid,
			ModTime: mtime, Size: int64(len(e.body)), Format: tar.FormatPAX}
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
		if len(e.xattrs) > 0 {
			h.PAXRecords = map[string]string{}
			for k, v := range e.xattrs {
				h.PAXRecords["SCHILY.xattr."+k] = v
			}
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			tw.Write([]byte(e.body))
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

func image(t testing.TB, layers ...v1.Layer) v1.Image {
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
	cf.OS, cf.Architecture = platform.OS, platform.Architecture
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// nodeImage is a small rootfs with what a node image has (an OS tree,
// merged /usr links, a setuid binary, hard links, file capabilities) and
// what unpacking must get right: a file and a directory's content deleted
// by an upper layer's whiteouts.
func nodeImage(t testing.TB) v1.Image {
	t.Helper()
	base := layer(t,
		entry{name: "usr/", typ: tar.TypeDir},
		entry{name: "usr/bin/", typ: tar.TypeDir},
		entry{name: "usr/bin/sh", body: "#!shell", mode: 0o755},
		entry{name: "usr/bin/su", body: "su", mode: 0o4755},
		entry{name: "usr/bin/ping", body: "ping", mode: 0o755, xattrs: map[string]string{"user.unbounded-test": "cap"}},
		entry{name: "bin", typ: tar.TypeSymlink, link: "usr/bin"},
		entry{name: "etc/", typ: tar.TypeDir},
		entry{name: "etc/os-release", body: "ID=debian\n"},
		entry{name: "etc/removed-by-upper", body: "old"},
		entry{name: "etc/localtime", typ: tar.TypeSymlink, link: "/usr/share/zoneinfo/UTC"},
		entry{name: "etc/resolv.conf", typ: tar.TypeSymlink, link: "../run/systemd/resolve/stub-resolv.conf"},
		entry{name: "srv/", typ: tar.TypeDir, mode: 0o750, uid: 1234, gid: 5678},
		entry{name: "srv/owned", body: "x", uid: 1234, gid: 5678},
		entry{name: "opt/", typ: tar.TypeDir},
		entry{name: "opt/opaque/", typ: tar.TypeDir},
		entry{name: "opt/opaque/lower", body: "hidden by the upper layer"},
		entry{name: "var/", typ: tar.TypeDir},
		entry{name: "var/lib/", typ: tar.TypeDir},
		entry{name: "var/lib/dbus/", typ: tar.TypeDir},
		entry{name: "var/lib/dbus/machine-id", body: "0123456789abcdef0123456789abcdef\n"},
	)
	upper := layer(t,
		entry{name: "etc/.wh.removed-by-upper", typ: tar.TypeReg},
		entry{name: "opt/opaque/.wh..wh..opq", typ: tar.TypeReg},
		entry{name: "opt/opaque/upper", body: "kept"},
		entry{name: "usr/bin/sh.hardlink", typ: tar.TypeLink, link: "usr/bin/sh"},
		entry{name: "etc/machine-id", body: "fedcba9876543210fedcba9876543210\n"},
	)
	return image(t, base, upper)
}

// serveRegistry runs go-containerregistry's registry on loopback and
// pushes img as repo:tag; it returns the reference.
func serveRegistry(t testing.TB, repoTag string, img v1.Image) string {
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

func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: unpacking a rootfs restores its owners (chown)")
	}
}
