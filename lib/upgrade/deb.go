package upgrade

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/klauspost/compress/zstd"
	"github.com/ulikunitz/xz"
)

// A Debian package read without dpkg, for an image-based host, which has
// none: an ar archive of debian-binary, control.tar[.gz|.xz|.zst] and
// data.tar[.gz|.xz|.zst] (deb(5)).

// debMember calls f with each member of the ar archive file until f says
// stop.
func debMembers(file string, f func(name string, r io.Reader) (stop bool, err error)) error {
	fh, err := os.Open(file)
	if err != nil {
		return err
	}
	defer fh.Close()
	br := bufio.NewReader(fh)
	magic := make([]byte, 8)
	if _, err := io.ReadFull(br, magic); err != nil || string(magic) != "!<arch>\n" {
		return fmt.Errorf("%s is not a Debian package (no ar archive)", file)
	}
	hdr := make([]byte, 60)
	for {
		if _, err := io.ReadFull(br, hdr); err == io.EOF {
			return nil
		} else if err != nil {
			return fmt.Errorf("%s: %w", file, err)
		}
		if string(hdr[58:60]) != "`\n" {
			return fmt.Errorf("%s: a damaged ar member header", file)
		}
		name := strings.TrimSuffix(strings.TrimSpace(string(hdr[0:16])), "/")
		size, err := strconv.ParseInt(strings.TrimSpace(string(hdr[48:58])), 10, 64)
		if err != nil || size < 0 || size > MaxPackage {
			return fmt.Errorf("%s: member %s: bad size", file, name)
		}
		body := io.LimitReader(br, size)
		stop, err := f(name, body)
		if err != nil || stop {
			return err
		}
		if _, err := io.Copy(io.Discard, body); err != nil {
			return err
		}
		if size%2 == 1 {
			br.ReadByte()
		}
	}
}

// decompress opens member name's tar stream by its suffix.
func decompress(name string, r io.Reader) (io.Reader, func(), error) {
	switch {
	case strings.HasSuffix(name, ".tar"):
		return r, func() {}, nil
	case strings.HasSuffix(name, ".tar.gz"):
		z, err := gzip.NewReader(r)
		return z, func() {}, err
	case strings.HasSuffix(name, ".tar.xz"):
		z, err := xz.NewReader(r)
		return z, func() {}, err
	case strings.HasSuffix(name, ".tar.zst"):
		z, err := zstd.NewReader(r)
		if err != nil {
			return nil, nil, err
		}
		return z, z.Close, nil
	}
	return nil, nil, fmt.Errorf("member %s: not a tar archive this reader knows", name)
}

// debTar calls f with the tar reader of the member whose name starts with
// prefix ("control.tar", "data.tar").
func debTar(file, prefix string, f func(*tar.Reader) error) error {
	found := false
	err := debMembers(file, func(name string, r io.Reader) (bool, error) {
		if !strings.HasPrefix(name, prefix) {
			return false, nil
		}
		found = true
		z, done, err := decompress(name, r)
		if err != nil {
			return true, fmt.Errorf("%s: %w", file, err)
		}
		defer done()
		return true, f(tar.NewReader(z))
	})
	if err == nil && !found {
		err = fmt.Errorf("%s is not a Debian package (no %s member)", file, prefix)
	}
	return err
}

// DebMeta reads the package's name, version and architecture from its
// control file.
func DebMeta(file string) (Meta, error) {
	var m Meta
	err := debTar(file, "control.tar", func(tr *tar.Reader) error {
		for {
			h, err := tr.Next()
			if err == io.EOF {
				return fmt.Errorf("%s: no control file", file)
			}
			if err != nil {
				return err
			}
			if path.Clean(h.Name) != "control" {
				continue
			}
			data, err := io.ReadAll(io.LimitReader(tr, 1<<20))
			if err != nil {
				return err
			}
			for _, l := range strings.Split(string(data), "\n") {
				k, v, _ := strings.Cut(l, ":")
				switch strings.TrimSpace(k) {
				case "Package":
					m.Name = strings.TrimSpace(v)
				case "Version":
					m.Version = strings.TrimSpace(v)
				case "Architecture":
					m.Arch = strings.TrimSpace(v)
				}
			}
			return nil
		}
	})
	if err == nil && (m.Name == "" || m.Version == "" || m.Arch == "") {
		err = fmt.Errorf("%s: the control file names no package, version or architecture", file)
	}
	return m, err
}

// extractDir writes the regular files and symbolic links of the package's
// data under dir (a path inside it, such as usr/libexec/unbounded) into
// dst, flat, with their modes; a link must stay inside dir. It returns the
// names written.
func extractDir(file, dir, dst string) ([]string, error) {
	dir = strings.Trim(path.Clean(dir), "/") + "/"
	var names []string
	err := debTar(file, "data.tar", func(tr *tar.Reader) error {
		for {
			h, err := tr.Next()
			if err == io.EOF {
				return nil
			}
			if err != nil {
				return err
			}
			name := strings.TrimPrefix(path.Clean("/"+h.Name), "/")
			rest, ok := strings.CutPrefix(name, dir)
			if !ok || rest == "" || strings.Contains(rest, "/") {
				continue
			}
			out := filepath.Join(dst, rest)
			switch h.Typeflag {
			case tar.TypeReg:
				if err := writeExecutable(out, tr, h.Size, os.FileMode(h.Mode).Perm()); err != nil {
					return err
				}
			case tar.TypeSymlink:
				if strings.Contains(h.Linkname, "/") {
					return fmt.Errorf("%s: %s links out of %s (%s)", file, name, dir, h.Linkname)
				}
				if err := os.Symlink(h.Linkname, out); err != nil {
					return err
				}
			default:
				continue
			}
			names = append(names, rest)
		}
	})
	if err == nil && len(names) == 0 {
		err = fmt.Errorf("%s has nothing under /%s", file, strings.TrimSuffix(dir, "/"))
	}
	return names, err
}

func writeExecutable(dst string, r io.Reader, size int64, mode os.FileMode) error {
	f, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, io.LimitReader(r, size)); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Chmod(dst, mode)
}
