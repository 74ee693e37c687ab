package modes

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"unbounded-cloud.io/agent/lib/config"
	"unbounded-cloud.io/agent/lib/devices"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/state"
)

// Mode is the operation set every isolation mode implements
// (ARCHITECTURE section 2). Each mode package (lib/modes/nspawn,
// lib/modes/none) implements every method itself and asserts it with
// `var _ modes.Mode = (*Mode)(nil)`; no mode embeds another's type, so an
// operation added here is a compile error in every mode that lacks it,
// never a silent fallback to another mode's behaviour.
//
// Slots are hostpaths.Slots ("kube1", "kube2"). Which slot is active is
// the caller's record (lib/state); a mode only builds, starts and removes
// what it is told to.
type Mode interface {
	// Name is the mode's name in the config ("nspawn", "none").
	Name() string
	// NodeRoot is the root of slot's node stack file system on the host
	// (the machine's rootfs for nspawn, the host's root for none): where
	// the host finds a file the node stack names by its own path.
	NodeRoot(slot string) string
	// Installed says whether the host holds anything of this mode (a
	// slot's files or settings, installed versions), so that a reset
	// knows what to destroy.
	Installed() bool
	// InPlace says whether a repave replaces the node stack in its own
	// slot (none: the same units, a new version beside) rather than in
	// the other slot (blue/green).
	InPlace() bool
	// Prepare builds slot s.Name from s: everything the node stack needs
	// on disk, written atomically, so that Start can run it. Running it
	// again with the same input gives the same result (idempotent). It
	// refuses (ErrSlotActive) when the slot's supervising unit runs: a
	// running node is never rebuilt under its feet; Destroy it first.
	Prepare(ctx context.Context, s Slot) error
	// Start starts the slot's supervising unit(s) over D-Bus (after a
	// daemon-reload, so that the files Prepare wrote are loaded) and
	// returns when systemd's start job is done. It does not run the
	// allocation fence and does not start unbounded-node.target: the
	// caller runs the fence first and starts the target once the slot's
	// applied config is recorded (units/unbounded-node.target).
	Start(ctx context.Context, slot string) error
	// Restart restarts the node stack of slot in place, a soft reboot of
	// the node, never of the host.
	Restart(ctx context.Context, slot string) error
	// Stop stops the node stack of slot entirely (what outlives its
	// units' stop by design, such as mode none's pods, included) and
	// keeps its files, so that Start runs it again: an isolation change
	// stops the old mode's node before another mode's node takes the
	// host's network and kubelet port, and starts it again on rollback.
	// Stopping a stopped slot is not an error.
	Stop(ctx context.Context, slot string) error
	// Repave replaces the node stack running as slot `running` by s
	// (blue/green for nspawn: s.Name is the other slot; in place for
	// none: s.Name names the record, both slots are the same units).
	// The steps that are not the mode's (the fence, the health wait,
	// crash points) are h's. It is resumable: called again with the same
	// arguments after a crash at any point, it finishes or rolls back.
	// On failure it rolls back (the old stack runs again, the new one is
	// removed and checked gone) and returns an error that says so and
	// wraps ErrRolledBack; an error that does not wrap it means the
	// rollback itself failed. Recording the applied config is the
	// caller's (lib/repave), after Repave returned nil.
	Repave(ctx context.Context, running string, s Slot, h RepaveHooks) error
	// EnsureHooks makes the lifecycle hooks of the running node in slot
	// current.
	EnsureHooks(ctx context.Context, slot string) error
	// Destroy stops the slot's supervising unit(s) and removes everything
	// Prepare wrote for the slot, and checks that it is gone. Destroying a
	// slot that does not exist is not an error.
	Destroy(ctx context.Context, slot string) error
}

// KubeletClientCert is the kubelet's client certificate and key (one PEM
// file, a link to the current pair), written by its TLS bootstrap into its
// default --cert-dir, as the node stack sees its own file system.
const KubeletClientCert = "/var/lib/kubelet/pki/kubelet-client-current.pem"

// KubeletCertFile is KubeletClientCert of m's slot as the host sees it.
func KubeletCertFile(m Mode, slot string) string {
	return filepath.Join(m.NodeRoot(slot), KubeletClientCert)
}

// TargetSlot is the slot a repave of m builds the new stack into when
// running serves.
func TargetSlot(m Mode, running string) string {
	if m.InPlace() {
		return running
	}
	return hostpaths.OtherSlot(running)
}

// ErrNotImplemented is returned by an operation a mode does not carry in
// this release (a Repave or EnsureHooks it has no body for), having changed
// nothing: a repave that gets it leaves the host as it was, and lifecycle
// skips the hooks. A caller maps it to exit 1.
var ErrNotImplemented = errors.New("not implemented in this release")

// ErrRolledBack is wrapped by a Repave error after which the old node
// stack runs again and the new one is gone: the host is as it was before
// the repave (apart from the drain, which the caller undoes).
var ErrRolledBack = errors.New("rolled back to the previous node stack")

// RepaveHooks are the steps of a repave that are not the mode's.
type RepaveHooks struct {
	// Fence is called once the old stack is stopped and before the new
	// one starts (and again before a rollback starts the old one): it
	// runs the allocation fence (unbounded-fence.service); nil error
	// means allowed, and a mode starts nothing after an error. It is
	// also the caller's step between the stacks: lib/repave deletes the
	// Node here, when no old kubelet is left to register it again.
	Fence func(ctx context.Context) error
	// Healthy waits, bounded, until the node stack of slot is healthy
	// (kubelet healthz, and the Node Ready when the cluster is reachable).
	Healthy func(ctx context.Context, slot string) error
	// Crash is called at each named step ("repave/<point>", lib/crashpoint).
	Crash func(point string)
}

// ErrHookMissing: a repave was asked without its fence or its health
// wait. It fails closed: no new node starts unfenced, and none counts as
// up unchecked.
var ErrHookMissing = errors.New("a repave needs its Fence and Healthy hooks")

// Check refuses hooks without a Fence or Healthy (ErrHookMissing); a nil
// Crash is none.
func (h RepaveHooks) Check() error {
	var missing []string
	if h.Fence == nil {
		missing = append(missing, "Fence")
	}
	if h.Healthy == nil {
		missing = append(missing, "Healthy")
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w (missing: %s)", ErrHookMissing, strings.Join(missing, ", "))
	}
	return nil
}

// ErrSlotActive is returned by Prepare for a slot whose supervising unit is
// active or activating.
var ErrSlotActive = errors.New("the slot's node stack is running")

// Artifacts are the node stack's files, verified by lib/artifacts (paths
// of files in its cache; the mode copies them, it never moves them).
type Artifacts struct {
	// Kubelet is the kubelet executable.
	Kubelet string
	// Containerd is a .tar.gz holding bin/containerd,
	// bin/containerd-shim-runc-v2 and friends (the upstream release
	// layout); every regular file in it is installed by its base name.
	Containerd string
	// Runc is the runc executable.
	Runc string
	// CNIPlugins is a .tar.gz of CNI plugins (bridge, host-local,
	// loopback, portmap, ...), installed by base name.
	CNIPlugins string
	// CoreDNS is a .tar.gz holding the coredns executable (CoreDNS's
	// release layout), the node-local DNS cache; "" when Node.LocalDNS
	// is off.
	CoreDNS string
}

// ArtifactsByName builds Artifacts from verified files keyed by artifact
// name (lib/artifacts' names: kubelet, containerd, runc, cni-plugins, and
// coredns when fetched; others, such as crictl, are not installed by the
// modes in this release). Missing one of the first four is an error naming
// it; a node with the local DNS cache and no coredns fails at prepare. It takes a map rather
// than lib/artifacts' results so that this package, which the operator
// CLI links, does not link an HTTP client.
func ArtifactsByName(files map[string]string) (Artifacts, error) {
	a := Artifacts{Kubelet: files["kubelet"], Containerd: files["containerd"], Runc: files["runc"], CNIPlugins: files["cni-plugins"], CoreDNS: files["coredns"]}
	for _, n := range []string{"kubelet", "containerd", "runc", "cni-plugins"} {
		if files[n] == "" {
			return Artifacts{}, fmt.Errorf("artifact %s: no verified file", n)
		}
	}
	return a, nil
}

// Node is the node configuration a mode writes for the node stack.
type Node struct {
	// Name is the Machine's name: the Node name and the host name of the
	// node stack.
	Name string
	// APIServer is the https:// URL of the API server.
	APIServer string
	// CACert is the PEM of the cluster CA (kubelet's TLS bootstrap and its
	// client CA).
	CACert []byte
	// BootstrapToken is the bootstrap token; written only into the
	// bootstrap kubeconfig, mode 0600, never logged.
	BootstrapToken config.Secret
	// KubernetesVersion is the kubelet's version (MAJOR.MINOR.PATCH, with
	// or without the "v"); the none mode names its version directory after
	// it.
	KubernetesVersion string
	// ClusterDNS is the cluster DNS service IP.
	ClusterDNS string
	// ClusterDomain is the cluster's DNS domain; "" is "cluster.local".
	ClusterDomain string
	Labels        map[string]string
	// Taints are "key=value:Effect" or "key:Effect" (validated by
	// lib/config).
	Taints []string
	// SandboxImage is containerd's pause image.
	SandboxImage string
	// PodCIDR, when set, makes the mode write a bridge CNI config
	// (bridge + host-local in this range + portmap; loopback is set up by
	// containerd's CRI plugin itself from the installed plugins). Empty:
	// no CNI config is written, the cluster's CNI brings its own.
	PodCIDR string
	// SelfSignedServingCert makes the kubelet serve port 10250 with a
	// certificate of its own making; false (node.serving-cert "cluster")
	// has it ask the cluster for one (serverTLSBootstrap).
	SelfSignedServingCert bool
	// IPs is the Node's address (one, or one of each family): the
	// kubelet's --node-ip and the node's /etc/hosts entry for Name. Empty
	// where the host has no default route and none is configured.
	IPs []netip.Addr
	// CDI turns on containerd's Container Device Interface (containerd
	// 1.7 and later): containers get the devices a CDI specification in
	// /etc/cdi describes (the node's NVIDIA GPUs: lib/devices.CDISpec).
	CDI bool
	// LocalDNS runs the node-local DNS cache (lib/modes/nodestack's
	// LocalDNSFiles) and makes it the kubelet's clusterDNS.
	LocalDNS bool
	// ShutdownGracePeriod and ShutdownGracePeriodCriticalPods are the
	// kubelet's graceful node shutdown (node.shutdown-grace-period and
	// node.shutdown-grace-period-critical-pods); 0 turns it off.
	ShutdownGracePeriod, ShutdownGracePeriodCriticalPods time.Duration
}

// Slot is what Prepare builds.
type Slot struct {
	// Name is the slot, "kube1" or "kube2".
	Name      string
	Node      Node
	Artifacts Artifacts
	// Image is the rootfs image of modes that run the node stack in a
	// machine (nspawn); ignored by none.
	Image Image
	// Devices are the rules for the host devices the node is given
	// (lib/devices), by modes that run it in a machine; none runs on the
	// host and has them all.
	Devices devices.Options
	// RDMAModules loads rdma_ucm and ib_umad before the devices are found.
	RDMAModules bool
}

// Image says where a machine's rootfs comes from.
type Image struct {
	// Ref is an image reference: a registry reference
	// ("registry.example/node:1.36.3", "...@sha256:..."),
	// "oci-layout:DIR[:TAG]" (an OCI image layout directory) or
	// "docker-archive:FILE[:TAG]" (a `docker save` tarball).
	Ref string
	// OfflineDir, when set, is searched first for a registry reference:
	// OfflineDir/images is an OCI image layout, and an image whose
	// org.opencontainers.image.ref.name (or io.containerd.image.name)
	// annotation is Ref, or Ref's tag, is used without any network.
	OfflineDir string
}

// Check reports the first missing or invalid field of s, for a clear error
// before anything on the host is touched.
func (s Slot) Check() error {
	if !hostpaths.ValidSlot(s.Name) {
		return fmt.Errorf("slot %q: must be one of %v", s.Name, hostpaths.Slots)
	}
	missing := func(what string) error { return fmt.Errorf("slot %s: %s is not set", s.Name, what) }
	switch {
	case s.Node.Name == "":
		return missing("the node name")
	case s.Node.APIServer == "":
		return missing("the API server")
	case len(s.Node.CACert) == 0:
		return missing("the cluster CA")
	case s.Node.BootstrapToken.Empty():
		return missing("the bootstrap token")
	case s.Node.KubernetesVersion == "":
		return missing("the Kubernetes version")
	case s.Node.SandboxImage == "":
		return missing("the sandbox (pause) image")
	case s.Node.LocalDNS && s.Artifacts.CoreDNS == "":
		return missing("artifact coredns (node.local-dns is on)")
	}
	for what, p := range map[string]string{
		"artifact kubelet": s.Artifacts.Kubelet, "artifact containerd": s.Artifacts.Containerd,
		"artifact runc": s.Artifacts.Runc, "artifact cni-plugins": s.Artifacts.CNIPlugins,
	} {
		if p == "" {
			return missing(what)
		}
		if fi, err := os.Stat(p); err != nil {
			return fmt.Errorf("slot %s: %s: %w", s.Name, what, err)
		} else if !fi.Mode().IsRegular() {
			return fmt.Errorf("slot %s: %s: %s is not a regular file", s.Name, what, p)
		}
	}
	return nil
}

// CheckHost runs the configuration's checks against this host (node.ip,
// devices.allow: NodeIPs, Devices), each a configuration error at its
// key's line (exit 78). The operations that change the host call it
// once, before their first change: bootstrap in its config phase, the
// repave and the isolation change in their plan, before the drain.
func CheckHost(c *config.Config) error {
	if _, err := NodeIPs(c); err != nil {
		return err
	}
	_, err := Devices(c)
	return err
}

// NodeIPs is the Node's address on this host for the configuration c
// (HostNet.NodeIPs of node.ip): a configured address that is not the
// host's is a configuration error at node.ip's line (exit 78), a host
// whose routes or addresses cannot be read an error (exit 1: the kubelet
// would otherwise look its name up). The operations that change the host
// call it before their first change.
func NodeIPs(c *config.Config) ([]netip.Addr, error) {
	configured, err := config.ParseNodeIPs(c.Node.IP)
	if err != nil {
		return nil, c.KeyError("node.ip", "%v", err)
	}
	ips, err := HostNet{}.NodeIPs(configured)
	if errors.Is(err, ErrNotTheHosts) {
		return nil, c.KeyError("node.ip", "%v", err)
	}
	if err != nil {
		return nil, fmt.Errorf("the Node's address: %w", err)
	}
	return ips, nil
}

// Devices are the device rules of c ([devices]), with each device allowed
// by path checked on this host: one that is missing, not a device, or a
// disk the host uses is a configuration error at devices.allow's line
// (exit 78). Mode none has no use for them (it runs on the host) and gets none.
// The operations that change the host call it before their first change.
func Devices(c *config.Config) (devices.Options, error) {
	if c.Mode == "none" {
		return devices.Options{}, nil
	}
	o := devices.Options{Auto: c.Devices.Auto, Allow: c.Devices.Allow, Deny: c.Devices.Deny}
	// Deny needs no host check: denying what is not there is fine.
	host := devices.Host{Root: c.Resolve("/")}
	for _, d := range o.Allow {
		if _, err := host.Discover(devices.Options{Allow: []string{d}}); err != nil {
			return devices.Options{}, c.KeyError("devices.allow", "%v", err)
		}
	}
	return o, nil
}

// ContainerdHasCDI says whether containerd version v (MAJOR.MINOR.PATCH,
// with or without "v") reads CDI specifications: 1.7 and later.
func ContainerdHasCDI(v string) bool {
	parts := strings.SplitN(strings.TrimPrefix(v, "v"), ".", 3)
	if len(parts) < 2 {
		return false
	}
	major, err1 := strconv.Atoi(parts[0])
	minor, err2 := strconv.Atoi(parts[1])
	return err1 == nil && err2 == nil && (major > 1 || major == 1 && minor >= 7)
}

// SlotFromConfig builds the Slot that the configuration c describes, with
// the verified artifacts a. It reads the CA file and the bootstrap token
// (both checked by config.Load already; read again because they can change
// on disk while the config stays the same).
func SlotFromConfig(c *config.Config, slot string, a Artifacts) (Slot, error) {
	ca, err := os.ReadFile(c.Resolve(c.Cluster.CAFile))
	if err != nil {
		return Slot{}, fmt.Errorf("cluster CA: %w", err)
	}
	tok, err := c.ReadBootstrapToken()
	if err != nil {
		return Slot{}, err
	}
	ips, err := NodeIPs(c)
	if err != nil {
		return Slot{}, err
	}
	devs, err := Devices(c)
	if err != nil {
		return Slot{}, err
	}
	s := Slot{
		Name: slot,
		Node: Node{
			Name:                            c.Machine,
			APIServer:                       c.Cluster.APIServer,
			CACert:                          ca,
			BootstrapToken:                  tok,
			KubernetesVersion:               c.Cluster.KubernetesVersion,
			ClusterDNS:                      c.Cluster.ClusterDNS,
			Labels:                          c.Node.Labels,
			Taints:                          c.Node.Taints,
			SandboxImage:                    c.Node.SandboxImage,
			PodCIDR:                         c.Node.PodCIDR,
			SelfSignedServingCert:           c.Node.ServingCert == config.ServingCertSelfSigned,
			IPs:                             ips,
			CDI:                             ContainerdHasCDI(c.Artifacts.ContainerdVersion),
			LocalDNS:                        c.Node.LocalDNS,
			ShutdownGracePeriod:             c.Node.ShutdownGracePeriod.D(),
			ShutdownGracePeriodCriticalPods: c.Node.ShutdownGracePeriodCriticalPods.D(),
		},
		Artifacts:   a,
		Image:       Image{Ref: c.Nspawn.Image},
		Devices:     devs,
		RDMAModules: c.Devices.RDMAModules && c.Mode != "none",
	}
	if c.Artifacts.OfflineDir != "" {
		s.Image.OfflineDir = c.Resolve(c.Artifacts.OfflineDir)
	}
	return s, nil
}

// SwapDir puts the finished tree tmp (made by os.MkdirTemp(dir(dst),
// "."+base(dst)+".tmp-")) at dst: rename is atomic, but only onto a missing
// or empty directory, so an existing dst is renamed aside first (as
// "."+base+".old-"+tmp's suffix) and removed after. A crash between the two
// renames leaves no dst and the old tree aside; the caller's next build
// removes the leftovers (".<base>.tmp-*", ".<base>.old-*") and builds again.
// tmp's content is synced first (state.SyncTree): its builders write
// files without a sync each, and the rename must not publish a tree a
// power cut could still empty.
func SwapDir(tmp, dst string) error {
	if err := state.SyncTree(tmp); err != nil {
		return err
	}
	if _, err := os.Lstat(dst); err == nil {
		base := filepath.Base(dst)
		suffix := strings.TrimPrefix(filepath.Base(tmp), "."+base+".tmp-")
		old := filepath.Join(filepath.Dir(dst), "."+base+".old-"+suffix)
		if err := os.Rename(dst, old); err != nil {
			return err
		}
		defer RemoveVerified(old)
	} else if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err := os.Rename(tmp, dst); err != nil {
		return err
	}
	return state.SyncDir(filepath.Dir(dst))
}

// MountPoints are the mount points of a mount table in
// /proc/self/mountinfo's format, unescaped, as the kernel names them.
func MountPoints(mountinfo []byte) []string {
	var out []string
	for _, line := range strings.Split(string(mountinfo), "\n") {
		// ID PARENT MAJ:MIN ROOT POINT ...
		if f := strings.Fields(line); len(f) >= 5 {
			out = append(out, UnescapeMountinfo(f[4]))
		}
	}
	return out
}

// RemoveVerifiedKeepingMounts removes paths as RemoveVerified does, but
// for those in mountPoints: a file system the operator mounted there (a
// disk of its own for the slots, or for /var/lib/containerd) is not the
// agent's to unmount and cannot be removed, so it is emptied and stays,
// the mount point it was. (Unmounted and removed, it would come back at
// the next boot, with what it held.) It returns the paths emptied.
func RemoveVerifiedKeepingMounts(mountPoints []string, paths ...string) (emptied []string, err error) {
	var remove []string
	for _, p := range paths {
		if !slices.Contains(mountPoints, p) {
			remove = append(remove, p)
			continue
		}
		entries, err := os.ReadDir(p)
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			remove = append(remove, filepath.Join(p, e.Name()))
		}
		emptied = append(emptied, p)
	}
	return emptied, RemoveVerified(remove...)
}

// RemoveVerified removes each path (a file, a link or a whole tree) and
// checks that it is gone: Destroy's promise is "verified gone", and a
// RemoveAll that returned nil while a bind mount kept a file busy would
// otherwise pass unnoticed.
func RemoveVerified(paths ...string) error {
	var errs []error
	for _, p := range paths {
		if err := os.RemoveAll(p); err != nil {
			errs = append(errs, err)
			continue
		}
		if _, err := os.Lstat(p); err == nil {
			errs = append(errs, fmt.Errorf("%s is still there after removal", p))
		} else if !os.IsNotExist(err) {
			errs = append(errs, err)
		}
		// The removal must survive a power cut: sync the parent.
		if d, err := os.Open(filepath.Dir(p)); err == nil {
			d.Sync()
			d.Close()
		}
	}
	return errors.Join(errs...)
}
