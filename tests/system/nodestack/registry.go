package nodestack

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/klauspost/compress/zstd"

	"unbounded-cloud.io/agent/tests/tiers"
)

// Registry is a real OCI distribution registry (go-containerregistry's
// pkg/registry, in memory) on 127.0.0.1, plain HTTP.
type Registry struct {
	// Host is 127.0.0.1:PORT, the registry part of image references.
	Host string

	mu      sync.Mutex
	garbage bool
	srv     *http.Server
	// pushed is the manifest digest pushed under each repo:tag.
	pushed map[string]v1.Hash
}

// shared is the test process's shared registry (SharedRegistry).
var shared struct {
	sync.Mutex
	r *Registry
}

// SharedRegistry is one registry for every test of the process that
// needs only the images every host pulls (pushing them once, not per
// test: the node image is 74 MB, held in memory): it lives until the
// process ends. A test that makes its registry misbehave (SetGarbage)
// starts its own.
func SharedRegistry(t testing.TB) *Registry {
	t.Helper()
	shared.Lock()
	defer shared.Unlock()
	if shared.r == nil {
		r, err := startRegistry()
		if err != nil {
			t.Fatalf("nodestack: shared registry: %v", err)
		}
		shared.r = r
	}
	return shared.r
}

// StartRegistry starts an empty registry; it stops when the test ends.
func StartRegistry(t testing.TB) *Registry {
	t.Helper()
	r, err := startRegistry()
	if err != nil {
		t.Fatalf("nodestack: registry: %v", err)
	}
	t.Cleanup(func() { r.srv.Close() })
	return r
}

func startRegistry() (*Registry, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &Registry{Host: ln.Addr().String(), pushed: map[string]v1.Hash{}}
	h := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	r.srv = &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			r.mu.Lock()
			g := r.garbage
			r.mu.Unlock()
			if g {
				// 200 and a body no registry client can parse.
				w.Header().Set("Content-Type", "application/vnd.oci.image.manifest.v1+json")
				w.Write([]byte("<html>this is not a registry</html>\n"))
				return
			}
			h.ServeHTTP(w, req)
		}),
		ReadHeaderTimeout: 10 * time.Second,
	}
	go r.srv.Serve(ln)
	return r, nil
}

// SetGarbage makes every answer a 200 with a body that is not what a
// registry sends (a captive portal, a misconfigured proxy), or undoes it.
func (r *Registry) SetGarbage(on bool) {
	r.mu.Lock()
	r.garbage = on
	r.mu.Unlock()
}

// Push uploads img as Host/repoTag ("node:v1") and returns the reference
// by tag (Host/repoTag).
func (r *Registry) Push(t testing.TB, repoTag string, img v1.Image) string {
	t.Helper()
	ref, err := name.ParseReference(r.Host+"/"+repoTag, name.Insecure)
	if err != nil {
		t.Fatalf("nodestack: %v", err)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatalf("nodestack: push %s: %v", ref, err)
	}
	r.mu.Lock()
	done := r.pushed[repoTag] == d
	r.mu.Unlock()
	if done {
		return ref.String()
	}
	start := time.Now()
	if err := remote.Write(ref, img); err != nil {
		t.Fatalf("nodestack: push %s: %v", ref, err)
	}
	r.mu.Lock()
	r.pushed[repoTag] = d
	r.mu.Unlock()
	t.Logf("nodestack: pushed %s in %v", ref, time.Since(start).Round(time.Millisecond))
	return ref.String()
}

// images are the images built by this process, by what they are built
// from: an image is immutable and computes its digests once, so each is
// built (its layers read, compressed and hashed) once, not per test.
var images struct {
	sync.Mutex
	m map[string]*memoEntry
}

type memoEntry struct {
	sync.Mutex
	img v1.Image
}

// memoImage is the image of key, built by build the first time (a build
// that fails the test leaves it to the next caller).
func memoImage(key string, build func() v1.Image) v1.Image {
	images.Lock()
	if images.m == nil {
		images.m = map[string]*memoEntry{}
	}
	e := images.m[key]
	if e == nil {
		e = &memoEntry{}
		images.m[key] = e
	}
	images.Unlock()
	e.Lock()
	defer e.Unlock()
	if e.img == nil {
		e.img = build()
	}
	return e.img
}

// image is one OCI image of one layer, for linux on this architecture.
func image(t testing.TB, layer v1.Layer, cfg v1.Config) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(mutate.MediaType(mutate.ConfigMediaType(empty.Image, types.OCIConfigJSON), types.OCIManifestSchema1), layer)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", goarch()
	cf.Config = cfg
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// tarEntry is a file of a small in-memory layer.
type tarEntry struct {
	name     string
	mode     int64
	data     []byte
	linkname string // a symlink when set
}

func memLayer(t testing.TB, entries []tarEntry) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: e.mode, Size: int64(len(e.data)), Typeflag: tar.TypeReg, ModTime: time.Unix(0, 0)}
		switch {
		case e.linkname != "":
			h.Typeflag, h.Linkname, h.Size = tar.TypeSymlink, e.linkname, 0
		case e.mode&0o40000 != 0:
			h.Typeflag, h.Mode = tar.TypeDir, e.mode&0o7777
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			tw.Write(e.data)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	data := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil },
		tarball.WithMediaType(types.OCILayer))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// DNSBenchImage is the image of the node-local DNS cache's benchmark:
// ./dnsbench (this package's dnsbench command) built static, its
// entrypoint.
func DNSBenchImage(t testing.TB) v1.Image {
	t.Helper()
	out := filepath.Join(t.TempDir(), "dnsbench")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", out, "unbounded-cloud.io/agent/tests/system/nodestack/dnsbench")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nodestack: build dnsbench: %v\n%s", err, b)
	}
	bin, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return image(t, memLayer(t, []tarEntry{{name: "dnsbench", mode: 0o755, data: bin}}), v1.Config{Entrypoint: []string{"/dnsbench"}})
}

// PauseImage is the pod sandbox image: Kubernetes' own pause.c, static.
func (s *Stage) PauseImage(t testing.TB) v1.Image {
	t.Helper()
	return memoImage("pauseImage "+s.Dir, func() v1.Image { return s.pauseImage(t) })
}

func (s *Stage) pauseImage(t testing.TB) v1.Image {
	t.Helper()
	bin, err := os.ReadFile(filepath.Join(s.Dir, "bin", "pause"))
	if err != nil {
		t.Fatal(err)
	}
	return image(t, memLayer(t, []tarEntry{{name: "pause", mode: 0o755, data: bin}}), v1.Config{Entrypoint: []string{"/pause"}})
}

// BusyboxImage is the test workload image: Debian's busybox-static with
// the applets a test uses linked; by default it sleeps.
func (s *Stage) BusyboxImage(t testing.TB) v1.Image {
	t.Helper()
	return memoImage("busyboxImage "+s.Dir, func() v1.Image { return s.busyboxImage(t) })
}

func (s *Stage) busyboxImage(t testing.TB) v1.Image {
	t.Helper()
	bin, err := os.ReadFile(filepath.Join(s.Dir, "bin", "busybox"))
	if err != nil {
		t.Fatal(err)
	}
	entries := []tarEntry{{name: "bin", mode: 0o40755}, {name: "bin/busybox", mode: 0o755, data: bin}}
	for _, applet := range []string{"sh", "sleep", "cat", "echo", "ls", "wget", "ip", "hostname", "id", "true", "false", "nslookup"} {
		entries = append(entries, tarEntry{name: "bin/" + applet, linkname: "busybox"})
	}
	return image(t, memLayer(t, entries), v1.Config{Cmd: []string{"/bin/sleep", "3600"}, Env: []string{"PATH=/bin"}})
}

// NodeImage is the nspawn node rootfs (UNBOUNDED_TEST_ROOTFS) as a
// one-layer image. The layer (gzip -1 of the tree, without /dev, /proc,
// /sys contents) is built once per rootfs and kept in the stage directory.
func (s *Stage) NodeImage(t testing.TB) v1.Image {
	t.Helper()
	return memoImage("nodeImage "+s.Dir, func() v1.Image { return s.nodeImage(t) })
}

// NodeImageGzip is NodeImage with its root file system's layer
// gzip-compressed, as most registries still serve layers.
func (s *Stage) NodeImageGzip(t testing.TB) v1.Image {
	t.Helper()
	return memoImage("nodeImageGzip "+s.Dir, func() v1.Image {
		layers, err := s.NodeImage(t).Layers()
		if err != nil {
			t.Fatal(err)
		}
		gz, err := tarball.LayerFromOpener(layers[0].Uncompressed, tarball.WithMediaType(types.OCILayer))
		if err != nil {
			t.Fatal(err)
		}
		img, err := mutate.AppendLayers(image(t, gz, v1.Config{Cmd: []string{"/lib/systemd/systemd"}}), layers[1:]...)
		if err != nil {
			t.Fatal(err)
		}
		return img
	})
}

func (s *Stage) nodeImage(t testing.TB) v1.Image {
	t.Helper()
	rootfs := os.Getenv(EnvRootfs)
	if rootfs == "" {
		tiers.Skip(t, tiers.System, "nodestack: %s is not set: export %s=$(tests/system/rootfs.sh)", EnvRootfs, EnvRootfs)
	}
	// The file's name says what it holds: another zstdTar (nodeLayerKind)
	// is another file, never a stale one read for it.
	layerFile := filepath.Join(s.Dir, "images", filepath.Base(rootfs)+"."+nodeLayerKind+".tar.zst")
	if _, err := os.Stat(layerFile); err != nil {
		start := time.Now()
		if err := os.MkdirAll(filepath.Dir(layerFile), 0o755); err != nil {
			t.Fatal(err)
		}
		tmp := layerFile + ".tmp" + randomSuffix()
		if err := zstdTar(rootfs, tmp); err != nil {
			os.Remove(tmp)
			t.Fatalf("nodestack: layer of %s: %v", rootfs, err)
		}
		// The first build in place wins, and the file is never replaced:
		// tests (of this process and others) that built it at the same
		// time read it by path, and two builds differ (tar's pax headers
		// hold access times), so a rename over it changed a layer under
		// a push that had its digest (a cold CI run's parallel tests).
		if err := os.Link(tmp, layerFile); err != nil && !errors.Is(err, fs.ErrExist) {
			os.Remove(tmp)
			t.Fatal(err)
		}
		os.Remove(tmp)
		// The layer of an earlier kind (the whole tree), which no test
		// reads any more.
		os.Remove(filepath.Join(s.Dir, "images", filepath.Base(rootfs)+".tar.zst"))
		t.Logf("nodestack: built the node layer of %s in %v", rootfs, time.Since(start).Round(time.Millisecond))
	}
	l, err := tarball.LayerFromFile(layerFile, tarball.WithMediaType(types.OCILayerZStd))
	if err != nil {
		t.Fatal(err)
	}
	img := image(t, l, v1.Config{Cmd: []string{"/lib/systemd/systemd"}})
	// The second layer: iptables, which the CNI bridge's masquerading and
	// the kubelet use (stage.sh's layers/iptables).
	ipt, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		cmd := exec.Command("tar", "-C", filepath.Join(s.Dir, "layers", "iptables"), "--numeric-owner", "--owner=0", "--group=0", "-cf", "-", ".")
		out, err := cmd.StdoutPipe()
		if err != nil {
			return nil, err
		}
		if err := cmd.Start(); err != nil {
			return nil, err
		}
		return &waitCloser{ReadCloser: out, cmd: cmd}, nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		t.Fatal(err)
	}
	if img, err = mutate.AppendLayers(img, ipt); err != nil {
		t.Fatal(err)
	}
	return img
}

// nodeLayerKind names what zstdTar leaves out of the rootfs (it is part of
// the cached layer's file name).
const nodeLayerKind = "nodocs"

// nodeLayerExcludes are the rootfs's documentation, manual pages,
// translations and info pages, which a node image leaves out as the
// distributions' container images do (Debian's slim images, dpkg's
// path-exclude): nothing in a node reads them, and they were 3,700 of the
// rootfs's 9,400 files and 57 of its 174 MB, written by every slot build
// of the tier (each first boot that is not prepared, each repave and
// isolation change) and hashed with the layer.
var nodeLayerExcludes = []string{"./usr/share/doc/*", "./usr/share/man/*", "./usr/share/locale/*", "./usr/share/info/*"}

// zstdTar writes the tree at rootfs (without the contents of /dev, /proc
// and /sys, nor nodeLayerExcludes) to file as a zstd-compressed tar: the
// node image's layer. It is
// zstd (application/vnd.oci.image.layer.v1.tar+zstd), as images are more
// and more often, rather than gzip: every first boot, repave and isolation
// change of the tier unpacks it, and zstd decompresses this layer in
// about a third of gzip's time (0.3-0.5 s against 1.0-1.4 s here, under
// the tier's load). The gzip path is the unit tiers'
// (lib/modes/bluegreen/tree) and NodeImageGzip's.
func zstdTar(rootfs, file string) error {
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	defer f.Close()
	zw, err := zstd.NewWriter(f, zstd.WithEncoderLevel(zstd.SpeedDefault))
	if err != nil {
		return err
	}
	var stderr bytes.Buffer
	args := []string{"-C", rootfs, "--numeric-owner", "--xattrs", "--exclude=./dev/*", "--exclude=./proc/*", "--exclude=./sys/*"}
	for _, x := range nodeLayerExcludes {
		args = append(args, "--exclude="+x)
	}
	cmd := exec.Command("tar", append(args, "-cf", "-", ".")...)
	cmd.Stdout, cmd.Stderr = zw, &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("tar: %v: %s", err, stderr.String())
	}
	if err := zw.Close(); err != nil {
		return err
	}
	return f.Close()
}

// waitCloser is a command's stdout that reaps the command when closed.
type waitCloser struct {
	io.ReadCloser
	cmd *exec.Cmd
}

func (w *waitCloser) Close() error {
	w.ReadCloser.Close()
	return w.cmd.Wait()
}
