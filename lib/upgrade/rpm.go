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
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/rpmpack"

	"unbounded-cloud.io/agent/lib/state"
)

// Rpm is Packages for rpm, run on the host (Root "" or "/") or against
// another root (rpm --root, for tests). The database is where rpm's
// %_dbpath says, under Root.
type Rpm struct {
	Root string
}

// rpmMetaFormat is a package's name, version and architecture as Meta
// holds them: the version is rpm's [EPOCH:]VERSION-RELEASE, as rpm -q
// names the package.
const rpmMetaFormat = `%{NAME}\t%|EPOCH?{%{EPOCH}:}:{}|%{VERSION}-%{RELEASE}\t%{ARCH}\n`

func (r Rpm) Format() string { return "rpm" }

func (r Rpm) run(ctx context.Context, args ...string) (string, error) {
	if r.Root != "" && r.Root != "/" {
		args = append([]string{"--root", r.Root}, args...)
	}
	return command(ctx, []string{"LC_ALL=C"}, nil, "rpm", args...)
}

func (r Rpm) root() string {
	if r.Root == "" {
		return "/"
	}
	return r.Root
}

func parseRpmMeta(what, out string) (Meta, error) {
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		if l != "" {
			lines = append(lines, l)
		}
	}
	if len(lines) != 1 {
		return Meta{}, fmt.Errorf("%s: rpm names %d packages (%q), not one", what, len(lines), strings.Join(lines, "; "))
	}
	f := strings.Split(lines[0], "\t")
	if len(f) != 3 || f[0] == "" || f[1] == "" || f[2] == "" {
		return Meta{}, fmt.Errorf("%s: rpm says %q: not a package's name, version and architecture", what, lines[0])
	}
	// rpm takes an epoch of 0 for none, and names the package without.
	return Meta{Name: f[0], Version: strings.TrimPrefix(f[1], "0:"), Arch: f[2]}, nil
}

// rpmLead is the magic an rpm file starts with (its lead).
var rpmLead = []byte{0xed, 0xab, 0xee, 0xdb}

func (r Rpm) Inspect(ctx context.Context, file string) (Meta, error) {
	// rpm -qp takes a file that is not a package for a manifest, a list
	// of packages to read: the lead says first what the file is.
	f, err := os.Open(file)
	if err != nil {
		return Meta{}, err
	}
	lead := make([]byte, len(rpmLead))
	_, err = io.ReadFull(f, lead)
	f.Close()
	if err != nil || !bytes.Equal(lead, rpmLead) {
		return Meta{}, fmt.Errorf("%s is not an rpm package (no rpm lead)", file)
	}
	out, err := r.run(ctx, "-qp", "--qf", rpmMetaFormat, file)
	if err != nil {
		return Meta{}, fmt.Errorf("%s is not an rpm package rpm reads: %w", file, err)
	}
	return parseRpmMeta(file, out)
}

// Installed asks rpm's database, when there is one: a query creates a
// missing database (rpm -q on a Debian host that has rpm as a tool
// would leave one in root's home). A database this process cannot see
// (Debian's rpm keeps it in /root, which the upgrade's unit hides with
// ProtectHome=) is none either.
func (r Rpm) Installed(ctx context.Context, name string) (Meta, Status, error) {
	if _, err := exec.LookPath("rpm"); err != nil {
		return Meta{}, NotInstalled, nil // no rpm at all
	}
	db, err := r.run(ctx, "--eval", "%{_dbpath}")
	if err != nil {
		return Meta{}, NotInstalled, err
	}
	if db = strings.TrimSpace(db); !strings.HasPrefix(db, "/") {
		return Meta{}, NotInstalled, fmt.Errorf("rpm's database path %q is not absolute", db)
	}
	if _, err := os.Lstat(filepath.Join(r.root(), db)); err != nil {
		return Meta{}, NotInstalled, nil
	}
	out, err := r.run(ctx, "-q", "--qf", rpmMetaFormat, name)
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) && ee.ExitCode() == 1 && strings.Contains(out, "is not installed") {
			return Meta{}, NotInstalled, nil
		}
		return Meta{}, NotInstalled, err
	}
	// Two or more versions in the database (an rpm -U cut between the
	// new header's addition and the old one's removal) are an error,
	// never "not installed".
	m, err := parseRpmMeta("rpm -q "+name, out)
	if err != nil {
		return Meta{}, NotInstalled, err
	}
	return m, Installed, nil
}

// Repair has nothing to finish: rpm has no half-installed state as
// dpkg's. A package's files, scriptlets and header go in within one
// transaction, with no separate configuration step left for later, so
// Installed never says HalfInstalled. (What a cut transaction can leave,
// both versions' headers, Installed reports as an error.)
func (r Rpm) Repair(context.Context, string) error { return nil }

// Arch is rpm's name of this host's architecture (x86_64, aarch64). The
// agent's package holds executables: it is never noarch, and a noarch
// package is refused like one of another architecture.
func (r Rpm) Arch(ctx context.Context) (string, error) {
	out, err := r.run(ctx, "--eval", "%{_arch}")
	return strings.TrimSpace(out), err
}

// Install upgrades to file, or goes back to it (--oldpackage: a rollback
// installs the older version; --replacepkgs: the same version again). rpm
// asks nothing. The package ships no %config file (/etc/unbounded is the
// operator's); one a later package marks %config(noreplace) keeps the
// operator's edits, as rpm does with every such file.
func (r Rpm) Install(ctx context.Context, file string) error {
	_, err := r.run(ctx, "-U", "--oldpackage", "--replacepkgs", file)
	return err
}

// Verify is rpm -V, files only: dependencies are not the files' (and
// dpkg --verify does not check them either). Not counted, as not real
// differences: a modification time alone (--nomtime: the content is the
// package's), %config files (--noconfig: the operator's to change, kept by
// rpm) and %ghost files (--noghost: the package names them, never ships
// them).
func (r Rpm) Verify(ctx context.Context, name string) error {
	out, err := r.run(ctx, "-V", "--nodeps", "--nomtime", "--noconfig", "--noghost", name)
	if s := strings.TrimSpace(out); s != "" {
		return fmt.Errorf("rpm -V %s: %s", name, lastLines(s, 10))
	}
	return err
}

// The header tags Repack writes itself (lib/rpmtag.h): rpmpack writes the
// rest.
const (
	tagFileVerifyFlags = 1045
	tagPreinProg       = 1085
	tagPostinProg      = 1086
	tagPreunProg       = 1087
	tagPostunProg      = 1088
	tagVerifyScript    = 1079
	tagVerifyProg      = 1091
	tagPretrans        = 1151
	tagPosttrans       = 1152
	tagPretransProg    = 1153
	tagPosttransProg   = 1154

	senseLess    = 1 << 1
	senseEqual   = 1 << 3
	senseRPMLib  = 1 << 24
	fileIsGhost  = 1 << 6
	modeTypeMask = 0o170000
)

// rpmScriptlets are the scriptlets Repack carries, with their tags.
var rpmScriptlets = []struct {
	name         string
	script, prog int
}{
	{"PRETRANS", tagPretrans, tagPretransProg},
	{"PREIN", 1023, tagPreinProg},
	{"POSTIN", 1024, tagPostinProg},
	{"PREUN", 1025, tagPreunProg},
	{"POSTUN", 1026, tagPostunProg},
	{"POSTTRANS", tagPosttrans, tagPosttransProg},
	{"VERIFYSCRIPT", tagVerifyScript, tagVerifyProg},
}

// rpmDependencies are the dependency kinds Repack carries: rpm's query
// name and the tags of their names, versions and flags.
var rpmDependencies = []struct {
	kind                 string
	name, version, flags int
}{
	{"REQUIRE", 1049, 1050, 1048},
	{"PROVIDE", 1047, 1113, 1112},
	{"CONFLICT", 1054, 1055, 1053},
	{"OBSOLETE", 1090, 1115, 1114},
	{"RECOMMEND", 5046, 5047, 5048},
	{"SUGGEST", 5049, 5050, 5051},
	{"SUPPLEMENT", 5052, 5053, 5054},
	{"ENHANCE", 5055, 5056, 5057},
}

// repackLibRequires are the rpm features the repacked package needs:
// compressed file names and SHA-256 file digests (as rpmpack writes the
// file list), and its zstd payload; a payload requirement of the
// installed package's goes.
var repackLibRequires = []struct{ name, version string }{
	{"rpmlib(CompressedFileNames)", "3.0.4-1"},
	{"rpmlib(FileDigests)", "4.6.0-1"},
	{"rpmlib(PayloadFilesHavePrefix)", "4.0-1"},
	{"rpmlib(PayloadIsZstd)", "5.4.18-1"},
}

// Repack rebuilds the installed package name into dst, as rpm has no
// repack of its own and rpmbuild is not on hosts: the files as they are
// on disk, with the header's modes, owners, modification times and flags
// (%config, %doc, %license, %ghost), verify flags, scriptlets with their
// interpreters, dependencies of every kind (Requires(post) and the like
// with their flags), name, epoch, version, release, architecture and
// descriptive tags, written by rpmpack with a zstd payload at its
// fastest (the package stays on this host). rpmbuild's file classes,
// colors and languages, the changelog and a signature are not carried:
// rpm neither installs nor verifies by them. A package with triggers or
// file capabilities, which rpmpack cannot write, is refused.
func (r Rpm) Repack(ctx context.Context, name, dst string) error {
	q := func(format string) (string, error) { return r.run(ctx, "-q", "--qf", format, name) }
	out, err := q(`%|TRIGGERNAME?{triggers }:{}|%|FILETRIGGERNAME?{file-triggers }:{}|%|TRANSFILETRIGGERNAME?{transaction-file-triggers }:{}|`)
	if err != nil {
		return err
	}
	caps, err := q(`[%{FILECAPS}]`)
	if err != nil {
		return err
	}
	if caps != "" {
		out += "file-capabilities"
	}
	if s := strings.TrimSpace(out); s != "" {
		return fmt.Errorf("repack %s: the installed package has %s, which a repack does not carry", name, s)
	}
	// One line each: rpm keeps these tags to a line.
	out, err = q(`%{NAME}\n%|EPOCH?{%{EPOCH}}:{}|\n%{VERSION}\n%{RELEASE}\n%{ARCH}\n%{OS}\n%{SUMMARY}\n%|LICENSE?{%{LICENSE}}:{}|\n` +
		`%|URL?{%{URL}}:{}|\n%|VENDOR?{%{VENDOR}}:{}|\n%|PACKAGER?{%{PACKAGER}}:{}|\n%|GROUP?{%{GROUP}}:{}|\n` +
		`%|BUILDHOST?{%{BUILDHOST}}:{}|\n%|BUILDTIME?{%{BUILDTIME}}:{0}|\n`)
	if err != nil {
		return err
	}
	f := strings.Split(out, "\n")
	if len(f) != 15 {
		return fmt.Errorf("repack %s: rpm -q says %q: not one line per tag", name, out)
	}
	md := rpmpack.RPMMetaData{Name: f[0], Epoch: rpmpack.NoEpoch, Version: f[2], Release: f[3], Arch: f[4], OS: f[5],
		Summary: f[6], Licence: f[7], URL: f[8], Vendor: f[9], Packager: f[10], Group: f[11], BuildHost: f[12],
		Compressor: "zstd:fastest"}
	if f[1] != "" {
		e, err := strconv.ParseUint(f[1], 10, 32)
		if err != nil {
			return fmt.Errorf("repack %s: epoch %q: %w", name, f[1], err)
		}
		md.Epoch = uint32(e)
	}
	if t, err := strconv.ParseInt(f[13], 10, 64); err == nil && t > 0 {
		md.BuildTime = time.Unix(t, 0)
	}
	if md.Description, err = q(`%|DESCRIPTION?{%{DESCRIPTION}}:{}|`); err != nil {
		return err
	}
	pkg, err := rpmpack.NewRPM(md)
	if err != nil {
		return err
	}
	for _, s := range rpmScriptlets {
		script, err := q(`%|` + s.name + `?{%{` + s.name + `}}:{}|`)
		if err != nil {
			return err
		}
		// An interpreter may have arguments, or run no script body
		// (%post -p /sbin/ldconfig).
		prog, err := q(`%|` + s.name + `PROG?{[%{` + s.name + `PROG}\n]}:{}|`)
		if err != nil {
			return err
		}
		if script != "" {
			pkg.AddCustomTag(s.script, rpmpack.EntryString(script))
		}
		if p := strings.Split(strings.TrimSuffix(prog, "\n"), "\n"); prog != "" {
			pkg.AddCustomTag(s.prog, rpmpack.EntryStringSlice(p))
		}
	}
	if err := repackDependencies(pkg, name, q); err != nil {
		return err
	}
	files, err := r.repackFiles(ctx, name)
	if err != nil {
		return err
	}
	// rpmpack writes the files in the order of their names; the verify
	// flags follow it.
	slices.SortFunc(files, func(a, b repackFile) int { return strings.Compare(a.Name, b.Name) })
	verify := make([]int32, len(files))
	for i, f := range files {
		pkg.AddFile(f.RPMFile)
		verify[i] = f.verify
	}
	if len(files) > 0 {
		pkg.AddCustomTag(tagFileVerifyFlags, rpmpack.EntryInt32(verify))
	}
	var b bytes.Buffer
	if err := pkg.Write(&b); err != nil {
		return fmt.Errorf("repack %s: %w", name, err)
	}
	return state.WriteFileAtomic(dst, b.Bytes(), 0o600)
}

// repackDependencies copies the installed package's dependencies (as
// rpm -q, q, says them) into pkg, rpmlib's own requirements written as
// this build's rpmpack needs them.
func repackDependencies(pkg *rpmpack.RPM, name string, q func(format string) (string, error)) error {
	for _, d := range rpmDependencies {
		out, err := q(`[%{` + d.kind + `NAME}\t%{` + d.kind + `FLAGS}\t%{` + d.kind + `VERSION}\n]`)
		if err != nil {
			return err
		}
		var names, versions []string
		var flags []uint32
		for _, l := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
			if l == "" {
				continue
			}
			v := strings.Split(l, "\t")
			if len(v) != 3 {
				return fmt.Errorf("repack %s: rpm -q says %q: not a dependency's name, flags and version", name, l)
			}
			fl, err := strconv.ParseUint(v[1], 10, 32)
			if err != nil {
				return fmt.Errorf("repack %s: dependency %q: %w", name, l, err)
			}
			if d.kind == "REQUIRE" && repackLibRequired(v[0]) {
				continue // written below
			}
			names, versions, flags = append(names, v[0]), append(versions, v[2]), append(flags, uint32(fl))
		}
		if d.kind == "REQUIRE" {
			for _, lr := range repackLibRequires {
				names, versions, flags = append(names, lr.name), append(versions, lr.version), append(flags, senseRPMLib|senseLess|senseEqual)
			}
		}
		if len(names) > 0 {
			pkg.AddCustomTag(d.name, rpmpack.EntryStringSlice(names))
			pkg.AddCustomTag(d.version, rpmpack.EntryStringSlice(versions))
			pkg.AddCustomTag(d.flags, rpmpack.EntryUint32(flags))
		}
	}
	return nil
}

type repackFile struct {
	rpmpack.RPMFile
	verify int32
}

// repackFiles reads the installed package's file list from rpm's
// database and each file from disk. A file that is gone is left out (the
// operator removed it; rpm -V says so), as dpkg-repack does.
func (r Rpm) repackFiles(ctx context.Context, name string) ([]repackFile, error) {
	out, err := r.run(ctx, "-q", "--qf", `[%{FILENAMES}\t%{FILEMODES}\t%{FILEFLAGS}\t%{FILEMTIMES}\t%{FILEUSERNAME}\t%{FILEGROUPNAME}\t%{FILEVERIFYFLAGS}\n]`, name)
	if err != nil {
		return nil, err
	}
	var files []repackFile
	for _, l := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		if l == "" {
			continue
		}
		v := strings.Split(l, "\t")
		var n [4]uint64
		ok := len(v) == 7 && strings.HasPrefix(v[0], "/")
		for i, s := range []int{1, 2, 3, 6} {
			if !ok {
				break
			}
			n[i], err = strconv.ParseUint(v[s], 10, 32)
			ok = err == nil
		}
		if !ok {
			return nil, fmt.Errorf("repack %s: rpm -q says %q: not a file's name, mode, flags, time, owner, group and verify flags", name, l)
		}
		f := repackFile{RPMFile: rpmpack.RPMFile{Name: v[0], Mode: uint(n[0]), Type: rpmpack.FileType(n[1]), MTime: uint32(n[2]),
			Owner: v[4], Group: v[5]}, verify: int32(uint32(n[3]))}
		p := filepath.Join(r.root(), v[0])
		switch {
		case n[0]&modeTypeMask == 0o040000:
		case n[0]&modeTypeMask == 0o120000:
			target, err := os.Readlink(p)
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			if err != nil {
				return nil, err
			}
			f.Body = []byte(target)
		case n[0]&modeTypeMask == 0o100000:
			if n[1]&fileIsGhost != 0 {
				break
			}
			data, err := os.ReadFile(p)
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			if err != nil {
				return nil, err
			}
			f.Body = data
		default:
			return nil, fmt.Errorf("repack %s: %s is neither a directory, a link nor a regular file (mode %o)", name, v[0], n[0])
		}
		files = append(files, f)
	}
	return files, nil
}

// repackLibRequired says whether the rpm feature dependency name is one
// Repack writes itself: one of repackLibRequires, or a payload format
// (the installed package's payload may have been another).
func repackLibRequired(name string) bool {
	if strings.HasPrefix(name, "rpmlib(PayloadIs") {
		return true
	}
	for _, lr := range repackLibRequires {
		if lr.name == name {
			return true
		}
	}
	return false
}
