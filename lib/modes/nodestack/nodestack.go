// Package nodestack renders the files of a node stack (kubelet,
// containerd, CNI) and installs its artifacts, for any isolation mode. A
// mode says where things go (Layout) and under which root (an nspawn
// machine's rootfs, or the host); this package says what they hold.
//
// It is shared content, not shared behaviour: each mode still decides
// itself when and how to write, start and remove (lib/modes).
//
// The kubelet configuration is written as YAML from a local map rather
// than with k8s.io/kubelet's types: those pull component-base's logging
// and tracing configuration APIs into unbounded-agent for a file of fifteen
// keys (ARCHITECTURE section 3, the size budget).
package nodestack

import (
	"archive/tar"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/klauspost/compress/gzip"
	"sigs.k8s.io/yaml"

	"unbounded-cloud.io/agent/lib/modes"
	"unbounded-cloud.io/agent/lib/state"
)

// Layout is where the node stack's files live, as the node stack sees
// them (absolute paths inside the machine, or on the host).
type Layout struct {
	// BinDir holds kubelet, runc and containerd's executables.
	BinDir string
	// CNIBinDir holds the CNI plugins.
	CNIBinDir string
	// CNIConfDir is where containerd looks for CNI configurations (and
	// where a cluster's CNI DaemonSet writes its own).
	CNIConfDir string
	// KubeletConfig is the KubeletConfiguration file.
	KubeletConfig string
	// BootstrapKubeconfig holds the bootstrap token (0600).
	BootstrapKubeconfig string
	// Kubeconfig is where kubelet writes its kubeconfig after TLS
	// bootstrap.
	Kubeconfig string
	// CACert is the cluster CA.
	CACert string
	// ContainerdConfig is containerd's config.toml.
	ContainerdConfig string
	// ContainerdRoot and ContainerdState are containerd's root and state
	// directories; the socket is ContainerdState/containerd.sock.
	ContainerdRoot, ContainerdState string
	// ResolvConf is the resolv.conf kubelet gives pods with dnsPolicy
	// Default (and whose search path ClusterFirst pods extend).
	ResolvConf string
	// VolumePluginDir is where kubelet looks for FlexVolume drivers (and
	// which it creates at start). Empty: kubelet's default,
	// /usr/libexec/kubernetes/kubelet-plugins/volume/exec, fine in a
	// machine's own rootfs but under the host's /usr in mode none.
	VolumePluginDir string
	// ContainerdOptDir is containerd's "opt" plugin directory (created at
	// start, for binaries and libraries a plugin installs). Empty:
	// containerd's default, /opt/containerd.
	ContainerdOptDir string
	// LocalDNSCorefile is the node-local DNS cache's Corefile, and
	// PodResolvConf the resolv.conf the kubelet gives pods (in place of
	// ResolvConf) when the cache runs (LocalDNSFiles).
	LocalDNSCorefile, PodResolvConf string
}

// Socket is containerd's CRI endpoint.
func (l Layout) Socket() string { return path.Join(l.ContainerdState, "containerd.sock") }

// Cgroup is the node's cgroup hierarchy: "legacy" or "unified"
// (modes.Host.CgroupHierarchy).
type Cgroup string

const (
	Legacy  Cgroup = "legacy"
	Unified Cgroup = "unified"
)

// File is one file to write; Path is as the node stack sees it.
type File struct {
	Path string
	Mode os.FileMode
	Data []byte
}

// Files renders the node configuration for n in layout l on a node with
// cgroup hierarchy cg: bootstrap kubeconfig (0600, the token), CA, kubelet
// config, containerd config, and the CNI config when n.PodCIDR is set.
func Files(n modes.Node, l Layout, cg Cgroup) ([]File, error) {
	if cg != Legacy && cg != Unified {
		return nil, fmt.Errorf("unknown cgroup hierarchy %q", cg)
	}
	kc, err := bootstrapKubeconfig(n, l)
	if err != nil {
		return nil, err
	}
	kcfg, err := kubeletConfig(n, l, cg)
	if err != nil {
		return nil, err
	}
	files := []File{
		{Path: l.CACert, Mode: 0o644, Data: n.CACert},
		{Path: l.BootstrapKubeconfig, Mode: 0o600, Data: kc},
		{Path: l.KubeletConfig, Mode: 0o644, Data: kcfg},
		{Path: l.ContainerdConfig, Mode: 0o644, Data: containerdConfig(n, l, cg)},
	}
	if n.PodCIDR != "" {
		cni, err := cniConfig(n)
		if err != nil {
			return nil, err
		}
		files = append(files, File{Path: path.Join(l.CNIConfDir, CNIConfName), Mode: 0o644, Data: cni})
	}
	return files, nil
}

// WriteFiles writes files under root (a machine's rootfs, or "/"),
// each atomically (lib/state.WriteFileAtomic), secrets with their mode
// set before the first byte.
func WriteFiles(root string, files []File) error {
	for _, f := range files {
		if err := WriteFile(root, f.Path, f.Data, f.Mode); err != nil {
			return fmt.Errorf("write %s: %w", f.Path, err)
		}
	}
	return nil
}

// WriteFile writes data to name (a path as the node sees it) under root,
// atomically, after MkdirUnder has made sure that no directory on the way
// is a symlink: a rootfs comes from an image, and an image with
// /etc/kubernetes -> /etc would otherwise have the bootstrap token written
// into the host's /etc. The file itself replaces whatever was at name (a
// symlink included): rename(2) does not follow it.
func WriteFile(root, name string, data []byte, perm os.FileMode) error {
	dir, err := MkdirUnder(root, path.Dir(name))
	if err != nil {
		return err
	}
	return state.WriteFileAtomic(filepath.Join(dir, path.Base(name)), data, perm)
}

// MkdirUnder creates dir (a path as the node sees it) under root, 0755,
// component by component, and refuses a component that exists and is not
// a directory, a symlink in particular. It returns the directory's path
// under root. Only root itself may be (or sit under) a symlink.
func MkdirUnder(root, dir string) (string, error) {
	cur := root
	for _, c := range strings.Split(path.Clean("/"+dir), "/") {
		if c == "" {
			continue
		}
		cur = filepath.Join(cur, c)
		fi, err := os.Lstat(cur)
		switch {
		case errors.Is(err, os.ErrNotExist):
			if err := os.Mkdir(cur, 0o755); err != nil {
				return "", err
			}
		case err != nil:
			return "", err
		case fi.Mode()&os.ModeSymlink != 0:
			return "", fmt.Errorf("%s is a symlink: refusing to write %s through it", cur, dir)
		case !fi.IsDir():
			return "", fmt.Errorf("%s is not a directory (writing %s)", cur, dir)
		}
	}
	return cur, nil
}

// kubeconfig is the part of clientcmd's v1 Config kubelet reads.
type kubeconfig struct {
	APIVersion     string         `json:"apiVersion"`
	Kind           string         `json:"kind"`
	Clusters       []namedCluster `json:"clusters"`
	Users          []namedUser    `json:"users"`
	Contexts       []namedContext `json:"contexts"`
	CurrentContext string         `json:"current-context"`
}
type namedCluster struct {
	Name    string `json:"name"`
	Cluster struct {
		Server                   string `json:"server"`
		CertificateAuthorityData string `json:"certificate-authority-data"`
	} `json:"cluster"`
}
type namedUser struct {
	Name string `json:"name"`
	User struct {
		Token string `json:"token"`
	} `json:"user"`
}
type namedContext struct {
	Name    string `json:"name"`
	Context struct {
		Cluster string `json:"cluster"`
		User    string `json:"user"`
	} `json:"context"`
}

func bootstrapKubeconfig(n modes.Node, l Layout) ([]byte, error) {
	k := kubeconfig{APIVersion: "v1", Kind: "Config", CurrentContext: "bootstrap"}
	var c namedCluster
	c.Name = "cluster"
	c.Cluster.Server = n.APIServer
	// The CA inline, not by path: the file stays valid wherever the
	// rootfs is looked at (from the host, inside the machine).
	c.Cluster.CertificateAuthorityData = base64.StdEncoding.EncodeToString(n.CACert)
	var u namedUser
	u.Name = "kubelet-bootstrap"
	u.User.Token = n.BootstrapToken.Reveal()
	var x namedContext
	x.Name = "bootstrap"
	x.Context.Cluster, x.Context.User = "cluster", "kubelet-bootstrap"
	k.Clusters, k.Users, k.Contexts = []namedCluster{c}, []namedUser{u}, []namedContext{x}
	return yaml.Marshal(k)
}

type taint struct {
	Key    string `json:"key"`
	Value  string `json:"value,omitempty"`
	Effect string `json:"effect"`
}

// parseTaint splits "key=value:Effect" or "key:Effect" (lib/config has
// validated the form).
func parseTaint(s string) (taint, error) {
	kv, effect, ok := strings.Cut(s, ":")
	if !ok || effect == "" {
		return taint{}, fmt.Errorf("taint %q: want key=value:Effect or key:Effect", s)
	}
	k, v, _ := strings.Cut(kv, "=")
	return taint{Key: k, Value: v, Effect: effect}, nil
}

// kubeletConfig is a KubeletConfiguration (kubelet.config.k8s.io/v1beta1).
func kubeletConfig(n modes.Node, l Layout, cg Cgroup) ([]byte, error) {
	domain := n.ClusterDomain
	if domain == "" {
		domain = "cluster.local"
	}
	var taints []taint
	for _, s := range n.Taints {
		t, err := parseTaint(s)
		if err != nil {
			return nil, err
		}
		taints = append(taints, t)
	}
	c := map[string]any{
		"apiVersion": "kubelet.config.k8s.io/v1beta1",
		"kind":       "KubeletConfiguration",
		// Authentication of the kubelet's API: the API server's client
		// certificate (signed by the cluster CA) and bearer tokens checked
		// by TokenReview; no anonymous access.
		"authentication": map[string]any{
			"anonymous": map[string]any{"enabled": false},
			"webhook":   map[string]any{"enabled": true},
			"x509":      map[string]any{"clientCAFile": l.CACert},
		},
		"authorization":            map[string]any{"mode": "Webhook"},
		"containerRuntimeEndpoint": "unix://" + l.Socket(),
		// Client certificate renewal through CSRs (the cluster's
		// selfnodeclient approval), so the node keeps its identity.
		"rotateCertificates": true,
		// The serving certificate of port 10250 (logs, exec, port-forward,
		// metrics) from the cluster too: a kubernetes.io/kubelet-serving
		// CSR for the Node's names and addresses, which the cluster's
		// approver approves, renewed like the client certificate. The API
		// server can then verify the kubelet (--kubelet-certificate-authority).
		// node.serving-cert = "self-signed" leaves the kubelet its own.
		"serverTLSBootstrap": !n.SelfSignedServingCert,
		"clusterDomain":      domain,
		"resolvConf":         l.ResolvConf,
		// kubelet's health endpoint, what bootstrap and the health check
		// poll; loopback only.
		"healthzBindAddress": "127.0.0.1",
		"healthzPort":        10248,
	}
	switch {
	case n.LocalDNS:
		// The node-local DNS cache (LocalDNSFiles): pods ask it, for
		// cluster names and others, and pods with dnsPolicy Default get
		// its resolv.conf.
		c["clusterDNS"] = []string{LocalDNSClusterAddr}
		c["resolvConf"] = l.PodResolvConf
	case n.ClusterDNS != "":
		c["clusterDNS"] = []string{n.ClusterDNS}
	}
	if l.VolumePluginDir != "" {
		c["volumePluginDir"] = l.VolumePluginDir
	}
	if n.ShutdownGracePeriod > 0 {
		// Graceful node shutdown: on logind's PrepareForShutdown the
		// kubelet ends the pods, critical ones last, each within its
		// grace period, holding a logind delay lock meanwhile.
		c["shutdownGracePeriod"] = n.ShutdownGracePeriod.String()
		c["shutdownGracePeriodCriticalPods"] = n.ShutdownGracePeriodCriticalPods.String()
	}
	if len(taints) > 0 {
		c["registerWithTaints"] = taints
	}
	switch cg {
	case Legacy:
		// kubelet 1.36 refuses cgroup v1 unless told; a host whose
		// controllers are bound to v1 has no other choice. cgroupfs: with
		// a legacy hierarchy inside a machine, systemd's cgroup driver
		// cannot delegate the v1 controllers to the kubelet's slices.
		c["failCgroupV1"] = false
		c["cgroupDriver"] = "cgroupfs"
	case Unified:
		// On cgroup v2 the node's systemd owns the tree: the systemd
		// driver keeps kubelet and systemd from fighting over it.
		c["cgroupDriver"] = "systemd"
	}
	return yaml.Marshal(c)
}

// LogindConf is the node's logind drop-in (a machine's own systemd-logind,
// in modes nspawn and container), LogindFiles.
const LogindConf = "/etc/systemd/logind.conf.d/50-unbounded-node.conf"

// LogindFiles are the files a node machine's logind needs for the
// kubelet's graceful node shutdown: InhibitDelayMaxSec at least
// n.ShutdownGracePeriod (logind's default, 5 s, would cut the kubelet's
// delay lock short), read by logind at the machine's boot, before the
// kubelet starts (which would otherwise write one itself and reload
// logind). None when the shutdown is off. Mode none's is the host's
// logind, which the kubelet raises itself (its 99-kubelet.conf).
func LogindFiles(n modes.Node) []File {
	if n.ShutdownGracePeriod <= 0 {
		return nil
	}
	return []File{{Path: LogindConf, Mode: 0o644, Data: fmt.Appendf(nil, `# Written by unbounded-agent: the kubelet's graceful node shutdown
# (node.shutdown-grace-period) holds a delay lock of logind for up to this
# long while it ends the pods.
[Login]
InhibitDelayMaxSec=%d
`, int(n.ShutdownGracePeriod.Seconds()))}}
}

// KubeletArgs are kubelet's command-line flags for n in layout l, the
// settings that have no KubeletConfiguration field.
func KubeletArgs(n modes.Node, l Layout) []string {
	args := []string{
		"--config=" + l.KubeletConfig,
		"--bootstrap-kubeconfig=" + l.BootstrapKubeconfig,
		"--kubeconfig=" + l.Kubeconfig,
		// The Node's name is the Machine's, whatever the kernel's
		// hostname says (a machine whose /etc/hostname was edited must
		// not register as a second Node).
		"--hostname-override=" + n.Name,
	}
	if len(n.IPs) > 0 {
		// The Node's address, known: without it the kubelet resolves its
		// own name in DNS at start and at every status update, and waits
		// 10 s each time where no resolver answers.
		ips := make([]string, len(n.IPs))
		for i, a := range n.IPs {
			ips[i] = a.String()
		}
		args = append(args, "--node-ip="+strings.Join(ips, ","))
	}
	if len(n.Labels) > 0 {
		keys := make([]string, 0, len(n.Labels))
		for k := range n.Labels {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var kv []string
		for _, k := range keys {
			kv = append(kv, k+"="+n.Labels[k])
		}
		args = append(args, "--node-labels="+strings.Join(kv, ","))
	}
	return args
}

// tomlString quotes s as a TOML basic string (JSON's escapes are TOML's).
func tomlString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// containerdConfig is containerd's config.toml, version 2: read by
// containerd 1.6 and 1.7 as is and migrated in memory by 2.x.
// cdiConfig is the CRI plugin's CDI settings, where containerd has CDI.
func cdiConfig(n modes.Node) string {
	if !n.CDI {
		return ""
	}
	return `  # Containers get the devices a CDI specification describes (the node's
  # NVIDIA GPUs: /etc/cdi/nvidia.yaml, written at prepare and restart), as
  # device plugins ask for them.
  enable_cdi = true
  cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]
`
}

func containerdConfig(n modes.Node, l Layout, cg Cgroup) []byte {
	systemdCgroup := "false"
	if cg == Unified {
		systemdCgroup = "true"
	}
	var b strings.Builder
	fmt.Fprintf(&b, `# Written by unbounded-agent for this node stack; regenerated at every
# prepare, so edits here do not last.
version = 2
root = %s
state = %s

[grpc]
  address = %s

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %s
  # Containers may not lower their OOM score below containerd's own: runc
  # fails ("can't get final child's PID from pipe") where root lacks
  # CAP_SYS_RESOURCE (nested machines), and elsewhere it keeps a pod from
  # making itself harder to kill than the runtime.
  restrict_oom_score_adj = true
%s
[plugins."io.containerd.grpc.v1.cri".containerd]
  default_runtime_name = "runc"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
  BinaryName = %s
  # Must match kubelet's cgroupDriver: systemd on a unified hierarchy,
  # cgroupfs on a legacy one.
  SystemdCgroup = %s

[plugins."io.containerd.grpc.v1.cri".cni]
  bin_dir = %s
  conf_dir = %s
`, tomlString(l.ContainerdRoot), tomlString(l.ContainerdState), tomlString(l.Socket()),
		tomlString(n.SandboxImage), cdiConfig(n), tomlString(path.Join(l.BinDir, "runc")), systemdCgroup,
		tomlString(l.CNIBinDir), tomlString(l.CNIConfDir))
	if l.ContainerdOptDir != "" {
		fmt.Fprintf(&b, `
# containerd's "opt" plugin creates this directory at start (default
# /opt/containerd).
[plugins."io.containerd.internal.v1.opt"]
  path = %s
`, tomlString(l.ContainerdOptDir))
	}
	return []byte(b.String())
}

// CNIConfName is the file name of the bridge CNI config; "10-" sorts it
// before a cluster CNI's usual names, and containerd uses the first.
const CNIConfName = "10-unbounded-bridge.conflist"

func cniConfig(n modes.Node) ([]byte, error) {
	c := map[string]any{
		// 0.4.0: understood by every plugin release containerd 1.6 and
		// later ship with.
		"cniVersion": "0.4.0",
		"name":       "unbounded",
		"plugins": []any{
			map[string]any{
				"type":        "bridge",
				"bridge":      "cni0",
				"isGateway":   true,
				"ipMasq":      true,
				"hairpinMode": true,
				"ipam": map[string]any{
					"type":   "host-local",
					"ranges": [][]map[string]string{{{"subnet": n.PodCIDR}}},
					"routes": []map[string]string{{"dst": "0.0.0.0/0"}},
				},
			},
			map[string]any{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}},
		},
	}
	b, err := json.MarshalIndent(c, "", "  ")
	return append(b, '\n'), err
}

// Binaries are the executables the node stack needs after InstallArtifacts,
// by the artifact that brings them.
var Binaries = map[string][]string{
	"kubelet":     {"kubelet"},
	"runc":        {"runc"},
	"containerd":  {"containerd", "containerd-shim-runc-v2"},
	"cni-plugins": {"bridge", "host-local", "loopback", "portmap"},
	"coredns":     {"coredns"},
}

// InstallArtifacts installs a under root in layout l: kubelet and runc as
// l.BinDir/kubelet and l.BinDir/runc, every regular file of the
// containerd archive into l.BinDir and of the CNI archive into
// l.CNIBinDir, by base name, mode 0755. It fails when an archive lacks
// one of Binaries.
//
// root is a tree being built (a slot's rootfs or version directory under
// its temporary name): each file is streamed into a temporary name and
// renamed, so no reader ever sees half of one, but not synced one by one.
// The tree is published by modes.SwapDir, which syncs it once before the
// rename (one writeback of every file instead of a journal commit per
// file: a first boot's slot writes about 250 MB of executables here).
func InstallArtifacts(a modes.Artifacts, root string, l Layout) error {
	bin, err := MkdirUnder(root, l.BinDir)
	if err != nil {
		return err
	}
	cni, err := MkdirUnder(root, l.CNIBinDir)
	if err != nil {
		return err
	}
	if err := copyExecutable(a.Kubelet, filepath.Join(bin, "kubelet")); err != nil {
		return fmt.Errorf("artifact kubelet: %w", err)
	}
	if err := copyExecutable(a.Runc, filepath.Join(bin, "runc")); err != nil {
		return fmt.Errorf("artifact runc: %w", err)
	}
	archives := []struct{ name, archive, dir string }{
		{"containerd", a.Containerd, bin},
		{"cni-plugins", a.CNIPlugins, cni},
	}
	if a.CoreDNS != "" {
		archives = append(archives, struct{ name, archive, dir string }{"coredns", a.CoreDNS, bin})
	}
	for _, x := range archives {
		got, err := extractExecutables(x.archive, x.dir)
		if err != nil {
			return fmt.Errorf("artifact %s: %w", x.name, err)
		}
		for _, want := range Binaries[x.name] {
			if !slices.Contains(got, want) {
				return fmt.Errorf("artifact %s: %s has no %s (it has %v)", x.name, x.archive, want, got)
			}
		}
	}
	return nil
}

// MoveArtifacts moves what InstallArtifacts put under stage (a directory
// of its own on root's filesystem) into root, same layout: each file of
// l.BinDir and l.CNIBinDir by a rename, replacing a file of the same name
// there (an image's own kubelet, say). It lets a slot's artifacts be
// installed while its image is unpacked, each into its own tree.
func MoveArtifacts(stage, root string, l Layout) error {
	for _, dir := range []string{l.BinDir, l.CNIBinDir} {
		from := filepath.Join(stage, dir)
		ents, err := os.ReadDir(from)
		if err != nil {
			return err
		}
		to, err := MkdirUnder(root, dir)
		if err != nil {
			return err
		}
		for _, e := range ents {
			if !e.Type().IsRegular() {
				return fmt.Errorf("%s: %s is not a regular file", from, e.Name())
			}
			if err := os.Rename(filepath.Join(from, e.Name()), filepath.Join(to, e.Name())); err != nil {
				return err
			}
		}
	}
	return nil
}

func copyExecutable(src, dst string) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	return writeExecutable(dst, f, maxArchiveEntry)
}

// writeExecutable streams at most limit bytes of r into dst, mode 0755:
// a temporary name in dst's directory first, then renamed (InstallArtifacts
// says why it is not synced here). More than limit bytes is an error.
func writeExecutable(dst string, r io.Reader, limit int64) error {
	f, err := os.CreateTemp(filepath.Dir(dst), "."+filepath.Base(dst)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	ok := false
	defer func() {
		if !ok {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if err := f.Chmod(0o755); err != nil {
		return err
	}
	n, err := io.Copy(f, io.LimitReader(r, limit+1))
	if err != nil {
		return err
	}
	if n > limit {
		return fmt.Errorf("%s: more than %d bytes, larger than any node stack binary", dst, limit)
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, dst); err != nil {
		return err
	}
	ok = true
	return nil
}

// maxArchiveEntry bounds one file of an artifact archive: containerd's
// largest executable is about 60 MB; a gigabyte entry is a wrong archive.
const maxArchiveEntry = 1 << 30

// extractExecutables writes every regular file of the .tar.gz archive into
// dir by its base name (directories, links and anything else are
// skipped: the executables are all the node stack needs, and a base name
// cannot escape dir). It returns the names written.
func extractExecutables(archive, dir string) ([]string, error) {
	f, err := os.Open(archive)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	// klauspost/compress's gzip (already linked for zstd): the same
	// format as compress/gzip, decompressed about a fifth faster, and
	// this runs beside the node image's unpack on a two-core host.
	gz, err := gzip.NewReader(f)
	if err != nil {
		return nil, fmt.Errorf("%s: not a .tar.gz: %w", archive, err)
	}
	tr := tar.NewReader(gz)
	var names []string
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", archive, err)
		}
		name := path.Base(path.Clean("/" + h.Name))
		if h.Typeflag != tar.TypeReg || name == "/" || name == "." || strings.HasPrefix(name, ".") {
			continue
		}
		if h.Size > maxArchiveEntry {
			return nil, fmt.Errorf("%s: %s is %d bytes, larger than any node stack binary", archive, h.Name, h.Size)
		}
		if err := writeExecutable(filepath.Join(dir, name), tr, h.Size); err != nil {
			return nil, fmt.Errorf("%s: %s: %w", archive, h.Name, err)
		}
		names = append(names, name)
	}
	return names, nil
}

// Hosts is the node's /etc/hosts: localhost, and the Node's name at its
// addresses, so that a lookup of the name (the kubelet's without a node
// IP, a hostNetwork pod's, a tool's) is answered without DNS.
func Hosts(n modes.Node) []byte {
	var b strings.Builder
	b.WriteString("# Written by unbounded-agent at prepare: the Node's name at its address.\n")
	b.WriteString("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n")
	for _, a := range n.IPs {
		fmt.Fprintf(&b, "%s\t%s\n", a, n.Name)
	}
	return []byte(b.String())
}
