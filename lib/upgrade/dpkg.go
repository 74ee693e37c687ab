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

	"unbounded-cloud.io/agent/lib/crashpoint"
)

// Meta is what a package says about itself.
type Meta struct {
	Name, Version, Arch string
}

// Status is how far the package manager got with a package.
type Status int

const (
	// NotInstalled: not in the package database (dpkg: nor a package
	// removed with its configuration files kept), or no package manager
	// on the host.
	NotInstalled Status = iota
	// Installed: unpacked and configured (dpkg's "ii"); every package in
	// rpm's database.
	Installed
	// HalfInstalled: in dpkg's database, but a run of dpkg that was cut
	// (a power cut in dpkg --install) left it half-installed, unpacked,
	// half-configured, awaiting triggers or marked reinstall-required:
	// its files may be either version's and its scripts have not all
	// run. It is the package manager's, never an image's agent:
	// Packages.Repair (dpkg --configure -a) or a reinstall finishes it.
	// rpm has no such state (Rpm.Repair).
	HalfInstalled
)

func (s Status) String() string {
	switch s {
	case NotInstalled:
		return "not installed"
	case Installed:
		return "installed"
	case HalfInstalled:
		return "half-installed"
	}
	return fmt.Sprintf("status %d", int(s))
}

// CrashAfterUnpack is the crash point (lib/crashpoint) inside Dpkg.Install
// between the unpack and the configuration: a cut there leaves the
// package unpacked, not configured (dpkg's "iU"), as a power cut inside
// dpkg --install does.
const CrashAfterUnpack = Operation + "/after-unpack"

// Packages is the host's package manager, as the upgrade uses it.
type Packages interface {
	// Inspect reads the metadata of the package file.
	Inspect(ctx context.Context, file string) (Meta, error)
	// Installed is the installed package name and its status:
	// NotInstalled when it is not installed (an image-based host, or a
	// copy of the binaries) or the package manager is not on the host,
	// HalfInstalled when a cut run of the package manager left it so
	// (m is then the version dpkg was installing). Its version is the
	// package manager's (dpkg: [epoch:]upstream[-revision], rpm:
	// [epoch:]version-release).
	Installed(ctx context.Context, name string) (m Meta, st Status, err error)
	// Repair finishes what a cut run of the package manager left
	// unfinished (dpkg --configure -a) and checks that nothing of name
	// is left so (dpkg --audit); an error says what is. What it cannot
	// finish (dpkg's half-installed: an unpack cut midway) takes a
	// reinstall.
	Repair(ctx context.Context, name string) error
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
		// A half-installed agent is that package manager's too: never
		// the image-based path.
		_, st, err := p.Installed(ctx, Package)
		if err != nil {
			return nil, fmt.Errorf("is %s installed by %s: %w", Package, p.Format(), err)
		}
		if st != NotInstalled {
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
	// CrashPoint is called at CrashAfterUnpack; nil: crashpoint.Hit.
	CrashPoint func(name string)
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

func (d Dpkg) Installed(ctx context.Context, name string) (Meta, Status, error) {
	out, err := d.run(ctx, nil, "dpkg-query", "--show", "--showformat=${Package}\t${Version}\t${Architecture}\t${db:Status-Abbrev}\n", name)
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) && ee.ExitCode() == 1 {
			return Meta{}, NotInstalled, nil // dpkg-query: no package found
		}
		if errors.Is(err, exec.ErrNotFound) {
			return Meta{}, NotInstalled, nil // no dpkg at all: an image-based host
		}
		return Meta{}, NotInstalled, err
	}
	m, st, err := parseDpkgStatus(out)
	if err != nil {
		return Meta{}, NotInstalled, fmt.Errorf("dpkg-query --show %s: %w", name, err)
	}
	return m, st, nil
}

// parseDpkgStatus reads dpkg-query's line for one package: name,
// version, architecture and the status abbreviation (desired action,
// status, error flag: "ii " installed; "iU " unpacked; "iF "
// half-configured; "iH " half-installed; "iW ", "it " triggers awaited or
// pending; "rc " removed, its configuration kept; "un " not installed; an
// "R" flag: reinstall required). Anything else than one such line is an
// error, never "not installed": that would send the upgrade down the
// image-based path on a host dpkg installed the agent on.
func parseDpkgStatus(out string) (Meta, Status, error) {
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if len(lines) != 1 {
		return Meta{}, NotInstalled, fmt.Errorf("%d packages (%q), not one", len(lines), out)
	}
	f := strings.Split(lines[0], "\t")
	if len(f) != 4 || f[0] == "" || len(f[3]) < 2 {
		return Meta{}, NotInstalled, fmt.Errorf("%q: not a package's name, version, architecture and status", lines[0])
	}
	m := Meta{Name: f[0], Version: f[1], Arch: f[2]}
	flag := byte(' ')
	if len(f[3]) > 2 {
		flag = f[3][2]
	}
	switch {
	case f[3][1] == 'n' || f[3][1] == 'c':
		return Meta{}, NotInstalled, nil
	case f[3][1] == 'i' && flag == ' ':
		return m, Installed, nil
	}
	return m, HalfInstalled, nil
}

func (d Dpkg) Arch(ctx context.Context) (string, error) {
	out, err := d.run(ctx, nil, "dpkg", "--print-architecture")
	return strings.TrimSpace(out), err
}

// Install is dpkg --install in its two halves, --unpack then
// --configure (what --install does in one run), with the crash point
// CrashAfterUnpack between them.
func (d Dpkg) Install(ctx context.Context, file string) error {
	m, err := d.Inspect(ctx, file)
	if err != nil {
		return err
	}
	if _, err := d.run(ctx, nil, "dpkg", "--unpack", "--force-confold", file); err != nil {
		return err
	}
	crashpoint.Via(d.CrashPoint, CrashAfterUnpack)
	_, err = d.run(ctx, nil, "dpkg", "--configure", "--force-confold", m.Name)
	return err
}

// Repair is dpkg --configure -a (every package a cut run left unpacked
// or half-configured, as apt asks for after one), then dpkg --audit name,
// which must say nothing.
func (d Dpkg) Repair(ctx context.Context, name string) error {
	_, cerr := d.run(ctx, nil, "dpkg", "--configure", "-a", "--force-confold")
	out, err := d.run(ctx, nil, "dpkg", "--audit", name)
	if err != nil {
		return errors.Join(cerr, err)
	}
	if s := strings.TrimSpace(out); s != "" {
		return errors.Join(cerr, fmt.Errorf("dpkg --audit %s: %s", name, lastLines(s, 10)))
	}
	return cerr
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
