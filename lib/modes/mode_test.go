package modes_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"unbounded-cloud.io/agent/lib/config"
	"unbounded-cloud.io/agent/lib/exitcode"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/modes"
	"unbounded-cloud.io/agent/lib/modes/modestest"
	"unbounded-cloud.io/agent/tests/fixtures"
)

const agentTOML = `machine = "site-w1"
mode = "nspawn"

[cluster]
api-server = "https://127.0.0.1:1"
kubernetes-version = "1.36.3"

[node]
labels = { "topology.kubernetes.io/zone" = "edge-1" }
pod-cidr = "10.244.1.0/24"

[nspawn]
image = "registry.example.internal/unbounded/node:1.36.3"
`

func write(t *testing.T, p string, data string, mode os.FileMode) {
	t.Helper()
	os.MkdirAll(filepath.Dir(p), 0o755)
	if err := os.WriteFile(p, []byte(data), mode); err != nil {
		t.Fatal(err)
	}
	os.Chmod(p, mode)
}

func TestSlotFromConfigCarriesTheConfigAndTheArtifacts(t *testing.T) {
	p := hostpaths.New(t.TempDir())
	write(t, p.ConfigFile(), agentTOML, 0o644)
	// A CA file must hold certificates; the config check parses it.
	ca := fixtures.CA(t)
	write(t, p.Join("/etc/unbounded/ca.crt"), string(ca), 0o644)
	write(t, p.Join("/etc/unbounded/bootstrap-token"), modestest.Token+"\n", 0o600)
	cfg, err := config.Load(p)
	if err != nil {
		t.Fatal(err)
	}
	a := modestest.Artifacts(t)
	s, err := modes.SlotFromConfig(cfg, "kube2", a)
	if err != nil {
		t.Fatal(err)
	}
	n := s.Node
	if s.Name != "kube2" || n.Name != "site-w1" || n.APIServer != "https://127.0.0.1:1" || !bytes.Equal(n.CACert, ca) ||
		n.BootstrapToken.Reveal() != modestest.Token || n.KubernetesVersion != "1.36.3" || n.ClusterDNS != "10.96.0.10" ||
		n.Labels["topology.kubernetes.io/zone"] != "edge-1" || n.SandboxImage != "registry.k8s.io/pause:3.10" || n.PodCIDR != "10.244.1.0/24" {
		t.Errorf("node: %+v", n)
	}
	if s.Image.Ref != "registry.example.internal/unbounded/node:1.36.3" || s.Image.OfflineDir != p.Join("/var/lib/unbounded/offline") || s.Artifacts != a {
		t.Errorf("image %+v artifacts %+v", s.Image, s.Artifacts)
	}
	if err := s.Check(); err != nil {
		t.Errorf("a slot from a valid config does not pass Check: %v", err)
	}
	// No node.ip: the address of this host's default route, as the
	// kernel says.
	if want, _ := (modes.HostNet{}).NodeIPs(nil); fmt.Sprint(n.IPs) != fmt.Sprint(want) {
		t.Errorf("node IPs %v, want the default route's %v", n.IPs, want)
	}

	// A node.ip that is not this host's: exit 78 at the key's line.
	write(t, p.ConfigDropinDir()+"/50-ip.toml", "[node]\nip = \"2001:db8::dead\"\n", 0o644)
	cfg, err = config.Load(p)
	if err != nil {
		t.Fatal(err)
	}
	_, err = modes.SlotFromConfig(cfg, "kube2", a)
	if err == nil || !errors.Is(err, exitcode.ErrConfigInvalid) || !strings.Contains(err.Error(), "50-ip.toml:2: node.ip: 2001:db8::dead is not an address of this host") {
		t.Errorf("a foreign node.ip: %v; want exit 78 naming the drop-in, line and key", err)
	}
	if strings.Contains(fmt.Sprintf("%+v %#v", s, s), modestest.Token) {
		t.Error("printing the slot prints the token")
	}
	s.Artifacts.Runc = filepath.Join(t.TempDir(), "missing")
	if err := s.Check(); err == nil || !strings.Contains(err.Error(), "artifact runc") {
		t.Errorf("a missing artifact: %v", err)
	}
}

func TestArtifactsByNameNamesAMissingArtifact(t *testing.T) {
	files := map[string]string{"kubelet": "/k", "containerd": "/c.tgz", "runc": "/r", "cni-plugins": "/n.tgz", "crictl": "/x.tgz"}
	a, err := modes.ArtifactsByName(files)
	if err != nil || a != (modes.Artifacts{Kubelet: "/k", Containerd: "/c.tgz", Runc: "/r", CNIPlugins: "/n.tgz"}) {
		t.Fatalf("%+v %v", a, err)
	}
	delete(files, "runc")
	if _, err := modes.ArtifactsByName(files); err == nil || !strings.Contains(err.Error(), "artifact runc") {
		t.Fatalf("missing runc: %v", err)
	}
}

// [devices] reaches the slot; a device allowed by path that this host
// lacks (or that is not a device) is exit 78 at devices.allow's line,
// before anything is built; mode none gets no device rules.
func TestSlotFromConfigCarriesTheDeviceRulesAndRefusesAMissingDevice(t *testing.T) {
	p := hostpaths.New(t.TempDir())
	write(t, p.ConfigFile(), agentTOML, 0o644)
	write(t, p.Join("/etc/unbounded/ca.crt"), string(fixtures.CA(t)), 0o644)
	write(t, p.Join("/etc/unbounded/bootstrap-token"), modestest.Token+"\n", 0o600)
	write(t, p.Join("/dev/not-a-device"), "x", 0o644)
	a := modestest.Artifacts(t)
	write(t, p.ConfigDropinDir()+"/60-devices.toml", "[devices]\nauto = false\ndeny = [\"/dev/fuse\"]\nrdma-modules = true\n", 0o644)
	cfg, err := config.Load(p)
	if err != nil {
		t.Fatal(err)
	}
	s, err := modes.SlotFromConfig(cfg, "kube1", a)
	if err != nil {
		t.Fatal(err)
	}
	if s.Devices.Auto || !slices.Equal(s.Devices.Deny, []string{"/dev/fuse"}) || !s.RDMAModules {
		t.Errorf("slot devices %+v rdma %v", s.Devices, s.RDMAModules)
	}
	for _, dev := range []string{"/dev/missing0", "/dev/not-a-device"} {
		write(t, p.ConfigDropinDir()+"/60-devices.toml", "[devices]\n\nallow = [\""+dev+"\"]\n", 0o644)
		cfg, err := config.Load(p)
		if err != nil {
			t.Fatal(err)
		}
		_, err = modes.SlotFromConfig(cfg, "kube1", a)
		if err == nil || !errors.Is(err, exitcode.ErrConfigInvalid) || !strings.Contains(err.Error(), "60-devices.toml:3: devices.allow: "+dev) {
			t.Errorf("allow %s: %v; want exit 78 naming the drop-in, line 3, the key and the device", dev, err)
		}
		if _, err := modes.Devices(cfg); err == nil {
			t.Errorf("modes.Devices accepts %s", dev)
		}
	}
	write(t, p.ConfigDropinDir()+"/70-none.toml", "mode = \"none\"\n", 0o644)
	cfg, err = config.Load(p)
	if err != nil {
		t.Fatal(err)
	}
	if o, err := modes.Devices(cfg); err != nil || o.Auto || len(o.Allow) != 0 {
		t.Errorf("mode none: %+v %v, want no device rules", o, err)
	}
}

func TestContainerdHasCDIFrom17(t *testing.T) {
	for v, want := range map[string]bool{"1.6.20": false, "v1.7.0": true, "1.7.27": true, "2.0.0": true, "1": false, "": false, "x.y": false} {
		if got := modes.ContainerdHasCDI(v); got != want {
			t.Errorf("ContainerdHasCDI(%q) = %v, want %v", v, got, want)
		}
	}
}
