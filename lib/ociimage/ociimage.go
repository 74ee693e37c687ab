// Package ociimage builds the cluster side's container image (`make
// images`, ARCHITECTURE section 3): one static executable on an empty base,
// a non-root user and the CA certificates, reproducibly (the same binary,
// version and time give the same digest on any machine), written as an OCI
// image layout archive that `skopeo copy oci-archive:` or `crane push`
// takes to a registry without changing the digest.
//
// No Docker and no base image: the layer is written here, file by file,
// with fixed owners, modes and times, and the CA bundle comes from the
// pinned golang.org/x/crypto/x509roots/fallback module (Mozilla's NSS
// roots), not from the building machine's /etc/ssl.
package ociimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"debug/elf"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/crypto/x509roots/fallback/bundle"

	"unbounded-cloud.io/agent/lib/state"
)

// NonRoot is the user and group the image runs as (distroless' nonroot).
const NonRoot = 65532

// CABundle is where the image holds the CA certificates (Debian's path,
// which Go's crypto/x509 reads first).
const CABundle = "/etc/ssl/certs/ca-certificates.crt"

// Spec is what an image is built from.
type Spec struct {
	// Binary is the static executable (CGO_ENABLED=0) the image runs.
	Binary string
	// Path is where the image holds it, the entrypoint ("/unbounded-controller").
	Path string
	// Title and Version are the OCI annotations' image title and version.
	Title, Version string
	// Arch is the GOARCH the binary was built for.
	Arch string
	// Created is the time every file and the image carry
	// (SOURCE_DATE_EPOCH: the commit's time).
	Created time.Time
}

func (s Spec) validate() error {
	switch {
	case s.Binary == "":
		return errors.New("ociimage: no binary")
	case !strings.HasPrefix(s.Path, "/") || strings.HasSuffix(s.Path, "/") || filepath.Clean(s.Path) != s.Path:
		return fmt.Errorf("ociimage: in-image path %q is not an absolute file path", s.Path)
	case s.Arch == "":
		return errors.New("ociimage: no architecture")
	case s.Version == "":
		return errors.New("ociimage: no version")
	}
	return nil
}

// Build returns the image of s.
func Build(s Spec) (v1.Image, error) {
	if err := s.validate(); err != nil {
		return nil, err
	}
	if err := staticELF(s.Binary); err != nil {
		return nil, err
	}
	bin, err := os.ReadFile(s.Binary)
	if err != nil {
		return nil, fmt.Errorf("ociimage: %w", err)
	}
	data, err := layerTar(s, bin)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	}, tarball.WithMediaType(types.OCILayer), tarball.WithCompressionLevel(gzip.BestCompression))
	if err != nil {
		return nil, fmt.Errorf("ociimage: layer: %w", err)
	}
	created := v1.Time{Time: s.Created.UTC()}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{
		Layer:     layer,
		MediaType: types.OCILayer,
		History:   v1.History{Created: created, CreatedBy: "make images: " + filepath.Base(s.Path) + ", CA certificates, user nonroot", Comment: "unbounded-agent"},
	})
	if err != nil {
		return nil, fmt.Errorf("ociimage: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("ociimage: %w", err)
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS = s.Arch, "linux"
	cf.Created = created
	cf.Config = v1.Config{
		User:       fmt.Sprintf("%d:%d", NonRoot, NonRoot),
		Entrypoint: []string{s.Path},
		WorkingDir: "/",
		Env:        []string{"PATH=/usr/local/bin:/usr/bin:/bin", "SSL_CERT_FILE=" + CABundle},
		Labels:     annotations(s),
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("ociimage: %w", err)
	}
	return mutate.Annotations(img, annotations(s)).(v1.Image), nil
}

func annotations(s Spec) map[string]string {
	return map[string]string{
		"org.opencontainers.image.title":   s.Title,
		"org.opencontainers.image.version": s.Version,
		"org.opencontainers.image.created": s.Created.UTC().Format(time.RFC3339),
		"org.opencontainers.image.vendor":  "unbounded-agent",
	}
}

// staticELF: path is an ELF executable without a program interpreter
// (PT_INTERP names a dynamically linked one's loader, which an image
// without libc lacks).
func staticELF(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("ociimage: %s is not an ELF executable: %w", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("ociimage: %s is dynamically linked (build it with CGO_ENABLED=0): the image has no libc", path)
		}
	}
	if f.Type != elf.ET_EXEC && f.Type != elf.ET_DYN {
		return fmt.Errorf("ociimage: %s is an ELF %v, not an executable", path, f.Type)
	}
	return nil
}

// caBundle is the PEM of every unconstrained root of the pinned NSS bundle
// (a root with a distrust-after constraint cannot be said in a PEM file,
// so it is left out rather than trusted without its limit).
func caBundle() []byte {
	var buf bytes.Buffer
	for r := range bundle.Roots() {
		if r.Constraint != nil {
			continue
		}
		pem.Encode(&buf, &pem.Block{Type: "CERTIFICATE", Bytes: r.Certificate})
	}
	return buf.Bytes()
}

type entry struct {
	name string
	mode int64
	uid  int
	dir  bool
	data []byte
}

// layerTar is the one layer: directories, the user database, the CA
// bundle and the executable, in name order, owned by root (the home of
// nonroot by nonroot), every time Created.
func layerTar(s Spec, bin []byte) ([]byte, error) {
	entries := []entry{
		{name: "etc/", mode: 0o755, dir: true},
		{name: "etc/passwd", mode: 0o644, data: fmt.Appendf(nil, "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%d:%d:nonroot:/home/nonroot:/sbin/nologin\n", NonRoot, NonRoot)},
		{name: "etc/group", mode: 0o644, data: fmt.Appendf(nil, "root:x:0:\nnonroot:x:%d:\n", NonRoot)},
		{name: "etc/ssl/", mode: 0o755, dir: true},
		{name: "etc/ssl/certs/", mode: 0o755, dir: true},
		{name: strings.TrimPrefix(CABundle, "/"), mode: 0o644, data: caBundle()},
		{name: "home/", mode: 0o755, dir: true},
		{name: "home/nonroot/", mode: 0o700, uid: NonRoot, dir: true},
		{name: "tmp/", mode: 0o1777, dir: true},
	}
	// The executable's parent directories, then itself.
	rel := strings.TrimPrefix(s.Path, "/")
	for d := filepath.Dir(rel); d != "."; d = filepath.Dir(d) {
		if !slices.ContainsFunc(entries, func(e entry) bool { return e.name == d+"/" }) {
			entries = append(entries, entry{name: d + "/", mode: 0o755, dir: true})
		}
	}
	entries = append(entries, entry{name: rel, mode: 0o755, data: bin})
	slices.SortFunc(entries, func(a, b entry) int { return strings.Compare(a.name, b.name) })

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	mtime := s.Created.UTC().Truncate(time.Second)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: e.mode, Uid: e.uid, Gid: e.uid, ModTime: mtime, Format: tar.FormatPAX}
		if e.uid == NonRoot {
			h.Uname, h.Gname = "nonroot", "nonroot"
		} else {
			h.Uname, h.Gname = "root", "root"
		}
		if e.dir {
			h.Typeflag = tar.TypeDir
		} else {
			h.Typeflag, h.Size = tar.TypeReg, int64(len(e.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("ociimage: layer: %w", err)
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, fmt.Errorf("ociimage: layer: %w", err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("ociimage: layer: %w", err)
	}
	return buf.Bytes(), nil
}

// WriteArchive writes img as an OCI image layout archive at path (a tar
// of the layout: oci-layout, index.json, blobs/sha256/...), its index
// entry named ref (org.opencontainers.image.ref.name, the tag `skopeo copy
// oci-archive:PATH:REF` picks), atomically and reproducibly, and returns
// the image's manifest digest.
func WriteArchive(path string, img v1.Image, ref string) (v1.Hash, error) {
	digest, err := img.Digest()
	if err != nil {
		return v1.Hash{}, fmt.Errorf("ociimage: %w", err)
	}
	dir, err := os.MkdirTemp(filepath.Dir(path), ".oci-layout-")
	if err != nil {
		return v1.Hash{}, fmt.Errorf("ociimage: %w", err)
	}
	defer os.RemoveAll(dir)
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("ociimage: layout: %w", err)
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": ref})); err != nil {
		return v1.Hash{}, fmt.Errorf("ociimage: layout: %w", err)
	}
	var buf bytes.Buffer
	if err := tarDir(&buf, dir); err != nil {
		return v1.Hash{}, err
	}
	if err := state.WriteFileAtomic(path, buf.Bytes(), 0o644); err != nil {
		return v1.Hash{}, fmt.Errorf("ociimage: %w", err)
	}
	return digest, nil
}

// tarDir writes the files below dir into w in name order, with fixed
// owners, modes and times: the archive depends only on their contents.
func tarDir(w io.Writer, dir string) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		h := &tar.Header{Name: filepath.ToSlash(rel), Mode: 0o644, ModTime: time.Unix(0, 0).UTC(), Format: tar.FormatPAX, Uname: "root", Gname: "root"}
		if d.IsDir() {
			h.Name += "/"
			h.Typeflag, h.Mode = tar.TypeDir, 0o755
			return tw.WriteHeader(h)
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		h.Typeflag, h.Size = tar.TypeReg, int64(len(data))
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		_, err = tw.Write(data)
		return err
	})
	if err != nil {
		return fmt.Errorf("ociimage: archive: %w", err)
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("ociimage: archive: %w", err)
	}
	return nil
}
