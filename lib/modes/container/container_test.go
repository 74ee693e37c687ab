package container

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/modes"
	"unbounded-cloud.io/agent/lib/modes/bluegreen/tree"
	"unbounded-cloud.io/agent/lib/modes/container/bundle"
	"unbounded-cloud.io/agent/lib/modes/modestest"
)

const mountsLegacy = `32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,xattr,name=systemd
`

// image is an OCI layout holding a node image: an OS tree with a systemd
// (or, withInit false, without one).
func image(t *testing.T, withInit bool) string {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, d := range []string{"usr/", "usr/lib/", "usr/lib/systemd/", "etc/", "usr/sbin/"} {
		tw.WriteHeader(&tar.Header{Name: d, Typeflag: tar.TypeDir, Mode: 0o755})
	}
	files := map[string]string{"etc/os-release": "ID=debian\n", "usr/sbin/iptables-save": "#!/bin/sh\n"}
	if withInit {
		files["usr/lib/systemd/systemd"] = "\x7fELF"
	}
	for n, data := range files {
		tw.WriteHeader(&tar.Header{Name: n, Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(data))})
		tw.Write([]byte(data))
	}
	tw.Close()
	data := b.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, l)
	if err != nil {
		t.Fatal(err)
	}
	img, err = mutate.ConfigFile(img, &v1.ConfigFile{OS: "linux", Architecture: "amd64", RootFS: v1.RootFS{Type: "layers"}})
	if err != nil {
		t.Fatal(err)
	}
	if d, err := l.DiffID(); err == nil {
		cf, _ := img.ConfigFile()
		cf.RootFS.DiffIDs = []v1.Hash{d}
		img, _ = mutate.ConfigFile(img, cf)
	}
	dir := filepath.Join(t.TempDir(), "layout")
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	return "oci-layout:" + dir
}

type fixture struct {
	m    *Mode
	sd   *modestest.Systemd
	p    hostpaths.Paths
	slot modes.Slot
}

var testCaps = []string{"CAP_CHOWN", "CAP_NET_ADMIN", "CAP_SYS_ADMIN"}

func newFixture(t *testing.T, withInit bool) *fixture {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: unpacking a rootfs restores its owners (chown)")
	}
	f := &fixture{sd: &modestest.Systemd{}, p: hostpaths.New(t.TempDir())}
	resolv := filepath.Join(t.TempDir(), "resolv.conf")
	os.WriteFile(resolv, []byte("nameserver 127.0.0.153\n"), 0o644)
	f.m = &Mode{
		Paths: f.p,
		Host: modes.Host{ReadFile: func(p string) ([]byte, error) {
			if p == "/proc/self/mountinfo" {
				return []byte(mountsLegacy), nil
			}
			return nil, fs.ErrNotExist
		}},
		Systemd:        f.sd.Dial,
		ResolvConf:     resolv,
		BoundingSet:    func() ([]string, error) { return testCaps, nil },
		NetworkCleaner: func(context.Context, string) {},
		Log:            slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	f.slot = modes.Slot{Name: "kube1", Node: modestest.Node(), Artifacts: modestest.Artifacts(t), Image: modes.Image{Ref: image(t, withInit)}}
	return f
}

func readSpec(t *testing.T, p hostpaths.Paths, slot string) specs.Spec {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(bundle.Dir(p, slot), bundle.ConfigFile))
	if err != nil {
		t.Fatal(err)
	}
	var s specs.Spec
	if err := json.Unmarshal(data, &s); err != nil {
		t.Fatalf("config.json: %v", err)
	}
	return s
}

// Prepare builds the slot's bundle: the nspawn machine's rootfs (its
// units, node files and artifacts) and a config.json that systemd-nspawn
// 252 takes (version 1.0.0), running the image's systemd with the host's
// network, every capability given, /dev/kmsg and the slot's containerd
// store bound in; Start starts the slot's unit; Destroy leaves nothing.
func TestPrepareBuildsABundleThatRunsTheNodesSystemd(t *testing.T) {
	f := newFixture(t, true)
	ctx := context.Background()
	if err := f.m.Prepare(ctx, f.slot); err != nil {
		t.Fatal(err)
	}
	root := f.m.NodeRoot("kube1")
	if root != filepath.Join(f.p.SlotDir("kube1"), "bundle", "rootfs") {
		t.Errorf("NodeRoot = %s", root)
	}
	for _, p := range []string{"/etc/systemd/system/" + tree.KubeletUnit, "/etc/systemd/system/" + tree.ContainerdUnit,
		tree.Layout.BinDir + "/kubelet", tree.StopConf, "/etc/hostname"} {
		if _, err := os.Stat(filepath.Join(root, p)); err != nil {
			t.Errorf("the container's rootfs lacks %s: %v", p, err)
		}
	}
	s := readSpec(t, f.p, "kube1")
	if s.Version != "1.0.0" {
		t.Errorf("ociVersion %q: systemd-nspawn 252 reads only 1.0.0", s.Version)
	}
	if s.Process == nil || !slices.Equal(s.Process.Args, []string{"/usr/lib/systemd/systemd"}) {
		t.Errorf("process %+v, want the image's systemd", s.Process)
	}
	if s.Root == nil || s.Root.Path != bundle.RootfsDir || s.Root.Readonly {
		t.Errorf("root %+v", s.Root)
	}
	if s.Hostname != f.slot.Node.Name {
		t.Errorf("hostname %q, want the Machine's name %q", s.Hostname, f.slot.Node.Name)
	}
	var ns []specs.LinuxNamespaceType
	for _, n := range s.Linux.Namespaces {
		ns = append(ns, n.Type)
	}
	for _, want := range []specs.LinuxNamespaceType{specs.PIDNamespace, specs.MountNamespace, specs.CgroupNamespace} {
		if !slices.Contains(ns, want) {
			t.Errorf("namespaces %v lack %s", ns, want)
		}
	}
	for _, never := range []specs.LinuxNamespaceType{specs.NetworkNamespace, specs.UserNamespace} {
		if slices.Contains(ns, never) {
			t.Errorf("namespaces %v have %s: the node uses the host's network and users", ns, never)
		}
	}
	if c := s.Process.Capabilities; c == nil || !slices.Equal(c.Bounding, testCaps) || !slices.Equal(c.Effective, testCaps) {
		t.Errorf("capabilities %+v, want the bounding set %v", c, testCaps)
	}
	mounts := map[string]string{}
	for _, m := range s.Mounts {
		mounts[m.Destination] = m.Source
	}
	if mounts["/dev/kmsg"] != "/dev/kmsg" || mounts["/var/lib/containerd"] != "/var/lib/unbounded/slots/kube1/containerd" {
		t.Errorf("mounts %v", mounts)
	}
	if _, err := os.Stat(f.p.Join("/var/lib/unbounded/slots/kube1/containerd")); err != nil {
		t.Errorf("the containerd store: %v", err)
	}
	if env, err := os.ReadFile(filepath.Join(bundle.Dir(f.p, "kube1"), bundle.EnvFile)); err != nil || !strings.Contains(string(env), "\nSYSTEMD_NSPAWN_UNIFIED_HIERARCHY=0\n") {
		t.Errorf("nspawn.env on a legacy host: %v\n%s", err, env)
	}
	for _, p := range []string{bundle.ConfigFile, bundle.EnvFile} {
		if fi, err := os.Stat(filepath.Join(bundle.Dir(f.p, "kube1"), p)); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v %v, want 0600 (it names the node's settings)", p, fi, err)
		}
	}
	if !f.m.Installed() {
		t.Error("Installed() false with a bundle")
	}
	// Prepared again from the same input: the same bundle, no leftovers.
	if err := f.m.Prepare(ctx, f.slot); err != nil {
		t.Fatal(err)
	}
	if l, _ := leftovers(f.p.SlotDir("kube1")); len(l) > 0 {
		t.Errorf("leftovers: %v", l)
	}
	f.sd.Calls = nil
	if err := f.m.Start(ctx, "kube1"); err != nil {
		t.Fatal(err)
	}
	if want := []string{"reload", "start unbounded-container@kube1.service"}; !slices.Equal(f.sd.Calls, want) {
		t.Errorf("Start calls %v, want %v", f.sd.Calls, want)
	}
	if err := f.m.Prepare(ctx, f.slot); err == nil {
		t.Error("Prepare of a running slot succeeded")
	}
	if err := f.m.Destroy(ctx, "kube1"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(f.p.SlotDir("kube1")); !os.IsNotExist(err) {
		t.Errorf("slot directory after Destroy: %v", err)
	}
	if f.m.Installed() {
		t.Error("Installed() true after Destroy")
	}
}

// An image without a systemd cannot be the container's init: Prepare
// says so and leaves no bundle.
func TestPrepareRefusesAnImageWithoutSystemd(t *testing.T) {
	f := newFixture(t, false)
	err := f.m.Prepare(context.Background(), f.slot)
	if err == nil || !strings.Contains(err.Error(), "no systemd") {
		t.Fatalf("Prepare: %v, want an error saying the image has no systemd", err)
	}
	if _, err := os.Lstat(bundle.Dir(f.p, "kube1")); !os.IsNotExist(err) {
		t.Errorf("bundle after a failed prepare: %v", err)
	}
	if l, _ := leftovers(f.p.SlotDir("kube1")); len(l) > 0 {
		t.Errorf("leftovers: %v", l)
	}
}

// The repave is the blue/green one: the old slot's unit stopped, the
// fence, the new slot's started, healthy.
func TestRepaveSwitchesBetweenTheSlotsContainers(t *testing.T) {
	f := newFixture(t, true)
	ctx := context.Background()
	if err := f.m.Prepare(ctx, f.slot); err != nil {
		t.Fatal(err)
	}
	if err := f.m.Start(ctx, "kube1"); err != nil {
		t.Fatal(err)
	}
	f.sd.Calls = nil
	s2 := f.slot
	s2.Name = "kube2"
	var ev []string
	h := modes.RepaveHooks{
		Fence:   func(context.Context) error { ev = append(ev, "fence"); return nil },
		Healthy: func(_ context.Context, slot string) error { ev = append(ev, "healthy "+slot); return nil },
	}
	if err := f.m.Repave(ctx, "kube1", s2, h); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range f.sd.Calls {
		if strings.HasPrefix(c, "stop") || strings.HasPrefix(c, "start") {
			got = append(got, c)
		}
	}
	if want := []string{"stop unbounded-container@kube1.service", "start unbounded-container@kube2.service"}; !slices.Equal(got, want) {
		t.Errorf("calls %v, want %v", got, want)
	}
	if want := []string{"fence", "healthy kube2"}; !slices.Equal(ev, want) {
		t.Errorf("hooks %v, want %v", ev, want)
	}
	if s := readSpec(t, f.p, "kube2"); s.Hostname != f.slot.Node.Name {
		t.Errorf("kube2's hostname %q", s.Hostname)
	}
}

func TestCapabilityNamesAreTheMasksBits(t *testing.T) {
	// This machine's bounding set: every capability but CAP_SYS_RESOURCE.
	got, err := CapabilityNames("000001fffeffffff")
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(got, "CAP_SYS_RESOURCE") || !slices.Contains(got, "CAP_SYS_ADMIN") || !slices.Contains(got, "CAP_CHECKPOINT_RESTORE") || len(got) != 40 {
		t.Errorf("CapabilityNames = %v", got)
	}
	if _, err := CapabilityNames("0000000000000001"); err == nil {
		t.Error("a mask without CAP_SYS_ADMIN was taken")
	}
	if _, err := CapabilityNames("zz"); err == nil {
		t.Error("a mask that is not hexadecimal was taken")
	}
}
