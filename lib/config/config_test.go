package config

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"unbounded-cloud.io/agent/lib/exitcode"
	"unbounded-cloud.io/agent/lib/hostpaths"
)

// testToken is the token the fixtures write; tests assert it never leaks.
const testToken = "abcdef.0123456789abcdef"

const validConfig = `machine = "site-w1"
mode = "nspawn"

[cluster]
api-server = "https://127.0.0.1:1"
ca-file = "/etc/unbounded/ca.crt"
bootstrap-token-file = "/etc/unbounded/bootstrap-token"
kubernetes-version = "1.36.3"
cluster-dns = "10.96.0.10"

[node]
labels = { "topology.kubernetes.io/zone" = "edge-1" }
taints = ["dedicated=gpu:NoSchedule"]

[artifacts]
base-url = "https://artifacts.example.internal"

[allocation]
uid = ""
`

// caPEM is one self-signed CA certificate, made once per test binary.
var caPEM = func() []byte {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		panic(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "test-ca"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		panic(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}()

// host is a temporary root with a valid configuration.
type host struct {
	t    *testing.T
	root string
	p    hostpaths.Paths
}

func newHost(t *testing.T) *host {
	t.Helper()
	h := &host{t: t, root: t.TempDir()}
	h.p = hostpaths.New(h.root)
	h.write("/etc/unbounded/agent.toml", validConfig, 0o644)
	h.write("/etc/unbounded/ca.crt", string(caPEM), 0o644)
	h.write("/etc/unbounded/bootstrap-token", testToken+"\n", 0o600)
	return h
}

func (h *host) path(hostPath string) string { return h.p.Join(hostPath) }

func (h *host) write(hostPath, content string, perm os.FileMode) {
	h.t.Helper()
	f := h.path(hostPath)
	if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
		h.t.Fatal(err)
	}
	if err := os.WriteFile(f, []byte(content), perm); err != nil {
		h.t.Fatal(err)
	}
	if err := os.Chmod(f, perm); err != nil { // umask must not weaken the test
		h.t.Fatal(err)
	}
}

// edit replaces old by new in a host file, failing when old is absent.
func (h *host) edit(hostPath, old, new string) {
	h.t.Helper()
	data, err := os.ReadFile(h.path(hostPath))
	if err != nil {
		h.t.Fatal(err)
	}
	if !strings.Contains(string(data), old) {
		h.t.Fatalf("%s does not contain %q", hostPath, old)
	}
	fi, _ := os.Stat(h.path(hostPath))
	h.write(hostPath, strings.Replace(string(data), old, new, 1), fi.Mode().Perm())
}

// snapshot lists every file under the root with its type, mode, size,
// modification time and content hash: loading must leave all of it alone.
func snapshot(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		entry := fmt.Sprintf("%v %d %d", fi.Mode(), fi.Size(), fi.ModTime().UnixNano())
		if fi.Mode().IsRegular() {
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			sum := sha256.Sum256(data)
			entry += " " + hex.EncodeToString(sum[:])
		}
		out[p] = entry
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// load loads the host's config and checks that nothing changed under the
// root and that the token never appears in an error.
func (h *host) load() (*Config, Errors) {
	h.t.Helper()
	before := snapshot(h.t, h.root)
	cfg, err := Load(h.p)
	after := snapshot(h.t, h.root)
	if !reflect.DeepEqual(before, after) {
		h.t.Errorf("loading changed the host:\nbefore %v\nafter  %v", before, after)
	}
	if err == nil {
		return cfg, nil
	}
	if strings.Contains(err.Error(), testToken) || strings.Contains(err.Error(), "0123456789abcdef") {
		h.t.Errorf("error leaks the bootstrap token: %v", err)
	}
	if !errors.Is(err, exitcode.ErrConfigInvalid) {
		h.t.Errorf("error %v does not match exitcode.ErrConfigInvalid", err)
	}
	es := AsErrors(err)
	if es == nil {
		h.t.Fatalf("error is not config.Errors: %T %v", err, err)
	}
	for _, e := range es {
		if e.File == "" {
			h.t.Errorf("error without a file: %v", e)
		}
	}
	return nil, es
}

func TestLoadAcceptsTheArchitectureExampleAndFillsDefaults(t *testing.T) {
	h := newHost(t)
	cfg, errs := h.load()
	if errs != nil {
		t.Fatalf("valid config rejected:\n%v", errs)
	}
	if cfg.Machine != "site-w1" || cfg.Mode != "nspawn" || cfg.Cluster.APIServer != "https://127.0.0.1:1" {
		t.Errorf("values not loaded: %+v", cfg)
	}
	if got := cfg.Node.Labels["topology.kubernetes.io/zone"]; got != "edge-1" {
		t.Errorf("label = %q", got)
	}
	// Defaults come from reference.toml.
	if cfg.Fence.RetryBudget.D() != 2*time.Minute {
		t.Errorf("fence.retry-budget default = %v, want 2m", cfg.Fence.RetryBudget.D())
	}
	if cfg.Node.ShutdownGracePeriod.D() != 30*time.Second || cfg.Node.ShutdownGracePeriodCriticalPods.D() != 10*time.Second {
		t.Errorf("node.shutdown-grace-period defaults = %v, %v; want 30s, 10s", cfg.Node.ShutdownGracePeriod.D(), cfg.Node.ShutdownGracePeriodCriticalPods.D())
	}
	if cfg.Daemon.LogLevel != "info" {
		t.Errorf("daemon.log-level default = %q", cfg.Daemon.LogLevel)
	}
	if want := hostpaths.New("").OfflineDir(); cfg.Artifacts.OfflineDir != want {
		t.Errorf("artifacts.offline-dir default = %q, want hostpaths' %q", cfg.Artifacts.OfflineDir, want)
	}
	if cfg.Resolve(cfg.Cluster.CAFile) != h.path("/etc/unbounded/ca.crt") {
		t.Errorf("Resolve does not resolve under the root: %s", cfg.Resolve(cfg.Cluster.CAFile))
	}
	if !reflect.DeepEqual(cfg.Files, []string{h.path("/etc/unbounded/agent.toml")}) {
		t.Errorf("Files = %v", cfg.Files)
	}
}

// An image's config (LoadImage, `unbounded prepare`) leaves the machine's
// name and the bootstrap token to each host; a host's config may not, and
// the image's other keys are checked as a host's.
func TestLoadImageLeavesTheMachineAndTheTokenToEachHost(t *testing.T) {
	h := newHost(t)
	h.edit("/etc/unbounded/agent.toml", `machine = "site-w1"`, ``)
	os.Remove(h.path("/etc/unbounded/bootstrap-token"))
	if _, err := LoadImage(h.p); err != nil {
		t.Fatalf("an image's config without machine and token: %v", err)
	}
	_, errs := h.load()
	var keys []string
	for _, e := range errs {
		keys = append(keys, e.Key)
	}
	if !slices.Contains(keys, "machine") || !slices.Contains(keys, "cluster.bootstrap-token-file") {
		t.Errorf("a host's config without machine and token: errors on %v, want machine and cluster.bootstrap-token-file", keys)
	}
	h.edit("/etc/unbounded/agent.toml", `mode = "nspawn"`, `mode = "vm"`)
	if _, err := LoadImage(h.p); err == nil || !strings.Contains(err.Error(), "mode") {
		t.Errorf("an image's bad mode: %v", err)
	}
}

func TestMetricsAddressTakesIPLiteralsAndPorts(t *testing.T) {
	for a, want := range map[string]bool{
		"127.0.0.1:9464": true, ":9464": true, "[::1]:9464": true, "0.0.0.0:65535": true,
		"localhost:9464": false, "127.0.0.1": false, ":0": false, ":65536": false, "[fe80::1%eth0]:9464": false,
		"127.0.0.1:http": false, "": false,
	} {
		if got := validListenAddress(a); got != want {
			t.Errorf("validListenAddress(%q) = %v, want %v", a, got, want)
		}
	}
}
