// Package packages_test is test tier 3 (ARCHITECTURE section 9): the built
// .deb and .rpm are installed, upgraded and removed in scratch roots with the
// real dpkg and rpm, their maintainer scripts run for real against a
// systemctl that logs its calls, and lintian checks the .deb.
//
// The packages come from `make packages` through UNBOUNDED_TEST_DEB and
// UNBOUNDED_TEST_RPM (tests/run-tiers.sh sets them). What a package must
// hold is computed from this tree (units/, lib/config/reference.toml, the
// CONCERNS line of deb/build-packages.sh), so the packages under test must
// have been built from it.
package packages_test

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"debug/elf"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"unbounded-cloud.io/agent/tests/tiers"
)

// entry is one path a package installs, as the file system sees it.
type entry struct {
	typ  byte        // 'f' regular file, 'd' directory, 'l' symlink
	perm fs.FileMode // permission bits (not for symlinks)
	link string      // target of a symlink
}

func (e entry) String() string {
	if e.typ == 'l' {
		return "symlink -> " + e.link
	}
	return fmt.Sprintf("%c %04o", e.typ, e.perm)
}

// contents is what one package format must install: files and symlinks, the
// directories the package owns, and the package's units by name.
type contents struct {
	entries map[string]entry // absolute path -> entry; owned dirs included
	// units are the unit names under /usr/lib/systemd/system that the
	// maintainer scripts act on (templates excluded); stopNames adds one
	// instance pattern per template, as prerm/%preun stop them.
	units, stopNames []string
	// unitSources maps an installed unit path to its file in units/.
	unitSources map[string]string
}

// repoRoot is the repository this test is part of.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "deb", "build-packages.sh")); err != nil {
		t.Fatalf("repository root %s: %v", root, err)
	}
	return root
}

// isUnitFile mirrors is_unit_file in deb/build-packages.sh: the files of
// units/ that are not installed as units.
func isUnitFile(name string) bool {
	switch {
	case name == "80-unbounded.preset", strings.HasPrefix(name, "README"),
		strings.HasSuffix(name, ".go"), strings.HasSuffix(name, ".md"),
		strings.HasPrefix(name, "."):
		return false
	}
	return true
}

// concerns reads the one CONCERNS="..." line of deb/build-packages.sh: the
// links to the multicall executable that the package must hold.
func concerns(t *testing.T, root string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "deb", "build-packages.sh"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^CONCERNS="([^"]*)"$`).FindSubmatch(b)
	if m == nil {
		t.Fatal(`deb/build-packages.sh has no CONCERNS="..." line`)
	}
	return strings.Fields(string(m[1]))
}

// manPages are the man pages both packages ship (make docs).
var manPages = []string{"/usr/share/man/man1/unbounded.1.gz", "/usr/share/man/man5/unbounded-agent.toml.5.gz"}

// completions are the completion scripts of each format, in the places
// bash-completion, zsh and fish look (zsh: Debian's vendor-completions,
// Fedora's site-functions).
var completions = map[string][]string{
	"deb": {"/usr/share/bash-completion/completions/unbounded", "/usr/share/zsh/vendor-completions/_unbounded", "/usr/share/fish/vendor_completions.d/unbounded.fish"},
	"rpm": {"/usr/share/bash-completion/completions/unbounded", "/usr/share/zsh/site-functions/_unbounded", "/usr/share/fish/vendor_completions.d/unbounded.fish"},
}

// expected computes what the package of format ("deb" or "rpm") must hold
// from the tree it was built from.
func expected(t *testing.T, format string) contents {
	t.Helper()
	root := repoRoot(t)
	c := contents{entries: map[string]entry{}, unitSources: map[string]string{}}
	file := func(p string, perm fs.FileMode) { c.entries[p] = entry{typ: 'f', perm: perm} }
	dir := func(p string, perm fs.FileMode) { c.entries[p] = entry{typ: 'd', perm: perm} }

	file("/usr/bin/unbounded", 0o755)
	file("/usr/lib/systemd/system-generators/unbounded-generator", 0o755)
	file("/usr/libexec/unbounded/restart", 0o755)
	file("/usr/libexec/unbounded/health", 0o755)
	file("/usr/lib/systemd/system-preset/80-unbounded.preset", 0o644)
	file(tmpfilesConf, 0o644)
	dir("/usr/libexec/unbounded", 0o755)
	dir("/etc/unbounded", 0o755)
	dir("/etc/unbounded/agent.toml.d", 0o755)
	dir("/var/lib/unbounded", 0o700)
	dir("/usr/share/doc/unbounded-agent", 0o755)
	for _, p := range manPages {
		file(p, 0o644)
	}
	for _, p := range completions[format] {
		file(p, 0o644)
	}
	switch format {
	case "deb":
		// Debian's copyright file stays out of the .rpm, which has the
		// license text instead.
		file("/usr/share/doc/unbounded-agent/copyright", 0o644)
		file("/usr/share/doc/unbounded-agent/changelog.gz", 0o644)
		file("/usr/share/lintian/overrides/unbounded-agent", 0o644)
	case "rpm":
		dir("/usr/share/licenses/unbounded-agent", 0o755)
		file("/usr/share/licenses/unbounded-agent/LICENSE", 0o644)
	}
	if _, err := os.Stat(filepath.Join(root, "lib", "config", "reference.toml")); err == nil {
		file("/usr/share/doc/unbounded-agent/agent.toml.example", 0o644)
	}
	if cs := concerns(t, root); len(cs) > 0 {
		file("/usr/libexec/unbounded/unbounded-agent", 0o755)
		for _, name := range cs {
			c.entries["/usr/libexec/unbounded/"+name] = entry{typ: 'l', link: "unbounded-agent"}
		}
	}

	unitsDir := filepath.Join(root, "units")
	err := filepath.WalkDir(unitsDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(unitsDir, p)
		dst := "/usr/lib/systemd/system/" + filepath.ToSlash(rel)
		switch {
		case p == unitsDir:
			return nil
		case d.IsDir() && d.Name() == "testdata":
			return filepath.SkipDir
		case d.IsDir():
			dir(dst, 0o755)
		case d.Type().IsRegular() && isUnitFile(d.Name()):
			file(dst, 0o644)
			c.unitSources[dst] = p
			if filepath.Dir(rel) == "." && strings.HasPrefix(d.Name(), "unbounded-") {
				if i := strings.Index(d.Name(), "@."); i >= 0 {
					c.stopNames = append(c.stopNames, d.Name()[:i]+"@*."+d.Name()[i+2:])
				} else {
					c.units = append(c.units, d.Name())
					c.stopNames = append(c.stopNames, d.Name())
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("reading units/: %v", err)
	}
	return c
}

// packageFile returns the package named by env, or skips the test.
func packageFile(t *testing.T, env string) string {
	t.Helper()
	p := os.Getenv(env)
	if p == "" {
		tiers.Skip(t, tiers.Packages, "%s is not set: build the packages with `make packages` and point it at the result (make test does)", env)
	}
	if _, err := os.Stat(p); err != nil {
		tiers.Skip(t, tiers.Packages, "%s=%s: %v", env, p, err)
	}
	return p
}

func requireRoot(t *testing.T, why string) {
	t.Helper()
	if os.Geteuid() != 0 {
		tiers.Skip(t, tiers.Packages, "needs root: %s", why)
	}
}

func requireTools(t *testing.T, names ...string) {
	t.Helper()
	for _, n := range names {
		if _, err := exec.LookPath(n); err != nil {
			tiers.Skip(t, tiers.Packages, "%s is not installed (apt-get install dpkg rpm lintian busybox-static)", n)
		}
	}
}

// staticBusybox is a busybox that runs inside a scratch root with no
// libraries: rpm, and dpkg without --force-script-chrootless, run the
// maintainer scripts chrooted into the root with its /bin/sh.
func staticBusybox(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("busybox")
	if err != nil {
		tiers.Skip(t, tiers.Packages, "busybox is not installed: apt-get install busybox-static (its sh runs the scripts inside the scratch root)")
	}
	f, err := elf.Open(p)
	if err != nil {
		tiers.Skip(t, tiers.Packages, "busybox at %s: %v", p, err)
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			tiers.Skip(t, tiers.Packages, "busybox at %s is dynamically linked: install busybox-static", p)
		}
	}
	return p
}

// run runs a command and fails the test with its output when it fails.
func run(t *testing.T, env []string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// debEntries lists the data archive of a .deb with dpkg-deb; the file
// contents of the changelog come along to compare with the control version.
func debEntries(t *testing.T, deb string) (map[string]entry, []byte) {
	t.Helper()
	cmd := exec.Command("dpkg-deb", "--fsys-tarfile", deb)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("dpkg-deb --fsys-tarfile %s: %v\n%s", deb, err, stderr.String())
	}
	got := map[string]entry{}
	var changelog []byte
	tr := tar.NewReader(bytes.NewReader(out))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("reading the data archive of %s: %v", deb, err)
		}
		p := "/" + strings.Trim(strings.TrimPrefix(h.Name, "."), "/")
		if p == "/" {
			continue
		}
		perm := fs.FileMode(h.Mode) & fs.ModePerm
		switch h.Typeflag {
		case tar.TypeDir:
			got[p] = entry{typ: 'd', perm: perm}
		case tar.TypeSymlink:
			got[p] = entry{typ: 'l', link: h.Linkname}
		case tar.TypeReg:
			got[p] = entry{typ: 'f', perm: perm}
			if p == "/usr/share/doc/unbounded-agent/changelog.gz" {
				changelog, _ = io.ReadAll(tr)
			}
		default:
			t.Errorf("%s: unexpected tar entry type %q", p, h.Typeflag)
		}
	}
	return got, changelog
}

// rpmEntries lists the files of an .rpm with the real rpm.
func rpmEntries(t *testing.T, rpm string) map[string]entry {
	t.Helper()
	out := run(t, nil, "rpm", "-qp", "--qf", `[%{FILENAMES}\t%{FILEMODES}\t%{FILELINKTOS}\n]`, rpm)
	got := map[string]entry{}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Split(line, "\t")
		if len(f) != 3 || !strings.HasPrefix(f[0], "/") {
			continue // rpm's warnings on Debian ("use Alien instead")
		}
		mode, err := strconv.ParseUint(f[1], 10, 32)
		if err != nil {
			t.Fatalf("rpm -qp: bad mode in %q", line)
		}
		perm := fs.FileMode(mode) & fs.ModePerm
		switch mode & 0o170000 {
		case 0o040000:
			got[f[0]] = entry{typ: 'd', perm: perm}
		case 0o120000:
			got[f[0]] = entry{typ: 'l', link: f[2]}
		case 0o100000:
			got[f[0]] = entry{typ: 'f', perm: perm}
		default:
			t.Errorf("%s: unexpected file type %o", f[0], mode)
		}
	}
	return got
}

// compareEntries reports every path the package holds that it should not,
// and every expected path it lacks or holds with another type or mode.
// implicitDirs allows the parent directories of expected paths (a .deb lists
// them; an .rpm lists only the directories it owns).
func compareEntries(t *testing.T, pkg string, got, want map[string]entry, implicitDirs bool) {
	t.Helper()
	parents := map[string]bool{}
	for p := range want {
		for d := filepath.Dir(p); d != "/"; d = filepath.Dir(d) {
			parents[d] = true
		}
	}
	for _, p := range sortedKeys(got) {
		w, ok := want[p]
		switch {
		case ok && w != got[p]:
			t.Errorf("%s: %s is %v, want %v", pkg, p, got[p], w)
		case !ok && implicitDirs && got[p].typ == 'd' && parents[p]:
		case !ok:
			t.Errorf("%s: holds %s (%v), which it should not", pkg, p, got[p])
		}
	}
	for _, p := range sortedKeys(want) {
		if _, ok := got[p]; !ok {
			t.Errorf("%s: lacks %s (%v)", pkg, p, want[p])
		}
	}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func TestDebHoldsExactlyTheExpectedFiles(t *testing.T) {
	deb := packageFile(t, "UNBOUNDED_TEST_DEB")
	requireTools(t, "dpkg-deb")
	got, changelog := debEntries(t, deb)
	compareEntries(t, filepath.Base(deb), got, expected(t, "deb").entries, true)

	// The changelog's newest entry names the version the package has:
	// that is how `apt changelog` and lintian read it.
	version := strings.TrimSpace(run(t, nil, "dpkg-deb", "-f", deb, "Version"))
	if changelog == nil {
		t.Fatal("no changelog.gz to check")
	}
	zr, err := gzip.NewReader(bytes.NewReader(changelog))
	if err != nil {
		t.Fatalf("changelog.gz: %v", err)
	}
	first, _ := bufio.NewReader(zr).ReadString('\n')
	if want := "unbounded-agent (" + version + ") "; !strings.HasPrefix(first, want) {
		t.Errorf("changelog.gz starts with %q, want the package version %q", first, want)
	}
}

func TestRPMHoldsExactlyTheExpectedFiles(t *testing.T) {
	rpm := packageFile(t, "UNBOUNDED_TEST_RPM")
	requireTools(t, "rpm")
	compareEntries(t, filepath.Base(rpm), rpmEntries(t, rpm), expected(t, "rpm").entries, false)
}

// snapshot describes every path under root but those skipped (package
// databases, the fake systemctl's log).
func snapshot(t *testing.T, root string, skip ...string) map[string]entry {
	t.Helper()
	got := map[string]entry{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel := "/" + strings.TrimPrefix(strings.TrimPrefix(p, root), "/")
		if slices.Contains(skip, rel) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			l, err := os.Readlink(p)
			if err != nil {
				return err
			}
			got[rel] = entry{typ: 'l', link: l}
		case d.IsDir():
			got[rel] = entry{typ: 'd', perm: info.Mode().Perm()}
		default:
			got[rel] = entry{typ: 'f', perm: info.Mode().Perm()}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// assertNothingLeft fails for every path that exists after removal but did
// not before the install.
func assertNothingLeft(t *testing.T, before, after map[string]entry) {
	t.Helper()
	for _, p := range sortedKeys(after) {
		if _, ok := before[p]; !ok {
			t.Errorf("left behind after removal: %s (%v)", p, after[p])
		}
	}
}

// assertInstalled checks every expected path in root with its type and
// mode, and that each unit is the file of units/ it was built from.
func assertInstalled(t *testing.T, root string, want contents) {
	t.Helper()
	for _, p := range sortedKeys(want.entries) {
		w := want.entries[p]
		info, err := os.Lstat(filepath.Join(root, p))
		if err != nil {
			t.Errorf("not installed: %s: %v", p, err)
			continue
		}
		var got entry
		switch {
		case info.Mode()&fs.ModeSymlink != 0:
			l, _ := os.Readlink(filepath.Join(root, p))
			got = entry{typ: 'l', link: l}
		case info.IsDir():
			got = entry{typ: 'd', perm: info.Mode().Perm()}
		default:
			got = entry{typ: 'f', perm: info.Mode().Perm()}
		}
		if got != w {
			t.Errorf("installed %s is %v, want %v", p, got, w)
		}
	}
	for dst, src := range want.unitSources {
		a, errA := os.ReadFile(filepath.Join(root, dst))
		b, errB := os.ReadFile(src)
		if errA == nil && errB == nil && !bytes.Equal(a, b) {
			t.Errorf("installed %s differs from %s: rebuild the packages (make packages)", dst, src)
		}
	}
}

// fakeSystemctl is the log of a systemctl that records its arguments.
type fakeSystemctl struct{ log string }

// calls returns the logged calls, each normalized with its unit arguments
// sorted: the scripts list units in the order of their shell's globbing.
func (f fakeSystemctl) calls(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(f.log)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var calls []string
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if line != "" {
			calls = append(calls, normalizeCall(line))
		}
	}
	return calls
}

func normalizeCall(line string) string {
	var flags, rest []string
	for _, a := range strings.Fields(line) {
		if strings.HasPrefix(a, "-") {
			flags = append(flags, a)
		} else {
			rest = append(rest, a)
		}
	}
	if len(rest) > 1 {
		sort.Strings(rest[1:])
	}
	return strings.Join(append(flags, rest...), " ")
}

// call builds the normalized call the scripts are expected to make; a verb
// over no units is not called at all (nil).
func call(flags []string, verb string, units []string) []string {
	if len(units) == 0 && verb != "daemon-reload" {
		return nil
	}
	return []string{normalizeCall(strings.Join(append(append(slices.Clone(flags), verb), units...), " "))}
}

func assertCalls(t *testing.T, phase string, got []string, want ...[]string) {
	t.Helper()
	var w []string
	for _, c := range want {
		w = append(w, c...)
	}
	if !slices.Equal(got, w) {
		t.Errorf("%s: systemctl calls\n got  %q\n want %q", phase, got, w)
	}
}

// newRoot makes a scratch root holding the directories that a Debian or
// RPM system's base packages own (so that removal can be compared with the
// state before install), /bin/sh from busybox-static when the scripts run
// inside it, and a fake systemctl in /usr/bin that logs its calls.
func newRoot(t *testing.T, busybox string, systemdRunning bool) (string, fakeSystemctl) {
	t.Helper()
	root := t.TempDir()
	for _, d := range []string{
		"bin", "tmp", "var/tmp", "usr/bin", "usr/libexec", "usr/share/doc", "usr/share/licenses",
		"usr/lib/systemd/system", "usr/lib/systemd/system-generators", "usr/lib/systemd/system-preset",
		"usr/lib/tmpfiles.d",
		"etc/systemd/system", "var/lib",
		// Owned by the base system and the shells, not by this package.
		"usr/share/man/man1", "usr/share/man/man5", "usr/share/bash-completion/completions",
		"usr/share/zsh/vendor-completions", "usr/share/zsh/site-functions", "usr/share/fish/vendor_completions.d",
	} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// Scripts redirect to /dev/null, as on every real system.
	if err := os.MkdirAll(filepath.Join(root, "dev"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mknod(filepath.Join(root, "dev/null"), syscall.S_IFCHR|0o666, 1<<8|3); err != nil {
		tiers.Skip(t, tiers.Packages, "cannot make /dev/null in the scratch root %s: %v", root, err)
	}
	if systemdRunning {
		if err := os.MkdirAll(filepath.Join(root, "run/systemd/system"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if busybox != "" {
		b, err := os.ReadFile(busybox)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, "bin/busybox"), b, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink("busybox", filepath.Join(root, "bin/sh")); err != nil {
			t.Fatal(err)
		}
	}
	script := "#!/bin/sh\necho \"$*\" >>/tmp/systemctl.log\n"
	if err := os.WriteFile(filepath.Join(root, "usr/bin/systemctl"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	// deb-systemd-invoke is Perl, which the scratch root has not: this one
	// passes its call on to systemctl, as the real one does when
	// policy-rc.d allows it (TestDebPrermHonoursPolicyRcD runs the real
	// one).
	invoke := "#!/bin/sh\nexec systemctl \"$@\"\n"
	if err := os.WriteFile(filepath.Join(root, "usr/bin/deb-systemd-invoke"), []byte(invoke), 0o755); err != nil {
		t.Fatal(err)
	}
	return root, fakeSystemctl{log: filepath.Join(root, "tmp/systemctl.log")}
}

func newDpkgDatabase(t *testing.T, root string) {
	t.Helper()
	for _, d := range []string{"var/lib/dpkg/info", "var/lib/dpkg/updates"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "var/lib/dpkg/status"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestDebScriptsReloadAndStopOnlyWhereSystemdRuns runs dpkg the way a host
// does (the scripts chrooted into the root, with the root's /bin/sh), once as
// a host where systemd runs (/run/systemd/system exists) and once as one
// where it does not.
func TestDebScriptsReloadAndStopOnlyWhereSystemdRuns(t *testing.T) {
	deb := packageFile(t, "UNBOUNDED_TEST_DEB")
	requireRoot(t, "dpkg --root chroots into the scratch root to run the maintainer scripts")
	requireTools(t, "dpkg", "dpkg-deb")
	busybox := staticBusybox(t)
	want := expected(t, "deb")

	for _, running := range []bool{true, false} {
		t.Run(fmt.Sprintf("systemd running=%v", running), func(t *testing.T) {
			t.Parallel()
			root, fake := newRoot(t, busybox, running)
			newDpkgDatabase(t, root)

			// What an operator owns and a purge must keep: a mask of one of
			// the package's units.
			mask := filepath.Join(root, "etc/systemd/system/unbounded-masked-by-operator.service")
			if err := os.Symlink("/dev/null", mask); err != nil {
				t.Fatal(err)
			}
			before := snapshot(t, root, "/var/lib/dpkg", "/tmp/systemctl.log")
			var reload []string
			if running {
				reload = call(nil, "daemon-reload", nil)
			}
			// The scratch root has no systemd package: the dependency on it
			// cannot be met there.
			dpkg := func(args ...string) string {
				return run(t, nil, "dpkg", append([]string{"--root=" + root, "--force-depends"}, args...)...)
			}

			dpkg("-i", deb)
			assertInstalled(t, root, want)
			assertCalls(t, "first install", fake.calls(t),
				call([]string{"--no-reload"}, "preset", want.units), reload)

			// Upgrade: the same package again runs prerm upgrade and
			// postinst configure <old version>: no preset, no stop.
			_ = os.Remove(fake.log)
			dpkg("-i", deb)
			assertCalls(t, "upgrade", fake.calls(t), reload)

			// What `systemctl preset` would have made (the fake makes
			// nothing): a purge removes it with the .wants directory.
			if len(want.units) > 0 {
				wants := filepath.Join(root, "etc/systemd/system/multi-user.target.wants")
				if err := os.MkdirAll(wants, 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.Symlink("/usr/lib/systemd/system/"+want.units[0], filepath.Join(wants, want.units[0])); err != nil {
					t.Fatal(err)
				}
			}

			_ = os.Remove(fake.log)
			dpkg("-r", "unbounded-agent")
			var stop []string
			if running {
				stop = call(nil, "stop", want.stopNames)
			}
			assertCalls(t, "remove", fake.calls(t), stop, reload)

			_ = os.Remove(fake.log)
			dpkg("-P", "unbounded-agent")
			assertCalls(t, "purge", fake.calls(t), reload)
			assertNothingLeft(t, before, snapshot(t, root, "/var/lib/dpkg", "/tmp/systemctl.log"))
			if _, err := os.Lstat(mask); err != nil {
				t.Errorf("purge removed the operator's mask: %v", err)
			}
		})
	}
}

// TestDebImageBuilderInstallAppliesPresetsOffline installs the way an image
// builder does (dpkg --root with --force-script-chrootless: the scripts run
// on the build host with DPKG_ROOT set). The presets are applied by the real
// systemctl with --root; nothing touches the build host's systemd; the purge
// takes the enablement links away again.
func TestDebImageBuilderInstallAppliesPresetsOffline(t *testing.T) {
	deb := packageFile(t, "UNBOUNDED_TEST_DEB")
	requireRoot(t, "dpkg --root installs files owned by root")
	requireTools(t, "dpkg", "dpkg-deb", "systemctl")
	realSystemctl, _ := exec.LookPath("systemctl")
	want := expected(t, "deb")
	t.Parallel()

	root, _ := newRoot(t, "", false)
	newDpkgDatabase(t, root)
	// The fake on the build host's PATH logs every call, passes the
	// offline ones (--root) to the real systemctl and drops the rest: a
	// call without --root would act on the build host.
	fakeDir := t.TempDir()
	fake := fakeSystemctl{log: filepath.Join(fakeDir, "log")}
	script := fmt.Sprintf("#!/bin/sh\necho \"$*\" >>%s\ncase \" $* \" in *' --root='*) exec %s \"$@\" ;; esac\nexit 0\n", fake.log, realSystemctl)
	if err := os.WriteFile(filepath.Join(fakeDir, "systemctl"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	env := []string{"PATH=" + fakeDir + ":" + os.Getenv("PATH")}
	dpkg := func(args ...string) string {
		return run(t, env, "dpkg", append([]string{"--root=" + root, "--force-script-chrootless", "--force-depends"}, args...)...)
	}
	before := snapshot(t, root, "/var/lib/dpkg")

	dpkg("-i", deb)
	assertInstalled(t, root, want)
	assertCalls(t, "first install", fake.calls(t), call([]string{"--root=" + root, "--no-reload"}, "preset", want.units))

	// Every link the presets made points at one of the package's units.
	links := 0
	etc := filepath.Join(root, "etc/systemd/system")
	_ = filepath.WalkDir(etc, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.Type()&fs.ModeSymlink == 0 {
			return err
		}
		target, _ := os.Readlink(p)
		if !strings.HasPrefix(target, "/usr/lib/systemd/system/unbounded-") {
			t.Errorf("preset made %s -> %s, not a link to a unit of the package", p, target)
		}
		if _, err := os.Stat(filepath.Join(root, target)); err != nil {
			t.Errorf("preset made %s -> %s: %v", p, target, err)
		}
		links++
		return nil
	})
	t.Logf("the presets enabled %d unit link(s)", links)

	_ = os.Remove(fake.log)
	dpkg("-i", deb)
	assertCalls(t, "upgrade", fake.calls(t))

	_ = os.Remove(fake.log)
	dpkg("-P", "unbounded-agent")
	assertCalls(t, "purge", fake.calls(t))
	assertNothingLeft(t, before, snapshot(t, root, "/var/lib/dpkg"))
}

// TestPurgeKeepsTheNodeState: the agent's state in /var/lib/unbounded is the
// node's (keys, applied configs); a purge must not delete it.
func TestPurgeKeepsTheNodeState(t *testing.T) {
	deb := packageFile(t, "UNBOUNDED_TEST_DEB")
	requireRoot(t, "dpkg --root installs files owned by root")
	requireTools(t, "dpkg", "dpkg-deb")
	t.Parallel()

	root, _ := newRoot(t, "", false)
	newDpkgDatabase(t, root)
	fakeDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(fakeDir, "systemctl"), []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	env := []string{"PATH=" + fakeDir + ":" + os.Getenv("PATH")}
	dpkg := func(args ...string) string {
		return run(t, env, "dpkg", append([]string{"--root=" + root, "--force-script-chrootless", "--force-depends"}, args...)...)
	}
	dpkg("-i", deb)
	state := filepath.Join(root, "var/lib/unbounded/kube1-applied-config.json")
	config := filepath.Join(root, "etc/unbounded/agent.toml")
	for _, p := range []string{state, config} {
		if err := os.WriteFile(p, []byte("{}"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	dpkg("-P", "unbounded-agent")
	for _, p := range []string{state, config} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("purge deleted %s: %v", p, err)
		}
	}
	if info, err := os.Stat(filepath.Dir(state)); err == nil && info.Mode().Perm() != 0o700 {
		t.Errorf("kept /var/lib/unbounded is %04o, want 0700", info.Mode().Perm())
	}
}

// TestRPMScriptletsReloadAndStopOnlyWhereSystemdRuns installs, upgrades and
// erases the .rpm in a scratch root; rpm runs the scriptlets chrooted into
// it with busybox-static's sh.
func TestRPMScriptletsReloadAndStopOnlyWhereSystemdRuns(t *testing.T) {
	rpm := packageFile(t, "UNBOUNDED_TEST_RPM")
	requireRoot(t, "rpm --root chroots into the scratch root to run the scriptlets")
	requireTools(t, "rpm")
	busybox := staticBusybox(t)
	want := expected(t, "rpm")

	for _, running := range []bool{true, false} {
		t.Run(fmt.Sprintf("systemd running=%v", running), func(t *testing.T) {
			t.Parallel()
			root, fake := newRoot(t, busybox, running)
			before := snapshot(t, root, "/var/lib/rpm", "/tmp/systemctl.log")
			var reload []string
			if running {
				reload = call(nil, "daemon-reload", nil)
			}
			// The scratch root has no systemd package: --nodeps.
			rpmRun := func(args ...string) {
				out := run(t, nil, "rpm", append([]string{"--root", root, "--define", "_dbpath /var/lib/rpm"}, args...)...)
				// A failing scriptlet does not fail rpm: look for its warning.
				if strings.Contains(out, "scriptlet failed") {
					t.Errorf("rpm %s: %s", strings.Join(args, " "), out)
				}
			}

			rpmRun("-i", "--nodeps", rpm)
			assertInstalled(t, root, want)
			assertCalls(t, "first install", fake.calls(t),
				call([]string{"--no-reload"}, "preset", want.units), reload)

			// Upgrade: %post with $1=2, then the old %preun and %postun
			// with $1=1: no preset, no stop.
			_ = os.Remove(fake.log)
			rpmRun("-U", "--replacepkgs", "--nodeps", rpm)
			assertCalls(t, "upgrade", fake.calls(t), reload, reload)

			_ = os.Remove(fake.log)
			rpmRun("-e", "unbounded-agent")
			var stop []string
			if running {
				stop = call(nil, "stop", want.stopNames)
			}
			assertCalls(t, "erase", fake.calls(t), stop,
				call([]string{"--no-reload"}, "disable", want.units), reload)
			assertNothingLeft(t, before, snapshot(t, root, "/var/lib/rpm", "/tmp/systemctl.log"))
		})
	}
}

func TestRPMDigestsAndScriptletsAreSane(t *testing.T) {
	rpm := packageFile(t, "UNBOUNDED_TEST_RPM")
	requireTools(t, "rpm")
	t.Parallel()

	out := run(t, nil, "rpm", "-Kv", rpm)
	for _, want := range []string{"Header SHA256 digest: OK", "Payload SHA256 digest: OK"} {
		if !strings.Contains(out, want) {
			t.Errorf("rpm -Kv: no %q in\n%s", want, out)
		}
	}
	if strings.Contains(out, "BAD") {
		t.Errorf("rpm -Kv reports a bad digest:\n%s", out)
	}

	scripts := run(t, nil, "rpm", "-qp", "--scripts", rpm)
	for _, want := range []string{
		"postinstall scriptlet (using /bin/sh)",
		"preuninstall scriptlet (using /bin/sh)",
		"postuninstall scriptlet (using /bin/sh)",
		"preset",
	} {
		if !strings.Contains(scripts, want) {
			t.Errorf("rpm -qp --scripts: no %q in\n%s", want, scripts)
		}
	}
	for _, line := range strings.Split(scripts, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue
		}
		for _, verb := range []string{" start ", " restart ", " try-restart ", " reload-or-restart ", "--now"} {
			if strings.Contains(line+" ", verb) {
				t.Errorf("rpm -qp --scripts: %q: the scriptlets must start nothing", line)
			}
		}
	}
}

// TestDebHasNoLintianErrors runs lintian on the .deb; warnings are allowed
// but listed in the test log.
func TestDebHasNoLintianErrors(t *testing.T) {
	deb := packageFile(t, "UNBOUNDED_TEST_DEB")
	requireTools(t, "lintian")
	t.Parallel()

	// Not --show-overrides: with it lintian 2.116 counts the overridden
	// errors in its exit status.
	cmd := exec.Command("lintian", "--fail-on", "error", "--display-info", deb)
	out, err := cmd.CombinedOutput()
	errors := 0
	for _, line := range strings.Split(string(out), "\n") {
		switch {
		case strings.HasPrefix(line, "E: "):
			errors++
			t.Errorf("lintian: %s", line)
		case strings.Contains(line, " no-manual-page "), strings.Contains(line, "maintainer-script-calls-systemctl [prerm"):
			// Fixed for good: the man pages ship, and prerm stops
			// units through deb-systemd-invoke.
			t.Errorf("lintian: %s", line)
		case strings.HasPrefix(line, "W: "), strings.HasPrefix(line, "I: "),
			strings.HasPrefix(line, "P: "), strings.HasPrefix(line, "X: "):
			t.Logf("lintian: %s", line)
		}
	}
	if err != nil && errors == 0 {
		t.Errorf("lintian failed without reporting an error tag: %v\n%s", err, out)
	}
}

// TestEveryProgramAUnitStartsIsPackaged: a unit whose Exec*= names one of
// the agent's programs (under /usr/libexec/unbounded or /usr/bin/unbounded)
// must find it in the package. A concern that cmd/unbounded-agent serves
// needs its name on the CONCERNS line of deb/build-packages.sh, and
// bin/unbounded-agent in `make build`.
func TestEveryProgramAUnitStartsIsPackaged(t *testing.T) {
	want := expected(t, "deb")
	execLine := regexp.MustCompile(`^\s*Exec[A-Za-z]*\s*=\s*[-@:+!|]*(\S+)`)
	for _, dst := range sortedKeys(want.unitSources) {
		src := want.unitSources[dst]
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(b), "\n") {
			m := execLine.FindStringSubmatch(line)
			if m == nil {
				continue
			}
			prog := m[1]
			if !strings.HasPrefix(prog, "/usr/libexec/unbounded/") && !strings.HasPrefix(prog, "/usr/bin/unbounded") {
				continue
			}
			if _, ok := want.entries[prog]; !ok {
				t.Errorf("%s:%d starts %s, which the package does not hold (a concern of the multicall executable goes on the CONCERNS line of deb/build-packages.sh)", src, i+1, prog)
			}
		}
	}
}

// extractDeb unpacks the .deb's files into a new directory (no scripts).
func extractDeb(t *testing.T, deb string) string {
	t.Helper()
	requireTools(t, "dpkg-deb")
	dir := t.TempDir()
	run(t, nil, "dpkg-deb", "-x", deb, dir)
	return dir
}

// extractRPM installs the .rpm's files into a new root without its
// scriptlets or dependencies: rpm2cpio's cpio archive needs cpio, which
// Debian does not install by default; rpm itself is needed anyway.
func extractRPM(t *testing.T, rpm string) string {
	t.Helper()
	requireRoot(t, "rpm --root installs files owned by root")
	requireTools(t, "rpm")
	dir := t.TempDir()
	run(t, nil, "rpm", "--root", dir, "--define", "_dbpath /var/lib/rpm", "-i", "--nodeps", "--noscripts", rpm)
	return dir
}

// packageTrees are the files of each package that the test can get at.
func packageTrees(t *testing.T) map[string]string {
	t.Helper()
	trees := map[string]string{}
	if deb := os.Getenv("UNBOUNDED_TEST_DEB"); deb != "" {
		trees["deb"] = extractDeb(t, deb)
	}
	if rpm := os.Getenv("UNBOUNDED_TEST_RPM"); rpm != "" {
		trees["rpm"] = extractRPM(t, rpm)
	}
	if len(trees) == 0 {
		t.Skip("UNBOUNDED_TEST_DEB and UNBOUNDED_TEST_RPM are not set: build the packages with `make packages` (make test does)")
	}
	return trees
}

// Both packages ship unbounded(1) and unbounded-agent.toml(5); man renders
// them without a warning, and their NAME line is what whatis/apropos read.
func TestManPagesAreShippedAndRender(t *testing.T) {
	requireTools(t, "man")
	for format, tree := range packageTrees(t) {
		for _, page := range manPages {
			f := filepath.Join(tree, page)
			cmd := exec.Command("man", "--warnings", "-l", f)
			cmd.Env = append(os.Environ(), "LC_ALL=C.UTF-8", "MANWIDTH=80", "MAN_KEEP_FORMATTING=0")
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Run(); err != nil || stderr.Len() > 0 {
				t.Errorf("%s: man -l %s: %v\n%s", format, page, err, stderr.String())
				continue
			}
			// man formats for a terminal (bold and underline by
			// overstriking) even into a pipe: keep the letters.
			// Justified lines have runs of blanks: compare words.
			text := regexp.MustCompile(".\x08").ReplaceAllString(stdout.String(), "")
			text = strings.Join(strings.Fields(text), " ")
			var want []string
			switch filepath.Base(page) {
			case "unbounded.1.gz":
				want = []string{"unbounded - operator command of unbounded-agent", "config check", "supports-isolation MODE", "EXIT STATUS", "needs root"}
			case "unbounded-agent.toml.5.gz":
				want = []string{"unbounded-agent.toml - configuration of unbounded-agent", "api-server (required)", "retry-budget = \"2m\"", "[allocation]"}
			}
			for _, w := range want {
				if !strings.Contains(text, w) {
					t.Errorf("%s: %s as man renders it lacks %q:\n%s", format, page, w, text)
				}
			}
		}
	}
}

// The packaged completion scripts complete a subcommand in their shell;
// zsh and fish (when installed) at least parse theirs.
func TestPackagedCompletionCompletes(t *testing.T) {
	requireTools(t, "bash")
	for format, tree := range packageTrees(t) {
		files := completions[format]
		out := run(t, nil, "bash", "-c", `source "$1"; COMP_WORDS=(unbounded con); COMP_CWORD=1; _unbounded; echo "${COMPREPLY[*]}"`, "_", filepath.Join(tree, files[0]))
		if strings.TrimSpace(out) != "config" {
			t.Errorf("%s: bash completes \"unbounded con\" to %q, want config", format, out)
		}
		out = run(t, nil, "bash", "-c", `source "$1"; COMP_WORDS=(unbounded supports-isolation ""); COMP_CWORD=2; _unbounded; echo "${COMPREPLY[*]}"`, "_", filepath.Join(tree, files[0]))
		if strings.TrimSpace(out) != "nspawn container none" {
			t.Errorf("%s: bash completes \"unbounded supports-isolation \" to %q", format, out)
		}
		for _, sh := range []struct{ shell, flag, file string }{{"zsh", "-n", files[1]}, {"fish", "--no-execute", files[2]}} {
			if _, err := exec.LookPath(sh.shell); err != nil {
				t.Logf("%s is not installed: its completion is not parsed here (lib/cli runs it where it is)", sh.shell)
				continue
			}
			run(t, nil, sh.shell, sh.flag, filepath.Join(tree, sh.file))
		}
	}
}

// The .rpm says that systemd must be installed with it and that each of its
// scriptlets (they run systemctl) needs it: Requires(post), Requires(preun)
// and Requires(postun), as Fedora's %systemd_requires, by which rpm orders
// an install and an erase transaction. It marks the man pages and the
// example config as documentation (rpm -qd lists them, and --excludedocs
// leaves them out), and ships the license text, not Debian's copyright file.
func TestRPMDeclaresScriptletDependenciesAndDocs(t *testing.T) {
	rpm := packageFile(t, "UNBOUNDED_TEST_RPM")
	requireTools(t, "rpm")
	t.Parallel()

	// Each line is "TYPE[,TYPE...] NAME"; rpm may merge the types of one
	// name into one line (post,interp /bin/sh).
	out := run(t, nil, "rpm", "-qp", "--qf", `[%{REQUIREFLAGS:deptype} %{REQUIRENAME}\n]`, rpm)
	types := map[string][]string{}
	for _, line := range strings.Split(out, "\n") {
		if typ, name, ok := strings.Cut(line, " "); ok {
			types[name] = append(types[name], strings.Split(typ, ",")...)
		}
	}
	for _, want := range []string{"manual", "post", "preun", "postun"} {
		if !slices.Contains(types["systemd"], want) {
			tag := "Requires(" + want + ")"
			if want == "manual" {
				tag = "Requires"
			}
			t.Errorf("the rpm lacks %s: systemd; its requires are\n%s", tag, out)
		}
	}
	docs := strings.Split(strings.TrimSpace(run(t, nil, "rpm", "-qpd", rpm)), "\n")
	for _, want := range append(slices.Clone(manPages), "/usr/share/doc/unbounded-agent/agent.toml.example") {
		if !slices.Contains(docs, want) {
			t.Errorf("rpm -qpd does not list %s: %q", want, docs)
		}
	}
	if licenses := run(t, nil, "rpm", "-qpL", rpm); !strings.Contains(licenses, "/usr/share/licenses/unbounded-agent/LICENSE") {
		t.Errorf("rpm -qpL: %q", licenses)
	}
	if files := run(t, nil, "rpm", "-qpl", rpm); strings.Contains(files, "/copyright") {
		t.Errorf("the rpm ships Debian's copyright file:\n%s", files)
	}
}

// TestDebPrermHonoursPolicyRcD runs the .deb's prerm with the real
// deb-systemd-invoke, as dpkg does on a host where systemd runs: it stops
// the package's units, unless policy-rc.d says no (101), as image builders
// and containers set it. The host is left alone: the run is in a private
// mount namespace where /run (for /run/systemd/system), /usr/sbin (for
// policy-rc.d) and the unit directory are fresh tmpfs, and systemctl is a
// fake that logs its calls.
func TestDebPrermHonoursPolicyRcD(t *testing.T) {
	deb := packageFile(t, "UNBOUNDED_TEST_DEB")
	requireRoot(t, "mounts in a private mount namespace")
	requireTools(t, "dpkg-deb", "unshare", "deb-systemd-invoke", "perl")
	t.Parallel()

	control := t.TempDir()
	run(t, nil, "dpkg-deb", "-e", deb, control)
	want := expected(t, "deb")
	fakeDir := t.TempDir()
	log := filepath.Join(fakeDir, "log")
	if err := os.WriteFile(filepath.Join(fakeDir, "systemctl"), []byte("#!/bin/sh\necho \"$*\" >>"+log+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	var units []string
	for dst := range want.unitSources {
		units = append(units, filepath.Base(dst))
	}
	for _, policy := range []int{0, 101} {
		t.Run(fmt.Sprintf("policy-rc.d exits %d", policy), func(t *testing.T) {
			_ = os.Remove(log)
			script := fmt.Sprintf(`set -e
mount -t tmpfs tmpfs /run && mkdir -p /run/systemd/system
mount -t tmpfs tmpfs /usr/sbin
printf '#!/bin/sh\nexit %d\n' >/usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d
mount -t tmpfs tmpfs /usr/lib/systemd/system
for u in %s; do : >"/usr/lib/systemd/system/$u"; done
PATH=%s:$PATH sh %s remove
`, policy, strings.Join(units, " "), fakeDir, filepath.Join(control, "prerm"))
			cmd := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c", script)
			cmd.Env = append(os.Environ(), "DPKG_ROOT=")
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("prerm remove: %v\n%s", err, out)
			}
			var stop []string
			if policy == 0 {
				stop = call(nil, "stop", want.stopNames)
			}
			assertCalls(t, "prerm remove", fakeSystemctl{log: log}.calls(t), stop)
		})
	}
}
