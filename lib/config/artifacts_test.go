package config

import (
	"slices"
	"strings"
	"testing"
)

const testSum = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func TestArtifactKeysDefaultToDebianBookwormAndTheUpstreamLayout(t *testing.T) {
	h := newHost(t)
	cfg, errs := h.load()
	if errs != nil {
		t.Fatalf("valid config rejected:\n%v", errs)
	}
	// The versions Debian 12 packages (apt-cache policy containerd runc
	// containernetworking-plugins): the test node stack is built from them.
	for name, want := range map[string]string{"kubelet": "1.36.3", "containerd": "1.6.20", "runc": "1.1.5", "cni-plugins": "1.1.1", "crictl": "", "coredns": "1.15.0"} {
		if got := cfg.ArtifactVersion(name); got != want {
			t.Errorf("%s version = %q, want %q", name, got, want)
		}
	}
	if got := cfg.ArtifactsWanted(); !slices.Equal(got, []string{"kubelet", "containerd", "runc", "cni-plugins", "coredns"}) {
		t.Errorf("wanted = %v: crictl is fetched only with a version, coredns with node.local-dns (on by default)", got)
	}
	cfg.Node.LocalDNS = false
	if got := cfg.ArtifactsWanted(); slices.Contains(got, "coredns") {
		t.Errorf("wanted = %v with node.local-dns = false: coredns is fetched only for the cache", got)
	}
	if cfg.Artifacts.ChecksumsFile != "SHA256SUMS" {
		t.Errorf("checksums-file = %q", cfg.Artifacts.ChecksumsFile)
	}
	for name, want := range map[string]string{
		"kubelet":     "kubelet/v1.36.3/linux-amd64/kubelet",
		"containerd":  "containerd/v1.6.20/containerd-1.6.20-linux-amd64.tar.gz",
		"runc":        "runc/v1.1.5/runc.amd64",
		"cni-plugins": "cni-plugins/v1.1.1/cni-plugins-linux-amd64-v1.1.1.tgz",
		// CoreDNS's own release file name.
		"coredns": "coredns/v1.15.0/coredns_1.15.0_linux_amd64.tgz",
	} {
		if got := ExpandArtifactURL(cfg.ArtifactURLTemplate(name), name, cfg.ArtifactVersion(name), "amd64"); got != want {
			t.Errorf("%s expands to %q, want %q", name, got, want)
		}
	}
}

func TestArtifactPathDropinKeepsTheOtherPaths(t *testing.T) {
	h := newHost(t)
	h.write(dropinDir+"/10-urls.toml", "[artifacts]\nrunc-path = \"bin/{name}-{version}\"\n", 0o644)
	cfg, errs := h.load()
	if errs != nil {
		t.Fatalf("valid drop-in rejected:\n%v", errs)
	}
	if cfg.Artifacts.RuncPath != "bin/{name}-{version}" || !strings.HasPrefix(cfg.Artifacts.KubeletPath, "kubelet/") {
		t.Errorf("paths after a drop-in setting one: %+v", cfg.Artifacts)
	}
}

func TestArtifactKeysReportFileLineAndKey(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(h *host)
		want  want
	}{
		{"version not a version", func(h *host) {
			h.edit(mainFile, "base-url = \"https://artifacts.example.internal\"\n", "base-url = \"https://artifacts.example.internal\"\ncontainerd-version = \"latest\"\n")
		}, want{mainFile, 17, "artifacts.containerd-version", `MAJOR.MINOR.PATCH such as "1.6.20", got "latest"`}},
		{"crictl version invalid once set", func(h *host) {
			h.edit(mainFile, "base-url = \"https://artifacts.example.internal\"\n", "base-url = \"https://artifacts.example.internal\"\ncrictl-version = \"1.28\"\n")
		}, want{mainFile, 17, "artifacts.crictl-version", `got "1.28"`}},
		{"unknown placeholder", func(h *host) {
			h.edit(mainFile, "base-url = \"https://artifacts.example.internal\"\n", "base-url = \"https://artifacts.example.internal\"\nkubelet-path = \"k/{os}/kubelet\"\n")
		}, want{mainFile, 17, "artifacts.kubelet-path", "unknown placeholder {os}"}},
		{"template is a whole URL", func(h *host) {
			h.edit(mainFile, "base-url = \"https://artifacts.example.internal\"\n", "base-url = \"https://artifacts.example.internal\"\nrunc-path = \"https://x.example/runc\"\n")
		}, want{mainFile, 17, "artifacts.runc-path", "artifacts.overrides.<name>.url"}},
		{"template leaves offline-dir", func(h *host) {
			h.edit(mainFile, "base-url = \"https://artifacts.example.internal\"\n", "base-url = \"https://artifacts.example.internal\"\nrunc-path = \"../runc\"\n")
		}, want{mainFile, 17, "artifacts.runc-path", "no .."}},
		{"template absolute", func(h *host) {
			h.edit(mainFile, "base-url = \"https://artifacts.example.internal\"\n", "base-url = \"https://artifacts.example.internal\"\nrunc-path = \"/runc\"\n")
		}, want{mainFile, 17, "artifacts.runc-path", "not start with /"}},
		{"template names a directory", func(h *host) {
			h.edit(mainFile, "base-url = \"https://artifacts.example.internal\"\n", "base-url = \"https://artifacts.example.internal\"\nrunc-path = \"runc/{version}/\"\n")
		}, want{mainFile, 17, "artifacts.runc-path", "must name a file"}},
		{"template unbalanced brace", func(h *host) {
			h.edit(mainFile, "base-url = \"https://artifacts.example.internal\"\n", "base-url = \"https://artifacts.example.internal\"\nrunc-path = \"runc/{version\"\n")
		}, want{mainFile, 17, "artifacts.runc-path", "unbalanced brace"}},
		{"pinned checksum of an unknown artifact", func(h *host) {
			h.edit(mainFile, "[allocation]", "[artifacts.checksums]\nkublet = \""+testSum+"\"\n[allocation]")
		}, want{mainFile, 19, "artifacts.checksums.kublet", `unknown artifact "kublet"`}},
		{"pinned checksum not hex", func(h *host) {
			h.edit(mainFile, "[allocation]", "[artifacts.checksums]\nrunc = \"sha256:abc\"\n[allocation]")
		}, want{mainFile, 19, "artifacts.checksums.runc", "64 hex digits"}},
		{"override of an unknown artifact", func(h *host) {
			h.edit(mainFile, "[allocation]", "[artifacts.overrides.kublet]\nurl = \"https://m.example/k\"\nsha256 = \""+testSum+"\"\n[allocation]")
		}, want{mainFile, 18, "artifacts.overrides.kublet", `unknown artifact "kublet"`}},
		{"checksums-file leaves the mirror", func(h *host) {
			h.edit(mainFile, "base-url = \"https://artifacts.example.internal\"\n", "base-url = \"https://artifacts.example.internal\"\nchecksums-file = \"../SUMS\"\n")
		}, want{mainFile, 17, "artifacts.checksums-file", "no .."}},
		{"no sums file and an artifact not pinned", func(h *host) {
			h.edit(mainFile, "base-url = \"https://artifacts.example.internal\"\n", "base-url = \"https://artifacts.example.internal\"\nchecksums-file = \"\"\n")
			h.edit(mainFile, "[allocation]", "[artifacts.checksums]\nkubelet = \""+testSum+"\"\ncontainerd = \""+testSum+"\"\ncni-plugins = \""+testSum+"\"\n[allocation]")
		}, want{mainFile, 19, "artifacts.checksums.runc", "every artifact needs a pinned SHA-256"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHost(t)
			tc.setup(h)
			_, errs := h.load()
			if errs == nil {
				t.Fatal("invalid config accepted")
			}
			w := tc.want
			for _, e := range errs {
				if e.File == h.path(w.file) && e.Line == w.line && e.Key == w.key && strings.Contains(e.Msg, w.msg) {
					return
				}
			}
			t.Errorf("no error %+v among:\n%v", w, errs)
		})
	}
}

func TestArtifactsPinnedOnlyConfigIsAcceptedWhenEveryArtifactIsPinned(t *testing.T) {
	h := newHost(t)
	h.write(dropinDir+"/10-pins.toml", "[artifacts]\nchecksums-file = \"\"\ncrictl-version = \"1.28.0\"\n[artifacts.checksums]\nkubelet = \""+testSum+"\"\ncontainerd = \""+testSum+
		"\"\nrunc = \""+testSum+"\"\ncrictl = \""+testSum+"\"\ncoredns = \""+testSum+"\"\n[artifacts.overrides.cni-plugins]\nurl = \"https://m.example/cni.tgz\"\nsha256 = \""+testSum+"\"\n", 0o644)
	cfg, errs := h.load()
	if errs != nil {
		t.Fatalf("every artifact pinned (one by its override), yet rejected:\n%v", errs)
	}
	if !slices.Contains(cfg.ArtifactsWanted(), "crictl") {
		t.Errorf("crictl-version set but crictl not wanted: %v", cfg.ArtifactsWanted())
	}
}

func TestCoreDNSVersionIsNeededOnlyForTheLocalDNSCache(t *testing.T) {
	h := newHost(t)
	h.write(dropinDir+"/10-dns.toml", "[node]\nlocal-dns = false\n[artifacts]\ncoredns-version = \"\"\n", 0o644)
	if _, errs := h.load(); errs != nil {
		t.Fatalf("no cache, no CoreDNS version: rejected:\n%v", errs)
	}
	h.write(dropinDir+"/10-dns.toml", "[node]\nlocal-dns = true\n[artifacts]\ncoredns-version = \"\"\n", 0o644)
	_, errs := h.load()
	found := false
	for _, e := range errs {
		found = found || e.Key == "artifacts.coredns-version" && e.Line == 4 && strings.HasSuffix(e.File, "10-dns.toml")
	}
	if !found {
		t.Errorf("the cache on and no CoreDNS version: want an error at 10-dns.toml:4 naming artifacts.coredns-version, got:\n%v", errs)
	}
}
