package config

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"unbounded-cloud.io/agent/lib/exitcode"
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
		{`ip = "node-1"`, "node.ip", "must be an IP address"},
		{`ip = "127.0.0.1"`, "node.ip", "loopback"},
		{`ip = "fe80::1"`, "node.ip", "link-local"},
		{`ip = "192.0.2.10,198.51.100.1"`, "node.ip", "one IPv4 and one IPv6"},
		{`ip = "192.0.2.10,2001:db8::1,2001:db8::2"`, "node.ip", "at most two"},
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

// node.ip: one address, or one of each family; a problem found once the
// host is looked at (KeyError) is located like a load's own.
func TestNodeIPIsOneAddressOrOneOfEachFamilyAndKeyErrorsNameItsLine(t *testing.T) {
	for in, want := range map[string]string{
		"":                        "",
		"192.0.2.10":              "[192.0.2.10]",
		" 2001:db8::10 ":          "[2001:db8::10]",
		"192.0.2.10,2001:db8::10": "[192.0.2.10 2001:db8::10]",
		"::ffff:192.0.2.10":       "[192.0.2.10]",
	} {
		ips, err := ParseNodeIPs(in)
		got := ""
		if len(ips) > 0 {
			got = fmt.Sprint(ips)
		}
		if err != nil || got != want {
			t.Errorf("ParseNodeIPs(%q) = %v, %v; want %s", in, ips, err, want)
		}
	}

	h := newHost(t)
	h.edit("/etc/unbounded/agent.toml", "[artifacts]", "ip = \"192.0.2.10\"\n\n[artifacts]")
	cfg, errs := h.load()
	if errs != nil {
		t.Fatal(errs)
	}
	err := cfg.KeyError("node.ip", "%s is not an address of this host", cfg.Node.IP)
	var e *Error
	if !errors.As(err, &e) || e.Key != "node.ip" || e.Line == 0 || !strings.HasSuffix(e.File, "agent.toml") || !errors.Is(err, exitcode.ErrConfigInvalid) {
		t.Errorf("KeyError of a set key: %#v (%v); want it located, exit 78", e, err)
	}
	// A key at its default: the main file, no line, and it says so.
	h = newHost(t)
	cfg, _ = h.load()
	if err := cfg.KeyError("node.ip", "no address"); !strings.Contains(err.Error(), "the default value; set node.ip") {
		t.Errorf("KeyError of a default: %v", err)
	}
}

// [devices]: discovery on by default, nothing allowed or denied by name;
// a path that is not a device path under /dev, or one both allowed and
// denied, is an error at its line.
func TestDevicesKeysHaveDefaultsAndRejectBadPaths(t *testing.T) {
	h := newHost(t)
	cfg, errs := h.load()
	if errs != nil {
		t.Fatal(errs)
	}
	if !cfg.Devices.Auto || len(cfg.Devices.Allow) != 0 || len(cfg.Devices.Deny) != 0 || cfg.Devices.RDMAModules {
		t.Errorf("defaults: %+v", cfg.Devices)
	}
	for _, tc := range []struct{ body, key, msg string }{
		{`allow = ["kvm"]`, "devices.allow", "under /dev"},
		{`allow = ["/dev/../etc/passwd"]`, "devices.allow", "under /dev"},
		{`deny = ["/sys/class/block/sda"]`, "devices.deny", "under /dev"},
		{"allow = [\"/dev/sdb\"]\ndeny = [\"/dev/sdb\"]", "devices.allow", "in devices.deny too"},
		{`auto = "yes"`, "devices.auto", ""},
	} {
		t.Run(tc.body, func(t *testing.T) {
			h := newHost(t)
			h.edit("/etc/unbounded/agent.toml", `uid = ""`, "uid = \"\"\n[devices]\n"+tc.body)
			_, errs := h.load()
			if len(errs) != 1 || errs[0].Key != tc.key || errs[0].Line == 0 || !strings.Contains(errs[0].Msg, tc.msg) {
				t.Fatalf("want one error at %s with a line, saying %q; got %v", tc.key, tc.msg, errs)
			}
		})
	}
}
