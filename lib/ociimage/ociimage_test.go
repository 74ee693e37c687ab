package ociimage

import (
	"archive/tar"
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
)

var (
	staticOnce sync.Once
	staticBin  string
	staticErr  error
)

// staticBinary is a static executable (a tiny Go program, CGO_ENABLED=0).
func staticBinary(t *testing.T) string {
	t.Helper()
	staticOnce.Do(func() {
		dir, err := os.MkdirTemp("", "ociimage-test-")
		if err != nil {
			staticErr = err
			return
		}
		src := filepath.Join(dir, "main.go")
		os.WriteFile(src, []byte("package main\n\nfunc main() { println(\"hello\") }\n"), 0o644)
		os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module hello\n\ngo 1.26\n"), 0o644)
		staticBin = filepath.Join(dir, "hello")
		cmd := exec.Command("go", "build", "-o", staticBin, ".")
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			staticErr = err
			staticBin = string(out)
		}
	})
	if staticErr != nil {
		t.Fatalf("go build of a static test program: %v\n%s", staticErr, staticBin)
	}
	return staticBin
}

func spec(t *testing.T) Spec {
	return Spec{Binary: staticBinary(t), Path: "/unbounded-controller", Title: "unbounded-controller", Version: "1.2.3",
		Arch: runtime.GOARCH, Created: time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)}
}

func digest(t *testing.T, img v1.Image) v1.Hash {
	t.Helper()
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestBuildIsReproducibleAndEveryInputCounts(t *testing.T) {
	s := spec(t)
	a, err := Build(s)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Build(s)
	if err != nil {
		t.Fatal(err)
	}
	if digest(t, a) != digest(t, b) {
		t.Errorf("two builds of one spec: %v and %v", digest(t, a), digest(t, b))
	}
	for name, change := range map[string]func(*Spec){
		"version": func(s *Spec) { s.Version = "1.2.4" },
		"time":    func(s *Spec) { s.Created = s.Created.Add(time.Second) },
		"path":    func(s *Spec) { s.Path = "/usr/local/bin/unbounded-controller" },
	} {
		o := s
		change(&o)
		c, err := Build(o)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if digest(t, c) == digest(t, a) {
			t.Errorf("another %s, same digest %v", name, digest(t, a))
		}
	}
}

// files reads the image's one layer: name -> header and contents.
func files(t *testing.T, img v1.Image) (map[string]*tar.Header, map[string][]byte) {
	t.Helper()
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers: %d, %v; want one", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	hs, data := map[string]*tar.Header{}, map[string][]byte{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		hs[h.Name], data[h.Name] = h, b
	}
	return hs, data
}

func TestTheImageRunsTheBinaryAsNonRootWithCACertificates(t *testing.T) {
	s := spec(t)
	img, err := Build(s)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.Config.User != "65532:65532" {
		t.Errorf("user %q, want 65532:65532 (non-root)", cf.Config.User)
	}
	if len(cf.Config.Entrypoint) != 1 || cf.Config.Entrypoint[0] != "/unbounded-controller" {
		t.Errorf("entrypoint %q", cf.Config.Entrypoint)
	}
	if cf.OS != "linux" || cf.Architecture != runtime.GOARCH || !cf.Created.Time.Equal(s.Created) {
		t.Errorf("os %s arch %s created %v", cf.OS, cf.Architecture, cf.Created)
	}
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	if m.MediaType != "application/vnd.oci.image.manifest.v1+json" || m.Annotations["org.opencontainers.image.version"] != "1.2.3" {
		t.Errorf("manifest %s, annotations %v", m.MediaType, m.Annotations)
	}

	hs, data := files(t, img)
	bin, _ := os.ReadFile(s.Binary)
	if h := hs["unbounded-controller"]; h == nil || h.Mode != 0o755 || h.Uid != 0 || !bytes.Equal(data["unbounded-controller"], bin) {
		t.Errorf("the executable in the image: %+v", h)
	}
	for name, h := range hs {
		if !h.ModTime.Equal(s.Created) {
			t.Errorf("%s: time %v, want %v", name, h.ModTime, s.Created)
		}
		if h.Uid != 0 && name != "home/nonroot/" {
			t.Errorf("%s owned by %d", name, h.Uid)
		}
	}
	if !strings.Contains(string(data["etc/passwd"]), "nonroot:x:65532:65532:") {
		t.Errorf("/etc/passwd has no nonroot user:\n%s", data["etc/passwd"])
	}
	if h := hs["tmp/"]; h == nil || h.Mode != 0o1777 {
		t.Errorf("tmp/: %+v", h)
	}
	pool, n := x509.NewCertPool(), 0
	for rest := data["etc/ssl/certs/ca-certificates.crt"]; ; n++ {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			break
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			t.Fatalf("CA bundle, certificate %d: %v", n, err)
		}
		if !c.IsCA {
			t.Errorf("CA bundle holds %s, not a CA", c.Subject)
		}
		pool.AddCert(c)
	}
	if n < 100 {
		t.Errorf("CA bundle holds %d certificates, want Mozilla's (over 100)", n)
	}
}

func TestBadInputIsRefused(t *testing.T) {
	good := spec(t)
	dynamic := "/bin/true" // Debian's coreutils: dynamically linked
	for name, change := range map[string]func(*Spec){
		"dynamic binary":  func(s *Spec) { s.Binary = dynamic },
		"not an ELF":      func(s *Spec) { s.Binary = "/etc/os-release" },
		"missing binary":  func(s *Spec) { s.Binary = filepath.Join(t.TempDir(), "none") },
		"relative path":   func(s *Spec) { s.Path = "unbounded-controller" },
		"directory path":  func(s *Spec) { s.Path = "/bin/" },
		"no version":      func(s *Spec) { s.Version = "" },
		"no architecture": func(s *Spec) { s.Arch = "" },
	} {
		s := good
		change(&s)
		if _, err := Build(s); err == nil {
			t.Errorf("%s: built", name)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
}

func TestArchiveIsAnOCILayoutNamingTheImage(t *testing.T) {
	img, err := Build(spec(t))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "img.oci.tar")
	d, err := WriteArchive(path, img, "1.2.3")
	if err != nil {
		t.Fatal(err)
	}
	if d != digest(t, img) {
		t.Errorf("WriteArchive said %v, the image is %v", d, digest(t, img))
	}
	first, _ := os.ReadFile(path)
	if _, err := WriteArchive(path, img, "1.2.3"); err != nil {
		t.Fatal(err)
	}
	if second, _ := os.ReadFile(path); !bytes.Equal(first, second) {
		t.Error("the archive of one image differs between two writes")
	}
	// Unpacked, it is a layout whose index names the image by ref.
	un := filepath.Join(dir, "un")
	tr := tar.NewReader(bytes.NewReader(first))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(un, h.Name)
		if h.Typeflag == tar.TypeDir {
			os.MkdirAll(p, 0o755)
			continue
		}
		b, _ := io.ReadAll(tr)
		os.WriteFile(p, b, 0o644)
	}
	lp, err := layout.FromPath(un)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := lp.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 || im.Manifests[0].Digest != d || im.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != "1.2.3" {
		t.Fatalf("index: %+v", im.Manifests)
	}
	back, err := lp.Image(d)
	if err != nil {
		t.Fatal(err)
	}
	if digest(t, back) != d {
		t.Errorf("read back %v", digest(t, back))
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 2 {
		t.Errorf("left in the directory: %v (want the archive and the unpacked copy)", entries)
	}
}
