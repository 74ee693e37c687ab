package config

import (
	"strings"
	"testing"
)

// The node-stack keys added for first boot: defaults, and a bad value named
// by file, line and key.
func TestNodeStackKeysHaveDefaultsAndRejectBadValues(t *testing.T) {
	h := newHost(t)
	cfg, errs := h.load()
	if errs != nil {
		t.Fatal(errs)
	}
	if cfg.Node.SandboxImage != "registry.k8s.io/pause:3.10" || cfg.Node.PodCIDR != "" || cfg.Nspawn.Image != "" || cfg.Node.ServingCert != "cluster" {
		t.Errorf("defaults: sandbox-image %q pod-cidr %q nspawn.image %q", cfg.Node.SandboxImage, cfg.Node.PodCIDR, cfg.Nspawn.Image)
	}

	for _, tc := range []struct{ line, key, msg string }{
		{`pod-cidr = "10.244.1.7/24"`, "node.pod-cidr", "CIDR"},
		{`pod-cidr = "ten"`, "node.pod-cidr", "CIDR"},
		{`sandbox-image = "Pause Image"`, "node.sandbox-image", "image reference"},
		{`serving-cert = "none"`, "node.serving-cert", "one of cluster, self-signed"},
		{"[nspawn]\nimage = \"oci-layout:relative/dir\"", "nspawn.image", "absolute"},
		{"[nspawn]\nimage = \"no spaces:allowed\"", "nspawn.image", "image reference"},
	} {
		t.Run(tc.key, func(t *testing.T) {
			h := newHost(t)
			if strings.HasPrefix(tc.line, "[nspawn]") {
				h.edit("/etc/unbounded/agent.toml", `uid = ""`, "uid = \"\"\n"+tc.line)
			} else { // a [node] key: the example's [node] ends before [artifacts]
				h.edit("/etc/unbounded/agent.toml", "[artifacts]", tc.line+"\n\n[artifacts]")
			}
			_, errs := h.load()
			if len(errs) != 1 || errs[0].Key != tc.key || errs[0].Line == 0 || !strings.Contains(errs[0].Msg, tc.msg) {
				t.Fatalf("want one error at %s with a line, saying %q; got %v", tc.key, tc.msg, errs)
			}
		})
	}

	h = newHost(t)
	h.edit("/etc/unbounded/agent.toml", `uid = ""`, "uid = \"\"\n[nspawn]\nimage = \"127.0.0.1:5000/unbounded/node:1.36.3@sha256:"+strings.Repeat("a", 64)+"\"")
	if cfg, errs := h.load(); errs != nil || !strings.HasPrefix(cfg.Nspawn.Image, "127.0.0.1:5000/") {
		t.Fatalf("a registry reference with a port and a digest is refused: %v", errs)
	}
}
