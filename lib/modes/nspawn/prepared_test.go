package nspawn

import (
	"archive/tar"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/modes/bluegreen/tree"
	"unbounded-cloud.io/agent/lib/modes/bluegreen/tree/treetest"
)

// An image builder prepares the host-independent part of the tree
// (`unbounded prepare`: tree.Builder.Prepare) into the image's host root;
// the first slot build of a host booted from it takes that tree instead
// of unpacking the image and installing the artifacts again, and writes
// only what is the host's. The tree is the same as one built from
// scratch.
func TestPrepareTakesTheTreeAnImageBuilderPrepared(t *testing.T) {
	treetest.RequireRoot(t)
	ref := treetest.ServeRegistry(t, "unbounded/node:1.36.3", treetest.NodeImage(t))
	f := newFixture(t, mountsLegacy, ref)
	ctx := context.Background()
	b := &tree.Builder{Paths: f.p, Log: f.m.Log}
	st, err := b.Prepare(ctx, f.slot)
	if err != nil {
		t.Fatal(err)
	}
	prepared := filepath.Join(f.p.PreparedDir(), "tree")
	if st.Image != ref || !strings.HasPrefix(st.Digest, "sha256:") || st.Artifacts["kubelet"] == "" || strings.HasPrefix(st.Artifacts["kubelet"], f.root) {
		t.Errorf("stamp %+v: want the image, its digest, the artifacts relative to the root", st)
	}
	for _, p := range []string{"usr/bin/sh", "usr/local/bin/kubelet"} {
		if _, err := os.Stat(filepath.Join(prepared, p)); err != nil {
			t.Errorf("prepared tree: %v", err)
		}
	}
	// Nothing of the host's: no name, no token, no node files.
	if _, err := os.Stat(filepath.Join(prepared, "etc/hostname")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the prepared tree has a hostname (%v): nothing host-specific may be baked", err)
	}
	mark := filepath.Join(prepared, "prepared-by-the-image-builder")
	os.WriteFile(mark, []byte("x"), 0o644)

	f.logs.Reset()
	if err := f.m.Prepare(ctx, f.slot); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(f.rootfs("prepared-by-the-image-builder")); err != nil {
		t.Errorf("the slot's tree is not the prepared one: %v\n%s", err, f.logs)
	}
	if strings.Contains(f.logs.String(), "node image unpacked") || !strings.Contains(f.logs.String(), "taken") {
		t.Errorf("the build unpacked the image although a matching tree was prepared:\n%s", f.logs)
	}
	f.checkTree(t, "legacy")
	f.checkMachineSettings(t, "legacy")
	f.noLeftovers(t)
	for _, p := range []string{prepared, filepath.Join(f.p.PreparedDir(), "stamp.json")} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s after the tree was taken: %v", p, err)
		}
	}
}

// A prepared tree of another input is not taken: the slot is built as
// without one, the build says which input differed, and the stale tree
// goes.
func TestPrepareBuildsWhenThePreparedTreeIsOfAnotherImage(t *testing.T) {
	treetest.RequireRoot(t)
	ref := treetest.ServeRegistry(t, "unbounded/node:1.36.3", treetest.NodeImage(t))
	other := treetest.ServeRegistry(t, "unbounded/node:1.36.3", treetest.Image(t, treetest.Layer(t,
		treetest.Entry{Name: "usr/", Typ: tar.TypeDir}, treetest.Entry{Name: "usr/other", Body: "another image"})))
	f := newFixture(t, mountsLegacy, other)
	ctx := context.Background()
	b := &tree.Builder{Paths: f.p, Log: f.m.Log}
	if _, err := b.Prepare(ctx, f.slot); err != nil {
		t.Fatal(err)
	}
	f.slot.Image.Ref = ref
	f.logs.Reset()
	if err := f.m.Prepare(ctx, f.slot); err != nil {
		t.Fatal(err)
	}
	logs := f.logs.String()
	if !strings.Contains(logs, "node image unpacked") || !strings.Contains(logs, "differs") || !strings.Contains(logs, "the config names "+ref) {
		t.Errorf("want the slot built, saying the image differed:\n%s", logs)
	}
	if _, err := os.Stat(f.rootfs("usr/other")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the other image's tree was taken: %v", err)
	}
	f.checkTree(t, "legacy")
	deadline := time.Now().Add(10 * time.Second)
	for {
		ents, _ := os.ReadDir(f.p.PreparedDir())
		if len(ents) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the stale prepared tree is still there: %v", ents)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A /var/lib/machines of its own (another file system than the host
// root's): the prepared tree is copied, not moved, and taken all the
// same.
func TestPrepareTakesThePreparedTreeFromAnotherFileSystem(t *testing.T) {
	treetest.RequireRoot(t)
	ref := treetest.ServeRegistry(t, "unbounded/node:1.36.3", treetest.NodeImage(t))
	f := newFixture(t, mountsLegacy, ref)
	machines := f.p.Join(hostpaths.MachinesDirHost)
	if err := os.MkdirAll(machines, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", machines, "tmpfs", 0, "mode=0700"); err != nil {
		t.Skipf("tests/system: a tmpfs for /var/lib/machines: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(machines, unix.MNT_DETACH) })
	ctx := context.Background()
	b := &tree.Builder{Paths: f.p, Log: f.m.Log}
	if _, err := b.Prepare(ctx, f.slot); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(f.p.PreparedDir(), "tree", "prepared-by-the-image-builder"), []byte("x"), 0o644)
	f.logs.Reset()
	if err := f.m.Prepare(ctx, f.slot); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(f.rootfs("prepared-by-the-image-builder")); err != nil || !strings.Contains(f.logs.String(), "copied across file systems") {
		t.Errorf("the prepared tree was not copied across (%v):\n%s", err, f.logs)
	}
	f.checkTree(t, "legacy")
	if _, err := os.Stat(filepath.Join(f.p.PreparedDir(), "tree")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the prepared tree is left after its copy: %v", err)
	}
}
