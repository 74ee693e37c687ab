package tree

import (
	"archive/tar"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"unbounded-cloud.io/agent/lib/modes/bluegreen/tree/treetest"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"

	"unbounded-cloud.io/agent/lib/modes"
)

func TestContainerdNameNormalizesAsDockerDoes(t *testing.T) {
	for in, want := range map[string]string{
		"busybox:1.35":                                  "docker.io/library/busybox:1.35",
		"library/busybox:1.35":                          "docker.io/library/busybox:1.35",
		"registry.k8s.io/pause:3.10":                    "registry.k8s.io/pause:3.10",
		"127.0.0.1:5000/pause:3.10":                     "127.0.0.1:5000/pause:3.10",
		"localhost/app:v1":                              "localhost/app:v1",
		"127.0.0.1:5000/unbounded/node:book":            "127.0.0.1:5000/unbounded/node:book",
		"quay.io/a/b":                                   "quay.io/a/b:latest",
		"ghcr.io/x/y@sha256:" + strings.Repeat("a", 64): "ghcr.io/x/y@sha256:" + strings.Repeat("a", 64),
	} {
		if got, ok := containerdName(in); !ok || got != want {
			t.Errorf("containerdName(%q) = %q, %v; want %q", in, got, ok, want)
		}
	}
	for _, in := range []string{"", "1.35", "latest", "Bad Name:1"} {
		if got, ok := containerdName(in); ok {
			t.Errorf("containerdName(%q) = %q, want none: it names no image on its own", in, got)
		}
	}
}

// archiveOf reads the OCI archive: its index and the names of its blobs.
func archiveOf(t *testing.T, file string) (v1.IndexManifest, []string) {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var idx v1.IndexManifest
	var blobs []string
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		switch {
		case h.Name == "index.json":
			if err := json.NewDecoder(tr).Decode(&idx); err != nil {
				t.Fatal(err)
			}
		case strings.HasPrefix(h.Name, "blobs/sha256/"):
			blobs = append(blobs, strings.TrimPrefix(h.Name, "blobs/sha256/"))
		}
	}
	return idx, blobs
}

func TestWritePodImagesTakesTheNamedPodImagesButNotTheNodeImage(t *testing.T) {
	offline := t.TempDir()
	dir := filepath.Join(offline, "images")
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	node := treetest.NodeImage(t)
	pause := treetest.Image(t, treetest.Layer(t, treetest.Entry{Name: "pause", Body: "pause", Mode: 0o755}))
	app := treetest.Image(t, treetest.Layer(t, treetest.Entry{Name: "app", Body: "app", Mode: 0o755}))
	bare := treetest.Image(t, treetest.Layer(t, treetest.Entry{Name: "bare", Body: "bare", Mode: 0o755}))
	for ref, img := range map[string]v1.Image{
		"127.0.0.1:5000/unbounded/node:bookworm": node,
		"127.0.0.1:5000/pause:3.10":              pause,
		"busybox:1.35":                           app,
		"1.0":                                    bare, // a bare tag: no name for containerd
	} {
		if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{annRefName: ref})); err != nil {
			t.Fatal(err)
		}
	}
	rootfs := t.TempDir()
	names, err := writePodImages(rootfs, modes.Image{Ref: "127.0.0.1:5000/unbounded/node:bookworm", OfflineDir: offline})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(names)
	if want := []string{"127.0.0.1:5000/pause:3.10", "docker.io/library/busybox:1.35"}; !slices.Equal(names, want) {
		t.Errorf("pod images %q, want %q", names, want)
	}
	idx, blobs := archiveOf(t, filepath.Join(rootfs, podImagesArchive))
	var got []string
	for _, d := range idx.Manifests {
		got = append(got, d.Annotations[annContainerdName])
	}
	slices.Sort(got)
	if !slices.Equal(got, names) {
		t.Errorf("archive index names %q, want %q", got, names)
	}
	// Every blob of the pod images, none of the node image's layers.
	want := map[string]bool{}
	for _, img := range []v1.Image{pause, app} {
		d, _ := img.Digest()
		c, _ := img.ConfigName()
		want[d.Hex], want[c.Hex] = true, true
		ls, _ := img.Layers()
		for _, l := range ls {
			h, _ := l.Digest()
			want[h.Hex] = true
		}
	}
	nls, _ := node.Layers()
	for _, l := range nls {
		h, _ := l.Digest()
		if slices.Contains(blobs, h.Hex) {
			t.Errorf("the node image's layer %s is in the pod images", h)
		}
	}
	for h := range want {
		if !slices.Contains(blobs, h) {
			t.Errorf("blob %s missing from the archive", h)
		}
	}
	if len(blobs) != len(want) {
		t.Errorf("%d blobs in the archive, want %d", len(blobs), len(want))
	}
}

func TestWritePodImagesWritesNothingWithoutALayoutOrPodImages(t *testing.T) {
	rootfs := t.TempDir()
	for _, img := range []modes.Image{
		{Ref: "r.example/node:1"},
		{Ref: "r.example/node:1", OfflineDir: t.TempDir()},
	} {
		if names, err := writePodImages(rootfs, img); err != nil || names != nil {
			t.Errorf("%+v: %q, %v; want nothing", img, names, err)
		}
	}
	offline := t.TempDir()
	p, err := layout.Write(filepath.Join(offline, "images"), empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(treetest.NodeImage(t), layout.WithAnnotations(map[string]string{annRefName: "r.example/node:1"})); err != nil {
		t.Fatal(err)
	}
	if names, err := writePodImages(rootfs, modes.Image{Ref: "r.example/node:1", OfflineDir: offline}); err != nil || names != nil {
		t.Errorf("only the node image: %q, %v; want nothing", names, err)
	}
	if _, err := os.Stat(filepath.Join(rootfs, podImagesArchive)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("archive written: %v", err)
	}
}
