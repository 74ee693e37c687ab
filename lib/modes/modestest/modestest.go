// Package modestest holds what the tests of the isolation modes share: a
// node configuration, artifact files of the right shape, and a recorder
// of the service manager calls a mode makes. Tests only.
package modestest

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"unbounded-cloud.io/agent/lib/config"
	"unbounded-cloud.io/agent/lib/modes"
	"unbounded-cloud.io/agent/lib/units/unitstest"
)

// Token is the bootstrap token of Node; tests assert it never leaks.
const Token = "abcdef.0123456789abcdef"

// Node is a complete node configuration.
func Node() modes.Node {
	return modes.Node{
		Name:              "site-w1",
		APIServer:         "https://127.0.0.1:1",
		CACert:            []byte("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"),
		BootstrapToken:    config.NewSecret(Token),
		KubernetesVersion: "1.36.3",
		ClusterDNS:        "10.96.0.10",
		Labels:            map[string]string{"topology.kubernetes.io/zone": "edge-1", "a.example/x": "1"},
		Taints:            []string{"dedicated=gpu:NoSchedule"},
		SandboxImage:      "registry.k8s.io/pause:3.10",
		PodCIDR:           "10.244.1.0/24",
		IPs:               []netip.Addr{netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("2001:db8::10")},
		// On, as node.local-dns is by default.
		LocalDNS: true,
		// node.shutdown-grace-period's defaults.
		ShutdownGracePeriod:             30 * time.Second,
		ShutdownGracePeriodCriticalPods: 10 * time.Second,
	}
}

func tgz(t testing.TB, dir, name string, files []string) string {
	t.Helper()
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for _, f := range files {
		body := []byte("#!/bin/sh\n# " + f + "\n")
		if err := tw.WriteHeader(&tar.Header{Name: f, Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(body))}); err != nil {
			t.Fatal(err)
		}
		tw.Write(body)
	}
	tw.Close()
	gz.Close()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// Artifacts writes artifact files in the layout lib/artifacts delivers
// (executables and upstream-style archives) with stand-in contents.
func Artifacts(t testing.TB) modes.Artifacts {
	t.Helper()
	dir := t.TempDir()
	exe := func(name string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("#!/bin/sh\n# "+name+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	return modes.Artifacts{
		Kubelet:    exe("kubelet"),
		Runc:       exe("runc.amd64"),
		Containerd: tgz(t, dir, "containerd.tar.gz", []string{"bin/containerd", "bin/containerd-shim-runc-v2", "bin/ctr"}),
		CNIPlugins: tgz(t, dir, "cni-plugins.tgz", []string{"./bridge", "./host-local", "./loopback", "./portmap", "./LICENSE"}),
		// CoreDNS's release archive holds the one executable.
		CoreDNS: tgz(t, dir, "coredns.tgz", []string{"coredns"}),
	}
}

// Systemd is the service manager of the mode tests: lib/units/unitstest's
// Fake (unit states that jobs change, a log of the calls), as the modes'
// Systemd field takes it.
type Systemd struct{ unitstest.Fake }

// Dial returns s as the mode's connection.
func (s *Systemd) Dial(context.Context) (modes.Systemd, error) { return s, nil }
