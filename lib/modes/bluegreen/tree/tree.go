// Package tree builds the node's tree of a blue/green slot
// (ARCHITECTURE section 2): the rootfs a node image's systemd boots in,
// as an nspawn machine (lib/modes/nspawn, /var/lib/machines/<slot>) or as
// an OCI container's bundle rootfs (lib/modes/container,
// /var/lib/unbounded/slots/<slot>/bundle/rootfs). Both modes build the
// same tree: the node image resolved (image.go) and unpacked (unpack.go),
// the artifacts, the node's files and units (units.go), the offline pod
// images (podimages.go), the host devices found for the node. What only
// one mode writes beside the tree (nspawn's settings file and drop-in,
// the container's config.json) stays in that mode.
package tree

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"unbounded-cloud.io/agent/lib/devices"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/modes"
	"unbounded-cloud.io/agent/lib/modes/nodestack"
	"unbounded-cloud.io/agent/lib/modes/nspawn/machinefile"
)

// Builder builds slot trees on one host. The zero value is the real
// host; tests replace fields. A mode makes one from its own fields.
type Builder struct {
	// Paths is the host root ("" is /).
	Paths hostpaths.Paths
	// RemoteOptions are added to every registry request (a transport,
	// credentials). None by default: pulls are anonymous in this release.
	RemoteOptions []remote.Option
	// ResolvConf is the file copied into the node as /etc/resolv.conf;
	// "" is systemd-resolved's upstream list when the host runs it (the
	// stub 127.0.0.53 is of no use to pods), else the host's
	// /etc/resolv.conf.
	ResolvConf string
	// Modprobe loads kernel modules (Slot.RDMAModules); nil runs
	// modprobe(8).
	Modprobe func(ctx context.Context, modules ...string) error
	// Log receives progress lines; nil is slog.Default().
	Log *slog.Logger
}

func (b *Builder) log() *slog.Logger {
	if b.Log != nil {
		return b.Log
	}
	return slog.Default()
}

// rdmaModules give /dev/infiniband the RDMA connection manager's device
// (rdma_ucm) and the management datagram devices (ib_umad) that RDMA
// workloads open besides the verbs devices the driver makes.
var rdmaModules = []string{"rdma_ucm", "ib_umad"}

func (b *Builder) loadRDMAModules(ctx context.Context) error {
	load := b.Modprobe
	if load == nil {
		load = func(ctx context.Context, modules ...string) error {
			out, err := exec.CommandContext(ctx, "modprobe", append([]string{"-a", "--"}, modules...)...).CombinedOutput()
			if err != nil {
				return fmt.Errorf("modprobe %s: %w: %s", strings.Join(modules, " "), err, strings.TrimSpace(string(out)))
			}
			return nil
		}
	}
	if err := load(ctx, rdmaModules...); err != nil {
		return fmt.Errorf("devices.rdma-modules: %w", err)
	}
	b.log().Info("RDMA kernel modules loaded", "modules", strings.Join(rdmaModules, " "))
	return nil
}

// Build builds the node's rootfs for slot s into dir, an empty directory
// the caller made beside where the tree goes (and swaps into place, or
// removes on an error), in order:
//  1. loads the RDMA modules when Slot.RDMAModules asks;
//  2. resolves the image (Image.Ref: registry, "oci-layout:DIR[:TAG]",
//     "docker-archive:FILE[:TAG]"; a registry reference is first looked
//     up in Image.OfflineDir/images) with go-containerregistry;
//  3. takes the tree an image builder prepared (`unbounded prepare`,
//     Prepare: the host root's prepared/tree, moved onto dir by a rename)
//     when its stamp is this input's (the image's digest, the artifacts,
//     the offline pod images, the agent's version), and says which input
//     differed when it is not; else builds that host-independent part
//     (base): unpacks the image into dir (Unpack: whiteouts applied, no
//     write outside the directory), while the artifacts are installed
//     into a tree of their own (nodestack.InstallArtifacts), then moves
//     them in (nodestack.MoveArtifacts), and writes the pod images of
//     Image.OfflineDir/images as one OCI archive, imported before kubelet
//     starts (podimages.go): an offline host runs pods without a
//     registry;
//  4. writes the node configuration (nodestack.Files), the hostname (the
//     Machine's name), resolv.conf (the host's upstream servers), an
//     empty machine-id (systemd gives every copy its own at boot), and
//     the units containerd.service and kubelet.service (plus
//     unbounded-cgroup-rw.service on a legacy hierarchy), enabled;
//  5. finds the host devices the node is given (Slot.Devices: lib/devices),
//     with the CDI specification of its NVIDIA GPUs in the rootfs
//     (machinefile.Discover), and returns them.
//
// The artifacts are staged in a directory made in stageParent named
// stagePrefix* (removed before it returns; an interrupted build's is the
// caller's leftover to remove). A registry that may answer later wraps
// exitcode.ErrTemporary (exit 75); an image that does not exist wraps
// ErrImageNotFound (exit 1). The bootstrap token is written only into the
// node's bootstrap kubeconfig (0600) and appears in no error or log line.
// The nspawn mode builds its machine's rootfs with it, the container mode
// its bundle's: a node booted by systemd-nspawn either way.
func (b *Builder) Build(ctx context.Context, s modes.Slot, cg nodestack.Cgroup, dir, stageParent, stagePrefix string) (devices.Found, error) {
	if s.RDMAModules {
		if err := b.loadRDMAModules(ctx); err != nil {
			return devices.Found{}, err
		}
	}
	img, src, err := b.resolveImage(ctx, s.Image)
	if err != nil {
		return devices.Found{}, err
	}
	want, err := b.stampOf(s, img, src)
	if err != nil {
		return devices.Found{}, err
	}
	if !b.takePrepared(s.Name, want, dir) {
		if err := b.base(ctx, s, img, src, dir, stageParent, stagePrefix); err != nil {
			return devices.Found{}, err
		}
	}
	if err := b.writeNode(dir, s, cg); err != nil {
		return devices.Found{}, err
	}
	found, err := machinefile.Discover(b.Paths, dir, s.Devices)
	if err != nil {
		return devices.Found{}, fmt.Errorf("host devices: %w", err)
	}
	if len(found.Devices) > 0 {
		b.log().Info("host devices given to the node", "slot", s.Name, "devices", strings.Join(found.Paths(), " "),
			"driverFiles", len(found.DriverFiles))
	}
	return found, nil
}

// base builds the host-independent part of the tree into dir (Build's
// step 3): the image img (resolved from src) unpacked, the artifacts
// moved in, the offline pod images.
func (b *Builder) base(ctx context.Context, s modes.Slot, img v1.Image, src, dir, stageParent, stagePrefix string) error {
	// The artifacts are installed into a tree of their own while the
	// image is unpacked (both are mostly decompression and writes: a
	// core each), then moved into the rootfs by renames. Named like tmp,
	// so that an interrupted Prepare's leftovers include it.
	stage, err := os.MkdirTemp(stageParent, stagePrefix)
	if err != nil {
		return err
	}
	defer os.RemoveAll(stage)
	begin := time.Now()
	installed := make(chan error, 1)
	var artifactsTook time.Duration
	go func() {
		err := nodestack.InstallArtifacts(s.Artifacts, stage, Layout)
		artifactsTook = time.Since(begin)
		installed <- err
	}()
	stats, err := Unpack(img, dir)
	unpackTook := time.Since(begin)
	ierr := <-installed // also on an unpack error: stage is removed after
	if err != nil {
		return fmt.Errorf("node image %s: %w", src, classify(err))
	}
	// A machine's / is 0755, whatever MkdirTemp made and whatever the
	// image's "./" entry says: an image built from a 0700 directory
	// (tar -C DIR .) would otherwise lock every user but root out of the
	// machine's tree, and its dbus-daemon (user messagebus) fails, so the
	// machine never reports ready.
	if err := os.Chmod(dir, 0o755); err != nil {
		return err
	}
	// nspawn refuses a directory without /usr ("doesn't look like it has
	// an OS tree"): say so now, naming the image.
	if fi, err := os.Stat(filepath.Join(dir, "usr")); err != nil || !fi.IsDir() {
		return fmt.Errorf("node image %s has no /usr directory: not an OS tree a node can boot", src)
	}
	b.log().Info("node image unpacked", "slot", s.Name, "image", src, "took", unpackTook.Round(time.Millisecond).String(),
		"artifactsTook", artifactsTook.Round(time.Millisecond).String(), "files", stats.Files,
		"bytes", stats.Bytes, "skipped_devices", stats.Devices)
	if ierr != nil {
		return ierr
	}
	if err := nodestack.MoveArtifacts(stage, dir, Layout); err != nil {
		return err
	}
	return b.writePodImages(dir, s)
}

// StopConf bounds how long the machine's stop waits for what its units
// leave behind.
const StopConf = "/etc/systemd/system.conf.d/50-unbounded-node.conf"

const stopConfText = `# Written by unbounded-agent: how long the node machine's stop may take.
# Pods' processes live in the kubelet's pod cgroups, outside any unit, and
# a container's PID 1 ignores SIGTERM unless it handles it: at the final
# kill of a stop, systemd would wait its default 90 s for each such process
# before SIGKILL, holding systemd-nspawn@<slot>.service's stop (a host
# reboot, a restart, a repave's switch) for that long. A graceful end of
# the pods is the kubelet's (graceful node shutdown, node.shutdown-grace-period:
# the machine's stop goes through its logind, and the kubelet ends them
# before its units stop) and the drain's, before a repave; what is left
# by then is killed 10 s after its SIGTERM.
[Manager]
DefaultTimeoutStopSec=10s
`

// writeNode writes the node configuration and units into the rootfs.
func (b *Builder) writeNode(rootfs string, s modes.Slot, cg nodestack.Cgroup) error {
	files, err := nodestack.Files(s.Node, Layout, cg)
	if err != nil {
		return err
	}
	resolv, err := b.resolvConf()
	if err != nil {
		return err
	}
	units := "/etc/systemd/system"
	files = append(files,
		nodestack.File{Path: "/etc/hostname", Mode: 0o644, Data: []byte(s.Node.Name + "\n")},
		nodestack.File{Path: "/etc/resolv.conf", Mode: 0o644, Data: resolv},
		nodestack.File{Path: "/etc/hosts", Mode: 0o644, Data: nodestack.Hosts(s.Node)},
		// Empty: systemd gives the machine an id of its own at its first
		// boot, so two slots (and every copy of one image) differ, as
		// kubelet's machine ID and the journal expect.
		nodestack.File{Path: "/etc/machine-id", Mode: 0o444, Data: nil},
		nodestack.File{Path: units + "/" + ContainerdUnit, Mode: 0o644, Data: []byte(containerdUnit(cg, s.Node.LocalDNS))},
		nodestack.File{Path: units + "/" + KubeletUnit, Mode: 0o644, Data: []byte(kubeletUnit(s.Node))},
		nodestack.File{Path: StopConf, Mode: 0o644, Data: []byte(stopConfText)},
	)
	files = append(files, nodestack.LogindFiles(s.Node)...)
	enabled := []string{ContainerdUnit, KubeletUnit}
	if s.Node.LocalDNS {
		dns, err := LocalDNSUnitFile()
		if err != nil {
			return err
		}
		files = append(files, nodestack.LocalDNSFiles(s.Node, Layout, nodestack.ParseResolvConf(resolv))...)
		files = append(files, nodestack.File{Path: units + "/" + LocalDNSUnit, Mode: 0o644, Data: dns})
		enabled = append(enabled, LocalDNSUnit)
	}
	if cg == nodestack.Legacy {
		files = append(files,
			nodestack.File{Path: units + "/" + CgroupRWUnit, Mode: 0o644, Data: []byte(cgroupRWUnitText)},
			nodestack.File{Path: cgroupRWScript, Mode: 0o755, Data: []byte(cgroupRWScriptText)},
		)
		enabled = append(enabled, CgroupRWUnit)
	}
	if err := nodestack.WriteFiles(rootfs, files); err != nil {
		return err
	}
	// D-Bus reads /var/lib/dbus/machine-id: a link keeps it the one
	// systemd writes.
	if err := symlinkUnder(rootfs, "/var/lib/dbus/machine-id", "/etc/machine-id"); err != nil {
		return err
	}
	for _, u := range enabled {
		if err := symlinkUnder(rootfs, units+"/multi-user.target.wants/"+u, units+"/"+u); err != nil {
			return err
		}
	}
	return nil
}

// writePodImages puts the offline directory's pod images into the
// machine, with the unit that imports them (podimages.go).
func (b *Builder) writePodImages(rootfs string, s modes.Slot) error {
	names, err := writePodImages(rootfs, s.Image)
	if err != nil || len(names) == 0 {
		return err
	}
	if _, err := os.Stat(filepath.Join(rootfs, Layout.BinDir, "ctr")); err != nil {
		return fmt.Errorf("offline pod images: importing them needs ctr, which the containerd artifact does not hold: %w", err)
	}
	units := "/etc/systemd/system"
	if err := nodestack.WriteFile(rootfs, units+"/"+PodImagesUnit, []byte(podImagesUnitText()), 0o644); err != nil {
		return err
	}
	if err := symlinkUnder(rootfs, units+"/multi-user.target.wants/"+PodImagesUnit, units+"/"+PodImagesUnit); err != nil {
		return err
	}
	b.log().Info("offline pod images staged", "slot", s.Name, "images", strings.Join(names, " "))
	return nil
}

// symlinkUnder makes name (a path inside rootfs) a symlink to target,
// replacing what is there; no directory on the way may be a symlink.
func symlinkUnder(rootfs, name, target string) error {
	dir, err := nodestack.MkdirUnder(rootfs, filepath.Dir(name))
	if err != nil {
		return err
	}
	p := filepath.Join(dir, filepath.Base(name))
	if err := os.RemoveAll(p); err != nil {
		return err
	}
	return os.Symlink(target, p)
}

func (b *Builder) resolvConf() ([]byte, error) {
	candidates := []string{b.ResolvConf}
	if b.ResolvConf == "" {
		candidates = []string{b.Paths.Join("/run/systemd/resolve/resolv.conf"), b.Paths.Join("/etc/resolv.conf")}
	}
	for _, c := range candidates {
		data, err := os.ReadFile(c)
		if err == nil {
			return append([]byte("# Copied by unbounded-agent from the host's "+b.Paths.Rel(c)+" at prepare.\n"), data...), nil
		}
		if !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("resolv.conf: %w", err)
		}
	}
	// A host without any: the node resolves nothing but cluster names.
	return []byte("# The host had no resolv.conf at prepare.\n"), nil
}
