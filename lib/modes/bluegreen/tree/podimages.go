package tree

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"

	"unbounded-cloud.io/agent/lib/modes"
	"unbounded-cloud.io/agent/lib/modes/nodestack"
)

// Pod images of an offline host. The OCI layout <offline-dir>/images may
// hold, beside the node image, the images pods need (the sandbox image
// first): Prepare writes those into the machine as one OCI archive, and
// unbounded-pod-images.service imports it into containerd's k8s.io
// namespace (the CRI's) after containerd starts and before kubelet does.
// A pod whose image is there then starts without any registry (tagged
// images are pulled IfNotPresent).
const (
	PodImagesUnit = "unbounded-pod-images.service"
	// podImagesArchive is the archive in the machine (not under
	// /var/lib/containerd: that is the host's slot store, bound in).
	podImagesArchive = "/var/lib/unbounded-node/pod-images.tar"
)

// The annotations naming an image in an OCI layout: containerd's (a full
// reference, taken as is by `ctr images import`) and the OCI one.
const (
	annContainerdName = "io.containerd.image.name"
	annRefName        = "org.opencontainers.image.ref.name"
)

func podImagesUnitText() string {
	return fmt.Sprintf(`# Written by unbounded-agent: the pod images of the host's offline directory.
[Unit]
Description=Pod images from the offline directory, imported into containerd (unbounded node stack)
Documentation=https://unbounded-cloud.io/docs/agent/modes/nspawn
# The host had them in <offline-dir>/images (an OCI layout): pods, and
# their sandbox image first, start without a registry. Before kubelet, so
# that its first pod finds them; imported again at every boot (content
# already in the store is not copied twice).
Requires=%[1]s
After=%[1]s
Before=%[2]s

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=%[3]s/ctr --address %[4]s --namespace k8s.io images import %[5]s

[Install]
WantedBy=multi-user.target
`, ContainerdUnit, KubeletUnit, Layout.BinDir, Layout.Socket(), podImagesArchive)
}

// containerdName is the full reference containerd and the CRI name an
// image by (Docker's normalization: "busybox:1.35" is
// "docker.io/library/busybox:1.35"), or false when s names no image on
// its own (a bare tag such as "1.35", as `skopeo copy oci:DIR:TAG`
// writes).
func containerdName(s string) (string, bool) {
	if s == "" || !strings.ContainsAny(s, "/:@") {
		return "", false
	}
	r, err := name.ParseReference(s)
	if err != nil {
		return "", false
	}
	repo := s
	if i := strings.IndexAny(repo, "@"); i >= 0 {
		repo = repo[:i]
	}
	if i := strings.LastIndex(repo, ":"); i > strings.LastIndex(repo, "/") {
		repo = repo[:i]
	}
	first, _, hasSlash := strings.Cut(repo, "/")
	switch {
	case !hasSlash:
		repo = "docker.io/library/" + repo
	case !strings.ContainsAny(first, ".:") && first != "localhost":
		repo = "docker.io/" + repo
	}
	switch r.(type) {
	case name.Digest:
		return repo + "@" + r.Identifier(), true
	default:
		return repo + ":" + r.Identifier(), true
	}
}

// writePodImages writes the images of the OCI layout offlineDir/images
// that a full reference names, except the node image (img.Ref), as an
// OCI archive at podImagesArchive under rootfs, each named for containerd
// by the io.containerd.image.name annotation. It returns their names;
// none (and no file) when there is no layout or no such image.
func writePodImages(rootfs string, img modes.Image) ([]string, error) {
	if img.OfflineDir == "" {
		return nil, nil
	}
	dir := filepath.Join(img.OfflineDir, "images")
	if _, err := os.Stat(filepath.Join(dir, "index.json")); errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	p, keep, names, err := podImagesOf(dir, img)
	if err != nil || len(keep) == 0 {
		return nil, err
	}
	d, err := nodestack.MkdirUnder(rootfs, path.Dir(podImagesArchive))
	if err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(d, path.Base(podImagesArchive)), os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	lt := &layoutTar{tw: tar.NewWriter(f), p: p, seen: map[v1.Hash]bool{}}
	idx := v1.IndexManifest{SchemaVersion: 2, MediaType: "application/vnd.oci.image.index.v1+json", Manifests: keep}
	ib, err := json.Marshal(idx)
	if err != nil {
		return nil, err
	}
	if err := lt.addBytes("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return nil, err
	}
	if err := lt.addBytes("index.json", ib); err != nil {
		return nil, err
	}
	for _, d := range keep {
		if err := lt.walk(d); err != nil {
			return nil, fmt.Errorf("offline pod image %s (OCI layout %s): %w", d.Annotations[annContainerdName], dir, err)
		}
	}
	if err := lt.tw.Close(); err != nil {
		return nil, err
	}
	if err := f.Sync(); err != nil {
		return nil, err
	}
	return names, f.Close()
}

// podImagesOf reads the offline OCI layout dir and returns the entries
// that are pod images (not the node image img), annotated with the name
// containerd imports them under, and those names.
func podImagesOf(dir string, img modes.Image) (layout.Path, []v1.Descriptor, []string, error) {
	p, err := layout.FromPath(dir)
	if err != nil {
		return "", nil, nil, fmt.Errorf("offline pod images: OCI layout %s: %w", dir, err)
	}
	ii, err := p.ImageIndex()
	if err != nil {
		return "", nil, nil, fmt.Errorf("offline pod images: OCI layout %s: %w", dir, err)
	}
	im, err := ii.IndexManifest()
	if err != nil {
		return "", nil, nil, fmt.Errorf("offline pod images: OCI layout %s: %w", dir, err)
	}
	var nodeFull, nodeShort string
	if r, err := name.ParseReference(img.Ref); err == nil {
		nodeFull, nodeShort = r.Name(), r.Identifier()
	}
	var keep []v1.Descriptor
	var names []string
	for _, d := range im.Manifests {
		if nodeFull != "" && matches(d.Annotations, nodeFull, nodeShort) {
			continue
		}
		n := d.Annotations[annContainerdName]
		if n == "" {
			n = d.Annotations[annRefName]
		}
		full, ok := containerdName(n)
		if !ok || !(d.MediaType.IsImage() || d.MediaType.IsIndex()) {
			continue
		}
		ann := map[string]string{}
		for k, v := range d.Annotations {
			ann[k] = v
		}
		ann[annContainerdName] = full
		d.Annotations = ann
		keep = append(keep, d)
		names = append(names, full)
	}
	return p, keep, names, nil
}

// layoutTar writes an OCI layout as a tar archive: every blob the entries
// walked reach, once.
type layoutTar struct {
	tw   *tar.Writer
	p    layout.Path
	seen map[v1.Hash]bool
}

func (lt *layoutTar) add(name string, size int64, r io.Reader) error {
	if err := lt.tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: size, Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	n, err := io.Copy(lt.tw, r)
	if err == nil && n != size {
		err = fmt.Errorf("%s: %d bytes, the descriptor says %d", name, n, size)
	}
	return err
}

func (lt *layoutTar) addBytes(name string, b []byte) error {
	return lt.add(name, int64(len(b)), bytes.NewReader(b))
}

// walk adds d's blob and, for a manifest or an index, the blobs it names.
func (lt *layoutTar) walk(d v1.Descriptor) error {
	if lt.seen[d.Digest] {
		return nil
	}
	lt.seen[d.Digest] = true
	rc, err := lt.p.Blob(d.Digest)
	if err != nil {
		return err
	}
	defer rc.Close()
	blob := "blobs/" + d.Digest.Algorithm + "/" + d.Digest.Hex
	if !d.MediaType.IsImage() && !d.MediaType.IsIndex() {
		return lt.add(blob, d.Size, rc)
	}
	b, err := io.ReadAll(io.LimitReader(rc, 4<<20))
	if err != nil {
		return err
	}
	if err := lt.addBytes(blob, b); err != nil {
		return err
	}
	var children []v1.Descriptor
	if d.MediaType.IsIndex() {
		var sub v1.IndexManifest
		if err := json.Unmarshal(b, &sub); err != nil {
			return fmt.Errorf("%s: %w", blob, err)
		}
		children = sub.Manifests
	} else {
		var m v1.Manifest
		if err := json.Unmarshal(b, &m); err != nil {
			return fmt.Errorf("%s: %w", blob, err)
		}
		children = append([]v1.Descriptor{m.Config}, m.Layers...)
	}
	for _, c := range children {
		if err := lt.walk(c); err != nil {
			return err
		}
	}
	return nil
}
