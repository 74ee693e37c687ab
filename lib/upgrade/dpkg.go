package upgrade

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Meta is what a package says about itself.
type Meta struct {
	Name, Version, Arch string
}

// Packages is the host's package manager, as the upgrade uses it.
type Packages interface {
	// Inspect reads the metadata of the package file.
	Inspect(ctx context.Context, file string) (Meta, error)
	// Installed is the installed package name; ok is false when it is
	// not installed (an image-based host, or a copy of the binaries),
	// or the package manager is not on the host. Its version is the
	// package manager's (dpkg: [epoch:]upstream[-revision], rpm:
	// [epoch:]version-release).
	Installed(ctx context.Context, name string) (m Meta, ok bool, err error)
	// Arch is the host's package architecture as the package manager
	// names it (dpkg: amd64, arm64; rpm: x86_64, aarch64).
	Arch(ctx context.Context) (string, error)
	// Install installs file, non-interactively, keeping the operator's
	// changes to configuration files.
	Install(ctx context.Context, file string) error
	// Repack builds a package file at dst of the installed package
	// name, exactly as installed: a rollback's way back when the package
	// file the host was installed from is not on it.
	Repack(ctx context.Context, name, dst string) error
	// Verify checks the installed files of name against the package
	// database (dpkg --verify, rpm -V); an error lists what differs.
	Verify(ctx context.Context, name string) error
	// Format is the package format, "deb" or "rpm": the extension of
	// its files.
	Format() string
}

// HostPackages is the package manager that installed the agent on the
// host at root: dpkg, else rpm (dpkg is asked first: a Debian host may
// have rpm as a tool). When neither did, it is Dpkg, whose Installed says
// so: the upgrade takes the image-based path, which reads a .deb itself.
func HostPackages(ctx context.Context, root string) (Packages, error) {
	return firstInstalled(ctx, Dpkg{Root: root}, Rpm{Root: root})
}

// firstInstalled is the first of candidates that has the agent installed,
// else the first.
func firstInstalled(ctx context.Context, candidates ...Packages) (Packages, error) {
	for _, p := range candidates {
		_, ok, err := p.Installed(ctx, Package)
		if err != nil {
			return nil, fmt.Errorf("is %s installed by %s: %w", Package, p.Format(), err)
		}
		if ok {
			return p, nil
		}
	}
	return candidates[0], nil
}

// packageFile is the name of m's package file in format, as the package
// manager's tools name it.
func packageFile(format string, m Meta) string {
	if format == "rpm" {
		return m.Name + "-" + safeName(m.Version) + "." + m.Arch + ".rpm"
	}
	return m.Name + "_" + safeName(m.Version) + "_" + m.Arch + ".deb"
}

// Dpkg is Packages for Debian's dpkg, run on the host (Root "" or "/") or
// against another root (dpkg --root, for tests).
type Dpkg struct {
	Root string
}

func (d Dpkg) Format() string { return "deb" }

func (d Dpkg) run(ctx context.Context, stdin io.Reader, name string, args ...string) (string, error) {
	if d.Root != "" && d.Root != "/" {
		switch name {
		case "dpkg", "dpkg-query":
			args = append([]string{"--root=" + d.Root}, args...)
		}
	}
	return command(ctx, []string{"DEBIAN_FRONTEND=noninteractive", "LC_ALL=C"}, stdin, name, args...)
}

// command runs name with args and env added to this process's
// environment and returns its output; its error ends in the last lines
// it wrote.
func command(ctx context.Context, env []string, stdin io.Reader, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdin = stdin
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(errb.String())
		if msg == "" {
			msg = strings.TrimSpace(out.String())
		}
		return out.String(), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, lastLines(msg, 5))
	}
	return out.String(), nil
}

func (d Dpkg) Inspect(ctx context.Context, file string) (Meta, error) {
	out, err := d.run(ctx, nil, "dpkg-deb", "--show", "--showformat=${Package}\t${Version}\t${Architecture}", file)
	if err != nil {
		return Meta{}, fmt.Errorf("%s is not a Debian package: %w", file, err)
	}
	f := strings.Split(strings.TrimSpace(out), "\t")
	if len(f) != 3 || f[0] == "" {
		return Meta{}, fmt.Errorf("%s: dpkg-deb says %q: not a package's name, version and architecture", file, out)
	}
	return Meta{Name: f[0], Version: f[1], Arch: f[2]}, nil
}

func (d Dpkg) Installed(ctx context.Context, name string) (Meta, bool, error) {
	out, err := d.run(ctx, nil, "dpkg-query", "--show", "--showformat=${Package}\t${Version}\t${Architecture}\t${db:Status-Abbrev}", name)
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) && ee.ExitCode() == 1 {
			return Meta{}, false, nil // dpkg-query: no package found
		}
		if errors.Is(err, exec.ErrNotFound) {
			return Meta{}, false, nil // no dpkg at all: an image-based host
		}
		return Meta{}, false, err
	}
	f := strings.Split(strings.TrimSpace(out), "\t")
	if len(f) != 4 || !strings.HasPrefix(f[3], "ii") {
		return Meta{}, false, nil
	}
	return Meta{Name: f[0], Version: f[1], Arch: f[2]}, true, nil
}

func (d Dpkg) Arch(ctx context.Context) (string, error) {
	out, err := d.run(ctx, nil, "dpkg", "--print-architecture")
	return strings.TrimSpace(out), err
}

func (d Dpkg) Install(ctx context.Context, file string) error {
	_, err := d.run(ctx, nil, "dpkg", "--install", "--force-confold", file)
	return err
}

func (d Dpkg) Verify(ctx context.Context, name string) error {
	out, err := d.run(ctx, nil, "dpkg", "--verify", name)
	if err != nil {
		return err
	}
	if s := strings.TrimSpace(out); s != "" {
		return fmt.Errorf("dpkg --verify %s: %s", name, lastLines(s, 10))
	}
	return nil
}

// Repack rebuilds the installed package as dpkg-repack does: its files as
// they are on disk, its control fields, maintainer scripts, conffiles and
// md5sums from dpkg's database, into dst by dpkg-deb. dpkg-repack itself
// is not on every host (it is its own package).
func (d Dpkg) Repack(ctx context.Context, name, dst string) error {
	root := d.Root
	if root == "" {
		root = "/"
	}
	tree, err := os.MkdirTemp(filepath.Dir(dst), ".repack-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tree)
	control, err := d.run(ctx, nil, "dpkg-query", "--show", "--showformat="+controlFormat, name)
	if err != nil {
		return err
	}
	debian := filepath.Join(tree, "DEBIAN")
	if err := os.Mkdir(debian, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(debian, "control"), []byte(dropEmptyFields(control)), 0o644); err != nil {
		return err
	}
	info := filepath.Join(root, "var/lib/dpkg/info")
	for _, f := range []string{"preinst", "postinst", "prerm", "postrm", "conffiles", "md5sums"} {
		data, err := os.ReadFile(filepath.Join(info, name+"."+f))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		mode := os.FileMode(0o644)
		if f != "conffiles" && f != "md5sums" {
			mode = 0o755
		}
		if err := os.WriteFile(filepath.Join(debian, f), data, mode); err != nil {
			return err
		}
	}
	list, err := d.run(ctx, nil, "dpkg-query", "--listfiles", name)
	if err != nil {
		return err
	}
	for _, p := range strings.Split(strings.TrimSpace(list), "\n") {
		if p == "" || p == "/." || !strings.HasPrefix(p, "/") {
			continue
		}
		if err := copyEntry(filepath.Join(root, p), filepath.Join(tree, p)); err != nil {
			return fmt.Errorf("repack %s: %w", name, err)
		}
	}
	// gzip at its fastest: the package stays on this host, and xz (the
	// distribution's choice) takes seconds for the agent's 40 MB.
	tmp := dst + ".tmp"
	if _, err := d.run(ctx, nil, "dpkg-deb", "--root-owner-group", "-Zgzip", "-z1", "--build", tree, tmp); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}

// controlFormat asks dpkg-query for the fields a package's control file
// has (the installed status is not one).
const controlFormat = "Package: ${Package}\nVersion: ${Version}\nArchitecture: ${Architecture}\nMaintainer: ${Maintainer}\n" +
	"Installed-Size: ${Installed-Size}\nDepends: ${Depends}\nRecommends: ${Recommends}\nSection: ${Section}\n" +
	"Priority: ${Priority}\nHomepage: ${Homepage}\nDescription: ${Description}\n"

func dropEmptyFields(control string) string {
	var b strings.Builder
	for _, l := range strings.SplitAfter(control, "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && !strings.HasPrefix(k, " ") && strings.TrimSpace(v) == "" {
			continue
		}
		b.WriteString(l)
	}
	return b.String()
}

// copyEntry copies one listed path (a directory, a link or a regular file)
// into the tree, with its mode.
func copyEntry(src, dst string) error {
	fi, err := os.Lstat(src)
	if errors.Is(err, fs.ErrNotExist) {
		return nil // a file the operator removed: dpkg --verify says so
	}
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	switch {
	case fi.IsDir():
		if err := os.Mkdir(dst, fi.Mode().Perm()); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
		return os.Chmod(dst, fi.Mode().Perm())
	case fi.Mode()&fs.ModeSymlink != 0:
		target, err := os.Readlink(src)
		if err != nil {
			return err
		}
		return os.Symlink(target, dst)
	case fi.Mode().IsRegular():
		in, err := os.Open(src)
		if err != nil {
			return err
		}
		defer in.Close()
		out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, fi.Mode().Perm())
		if err != nil {
			return err
		}
		if _, err := io.Copy(out, in); err != nil {
			out.Close()
			return err
		}
		if err := out.Close(); err != nil {
			return err
		}
		return os.Chmod(dst, fi.Mode().Perm())
	}
	return fmt.Errorf("%s: neither a directory, a link nor a regular file", src)
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "; ")
}
