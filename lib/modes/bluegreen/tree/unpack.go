package tree

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"golang.org/x/sys/unix"
)

// UnpackStats counts what Unpack wrote and skipped.
type UnpackStats struct {
	Files, Dirs, Symlinks, Hardlinks int
	// Devices are character and block devices, FIFOs and sockets, which
	// are skipped: nspawn gives the machine its own /dev, and os.Root has
	// no mknod.
	Devices int
	Bytes   int64
}

// Unpack writes the flattened filesystem of img into dir, which must be
// an empty directory. The layers are flattened by go-containerregistry's
// mutate.Extract, which applies whiteouts (".wh.NAME" removes NAME of
// lower layers, ".wh..wh..opq" hides a directory's lower content) and
// drops entries whose names or link targets leave the rootfs. Every file
// is then created through an os.Root opened on dir, so that no entry, and
// no symlink planted by an earlier entry, can make a write land outside
// dir: a path that would escape is an error, not a write.
//
// Owners, modes (setuid included), modification times and extended
// attributes of regular files (file capabilities) are restored; a
// directory's mode and time are set after its content is written.
// Reading the image verifies every layer against its digest
// (go-containerregistry does, for remote and layout images).
func Unpack(img v1.Image, dir string) (UnpackStats, error) {
	// Layers first: a manifest that does not parse would otherwise come
	// out of mutate.Extract as an empty tar stream (it ends the archive
	// before it reports the error).
	if _, err := img.Layers(); err != nil {
		return UnpackStats{}, fmt.Errorf("the image's manifest: %w", err)
	}
	rc := mutate.Extract(img)
	defer rc.Close()
	st, err := unpackTar(rc, dir)
	if err != nil {
		return st, err
	}
	// The error of a layer that fails after the archive's end marker
	// (mutate.Extract writes the marker before it returns the error)
	// comes with the rest of the stream.
	if _, err := io.Copy(io.Discard, rc); err != nil {
		return st, fmt.Errorf("reading the image: %w", err)
	}
	return st, nil
}

// unpackTar writes the flattened tar stream r into dir, through os.Root.
func unpackTar(r io.Reader, dir string) (UnpackStats, error) {
	var st UnpackStats
	root, err := os.OpenRoot(dir)
	if err != nil {
		return st, err
	}
	defer root.Close()
	dirs := newDirRoots(root)
	defer dirs.close()

	type dirMeta struct {
		name     string
		mode     fs.FileMode
		uid, gid int
		mtime    time.Time
	}
	var metas []dirMeta
	type link struct{ name, target string }
	var hardlinks []link

	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return st, fmt.Errorf("reading the image: %w", err)
		}
		name, ok := entryName(h.Name)
		if !ok {
			return st, fmt.Errorf("image entry %q: the name leaves the rootfs", h.Name)
		}
		if name == "." {
			if h.Typeflag == tar.TypeDir {
				metas = append(metas, dirMeta{".", h.FileInfo().Mode(), h.Uid, h.Gid, h.ModTime})
			}
			continue
		}
		// The entry's directory (made as MkdirAll makes it), and the
		// entry's name in it.
		var parent *os.Root
		if h.Typeflag != tar.TypeLink {
			if parent, err = dirs.get(path.Dir(name)); err != nil {
				return st, fmt.Errorf("image entry %q: %w", h.Name, err)
			}
		}
		base := path.Base(name)
		mode := h.FileInfo().Mode()
		switch h.Typeflag {
		case tar.TypeDir:
			if err := parent.Mkdir(base, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
				return st, fmt.Errorf("image entry %q: %w", h.Name, err)
			}
			if fi, err := parent.Lstat(base); err != nil || !fi.IsDir() {
				return st, fmt.Errorf("image entry %q: not a directory after mkdir (%v)", h.Name, err)
			}
			metas = append(metas, dirMeta{name, mode, h.Uid, h.Gid, h.ModTime})
			st.Dirs++
		case tar.TypeReg:
			dirs.forget(name)
			n, err := writeRegular(parent, base, h, tr)
			if err != nil {
				return st, fmt.Errorf("image entry %q: %w", h.Name, err)
			}
			st.Files++
			st.Bytes += n
		case tar.TypeSymlink:
			// The target is stored as is, absolute ones included: it is
			// resolved inside the machine, where / is the rootfs. os.Root
			// refuses to follow it outside dir during the unpack.
			dirs.forget(name)
			parent.Remove(base)
			if err := parent.Symlink(h.Linkname, base); err != nil {
				return st, fmt.Errorf("image entry %q: %w", h.Name, err)
			}
			if err := parent.Lchown(base, h.Uid, h.Gid); err != nil {
				return st, fmt.Errorf("image entry %q: %w", h.Name, err)
			}
			st.Symlinks++
		case tar.TypeLink:
			target, ok := entryName(h.Linkname)
			if !ok || target == "." {
				return st, fmt.Errorf("image entry %q: hard link target %q leaves the rootfs", h.Name, h.Linkname)
			}
			// Made at the end: the flattened stream lists upper layers
			// first, so the target may come later.
			hardlinks = append(hardlinks, link{name, target})
		case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
			st.Devices++
		default:
			// tar.TypeXGlobalHeader and vendor types carry no file.
		}
	}
	for _, l := range hardlinks {
		if parent := path.Dir(l.name); parent != "." {
			if err := root.MkdirAll(parent, 0o755); err != nil {
				return st, fmt.Errorf("image hard link %q: %w", l.name, err)
			}
		}
		dirs.forget(l.name)
		root.Remove(l.name)
		if err := root.Link(l.target, l.name); err != nil {
			return st, fmt.Errorf("image hard link %q -> %q: %w", l.name, l.target, err)
		}
		st.Hardlinks++
	}
	// Deepest first, so that setting a parent's time is not undone by a
	// child's change, and a read-only parent is made read-only last.
	slices.SortStableFunc(metas, func(a, b dirMeta) int {
		return strings.Count(b.name, "/") - strings.Count(a.name, "/")
	})
	for _, d := range metas {
		parent, err := dirs.get(path.Dir(d.name))
		if err != nil {
			return st, fmt.Errorf("image directory %q: %w", d.name, err)
		}
		base := path.Base(d.name)
		if d.name == "." {
			parent, base = root, "."
		}
		if err := parent.Lchown(base, d.uid, d.gid); err != nil {
			return st, fmt.Errorf("image directory %q: %w", d.name, err)
		}
		if err := parent.Chmod(base, d.mode&(fs.ModePerm|fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky)); err != nil {
			return st, fmt.Errorf("image directory %q: %w", d.name, err)
		}
		if err := parent.Chtimes(base, d.mtime, d.mtime); err != nil {
			return st, fmt.Errorf("image directory %q: %w", d.name, err)
		}
	}
	return st, nil
}

// dirRoots keeps an os.Root open on each directory of the tree that an
// entry was written into, so that an entry is one system call in its
// directory rather than a walk from the tree's root (a walk opens and
// closes every component: for the node image's 7,000 files and 1,000
// directories, two thirds of the unpack's system calls). Each is opened
// from its parent's as os.Root opens a path's components, and from the
// tree's root with the whole path when that fails (a symlink inside the
// tree that leaves the parent: the tree's root confines it as before). A
// name replaced by a file, a symlink or a hard link is forgotten first,
// so no later entry is written into a directory no longer in the tree.
type dirRoots struct {
	top *os.Root
	m   map[string]*os.Root
}

// maxDirRoots bounds the descriptors kept open: past it the cache starts
// again (a flattened stream lists a directory's entries together).
const maxDirRoots = 4096

func newDirRoots(top *os.Root) *dirRoots { return &dirRoots{top: top, m: map[string]*os.Root{}} }

// get is the directory dir of the tree (relative, cleaned), made with
// mode 0755 (and its parents) where missing, as MkdirAll makes it.
func (d *dirRoots) get(dir string) (*os.Root, error) {
	if dir == "." {
		return d.top, nil
	}
	if r, ok := d.m[dir]; ok {
		return r, nil
	}
	parent, err := d.get(path.Dir(dir))
	if err != nil {
		return nil, err
	}
	base := path.Base(dir)
	r, err := parent.OpenRoot(base)
	if errors.Is(err, fs.ErrNotExist) {
		if err := parent.Mkdir(base, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return nil, err
		}
		r, err = parent.OpenRoot(base)
	}
	if err != nil {
		// Through the tree's root, as every entry was before.
		if err := d.top.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		if r, err = d.top.OpenRoot(dir); err != nil {
			return nil, err
		}
	}
	if len(d.m) >= maxDirRoots {
		d.close()
	}
	d.m[dir] = r
	return r, nil
}

// forget closes and drops what is kept for name, about to be replaced.
func (d *dirRoots) forget(name string) {
	if r, ok := d.m[name]; ok {
		r.Close()
		delete(d.m, name)
	}
}

func (d *dirRoots) close() {
	for k, r := range d.m {
		r.Close()
		delete(d.m, k)
	}
}

// entryName cleans a tar entry name into a path relative to the rootfs,
// and reports false when it leaves it ("../x", "a/../../x").
func entryName(n string) (string, bool) {
	c := path.Clean(strings.TrimPrefix(n, "/"))
	if c == ".." || strings.HasPrefix(c, "../") {
		return "", false
	}
	return c, true
}

// writeRegular writes one regular file, name in the directory dir, and
// its metadata. The file is opened with O_EXCL, after removing what was
// there when something was: never through a symlink an earlier entry left
// at that name.
func writeRegular(dir *os.Root, name string, h *tar.Header, r io.Reader) (int64, error) {
	f, err := dir.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		if err := dir.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return 0, err
		}
		f, err = dir.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	}
	if err != nil {
		return 0, err
	}
	n, err := io.Copy(f, r)
	if err == nil {
		err = f.Chown(h.Uid, h.Gid)
	}
	if err == nil {
		// After the chown, which clears setuid and setgid bits.
		err = f.Chmod(h.FileInfo().Mode() & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky))
	}
	if err == nil {
		err = setXattrs(f, h)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = dir.Chtimes(name, h.ModTime, h.ModTime)
	}
	return n, err
}

// setXattrs restores the extended attributes tar carries as PAX records
// (SCHILY.xattr.NAME), such as security.capability. On the open
// descriptor, so no path is resolved again.
func setXattrs(f *os.File, h *tar.Header) error {
	const prefix = "SCHILY.xattr."
	for k, v := range h.PAXRecords {
		if !strings.HasPrefix(k, prefix) {
			continue
		}
		attr := strings.TrimPrefix(k, prefix)
		if err := unix.Fsetxattr(int(f.Fd()), attr, []byte(v), 0); err != nil {
			return fmt.Errorf("set %s: %w", attr, err)
		}
	}
	return nil
}
