package tree

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"golang.org/x/sys/unix"

	"unbounded-cloud.io/agent/lib/modes"
	"unbounded-cloud.io/agent/lib/state"
	"unbounded-cloud.io/agent/lib/version"
)

// A prepared tree is the host-independent part of a slot's tree (Build's
// step 3), built once by an image builder inside the image's root
// (Prepare, run by `unbounded prepare`) into the host root's prepared/:
// every host booted from the image takes it at its first slot build (a
// rename) instead of unpacking the node image and installing the
// artifacts again. Nothing host-specific is in it: the node's files
// (name, token, IPs, resolv.conf), its machine-id and the devices are
// written at the build, on the host.

// Stamp says what a prepared tree was built from; the tree is taken only
// by a build of the same input.
type Stamp struct {
	// Agent is the agent's version that built it: the tree's layout is
	// the agent's (where the artifacts go, the pod images' unit).
	Agent string `json:"agent"`
	// Image is the node image's reference as configured, Digest its
	// manifest's digest as resolved.
	Image  string `json:"image"`
	Digest string `json:"digest"`
	// Artifacts are the artifacts' files by name, relative to the root:
	// the verified cache names each by its content.
	Artifacts map[string]string `json:"artifacts"`
	// PodImages is the SHA-256 of the offline pod images' index.json
	// (Image.OfflineDir/images), "" without one.
	PodImages string `json:"pod-images,omitempty"`
	// PreparedAt is when Prepare finished (not compared).
	PreparedAt time.Time `json:"prepared-at,omitzero"`
}

// differs names the first input in which s is not want ("" when none).
func (s Stamp) differs(want Stamp) string {
	switch {
	case s.Agent != want.Agent:
		return fmt.Sprintf("the agent's version (prepared by %s, this is %s)", s.Agent, want.Agent)
	case s.Image != want.Image:
		return fmt.Sprintf("the node image (prepared %s, the config names %s)", s.Image, want.Image)
	case s.Digest != want.Digest:
		return fmt.Sprintf("the node image's digest (prepared %s, %s is %s now)", s.Digest, want.Image, want.Digest)
	case s.PodImages != want.PodImages:
		return "the offline pod images (their index.json changed)"
	}
	for _, name := range []string{"kubelet", "containerd", "runc", "cni-plugins", "coredns"} {
		if s.Artifacts[name] != want.Artifacts[name] {
			return fmt.Sprintf("the %s artifact (prepared %q, the config's is %q)", name, s.Artifacts[name], want.Artifacts[name])
		}
	}
	if len(s.Artifacts) != len(want.Artifacts) {
		return "the artifacts"
	}
	return ""
}

func (b *Builder) preparedTree() string  { return filepath.Join(b.Paths.PreparedDir(), "tree") }
func (b *Builder) preparedStamp() string { return filepath.Join(b.Paths.PreparedDir(), "stamp.json") }

// stampOf is the stamp of s's base, its image img resolved from src.
func (b *Builder) stampOf(s modes.Slot, img v1.Image, src string) (Stamp, error) {
	st := Stamp{Agent: version.Version, Image: src, Artifacts: map[string]string{}}
	d, err := img.Digest()
	if err != nil {
		return Stamp{}, fmt.Errorf("node image %s: %w", src, classify(err))
	}
	st.Digest = d.String()
	for name, f := range map[string]string{"kubelet": s.Artifacts.Kubelet, "containerd": s.Artifacts.Containerd, "runc": s.Artifacts.Runc,
		"cni-plugins": s.Artifacts.CNIPlugins, "coredns": s.Artifacts.CoreDNS} {
		if f != "" {
			st.Artifacts[name] = b.Paths.Rel(f)
		}
	}
	if s.Image.OfflineDir != "" {
		data, err := os.ReadFile(filepath.Join(s.Image.OfflineDir, "images", "index.json"))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return Stamp{}, fmt.Errorf("offline pod images: %w", err)
		}
		if err == nil {
			sum := sha256.Sum256(data)
			st.PodImages = hex.EncodeToString(sum[:])
		}
	}
	return st, nil
}

// takePrepared moves the prepared tree onto dir (an empty directory) when
// its stamp is want, and reports whether it did. A prepared tree of
// another input is set aside (and removed in the background: the build
// goes on at once) and the build says which input differed. The stamp
// goes after the tree: a cut in between leaves a stamp without a tree,
// which the next build removes.
func (b *Builder) takePrepared(slot string, want Stamp, dir string) bool {
	pdir := b.Paths.PreparedDir()
	b.removeStale()
	data, err := os.ReadFile(b.preparedStamp())
	if errors.Is(err, fs.ErrNotExist) {
		return false
	}
	var got Stamp
	if err == nil {
		err = json.Unmarshal(data, &got)
	}
	if _, terr := os.Stat(b.preparedTree()); err == nil && terr != nil {
		err = fmt.Errorf("no prepared tree beside its stamp: %w", terr)
	}
	why := ""
	switch {
	case err != nil:
		why = "its stamp: " + err.Error()
	default:
		why = got.differs(want)
	}
	if why == "" {
		// rename(2) itself: it replaces an empty directory, which
		// os.Rename refuses to.
		how := "moved"
		if err := unix.Rename(b.preparedTree(), dir); errors.Is(err, unix.EXDEV) {
			// The slot's tree on another file system than the host
			// root (a /var/lib/machines of its own): copied, as cp -a
			// copies a tree (owners, modes, links, extended attributes),
			// by reflinks where the file system has them.
			how = "copied across file systems"
			if out, err := exec.Command("cp", "-a", "--reflink=auto", b.preparedTree()+"/.", dir+"/").CombinedOutput(); err != nil {
				b.log().Warn("the prepared tree could not be copied; building the slot's tree", "slot", slot,
					"error", err.Error(), "output", strings.TrimSpace(string(out)))
				b.emptyDir(dir)
				return false
			}
			os.RemoveAll(b.preparedTree())
		} else if err != nil {
			// A dir that is not empty, say: built as without a
			// prepared tree, which stays.
			b.log().Warn("the prepared tree could not be taken; building the slot's tree", "slot", slot, "error", err.Error())
			return false
		}
		if err := state.RemoveDurable(b.preparedStamp()); err != nil && !errors.Is(err, fs.ErrNotExist) {
			b.log().Warn("the prepared tree's stamp was not removed", "error", err.Error())
		}
		b.log().Info("node image and artifacts prepared by the image builder: taken", "how", how, "slot", slot, "image", want.Image,
			"digest", want.Digest, "prepared_at", got.PreparedAt.Format(time.RFC3339))
		return true
	}
	b.log().Info("a prepared tree is here but was built from another input: building the slot's tree", "slot", slot, "differs", why)
	stale, err := os.MkdirTemp(pdir, ".stale-")
	if err == nil {
		if err := os.Rename(b.preparedTree(), filepath.Join(stale, "tree")); err != nil && !errors.Is(err, fs.ErrNotExist) {
			b.log().Warn("the stale prepared tree was not set aside", "error", err.Error())
		}
		os.Remove(b.preparedStamp())
		go os.RemoveAll(stale)
	}
	return false
}

// emptyDir removes what is in dir (a failed copy's part), keeping dir.
func (b *Builder) emptyDir(dir string) {
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		os.RemoveAll(filepath.Join(dir, e.Name()))
	}
}

// removeStale removes what an earlier takePrepared set aside and did not
// finish removing.
func (b *Builder) removeStale() {
	old, _ := filepath.Glob(filepath.Join(b.Paths.PreparedDir(), ".stale-*"))
	tmp, _ := filepath.Glob(filepath.Join(b.Paths.PreparedDir(), ".tree.tmp-*"))
	for _, d := range append(old, tmp...) {
		os.RemoveAll(d)
	}
}

// Prepare builds the host-independent part of the tree of s (its Image
// and Artifacts; nothing of s.Node is used) into the host root's
// prepared/tree and stamps it, for the first slot build of a host booted
// from this root (Build takes it). It needs no systemd, no cluster and no
// identity: an image builder runs it in the image's root (`unbounded
// prepare --root DIR`). The tree is built beside (prepared/.tree.tmp-*),
// synced and swapped in, the stamp written last; running it again with
// the same input builds it again.
func (b *Builder) Prepare(ctx context.Context, s modes.Slot) (Stamp, error) {
	img, src, err := b.resolveImage(ctx, s.Image)
	if err != nil {
		return Stamp{}, err
	}
	st, err := b.stampOf(s, img, src)
	if err != nil {
		return Stamp{}, err
	}
	pdir := b.Paths.PreparedDir()
	if err := os.MkdirAll(pdir, 0o700); err != nil {
		return Stamp{}, err
	}
	b.removeStale()
	// Stamp first out: a cut later leaves a tree without a stamp, which
	// no build takes, and the next Prepare replaces.
	if err := os.Remove(b.preparedStamp()); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return Stamp{}, err
	}
	tmp, err := os.MkdirTemp(pdir, ".tree.tmp-")
	if err != nil {
		return Stamp{}, err
	}
	done := false
	defer func() {
		if !done {
			os.RemoveAll(tmp)
		}
	}()
	if err := b.base(ctx, s, img, src, tmp, pdir, ".tree.tmp-artifacts-"); err != nil {
		return Stamp{}, err
	}
	if err := modes.SwapDir(tmp, b.preparedTree()); err != nil {
		return Stamp{}, err
	}
	done = true
	st.PreparedAt = time.Now().UTC()
	data, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return Stamp{}, err
	}
	return st, state.WriteFileAtomic(b.preparedStamp(), append(data, '\n'), 0o600)
}
