// Package nodestack gives tests a real node stack to bootstrap from, all on
// loopback: an artifact mirror (kubelet, containerd, runc, CNI plugins with
// a SHA256SUMS) served by an HTTP server a test can break, a real OCI
// registry (go-containerregistry's), and the images a node needs (the
// nspawn node rootfs, pause, a busybox test image).
//
// Inputs (tests skip, with a "nodestack:" reason, without them; they fail
// instead where the system tier is required, see tests/tiers):
//
//	UNBOUNDED_TEST_NODESTACK  tests/system/nodestack/stage.sh's output: Debian's
//	                          containerd, runc, CNI plugins repacked, pause, busybox
//	UNBOUNDED_TEST_KUBELET    tests/kube/kubelet.sh's output
//	UNBOUNDED_TEST_ROOTFS     tests/system/rootfs.sh's output (NodeImage only)
//
// Use:
//
//	s := nodestack.Require(t)
//	mirror := s.Mirror(t)                  // dir: lib/config's [artifacts.urls] layout + SHA256SUMS
//	srv := nodestack.ServeArtifacts(t, mirror) // srv.URL is base-url
//	srv.SetFault(nodestack.Fault{Status: 500}) // or Garbage, CutAfter, Delay; srv.Close(), srv.Reopen()
//	reg := nodestack.StartRegistry(t)      // reg.Host is 127.0.0.1:PORT (plain HTTP)
//	pause := reg.Push(t, "pause:3.10", s.PauseImage(t))
//	app := reg.Push(t, "busybox:1.35", s.BusyboxImage(t))
//	node := reg.Push(t, "unbounded/node:bookworm", s.NodeImage(t))
//
// A container booted in a network namespace of its own reaches these (and
// the test API server) on its own loopback through Forward: listeners the
// test opens in that namespace at every boot.
//
// The package is for tests only: no shipped binary imports it.
package nodestack

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"testing"

	"unbounded-cloud.io/agent/tests/tiers"
)

// Environment variables the package reads.
const (
	EnvStage   = "UNBOUNDED_TEST_NODESTACK"
	EnvKubelet = "UNBOUNDED_TEST_KUBELET"
	EnvRootfs  = "UNBOUNDED_TEST_ROOTFS"
)

// Stage is what stage.sh staged, plus the kubelet.
type Stage struct {
	// Dir is stage.sh's output directory.
	Dir string
	// Kubelet is the kubelet binary.
	Kubelet string
	// Versions of the artifacts: kubelet, containerd, runc, cni-plugins
	// (without a leading "v"), as lib/config's [artifacts] versions.
	Versions map[string]string
}

// Require returns the staged inputs, or skips the test saying how to get
// them.
func Require(t testing.TB) *Stage {
	t.Helper()
	dir, kubelet := os.Getenv(EnvStage), os.Getenv(EnvKubelet)
	if dir == "" {
		tiers.Skip(t, tiers.System, "nodestack: %s is not set: export %s=$(tests/system/nodestack/stage.sh)", EnvStage, EnvStage)
	}
	if kubelet == "" {
		tiers.Skip(t, tiers.System, "nodestack: %s is not set: export %s=$(tests/kube/kubelet.sh)", EnvKubelet, EnvKubelet)
	}
	if _, err := os.Stat(kubelet); err != nil {
		t.Fatalf("nodestack: %s: %v", EnvKubelet, err)
	}
	data, err := os.ReadFile(filepath.Join(dir, "artifacts", "versions"))
	if err != nil {
		t.Fatalf("nodestack: %s=%s is not a staged directory: %v (run tests/system/nodestack/stage.sh)", EnvStage, dir, err)
	}
	s := &Stage{Dir: dir, Kubelet: kubelet, Versions: map[string]string{}}
	for _, l := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if k, v, ok := strings.Cut(l, "="); ok {
			s.Versions[k] = v
		}
	}
	for _, k := range Artifacts {
		if s.Versions[k] == "" {
			t.Fatalf("nodestack: %s/artifacts/versions names no %s version", dir, k)
		}
	}
	return s
}

// urlTemplates are lib/config's default [artifacts.urls]: each project's
// own release file names, so a mirror built here has the layout a real
// mirror of the upstream releases has.
var urlTemplates = map[string]string{
	"kubelet":     "kubelet/v{version}/linux-{arch}/kubelet",
	"containerd":  "containerd/v{version}/containerd-{version}-linux-{arch}.tar.gz",
	"runc":        "runc/v{version}/runc.{arch}",
	"cni-plugins": "cni-plugins/v{version}/cni-plugins-linux-{arch}-v{version}.tgz",
	"coredns":     "coredns/v{version}/coredns_{version}_linux_{arch}.tgz",
}

// Path is the artifact's path in a mirror (and in an offline directory).
func (s *Stage) Path(artifact string) string {
	r := strings.NewReplacer("{name}", artifact, "{version}", s.Versions[artifact], "{arch}", runtime.GOARCH)
	return r.Replace(urlTemplates[artifact])
}

// source is the staged file of each artifact.
func (s *Stage) source(artifact string) string {
	switch artifact {
	case "kubelet":
		return s.Kubelet
	case "containerd":
		return filepath.Join(s.Dir, "artifacts", "containerd-"+s.Versions[artifact]+".tar.gz")
	case "runc":
		return filepath.Join(s.Dir, "artifacts", "runc-"+s.Versions[artifact])
	case "cni-plugins":
		return filepath.Join(s.Dir, "artifacts", "cni-plugins-"+s.Versions[artifact]+".tgz")
	case "coredns":
		return filepath.Join(s.Dir, "artifacts", "coredns_"+s.Versions[artifact]+"_linux_"+runtime.GOARCH+".tgz")
	}
	panic("nodestack: unknown artifact " + artifact)
}

// Artifacts are the staged artifacts: the node stack's, and CoreDNS for
// the node-local DNS cache (node.local-dns, on by default).
var Artifacts = []string{"kubelet", "containerd", "runc", "cni-plugins", "coredns"}

// Mirror lays the artifacts out in a new directory of the test as a
// mirror (or offline directory) is, with SHA256SUMS (sha256sum's format)
// at its root, and returns it. Files are hard links to the staged ones
// where the file system allows (copies otherwise): a test that corrupts a
// file must replace it, not write into it.
func (s *Stage) Mirror(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	var sums []string
	for _, a := range Artifacts {
		rel := s.Path(a)
		dst := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := linkOrCopy(s.source(a), dst); err != nil {
			t.Fatalf("nodestack: mirror %s: %v", a, err)
		}
		sum, err := FileSHA256(dst)
		if err != nil {
			t.Fatal(err)
		}
		sums = append(sums, sum+"  "+rel)
	}
	sort.Strings(sums)
	if err := os.WriteFile(filepath.Join(dir, "SHA256SUMS"), []byte(strings.Join(sums, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// FileSHA256 is the hex SHA-256 of a file.
func FileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func linkOrCopy(src, dst string) error {
	if err := os.Link(src, dst); err == nil {
		return nil
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	st, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, st.Mode().Perm())
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return fmt.Errorf("%s: %w", dst, err)
	}
	return nil
}

func goarch() string { return runtime.GOARCH }

func randomSuffix() string {
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return hex.EncodeToString(b)
}
