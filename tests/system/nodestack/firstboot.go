package nodestack

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"unbounded-cloud.io/agent/lib/api/identity"
	"unbounded-cloud.io/agent/lib/fleet"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/modes/none"
	"unbounded-cloud.io/agent/tests/kubeenv"
	"unbounded-cloud.io/agent/tests/system/harness"
)

// NodeIP is the address NodeIPService gives a test host: the address of
// its default route's interface, which the agent gives its Node.
const NodeIP = "192.0.2.10"

// OtherNodeIP is a second address of the test host's interface, for a
// node.ip that is not the default one.
const OtherNodeIP = "192.0.2.11"

// NodeIPService is the [Service] section of a unit that gives a machine an
// address and a default route of its own, for the kubelet's Node address:
// a veth pair inside the machine's private network namespace, where
// nothing sent leaves the namespace. A real host has one.
const NodeIPService = `[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=ip link add ubt0 type veth peer name ubt1
ExecStart=ip addr add ` + NodeIP + `/24 dev ubt0
ExecStart=ip addr add ` + OtherNodeIP + `/24 dev ubt0
ExecStart=ip link set ubt1 up
ExecStart=ip link set ubt0 up
ExecStart=ip route add default via 192.0.2.1 dev ubt0
`

// kubeletForwardDir is where a test host's kubelet socket is (a directory
// of the VM bound in): the API server reaches the kubelet port through it
// (kubeenv.PublishKubelet).
const kubeletForwardDir = "/run/unbounded-test-kubelet"

// kubeletForwardFiles are the units that carry connections from the socket
// in kubeletForwardDir to the kubelet port on the host's own loopback (the
// node machine of mode nspawn shares the host's network).
var kubeletForwardFiles = []harness.File{
	{Path: "/etc/systemd/system/unbounded-test-kubelet.socket", Mode: 0o644, Data: []byte(
		"# Written by tests/system/nodestack: the API server's way to the kubelet port.\n[Socket]\nListenStream=" + kubeletForwardDir + "/10250.sock\n")},
	{Path: "/etc/systemd/system/unbounded-test-kubelet.service", Mode: 0o644, Data: []byte(
		"[Unit]\nRequires=unbounded-test-kubelet.socket\nAfter=unbounded-test-kubelet.socket\n[Service]\nExecStart=/lib/systemd/systemd-socket-proxyd 127.0.0.1:10250\n")},
	{Path: "/etc/systemd/system/sockets.target.d/unbounded-test-kubelet.conf", Mode: 0o644, Data: []byte(
		"[Unit]\nWants=unbounded-test-kubelet.socket\n")},
}

// DNSSink is the resolver every first-boot test host names in its
// resolv.conf: a listener that takes queries and never answers, as the
// DNS of a host at the edge or behind an air gap does (a resolver no
// longer reachable). A lookup there waits out Go's and glibc's timeouts
// (5 s x 2 attempts); nothing on the way to a Ready node may. It is on
// the host's own loopback, so no query leaves the test's namespaces.
const DNSSink = "127.0.0.153"

// dnsSinkFiles are the socket that takes the queries (UDP and TCP; systemd
// holds them) and the service it hands them to, which never reads.
var dnsSinkFiles = []harness.File{
	{Path: "/etc/resolv.conf", Mode: 0o644, Data: []byte("# tests/system/nodestack: a resolver that never answers (DNSSink).\nnameserver " + DNSSink + "\n")},
	{Path: "/etc/systemd/system/ubt-dns-sink.socket", Mode: 0o644, Data: []byte(
		"# Written by tests/system/nodestack: DNS queries are taken and never answered.\n[Socket]\nListenDatagram=" + DNSSink + ":53\nListenStream=" + DNSSink + ":53\n")},
	{Path: "/etc/systemd/system/ubt-dns-sink.service", Mode: 0o644, Data: []byte(
		"[Unit]\nRequires=ubt-dns-sink.socket\nAfter=ubt-dns-sink.socket\n[Service]\nExecStart=/bin/sleep infinity\n")},
	{Path: "/etc/systemd/system/sockets.target.d/ubt-dns-sink.conf", Mode: 0o644, Data: []byte(
		"[Unit]\nWants=ubt-dns-sink.socket\n")},
}

// firstBootNodeIPUnit is NodeIPService as a unit of a first-boot test host:
// up before the network is, so before unbounded-bootstrap.service.
const firstBootNodeIPUnit = `[Unit]
Description=The test host's own address (tests/system/nodestack)
DefaultDependencies=no
Before=network.target network-online.target
Wants=network.target
` + NodeIPService

// cgroupRWUnit makes a mode none test host's cgroup v1 controllers
// writable before anything runs. nspawn mounts them read-only in a
// container that shares the VM's users; a real host's are writable, and in
// mode none the test host is the host, so this is the host's part, not the
// product's (the nspawn mode does the same inside its machines, where it
// is the product's: lib/modes/bluegreen/tree's unbounded-cgroup-rw.service).
const cgroupRWUnit = `[Unit]
Description=Writable cgroup v1 controllers, as on a real host (tests/system/nodestack)
DefaultDependencies=no
After=local-fs.target
Before=sysinit.target
[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/sh -c 'for m in $(awk "\\$3 == \\"cgroup\\" {print \\$2}" /proc/self/mounts); do mount -o remount,bind,rw "$m" "$m" || exit 1; done'
`

// FirstBootOptions describe a first-boot test host: the cluster it joins
// and the node stack it bootstraps from (all on the test machine's
// loopback).
type FirstBootOptions struct {
	Env   *kubeenv.Env
	Stage *Stage
	// Name is the Machine's and the Node's name.
	Name string
	// Mode is agent.toml's isolation mode: "nspawn" or "none".
	Mode string
	// AlsoNone gives a host of another mode what a host of mode none has
	// (below), so that an isolation change can move its node to mode
	// none.
	AlsoNone bool
	// RegistryHost and MirrorURL are the loopback registry's host and the
	// artifact mirror's URL.
	RegistryHost, MirrorURL string
	// Pause is the sandbox image's reference; NodeRef the node image's,
	// empty for no [nspawn] section.
	Pause, NodeRef string
	// Offline forwards only the API server to the host: the mirror's and
	// the registry's ports on its loopback stay closed, so base-url and
	// the image references in agent.toml reach nothing.
	Offline bool
	// Extra is appended to agent.toml.
	Extra string
	// Serve are more loopback servers (127.0.0.1:PORT or a URL) the host
	// reaches at the same address, a package server say; not with
	// Offline.
	Serve []string
	// NodeIP is agent.toml's node.ip (empty: not set).
	NodeIP string
	// Joined, when set, is what `kubectl unbounded join` made for the
	// machine (lib/fleet.Join): its agent.toml, CA and token are the
	// host's files as they are, and the test's own settings (the mirror,
	// the versions it serves, the pause image, the pod CIDR, Extra) go
	// to a drop-in beside them, as a site's own settings would. Without
	// it the host gets a token of the test's making.
	Joined *fleet.Joined
}

// FirstBootHost is what a test host (a systemd container with the .deb
// installed and a private network) gets to boot for the first time and
// become a Node: /etc/unbounded/agent.toml, the CA, a bootstrap token of
// its own, and what a real host has already:
//   - the API server, the mirror and the registry on its own loopback
//     (Forward: listeners in its network namespace, fresh at every boot);
//   - an address and a default route of its own for the kubelet's Node
//     (NodeIPService);
//   - a resolver that never answers (DNSSink), as at the edge;
//   - a way from the API server to its kubelet port: a unix socket in a
//     directory of the VM (kubeletForwardFiles), published to the test
//     control plane under the Node's name (kubeenv.PublishKubelet);
//   - what TESTING.md's nested kubelet recipe gives a container that runs
//     a node stack: every capability, the keyring and bpf system calls,
//     a writable /proc/sys, cgroup v1 controllers (this VM binds them all
//     to v1);
//   - /var/lib/unbounded/slots on a directory of the VM's own file system
//     (a tmpfs: harness.TmpfsDir): containerd's overlayfs snapshotter
//     cannot put its layers on the host's overlay root.
//
// In mode none the test host is the node's OS, so it also gets what that
// OS has on a real host (installing it is not the product's job):
//   - iptables (the CNI bridge masquerades with it, the kubelet manages
//     its chains): the test rootfs has none; the files of the stage's
//     iptables layer, the one the nspawn node image gets
//     (Machine copies them into the host's root);
//   - writable cgroup v1 controllers (cgroupRWUnit);
//   - /var/lib/containerd (lib/modes/none Layout: where every tool
//     expects it) on a directory of the VM's own file system, for the
//     same reason as the slots.
type FirstBootHost struct {
	// Config is agent.toml's text.
	Config string
	// Files, NspawnArgs and Env are for harness.Options (Options adds
	// Forward's Listen as its Network).
	Files      []harness.File
	NspawnArgs []string
	Env        []string
	// Layers are harness.Options.Layers: a prepared image's files, say.
	Layers []string
	// Forward carries the API server (and the mirror and the registry
	// unless Offline) to the host's loopback; SetFault on it makes the API
	// server unreachable, or present another certificate, to the host.
	Forward *Forwarder

	mode     string
	alsoNone bool
	stage    *Stage
}

// NewFirstBootHost creates the host's bootstrap token and starts the
// forwarding of the API server, the registry and the mirror (until the
// test ends).
func NewFirstBootHost(t testing.TB, o FirstBootOptions) *FirstBootHost {
	t.Helper()
	s := o.Stage
	forwarded := []string{o.Env.Host(), o.RegistryHost, o.MirrorURL}
	if o.Offline {
		forwarded = forwarded[:1]
	} else {
		forwarded = append(forwarded, o.Serve...)
	}
	fwd := Forward(t, forwarded...)

	var token string
	if o.Joined == nil {
		id, secret := kubeenv.RandomTokenID(t)
		token = o.Env.CreateBootstrapToken(t, id, secret, strings.Split(identity.BootstrapExtraGroups(o.Name), ",")...)
	}

	cfg := fmt.Sprintf(`machine = %q
mode = %q

[cluster]
api-server = %q
ca-file = "/etc/unbounded/ca.crt"
bootstrap-token-file = "/etc/unbounded/bootstrap-token"
kubernetes-version = %q
cluster-dns = "10.96.0.10"

[node]
sandbox-image = %q
pod-cidr = "10.88.0.0/16"

[artifacts]
base-url = %q
containerd-version = %q
runc-version = %q
cni-plugins-version = %q
coredns-version = %q
`, o.Name, o.Mode, o.Env.Host(), s.Versions["kubelet"], o.Pause, o.MirrorURL,
		s.Versions["containerd"], s.Versions["runc"], s.Versions["cni-plugins"], s.Versions["coredns"])
	if o.NodeRef != "" {
		cfg += fmt.Sprintf("\n[nspawn]\nimage = %q\n", o.NodeRef)
	}
	if o.NodeIP != "" {
		cfg = strings.Replace(cfg, "[node]\n", fmt.Sprintf("[node]\nip = %q\n", o.NodeIP), 1)
	}
	cfg += o.Extra

	unbounded := []harness.File{
		{Path: hostpaths.ConfigFileHost, Data: []byte(cfg), Mode: 0o644},
		{Path: "/etc/unbounded/ca.crt", Data: o.Env.CAPEM(t), Mode: 0o644},
		{Path: "/etc/unbounded/bootstrap-token", Data: []byte(token + "\n"), Mode: 0o600},
	}
	if j := o.Joined; j != nil {
		// What join wrote, as it is; the rest of cfg (below its
		// [cluster] keys, which join writes) as a drop-in.
		unbounded = nil
		for _, f := range j.Files() {
			unbounded = append(unbounded, harness.File{Path: f.Host, Data: f.Data, Mode: f.Mode})
		}
		_, rest, _ := strings.Cut(cfg, "kubernetes-version = ")
		_, rest, _ = strings.Cut(rest, "\n")
		if o.NodeRef != "" {
			rest = strings.Replace(rest, fmt.Sprintf("\n[nspawn]\nimage = %q\n", o.NodeRef), "\n", 1)
		}
		cfg = "# tests/system: the test's own settings beside join's agent.toml\n[cluster]\n" + rest
		unbounded = append(unbounded, harness.File{Path: filepath.Join(hostpaths.ConfigDropinDirHost, "50-test.toml"), Data: []byte(cfg), Mode: 0o644})
	}
	files := append([]harness.File(nil), unbounded...)
	files = append(files,
		harness.File{Path: "/etc/systemd/system/ubt-nodeip.service", Data: []byte(firstBootNodeIPUnit), Mode: 0o644},
		harness.File{Path: "/etc/systemd/system/multi-user.target.d/ubt-nodeip.conf", Data: []byte("[Unit]\nWants=ubt-nodeip.service\n"), Mode: 0o644},
	)
	files = append(files, kubeletForwardFiles...)
	files = append(files, dnsSinkFiles...)
	// A short path: unix socket paths are limited to 107 bytes.
	kubeletDir, err := os.MkdirTemp("", "ubt-kl-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(kubeletDir) })
	o.Env.PublishKubelet(t, o.Name, filepath.Join(kubeletDir, "10250.sock"))
	slots := harness.TmpfsDir(t)
	args := []string{
		"--bind=" + kubeletDir + ":" + kubeletForwardDir,
		"--capability=all",
		"--system-call-filter=@keyring bpf",
		"--bind=" + slots + ":" + hostpaths.HostRootHost + "/slots",
	}
	if o.Mode == "none" || o.AlsoNone {
		files = append(files,
			harness.File{Path: "/etc/systemd/system/ubt-cgroup-rw.service", Data: []byte(cgroupRWUnit), Mode: 0o644},
			harness.File{Path: "/etc/systemd/system/sysinit.target.d/ubt-cgroup-rw.conf", Data: []byte("[Unit]\nWants=ubt-cgroup-rw.service\n"), Mode: 0o644},
		)
		args = append(args, "--bind="+harness.TmpfsDir(t)+":"+none.Layout.ContainerdRoot)
	}
	return &FirstBootHost{
		Config:     cfg,
		Files:      files,
		NspawnArgs: args,
		Env:        []string{"SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=0", "SYSTEMD_NSPAWN_API_VFS_WRITABLE=1"},
		Forward:    fwd,
		mode:       o.Mode,
		alsoNone:   o.AlsoNone,
		stage:      s,
	}
}

// Machine creates the host (harness.New with Options) and, in mode none,
// copies the stage's iptables layer into its root (FirstBootHost says
// why); the host is not started.
func (h *FirstBootHost) Machine(t testing.TB, bootTimeout time.Duration, extraArgs ...string) *harness.Machine {
	t.Helper()
	m := harness.New(t, h.Options(bootTimeout, extraArgs...))
	if h.mode == "none" || h.alsoNone {
		if out, err := exec.Command("cp", "-a", filepath.Join(h.stage.Dir, "layers", "iptables")+"/.", m.Root()+"/").CombinedOutput(); err != nil {
			t.Fatalf("iptables into the test host: %v\n%s", err, out)
		}
	}
	return m
}

// Options are harness.Options for the host, with extraArgs added to its
// systemd-nspawn command line. bootTimeout bounds its boot, which includes
// the whole first boot (unbounded-bootstrap.service runs until the Node is
// Ready).
func (h *FirstBootHost) Options(bootTimeout time.Duration, extraArgs ...string) harness.Options {
	return harness.Options{
		Package:     true,
		Files:       h.Files,
		NspawnArgs:  append(append([]string(nil), h.NspawnArgs...), extraArgs...),
		Env:         h.Env,
		BootTimeout: bootTimeout,
		Network:     h.Forward.Listen,
		Layers:      h.Layers,
	}
}

// SetKubernetesVersion changes the cluster's Kubernetes version in m's
// agent.toml from from to to, as an operator does before a repave by hand.
func SetKubernetesVersion(t testing.TB, m *harness.Machine, from, to string) {
	t.Helper()
	data, err := m.ReadFile(hostpaths.ConfigFileHost)
	if err != nil {
		t.Fatal(err)
	}
	old := `kubernetes-version = "` + from + `"`
	if !strings.Contains(string(data), old) {
		t.Fatalf("agent.toml has no %s:\n%s", old, data)
	}
	m.WriteFile(hostpaths.ConfigFileHost, []byte(strings.Replace(string(data), old, `kubernetes-version = "`+to+`"`, 1)), 0o644)
}
