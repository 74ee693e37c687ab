// Package none is the none isolation mode (ARCHITECTURE section 2): the
// node stack runs on the host itself, as the shipped units
// unbounded-containerd.service and unbounded-kubelet.service, from
// /var/lib/unbounded/versions/<version>/ through the Current link. Mode
// implements modes.Mode; Layout says what a version directory holds and
// what stays outside it, Repave (repave.go) how a version replaces another
// in place, and EnsureHooks (hooks.go) how what the units run from is made
// current without restarting them.
package none

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/modes"
	"unbounded-cloud.io/agent/lib/modes/nodestack"
	"unbounded-cloud.io/agent/lib/modes/softreboot"
	"unbounded-cloud.io/agent/lib/state"
	"unbounded-cloud.io/agent/lib/unitnames"
	"unbounded-cloud.io/agent/lib/units"
)

// The shipped units (units/), in start order.
const (
	ContainerdUnit = unitnames.Containerd
	KubeletUnit    = unitnames.Kubelet
)

// Current is the link the shipped units run through.
const Current = hostpaths.VersionsCurrentHost

// KubeletEnv is the file of kubelet's flags, read by unbounded-kubelet.service.
const KubeletEnv = Current + "/etc/kubelet/kubelet.env"

// Layout is the node stack's layout on the host, through Current. A version
// directory holds everything that changes with the node stack:
//
//	versions/<v>/bin/          kubelet, runc, containerd, containerd-shim-runc-v2, ...
//	versions/<v>/cni/bin/      CNI plugins
//	versions/<v>/etc/          kubelet/config.yaml, kubelet/kubelet.env (flags),
//	                           kubelet/bootstrap-kubeconfig (0600), pki/ca.crt,
//	                           containerd/config.toml
//	versions/current -> <v>
//
// Generated configuration lives in the version directory, not in
// /etc/unbounded: /etc/unbounded is the operator's, and a configuration
// that moves with its binaries makes an in-place repave one link flip and
// its rollback the flip back. Node state that must outlive a version stays
// where every tool expects it: /var/lib/kubelet (kubelet's identity after
// TLS bootstrap, its kubeconfig, and pods), /var/lib/containerd and
// /run/containerd (the socket crictl finds), and the CNI configuration in
// /etc/cni/net.d (where a cluster's CNI writes too). Nothing is written
// under /usr or /opt at run time (ARCHITECTURE section 4): /usr is
// read-only on image-based hosts, and so is /opt on some.
var Layout = nodestack.Layout{
	BinDir:              Current + "/bin",
	CNIBinDir:           Current + "/cni/bin",
	CNIConfDir:          "/etc/cni/net.d",
	KubeletConfig:       Current + "/etc/kubelet/config.yaml",
	BootstrapKubeconfig: Current + "/etc/kubelet/bootstrap-kubeconfig",
	Kubeconfig:          "/var/lib/kubelet/kubeconfig",
	CACert:              Current + "/etc/pki/ca.crt",
	ContainerdConfig:    Current + "/etc/containerd/config.toml",
	ContainerdRoot:      "/var/lib/containerd",
	ContainerdState:     "/run/containerd",
	ResolvConf:          "/etc/resolv.conf",
	// Not kubelet's and containerd's defaults under /usr and /opt
	// (ARCHITECTURE section 4): both create theirs at every start.
	VolumePluginDir:  "/var/lib/kubelet/volumeplugins",
	ContainerdOptDir: "/var/lib/containerd/opt",
	// The node-local DNS cache's (unbounded-local-dns.service reads the
	// Corefile; it starts only where the version has one).
	LocalDNSCorefile: Current + "/etc/coredns/Corefile",
	PodResolvConf:    Current + "/etc/kubelet/resolv.conf",
}

// resolvedUpstream is systemd-resolved's list of the upstream servers.
const resolvedUpstream = "/run/systemd/resolve/resolv.conf"

// StateDirs are the node stack's own state directories on the host,
// removed by Destroy (after their mounts are gone).
var StateDirs = []string{"/var/lib/kubelet", "/var/lib/containerd", "/run/containerd"}

// versionRE is what may name a version directory: lib/config's version
// syntax, never "current" or a path.
var versionRE = regexp.MustCompile(`^v?[0-9]+\.[0-9]+\.[0-9]+([-+][0-9A-Za-z.+-]+)?$`)

// Mode operates the none mode on one host. The zero value is the real
// host; tests replace fields.
type Mode struct {
	Paths hostpaths.Paths
	// Host detects the cgroup hierarchy of the running kernel.
	Host modes.Host
	// Systemd connects to the service manager; nil is the system bus.
	Systemd func(ctx context.Context) (modes.Systemd, error)
	// CgroupRoot is where the cgroup hierarchies are mounted; "" is
	// /sys/fs/cgroup (not under Paths: it is the kernel's).
	CgroupRoot string
	// Unmount detaches a mount point; nil is umount2(MNT_DETACH).
	Unmount func(target string) error
	// MountInfo returns /proc/self/mountinfo; nil reads it.
	MountInfo func() ([]byte, error)
	// CleanNetwork removes the host networking a stopped node stack
	// left (repave); nil is cleanHostNetwork.
	CleanNetwork func(ctx context.Context) error
	// DeleteLink deletes a network interface; nil is rtnetlink's
	// RTM_DELLINK.
	DeleteLink func(name string) error
	// Command runs a host tool (iptables, ip6tables)
	// with stdin and returns its standard output; nil runs it.
	Command func(ctx context.Context, stdin []byte, name string, args ...string) ([]byte, error)
	// SysClassNet is where the kernel lists network interfaces; "" is
	// /sys/class/net.
	SysClassNet string
	Log         *slog.Logger
}

var _ modes.Mode = (*Mode)(nil)

// Name is "none".
func (m *Mode) Name() string { return "none" }

// NodeRoot is the host's root: the node stack runs on the host.
func (m *Mode) NodeRoot(string) string { return m.Paths.Join("/") }

// Installed: the versions directory exists.
func (m *Mode) Installed() bool {
	_, err := os.Lstat(m.Paths.VersionsDir())
	return err == nil
}

// InPlace is true: both slots are the same units (a slot only names the
// applied record, <slot>-applied-config.json); a repave installs the new
// version beside the running one and flips `current`.
func (m *Mode) InPlace() bool { return true }

func (m *Mode) log() *slog.Logger {
	if m.Log != nil {
		return m.Log
	}
	return slog.Default()
}

func (m *Mode) systemd(ctx context.Context) (modes.Systemd, error) {
	if m.Systemd != nil {
		return m.Systemd(ctx)
	}
	return units.Dial(ctx)
}

// VersionDir is the directory of version v.
func (m *Mode) VersionDir(v string) string { return filepath.Join(m.Paths.VersionsDir(), v) }

// place maps a path of Layout under Current to its place in the
// version directory dir; other paths stay host paths under the root.
func (m *Mode) place(dir, p string) (root, name string) {
	if rest, ok := strings.CutPrefix(p, Current+"/"); ok {
		return dir, "/" + rest
	}
	return m.Paths.Join("/"), p
}

// Prepare installs the node stack of s as version
// s.Node.KubernetesVersion and points `current` at it. The version
// directory is built beside (versions/.<v>.tmp-*) and renamed into place;
// `current` is flipped by renaming a new link over it. It refuses while
// the units run (modes.ErrSlotActive): the in-place replacement of a
// running stack is repave's.
func (m *Mode) Prepare(ctx context.Context, s modes.Slot) error {
	if err := s.Check(); err != nil {
		return err
	}
	v := s.Node.KubernetesVersion
	if !versionRE.MatchString(v) {
		return fmt.Errorf("prepare slot %s: version %q cannot name a directory", s.Name, v)
	}
	sd, err := m.systemd(ctx)
	if err != nil {
		return err
	}
	defer sd.Close()
	for _, u := range []string{KubeletUnit, ContainerdUnit} {
		if st, err := sd.ActiveState(ctx, u); err != nil {
			return err
		} else if unitnames.Running(st) {
			return fmt.Errorf("prepare slot %s: %w (%s is %s)", s.Name, modes.ErrSlotActive, u, st)
		}
	}
	if err := m.install(s, v); err != nil {
		return fmt.Errorf("prepare slot %s: %w", s.Name, err)
	}
	if err := m.setCNIConf(v); err != nil {
		return fmt.Errorf("prepare slot %s: %w", s.Name, err)
	}
	if err := m.flipCurrent(v); err != nil {
		return fmt.Errorf("prepare slot %s: %w", s.Name, err)
	}
	m.log().Info("slot prepared", "slot", s.Name, "mode", "none", "version", v)
	return nil
}

// cniCopy is where a version directory keeps its copy of the bridge CNI
// configuration (absent: the version has none, the cluster's CNI brings
// its own). The live file in /etc/cni/net.d is shared by every version,
// so it is set from the copy only when `current` flips (setCNIConf):
// installing a version beside a running one never changes the running
// one's network, and a rollback restores the configuration it ran.
const cniCopy = "etc/cni/" + nodestack.CNIConfName

// install builds the node stack of s as the version directory named dir
// (versions/.<dir>.tmp-* first, renamed into place). It touches nothing
// outside that directory: not `current`, not /etc/cni/net.d.
func (m *Mode) install(s modes.Slot, dir string) error {
	cgs, err := m.Host.CgroupHierarchy()
	if err != nil {
		return err
	}
	cg := nodestack.Cgroup(cgs)

	versions := m.Paths.VersionsDir()
	if err := os.MkdirAll(versions, 0o755); err != nil {
		return err
	}
	if err := removeLeftovers(versions); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(versions, "."+dir+".tmp-")
	if err != nil {
		return err
	}
	done := false
	defer func() {
		if !done {
			os.RemoveAll(tmp)
		}
	}()
	if err := os.Chmod(tmp, 0o755); err != nil {
		return err
	}
	// Artifacts and files are laid out relative to the version
	// directory: Layout's Current prefix is stripped.
	rel := func(p string) string { return strings.TrimPrefix(p, Current) }
	if err := nodestack.InstallArtifacts(s.Artifacts, tmp, nodestack.Layout{BinDir: rel(Layout.BinDir), CNIBinDir: rel(Layout.CNIBinDir)}); err != nil {
		return err
	}
	l := Layout
	// On a host that runs systemd-resolved, /etc/resolv.conf names the
	// stub 127.0.0.53, which is of no use inside a pod's network
	// namespace: kubelet gets resolved's list of upstream servers.
	if _, err := os.Stat(m.Paths.Join(resolvedUpstream)); err == nil {
		l.ResolvConf = resolvedUpstream
	}
	files, err := nodestack.Files(s.Node, l, cg)
	if err != nil {
		return err
	}
	upstream, err := os.ReadFile(m.Paths.Join(l.ResolvConf))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("resolv.conf: %w", err)
	}
	files = append(files, nodestack.LocalDNSFiles(s.Node, l, nodestack.ParseResolvConf(upstream))...)
	env := "# Written by unbounded-agent: kubelet's flags, read by " + KubeletUnit + ".\n" +
		"KUBELET_ARGS=" + strings.Join(nodestack.KubeletArgs(s.Node, Layout), " ") + "\n"
	files = append(files, nodestack.File{Path: KubeletEnv, Mode: 0o644, Data: []byte(env)})
	for _, f := range files {
		root, name := m.place(tmp, f.Path)
		if root != tmp {
			// Only the CNI configuration lives outside the version
			// directory: the version keeps a copy (cniCopy).
			if f.Path != path.Join(Layout.CNIConfDir, nodestack.CNIConfName) {
				return fmt.Errorf("%s: no place for it in a version directory", f.Path)
			}
			root, name = tmp, "/"+cniCopy
		}
		if err := nodestack.WriteFile(root, name, f.Data, f.Mode); err != nil {
			return err
		}
	}
	if err := modes.SwapDir(tmp, m.VersionDir(dir)); err != nil {
		return err
	}
	done = true
	return nil
}

// setCNIConf makes the live bridge CNI configuration version dir's:
// its copy, or none when it has no copy.
func (m *Mode) setCNIConf(dir string) error {
	live := m.Paths.Join(path.Join(Layout.CNIConfDir, nodestack.CNIConfName))
	data, err := os.ReadFile(filepath.Join(m.VersionDir(dir), cniCopy))
	if errors.Is(err, os.ErrNotExist) {
		return modes.RemoveVerified(live)
	}
	if err != nil {
		return err
	}
	if cur, err := os.ReadFile(live); err == nil && bytes.Equal(cur, data) {
		// Unchanged: no write, no change event for containerd.
		return nil
	}
	return nodestack.WriteFiles(m.Paths.Join("/"), []nodestack.File{{Path: path.Join(Layout.CNIConfDir, nodestack.CNIConfName), Mode: 0o644, Data: data}})
}

// flipCurrent points `current` at v: a new link under a temporary name,
// renamed over the old one (rename(2) replaces it atomically: a reader
// sees the old target or the new one, never no link).
func (m *Mode) flipCurrent(v string) error {
	versions := m.Paths.VersionsDir()
	tmp := filepath.Join(versions, ".current.tmp")
	os.Remove(tmp)
	if err := os.Symlink(v, tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(versions, "current")); err != nil {
		os.Remove(tmp)
		return err
	}
	return state.SyncDir(versions)
}

// CurrentVersion is the version `current` points at ("" when none).
func (m *Mode) CurrentVersion() (string, error) {
	t, err := os.Readlink(filepath.Join(m.Paths.VersionsDir(), "current"))
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	return t, err
}

func removeLeftovers(versions string) error {
	var all []string
	for _, pat := range []string{".*.tmp-*", ".*.old-*", ".current.tmp"} {
		l, err := filepath.Glob(filepath.Join(versions, pat))
		if err != nil {
			return err
		}
		all = append(all, l...)
	}
	return modes.RemoveVerified(all...)
}

// Start daemon-reloads and starts containerd, then kubelet (the units
// order themselves too; starting both waits for both jobs).
func (m *Mode) Start(ctx context.Context, slot string) error {
	if !hostpaths.ValidSlot(slot) {
		return fmt.Errorf("slot %q: must be one of %v", slot, hostpaths.Slots)
	}
	sd, err := m.systemd(ctx)
	if err != nil {
		return err
	}
	defer sd.Close()
	if err := sd.Reload(ctx); err != nil {
		return err
	}
	for _, u := range []string{ContainerdUnit, KubeletUnit} {
		if err := sd.StartUnit(ctx, u); err != nil {
			return err
		}
	}
	return nil
}

// Restart restarts containerd and kubelet. Pods keep running:
// unbounded-containerd.service has KillMode=process, so the shims and
// their containers outlive the restart, and kubelet adopts them again.
// The body is lib/modes/softreboot's, which unbounded-restart links
// without the rest of this mode.
func (m *Mode) Restart(ctx context.Context, slot string) error {
	if !hostpaths.ValidSlot(slot) {
		return fmt.Errorf("slot %q: must be one of %v", slot, hostpaths.Slots)
	}
	sd, err := m.systemd(ctx)
	if err != nil {
		return err
	}
	defer sd.Close()
	return softreboot.Restart(ctx, sd, m.Name(), slot)
}

// killWait bounds how long Destroy waits for killed pod processes to go.
const killWait = 10 * time.Second

// stopOrder is the node stack's units in the order they are stopped:
// kubelet, containerd, then the node-local DNS cache (PartOf= stops it
// with containerd, but not when containerd has stopped already: failed,
// say).
var stopOrder = []string{KubeletUnit, ContainerdUnit, unitnames.LocalDNS}

// Stop stops the node stack's units (stopOrder) and kills what they leave
// running (containerd's shims outlive it by design, and pods live in the kubepods
// cgroups: left, they would keep the host's pod network and ports from
// another mode's node); the versions and state stay, so that Start runs
// the node again (its pods are started again by the kubelet).
func (m *Mode) Stop(ctx context.Context, slot string) error {
	if !hostpaths.ValidSlot(slot) {
		return fmt.Errorf("slot %q: must be one of %v", slot, hostpaths.Slots)
	}
	sd, err := m.systemd(ctx)
	if err != nil {
		return err
	}
	defer sd.Close()
	return m.stop(ctx, sd, slot)
}

func (m *Mode) stop(ctx context.Context, sd modes.Systemd, slot string) error {
	for _, u := range stopOrder {
		st, err := sd.ActiveState(ctx, u)
		if err != nil {
			return err
		}
		if st != "inactive" && st != "failed" && st != "" {
			if err := sd.StopUnit(ctx, u); err != nil {
				return fmt.Errorf("stop slot %s: %w", slot, err)
			}
		}
	}
	if err := m.killLeftovers(ctx); err != nil {
		return fmt.Errorf("stop slot %s: %w", slot, err)
	}
	return nil
}

// Destroy stops the node stack (Stop), detaches every mount under the
// node stack's state directories (pod volumes: removing through a bind
// mount would delete the data behind it), and removes the versions, the
// state directories and the CNI configuration Prepare wrote, verifying
// each is gone.
func (m *Mode) Destroy(ctx context.Context, slot string) error {
	if !hostpaths.ValidSlot(slot) {
		return fmt.Errorf("slot %q: must be one of %v", slot, hostpaths.Slots)
	}
	sd, err := m.systemd(ctx)
	if err != nil {
		return err
	}
	defer sd.Close()
	if err := m.stop(ctx, sd, slot); err != nil {
		return fmt.Errorf("destroy slot %s: %w", slot, err)
	}
	var dirs []string
	for _, d := range StateDirs {
		dirs = append(dirs, m.Paths.Join(d))
	}
	points, err := m.unmountUnder(dirs)
	if err != nil {
		return fmt.Errorf("destroy slot %s: %w", slot, err)
	}
	remove := append([]string{m.Paths.VersionsDir(), m.Paths.Join(path.Join(Layout.CNIConfDir, nodestack.CNIConfName))}, dirs...)
	// The kubelet's own logind drop-in (its graceful node shutdown raised
	// the host's InhibitDelayMaxSec), recognized by its first line, and
	// its directory when nothing else is in it: the node's, not the
	// operator's. logind keeps the raised delay until its next start.
	override := m.Paths.Join(KubeletLogindOverride)
	if b, err := os.ReadFile(override); err == nil && strings.HasPrefix(string(b), kubeletLogindOverrideHeader) {
		if err := os.Remove(override); err != nil {
			return fmt.Errorf("destroy slot %s: %w", slot, err)
		}
		if err := os.Remove(filepath.Dir(override)); err != nil && !errors.Is(err, syscall.ENOTEMPTY) && !errors.Is(err, syscall.EEXIST) {
			m.log().Warn("the kubelet's logind drop-in directory stays", "dir", m.Paths.Rel(filepath.Dir(override)), "error", err.Error())
		}
	}
	emptied, err := modes.RemoveVerifiedKeepingMounts(points, remove...)
	if err != nil {
		return fmt.Errorf("destroy slot %s: %w", slot, err)
	}
	for _, d := range emptied {
		m.log().Info("emptied, not removed: a file system is mounted on it", "dir", m.Paths.Rel(d))
	}
	if err := sd.Reload(ctx); err != nil {
		return err
	}
	m.log().Info("slot destroyed", "slot", slot, "mode", "none")
	return nil
}

// KubeletLogindOverride is the drop-in the kubelet writes into the host's
// logind configuration when its shutdownGracePeriod is longer than
// logind's InhibitDelayMaxSec (node.shutdown-grace-period: graceful node
// shutdown); Destroy removes it.
const KubeletLogindOverride = "/etc/systemd/logind.conf.d/99-kubelet.conf"

// kubeletLogindOverrideHeader is the first line the kubelet writes there.
const kubeletLogindOverrideHeader = "# Kubelet logind override\n"

// leftoverCgroups are the cgroups (relative to each hierarchy) whose
// processes outlive the units' stop: the pods (cgroupfs and systemd
// drivers) and containerd's shims, left in its unit's cgroup by
// KillMode=process.
var leftoverCgroups = []string{"kubepods", "kubepods.slice", "system.slice/" + ContainerdUnit}

// killLeftovers SIGKILLs every process in leftoverCgroups of every
// hierarchy, until none is left or killWait has passed.
func (m *Mode) killLeftovers(ctx context.Context) error {
	root := m.CgroupRoot
	if root == "" {
		root = "/sys/fs/cgroup"
	}
	var trees []string
	for _, c := range leftoverCgroups {
		// The unified hierarchy at the root, or (hybrid) under
		// unified/, and each v1 controller's.
		m1, _ := filepath.Glob(filepath.Join(root, c))
		m2, _ := filepath.Glob(filepath.Join(root, "*", c))
		trees = append(trees, append(m1, m2...)...)
	}
	deadline := time.Now().Add(killWait)
	for {
		pids := map[int]bool{}
		for _, t := range trees {
			filepath.WalkDir(t, func(p string, d os.DirEntry, err error) error {
				if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
					return nil
				}
				data, _ := os.ReadFile(p)
				for _, f := range strings.Fields(string(data)) {
					var pid int
					// Gone already (the kernel drops a process from
					// cgroup.procs at exit; this is the race with it).
					if _, err := fmt.Sscan(f, &pid); err == nil && pid > 1 && syscall.Kill(pid, 0) != syscall.ESRCH {
						pids[pid] = true
					}
				}
				return nil
			})
		}
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%d node stack processes still alive after SIGKILL (cgroups %s)", len(pids), strings.Join(trees, ", "))
		}
		for pid := range pids {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// unmountUnder detaches every mount below dirs (pod volumes, container
// root file systems), deepest first, and returns the mount points of the
// mount table: a dir that is itself one (the operator's disk for
// /var/lib/containerd) is not the node stack's to detach, and Destroy
// empties it instead of removing it.
func (m *Mode) unmountUnder(dirs []string) ([]string, error) {
	read := m.MountInfo
	if read == nil {
		read = func() ([]byte, error) { return os.ReadFile("/proc/self/mountinfo") }
	}
	umount := m.Unmount
	if umount == nil {
		umount = func(t string) error { return unix.Unmount(t, unix.MNT_DETACH) }
	}
	data, err := read()
	if err != nil {
		return nil, err
	}
	all := modes.MountPoints(data)
	var points []string
	for _, p := range all {
		for _, d := range dirs {
			if strings.HasPrefix(p, d+"/") {
				points = append(points, p)
				break
			}
		}
	}
	slices.SortFunc(points, func(a, b string) int {
		if d := strings.Count(b, "/") - strings.Count(a, "/"); d != 0 {
			return d
		}
		return strings.Compare(a, b)
	})
	points = slices.Compact(points)
	var errs []error
	for _, p := range points {
		if err := umount(p); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", p, err))
		}
	}
	return all, errors.Join(errs...)
}
