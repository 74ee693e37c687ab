package system_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/tests/system/harness"
)

// An image builder prepares an image (`unbounded prepare --root DIR`, the
// image's own agent: the artifacts verified into its cache, the node
// image unpacked with them into /var/lib/unbounded/prepared); two hosts
// booted from copies of it take the prepared tree at their first boot
// instead of unpacking the node image, and are two distinct hosts (their
// own Node names, machine-ids, client certificates), both Ready with a
// pod each. A third host, whose config names another node image than the
// one prepared, builds its tree as without one and says which input
// differed (issue 42).
func TestFirstBootsFromAPreparedImage(t *testing.T) {
	defer scenario(t)()
	// (One registry for the three: the shared one.)
	hosts := []*firstBoot{newFirstBoot(t, firstBootOptions{}), newFirstBoot(t, firstBootOptions{}), newFirstBoot(t, firstBootOptions{})}
	image := hosts[0]

	// The image: prepared in the first host's root, before it ever booted,
	// by the CLI of the agent installed into it.
	begin := time.Now()
	out, err := prepareImage(image)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("unbounded prepare: %v\n%s", time.Since(begin).Round(time.Millisecond), out)
	prepared := image.paths.PreparedDir()
	if _, err := os.Stat(filepath.Join(prepared, "tree", "usr")); err != nil {
		t.Fatalf("nothing prepared: %v", err)
	}
	// Its copies: what prepare wrote under the host root, into the other
	// hosts' roots as an image copy carries it.
	for _, h := range hosts[1:] {
		root := h.paths.HostRoot()
		if err := os.MkdirAll(root, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := copyPrepared(image, root); err != nil {
			t.Fatal(err)
		}
	}
	// The third host's config names the node image under another tag.
	other := hosts[2].setNodeImage(t, "other")

	for _, h := range hosts {
		begin := time.Now()
		h.m.Start()
		t.Logf("%s: first boot %v", h.name, time.Since(begin).Round(time.Millisecond))
	}
	for i, h := range hosts {
		p := waitUnitDone(t, h, bootstrapUnit, "", 8*time.Minute)
		j := h.m.Journal(bootstrapUnit)
		if p["ExecMainStatus"] != "0" {
			t.Fatalf("%s: first boot failed: %v\n%s", h.name, p, j)
		}
		taken := strings.Contains(j, "prepared by the image builder: taken")
		unpacked := strings.Contains(j, "node image unpacked")
		switch {
		case i < 2 && (!taken || unpacked):
			t.Errorf("%s (a copy of the prepared image): taken %v, unpacked %v; want the prepared tree taken:\n%s", h.name, taken, unpacked, j)
		case i == 2 && (taken || !unpacked || !strings.Contains(j, "the config names "+other)):
			t.Errorf("%s (another node image): taken %v, unpacked %v; want the tree built, saying the config names %s:\n%s", h.name, taken, unpacked, other, j)
		}
		if _, err := os.Stat(filepath.Join(h.paths.PreparedDir(), "tree")); !os.IsNotExist(err) {
			t.Errorf("%s: a prepared tree is left after the first boot (%v)", h.name, err)
		}
	}
	if t.Failed() {
		return
	}
	// Distinct hosts: their own Node, machine-ids (the host's and the
	// node machine's) and client certificates; each Ready with a pod.
	seen := map[string]string{}
	distinct := func(what, v, host string) {
		if v == "" {
			t.Errorf("%s: no %s", host, what)
		} else if o, dup := seen[what+"="+v]; dup {
			t.Errorf("%s and %s have the same %s %q", o, host, what, v)
		}
		seen[what+"="+v] = host
	}
	for _, h := range hosts[:2] {
		h.wantBootstrapped(t, "nspawn", "systemd-nspawn@kube1.service")
		h.runPod(t)
		id, _ := h.m.ReadFile("/etc/machine-id")
		distinct("host machine-id", strings.TrimSpace(string(id)), h.name)
		nid, _ := os.ReadFile(filepath.Join(h.m.Root(), hostpaths.MachinesDirHost, "kube1", "etc/machine-id"))
		distinct("node machine-id", strings.TrimSpace(string(nid)), h.name)
		hn, _ := os.ReadFile(filepath.Join(h.m.Root(), hostpaths.MachinesDirHost, "kube1", "etc/hostname"))
		if strings.TrimSpace(string(hn)) != h.name {
			t.Errorf("%s: the node's hostname is %q", h.name, hn)
		}
		// (kubelet-client-current.pem links to one of these by an
		// absolute path inside the node.)
		certs, _ := filepath.Glob(filepath.Join(h.m.Root(), hostpaths.MachinesDirHost, "kube1", "var/lib/kubelet/pki/kubelet-client-2*.pem"))
		var cert []byte
		if len(certs) > 0 {
			cert, _ = os.ReadFile(certs[len(certs)-1])
		}
		distinct("kubelet client certificate", string(cert), h.name)
		n, err := h.env.kube.CoreV1().Nodes().Get(context.Background(), h.name, metav1.GetOptions{})
		if err != nil {
			t.Errorf("%s: its Node: %v", h.name, err)
		} else {
			distinct("Node UID", string(n.UID), h.name)
		}
	}
}

// preparedImage is the run's prepared image (sharedPreparedImage).
var preparedImage struct {
	once sync.Once
	dir  string
	err  error
}

// sharedPreparedImage returns a layer (harness.Options.Layers) holding
// what `unbounded prepare` writes under the host root of a host of the
// default config (mode nspawn, the shared registry's node image, the
// staged artifacts): prepared/ (the node image unpacked with the
// artifacts, and its stamp) and artifacts/ (the verified cache). It is
// made once per test process, by a host that never boots: the scenarios
// that start from a Ready node of that config boot from it
// (firstBootOptions.prepared) as a fleet's hosts boot from one OS image,
// and take the prepared tree instead of each unpacking the node image.
// TestFirstBootsFromAPreparedImage tests that path itself (and that hosts
// from one image are distinct hosts).
func sharedPreparedImage(t *testing.T) string {
	t.Helper()
	preparedImage.once.Do(func() {
		// Set first: a t.Fatal in the making ends it without a result.
		preparedImage.err = fmt.Errorf("its making failed in %s", t.Name())
		preparedImage.dir, preparedImage.err = makePreparedImage(t)
	})
	if preparedImage.err != nil {
		t.Fatalf("the run's prepared image: %v", preparedImage.err)
	}
	return preparedImage.dir
}

func makePreparedImage(t *testing.T) (string, error) {
	image := newFirstBoot(t, firstBootOptions{})
	begin := time.Now()
	if _, err := prepareImage(image); err != nil {
		return "", err
	}
	dir, err := os.MkdirTemp("", "unbounded-prepared-image-")
	if err != nil {
		return "", err
	}
	harness.AtExit(func() { os.RemoveAll(dir) })
	// The layer's directories above the host root show through on every
	// host: the modes of the rootfs's own.
	for _, d := range []string{"var", "var/lib"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			return "", err
		}
	}
	root := filepath.Join(dir, hostpaths.HostRootHost)
	if err := os.Mkdir(root, 0o700); err != nil {
		return "", err
	}
	if err := copyPrepared(image, root); err != nil {
		return "", err
	}
	t.Logf("the run's prepared image: made in %v (%s)", time.Since(begin).Round(time.Millisecond), dir)
	return dir, nil
}

// prepareImage runs the image's own `unbounded prepare --root` in the root
// of image, a host that never booted, as an image builder does.
func prepareImage(image *firstBoot) ([]byte, error) {
	out, err := exec.Command(filepath.Join(image.m.Root(), "usr/bin/unbounded"), "prepare", "--root", image.m.Root()).CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("unbounded prepare --root %s: %v\n%s", image.m.Root(), err, out)
	}
	return out, nil
}

// copyPrepared copies what prepare wrote under image's host root (the
// prepared tree and the verified artifacts) into root, as a copy of the
// image carries them.
func copyPrepared(image *firstBoot, root string) error {
	for _, d := range []string{"prepared", "artifacts"} {
		if out, err := exec.Command("cp", "-a", filepath.Join(image.paths.HostRoot(), d), root+"/").CombinedOutput(); err != nil {
			return fmt.Errorf("copy %s of the prepared image: %v\n%s", d, err, out)
		}
	}
	return nil
}
