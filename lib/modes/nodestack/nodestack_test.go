package nodestack

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/BurntSushi/toml"
	"sigs.k8s.io/yaml"

	"unbounded-cloud.io/agent/lib/modes"
	"unbounded-cloud.io/agent/lib/modes/modestest"
)

var layout = Layout{
	BinDir: "/usr/local/bin", CNIBinDir: "/opt/cni/bin", CNIConfDir: "/etc/cni/net.d",
	KubeletConfig: "/var/lib/kubelet/config.yaml", BootstrapKubeconfig: "/etc/kubernetes/bootstrap-kubelet.conf",
	Kubeconfig: "/etc/kubernetes/kubelet.conf", CACert: "/etc/kubernetes/pki/ca.crt",
	ContainerdConfig: "/etc/containerd/config.toml", ContainerdRoot: "/var/lib/containerd",
	ContainerdState: "/run/containerd", ResolvConf: "/etc/resolv.conf",
}

func byPath(t *testing.T, files []File) map[string]File {
	t.Helper()
	m := map[string]File{}
	for _, f := range files {
		m[f.Path] = f
	}
	return m
}

func TestFilesConfigureKubeletAndContainerdForTheHostsCgroupHierarchy(t *testing.T) {
	n := modestest.Node()
	for _, tc := range []struct {
		cg            Cgroup
		driver        string
		systemdCgroup bool
		failCgroupV1  any // false on legacy, absent on unified
	}{
		{Legacy, "cgroupfs", false, false},
		{Unified, "systemd", true, nil},
	} {
		t.Run(string(tc.cg), func(t *testing.T) {
			files, err := Files(n, layout, tc.cg)
			if err != nil {
				t.Fatal(err)
			}
			m := byPath(t, files)

			var kc map[string]any
			if err := yaml.Unmarshal(m[layout.KubeletConfig].Data, &kc); err != nil {
				t.Fatal(err)
			}
			if kc["kind"] != "KubeletConfiguration" || kc["cgroupDriver"] != tc.driver || kc["failCgroupV1"] != tc.failCgroupV1 {
				t.Errorf("kubelet config: kind %v cgroupDriver %v failCgroupV1 %v, want %s and %v", kc["kind"], kc["cgroupDriver"], kc["failCgroupV1"], tc.driver, tc.failCgroupV1)
			}
			if kc["containerRuntimeEndpoint"] != "unix:///run/containerd/containerd.sock" {
				t.Errorf("containerRuntimeEndpoint = %v", kc["containerRuntimeEndpoint"])
			}
			// The node-local DNS cache (on by default) is the cluster DNS.
			if dns, _ := kc["clusterDNS"].([]any); len(dns) != 1 || dns[0] != LocalDNSClusterAddr {
				t.Errorf("clusterDNS = %v", kc["clusterDNS"])
			}
			taints, _ := kc["registerWithTaints"].([]any)
			if len(taints) != 1 || taints[0].(map[string]any)["effect"] != "NoSchedule" || taints[0].(map[string]any)["value"] != "gpu" {
				t.Errorf("registerWithTaints = %v", kc["registerWithTaints"])
			}

			var cd struct {
				Version int
				Plugins map[string]struct {
					SandboxImage        string `toml:"sandbox_image"`
					RestrictOOMScoreAdj bool   `toml:"restrict_oom_score_adj"`
					Containerd          struct {
						Runtimes map[string]struct {
							Options struct {
								SystemdCgroup bool
								BinaryName    string
							}
						}
					}
					CNI struct {
						BinDir  string `toml:"bin_dir"`
						ConfDir string `toml:"conf_dir"`
					}
				}
			}
			if _, err := toml.Decode(string(m[layout.ContainerdConfig].Data), &cd); err != nil {
				t.Fatalf("containerd config is not TOML: %v\n%s", err, m[layout.ContainerdConfig].Data)
			}
			cri := cd.Plugins["io.containerd.grpc.v1.cri"]
			runc := cri.Containerd.Runtimes["runc"].Options
			if cd.Version != 2 || cri.SandboxImage != n.SandboxImage || !cri.RestrictOOMScoreAdj ||
				runc.SystemdCgroup != tc.systemdCgroup || runc.BinaryName != "/usr/local/bin/runc" ||
				cri.CNI.BinDir != "/opt/cni/bin" || cri.CNI.ConfDir != "/etc/cni/net.d" {
				t.Errorf("containerd config: %+v", cd)
			}
			// Left to kubelet's and containerd's defaults when the layout
			// names no directory.
			if _, ok := kc["volumePluginDir"]; ok {
				t.Errorf("volumePluginDir = %v, want kubelet's default", kc["volumePluginDir"])
			}
			if _, ok := cd.Plugins["io.containerd.internal.v1.opt"]; ok {
				t.Errorf("containerd's opt plugin configured: %s", m[layout.ContainerdConfig].Data)
			}
		})
	}
}

func TestFilesMoveKubeletsAndContainerdsOwnDirectoriesWhenTheLayoutSaysSo(t *testing.T) {
	l := layout
	l.VolumePluginDir, l.ContainerdOptDir = "/var/lib/kubelet/volumeplugins", "/var/lib/containerd/opt"
	files, err := Files(modestest.Node(), l, Legacy)
	if err != nil {
		t.Fatal(err)
	}
	m := byPath(t, files)
	var kc struct {
		VolumePluginDir string `json:"volumePluginDir"`
	}
	if err := yaml.Unmarshal(m[l.KubeletConfig].Data, &kc); err != nil || kc.VolumePluginDir != l.VolumePluginDir {
		t.Errorf("kubelet volumePluginDir = %q (%v), want %s", kc.VolumePluginDir, err, l.VolumePluginDir)
	}
	var cd struct {
		Plugins map[string]struct {
			Path string
		}
	}
	if _, err := toml.Decode(string(m[l.ContainerdConfig].Data), &cd); err != nil {
		t.Fatalf("containerd config is not TOML: %v\n%s", err, m[l.ContainerdConfig].Data)
	}
	if got := cd.Plugins["io.containerd.internal.v1.opt"].Path; got != l.ContainerdOptDir {
		t.Errorf("containerd opt path = %q, want %s\n%s", got, l.ContainerdOptDir, m[l.ContainerdConfig].Data)
	}
}

func TestBootstrapKubeconfigHoldsTheTokenAt0600(t *testing.T) {
	n := modestest.Node()
	files, err := Files(n, layout, Legacy)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		has := bytes.Contains(f.Data, []byte(modestest.Token))
		if f.Path == layout.BootstrapKubeconfig {
			if !has || f.Mode != 0o600 {
				t.Errorf("bootstrap kubeconfig: token %v, mode %o; want the token at 0600", has, f.Mode)
			}
			var kc kubeconfig
			if err := yaml.Unmarshal(f.Data, &kc); err != nil {
				t.Fatal(err)
			}
			ca, _ := base64.StdEncoding.DecodeString(kc.Clusters[0].Cluster.CertificateAuthorityData)
			if kc.Clusters[0].Cluster.Server != n.APIServer || !bytes.Equal(ca, n.CACert) || kc.CurrentContext != "bootstrap" {
				t.Errorf("bootstrap kubeconfig: %+v", kc)
			}
			continue
		}
		if has {
			t.Errorf("%s holds the bootstrap token", f.Path)
		}
	}
	root := t.TempDir()
	if err := WriteFiles(root, files); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(root, layout.BootstrapKubeconfig))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("written bootstrap kubeconfig: %v %v", fi, err)
	}
}

func TestCNIConfigOnlyWhenAPodCIDRIsGiven(t *testing.T) {
	n := modestest.Node()
	n.PodCIDR = ""
	files, _ := Files(n, layout, Unified)
	if _, ok := byPath(t, files)[filepath.Join(layout.CNIConfDir, CNIConfName)]; ok {
		t.Error("a CNI config without a pod CIDR")
	}
	n.PodCIDR = "10.244.1.0/24"
	files, _ = Files(n, layout, Unified)
	f, ok := byPath(t, files)[filepath.Join(layout.CNIConfDir, CNIConfName)]
	if !ok {
		t.Fatal("no CNI config for a pod CIDR")
	}
	var c struct {
		Plugins []struct {
			Type string
			IPAM struct {
				Type   string
				Ranges [][]struct{ Subnet string }
			}
		}
	}
	if err := json.Unmarshal(f.Data, &c); err != nil {
		t.Fatal(err)
	}
	if len(c.Plugins) != 2 || c.Plugins[0].Type != "bridge" || c.Plugins[0].IPAM.Type != "host-local" ||
		c.Plugins[0].IPAM.Ranges[0][0].Subnet != "10.244.1.0/24" || c.Plugins[1].Type != "portmap" {
		t.Errorf("CNI config: %s", f.Data)
	}
}

func TestKubeletArgsNameTheNodeAndItsLabels(t *testing.T) {
	got := strings.Join(KubeletArgs(modestest.Node(), layout), " ")
	for _, want := range []string{"--hostname-override=site-w1", "--node-ip=192.0.2.10,2001:db8::10", "--node-labels=a.example/x=1,topology.kubernetes.io/zone=edge-1",
		"--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf", "--config=/var/lib/kubelet/config.yaml"} {
		if !strings.Contains(got, want) {
			t.Errorf("kubelet args %q lack %q", got, want)
		}
	}
}

// Without an address (no default route, none configured) the kubelet is
// given none and finds its own.
func TestKubeletArgsWithoutAnAddressGiveNoNodeIP(t *testing.T) {
	n := modestest.Node()
	n.IPs = nil
	if got := strings.Join(KubeletArgs(n, layout), " "); strings.Contains(got, "--node-ip") {
		t.Errorf("kubelet args %q carry a node IP the host does not have", got)
	}
}

func TestHostsNamesTheNodeAtEachOfItsAddresses(t *testing.T) {
	got := string(Hosts(modestest.Node()))
	for _, want := range []string{"127.0.0.1\tlocalhost\n", "::1\tlocalhost", "192.0.2.10\tsite-w1\n", "2001:db8::10\tsite-w1\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("hosts lacks %q:\n%s", want, got)
		}
	}
}

func TestMkdirUnderRefusesASymlinkOnTheWay(t *testing.T) {
	root, outside := t.TempDir(), t.TempDir()
	if err := os.Symlink(outside, filepath.Join(root, "etc")); err != nil {
		t.Fatal(err)
	}
	err := WriteFile(root, "/etc/kubernetes/bootstrap-kubelet.conf", []byte(modestest.Token), 0o600)
	if err == nil || !strings.Contains(err.Error(), "symlink") {
		t.Fatalf("write through a symlinked /etc: %v", err)
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 0 {
		t.Fatalf("a write landed outside the root: %v", ents)
	}
}

func tgz(t *testing.T, files map[string]string) string {
	t.Helper()
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for name, body := range files {
		typ := byte(tar.TypeReg)
		if strings.HasSuffix(name, "/") {
			typ = tar.TypeDir
		}
		tw.WriteHeader(&tar.Header{Name: name, Typeflag: typ, Mode: 0o755, Size: int64(len(body))})
		tw.Write([]byte(body))
	}
	tw.Close()
	gz.Close()
	p := filepath.Join(t.TempDir(), "a.tar.gz")
	os.WriteFile(p, buf.Bytes(), 0o644)
	return p
}

func TestInstallArtifactsPutsEveryExecutableInItsDirectory(t *testing.T) {
	a := modestest.Artifacts(t)
	root := t.TempDir()
	if err := InstallArtifacts(a, root, layout); err != nil {
		t.Fatal(err)
	}
	for dir, names := range map[string][]string{
		layout.BinDir:    {"kubelet", "runc", "containerd", "containerd-shim-runc-v2"},
		layout.CNIBinDir: {"bridge", "host-local", "loopback", "portmap"},
	} {
		for _, n := range names {
			fi, err := os.Stat(filepath.Join(root, dir, n))
			if err != nil || fi.Mode().Perm() != 0o755 {
				t.Errorf("%s/%s: %v %v", dir, n, fi, err)
			}
		}
	}
	// An archive that escapes with ../ is installed by base name only.
	a.CNIPlugins = tgz(t, map[string]string{"../../evil": "x", "bridge": "b", "host-local": "h", "loopback": "l", "portmap": "p"})
	root2 := t.TempDir()
	os.Mkdir(filepath.Join(root2, "r"), 0o755)
	if err := InstallArtifacts(a, filepath.Join(root2, "r"), layout); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root2, "r", layout.CNIBinDir, "evil")); err != nil {
		t.Errorf("evil not installed by base name: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root2, "evil")); err == nil {
		t.Error("an archive entry escaped the CNI directory")
	}
	// An archive without a needed binary is refused by name.
	a.Containerd = tgz(t, map[string]string{"bin/": "", "bin/containerd": "c"})
	err := InstallArtifacts(a, t.TempDir(), layout)
	if err == nil || !strings.Contains(err.Error(), "containerd-shim-runc-v2") || !strings.Contains(err.Error(), "artifact containerd") {
		t.Fatalf("missing shim: %v", err)
	}
	var _ modes.Artifacts = a
}

// The kubelet's serving certificate: from the cluster (serverTLSBootstrap)
// unless the operator chose a self-signed one; client certificates rotate
// either way.
func TestKubeletServingCertificateFromTheClusterUnlessSelfSigned(t *testing.T) {
	for _, selfSigned := range []bool{false, true} {
		n := modestest.Node()
		n.SelfSignedServingCert = selfSigned
		files, err := Files(n, layout, Legacy)
		if err != nil {
			t.Fatal(err)
		}
		var kc map[string]any
		if err := yaml.Unmarshal(byPath(t, files)[layout.KubeletConfig].Data, &kc); err != nil {
			t.Fatal(err)
		}
		if kc["serverTLSBootstrap"] != !selfSigned || kc["rotateCertificates"] != true {
			t.Errorf("self-signed %v: serverTLSBootstrap %v rotateCertificates %v, want %v and true",
				selfSigned, kc["serverTLSBootstrap"], kc["rotateCertificates"], !selfSigned)
		}
	}
}

// Graceful node shutdown: the kubelet's periods from the config, none
// (off) when it is 0; a machine's logind lets the kubelet's delay lock
// last that long.
func TestKubeletGracefulShutdownFromTheConfigAndTheMachinesLogindDelay(t *testing.T) {
	n := modestest.Node()
	n.ShutdownGracePeriod, n.ShutdownGracePeriodCriticalPods = 45*time.Second, 15*time.Second
	files, err := Files(n, layout, Unified)
	if err != nil {
		t.Fatal(err)
	}
	var kc map[string]any
	if err := yaml.Unmarshal(byPath(t, files)[layout.KubeletConfig].Data, &kc); err != nil {
		t.Fatal(err)
	}
	if kc["shutdownGracePeriod"] != "45s" || kc["shutdownGracePeriodCriticalPods"] != "15s" {
		t.Errorf("shutdownGracePeriod %v, shutdownGracePeriodCriticalPods %v; want 45s, 15s", kc["shutdownGracePeriod"], kc["shutdownGracePeriodCriticalPods"])
	}
	lf := LogindFiles(n)
	if len(lf) != 1 || lf[0].Path != LogindConf || !strings.Contains(string(lf[0].Data), "\n[Login]\nInhibitDelayMaxSec=45\n") {
		t.Errorf("the machine's logind drop-in: %+v", lf)
	}
	n.ShutdownGracePeriod, n.ShutdownGracePeriodCriticalPods = 0, 0
	files, err = Files(n, layout, Unified)
	if err != nil {
		t.Fatal(err)
	}
	kc = nil
	if err := yaml.Unmarshal(byPath(t, files)[layout.KubeletConfig].Data, &kc); err != nil {
		t.Fatal(err)
	}
	if _, ok := kc["shutdownGracePeriod"]; ok {
		t.Errorf("graceful node shutdown off, but the kubelet has shutdownGracePeriod %v", kc["shutdownGracePeriod"])
	}
	if lf := LogindFiles(n); len(lf) != 0 {
		t.Errorf("graceful node shutdown off, but a logind drop-in: %+v", lf)
	}
}

// MoveArtifacts moves a staged install into a rootfs by renames: a file
// of the same name there is replaced, nothing stays in the stage, and a
// directory on the way that is a symlink is refused (as every write under
// a rootfs refuses one).
func TestMoveArtifactsReplacesByRenameAndRefusesASymlinkOnTheWay(t *testing.T) {
	a := modestest.Artifacts(t)
	stage, root := t.TempDir(), t.TempDir()
	if err := InstallArtifacts(a, stage, layout); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(root, layout.BinDir), 0o755)
	os.WriteFile(filepath.Join(root, layout.BinDir, "kubelet"), []byte("old"), 0o755)
	if err := MoveArtifacts(stage, root, layout); err != nil {
		t.Fatal(err)
	}
	want, _ := os.ReadFile(a.Kubelet)
	if got, _ := os.ReadFile(filepath.Join(root, layout.BinDir, "kubelet")); !bytes.Equal(got, want) {
		t.Errorf("kubelet after the move: %q, want %q", got, want)
	}
	for _, n := range []string{"bridge", "portmap"} {
		if fi, err := os.Stat(filepath.Join(root, layout.CNIBinDir, n)); err != nil || fi.Mode().Perm() != 0o755 {
			t.Errorf("%s: %v %v", n, fi, err)
		}
	}
	if ents, _ := os.ReadDir(filepath.Join(stage, layout.BinDir)); len(ents) != 0 {
		t.Errorf("left in the stage: %v", ents)
	}

	stage2, root2, elsewhere := t.TempDir(), t.TempDir(), t.TempDir()
	if err := InstallArtifacts(a, stage2, layout); err != nil {
		t.Fatal(err)
	}
	top := strings.Split(strings.Trim(layout.BinDir, "/"), "/")[0]
	os.Symlink(elsewhere, filepath.Join(root2, top))
	if err := MoveArtifacts(stage2, root2, layout); err == nil || !strings.Contains(err.Error(), "symlink") {
		t.Errorf("move through a symlink: %v, want refused", err)
	}
	if ents, _ := os.ReadDir(elsewhere); len(ents) != 0 {
		t.Errorf("written through the symlink: %v", ents)
	}
}

// containerd 1.7+ reads CDI specifications: its CRI plugin gets
// enable_cdi and the spec directories; an older one gets neither (1.6
// knows no such keys).
func TestContainerdConfigTurnsOnCDIWhereContainerdHasIt(t *testing.T) {
	for _, on := range []bool{false, true} {
		n := modestest.Node()
		n.CDI = on
		files, err := Files(n, layout, Unified)
		if err != nil {
			t.Fatal(err)
		}
		data := byPath(t, files)[layout.ContainerdConfig].Data
		var cd struct {
			Plugins map[string]struct {
				EnableCDI   *bool    `toml:"enable_cdi"`
				CDISpecDirs []string `toml:"cdi_spec_dirs"`
			}
		}
		if _, err := toml.Decode(string(data), &cd); err != nil {
			t.Fatalf("containerd config is not TOML: %v\n%s", err, data)
		}
		cri := cd.Plugins["io.containerd.grpc.v1.cri"]
		if on && (cri.EnableCDI == nil || !*cri.EnableCDI || len(cri.CDISpecDirs) == 0 || cri.CDISpecDirs[0] != "/etc/cdi") {
			t.Errorf("CDI on: enable_cdi %v dirs %v\n%s", cri.EnableCDI, cri.CDISpecDirs, data)
		}
		if !on && (cri.EnableCDI != nil || cri.CDISpecDirs != nil) {
			t.Errorf("CDI off: enable_cdi %v dirs %v", cri.EnableCDI, cri.CDISpecDirs)
		}
	}
}
