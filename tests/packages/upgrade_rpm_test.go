package packages_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/rpmpack"

	"unbounded-cloud.io/agent/lib/exitcode"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/outcome"
	"unbounded-cloud.io/agent/lib/upgrade"
)

// The agent's self-upgrade on an rpm host (lib/upgrade's Rpm) keeps its
// rpm database where rpm's %_dbpath says, under the root: these tests
// install with rpm's default too, unlike the scriptlet tests above.

// rpmRoot is a scratch root with the .rpm installed by rpm (its
// scriptlets run with busybox-static's sh, systemctl a fake that logs),
// and the upgrade's Rpm on it. A stub package provides what the .rpm
// requires (systemd, /bin/sh), so that rpm installs it, and the upgrade's
// installs, without --nodeps.
func rpmRoot(t *testing.T) (root, dist string, p upgrade.Rpm) {
	t.Helper()
	dist = packageFile(t, "UNBOUNDED_TEST_RPM")
	requireRoot(t, "rpm --root installs files owned by root and chroots into the root for the scriptlets")
	requireTools(t, "rpm")
	root, _ = newRoot(t, staticBusybox(t), false)
	base := writeRPM(t, t.TempDir(), rpmpack.RPMMetaData{Name: "scratch-base", Version: "1", Release: "1", Arch: "noarch",
		Provides: rpmpack.Relations{{Name: "systemd"}, {Name: "/bin/sh"}}}, nil)
	rpmIn(t, root, "-i", base)
	rpmIn(t, root, "-i", dist)
	return root, dist, upgrade.Rpm{Root: root}
}

// rpmIn runs rpm on root and fails the test when a scriptlet failed (rpm
// itself only warns).
func rpmIn(t *testing.T, root string, args ...string) string {
	t.Helper()
	out := run(t, nil, "rpm", append([]string{"--root", root}, args...)...)
	if strings.Contains(out, "scriptlet failed") {
		t.Errorf("rpm %s: %s", strings.Join(args, " "), out)
	}
	return out
}

// writeRPM builds an rpm with rpmpack into dir.
func writeRPM(t *testing.T, dir string, md rpmpack.RPMMetaData, build func(*rpmpack.RPM)) string {
	t.Helper()
	md.Compressor, md.Epoch = "zstd:fastest", rpmpack.NoEpoch
	r, err := rpmpack.NewRPM(md)
	if err != nil {
		t.Fatal(err)
	}
	if build != nil {
		build(r)
	}
	var b bytes.Buffer
	if err := r.Write(&b); err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(dir, md.Name+"-"+md.Version+"-"+md.Release+"."+md.Arch+".rpm")
	if err := os.WriteFile(f, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

// newerRPM builds the package of version 9.9.9~up1 (release 1) from the
// .rpm dist: its files, scriptlets and requirement of systemd, and a
// file more, NEWER, by which a test sees which package is installed.
func newerRPM(t *testing.T, dist, ver string) string {
	t.Helper()
	tree := extractRPM(t, dist)
	qf := func(format string) string { return run(t, nil, "rpm", "-qp", "--qf", format, dist) }
	md := rpmpack.RPMMetaData{Name: upgrade.Package, Version: ver, Release: "1", Arch: strings.TrimSpace(qf("%{ARCH}")),
		Summary: "newer", Description: "newer", Licence: "Apache-2.0", Requires: rpmpack.Relations{{Name: "systemd"}}}
	return writeRPM(t, t.TempDir(), md, func(r *rpmpack.RPM) {
		r.AddPostin(qf("%{POSTIN}"))
		r.AddPreun(qf("%{PREUN}"))
		r.AddPostun(qf("%{POSTUN}"))
		for _, l := range strings.Split(strings.TrimSpace(qf(`[%{FILENAMES}\t%{FILEMODES}\t%{FILEFLAGS}\n]`)), "\n") {
			f := strings.Split(l, "\t")
			if len(f) != 3 {
				continue // rpm's warnings on Debian
			}
			mode, err := strconv.ParseUint(f[1], 10, 32)
			if err != nil {
				t.Fatal(err)
			}
			flags, err := strconv.ParseUint(f[2], 10, 32)
			if err != nil {
				t.Fatal(err)
			}
			file := rpmpack.RPMFile{Name: f[0], Mode: uint(mode), Owner: "root", Group: "root", Type: rpmpack.FileType(flags)}
			switch mode & 0o170000 {
			case 0o120000:
				l, err := os.Readlink(filepath.Join(tree, f[0]))
				if err != nil {
					t.Fatal(err)
				}
				file.Body = []byte(l)
			case 0o100000:
				data, err := os.ReadFile(filepath.Join(tree, f[0]))
				if err != nil {
					t.Fatal(err)
				}
				file.Body = data
			}
			r.AddFile(file)
		}
		r.AddFile(rpmpack.RPMFile{Name: "/usr/share/doc/unbounded-agent/NEWER", Body: []byte(ver + "\n"), Mode: 0o100644, Owner: "root", Group: "root"})
	})
}

// rpmFacts is what a test compares of two packages: name, version,
// release, architecture, every file with its mode, owner, flags, digest,
// link and time, the scriptlets, and the dependencies of each kind.
func rpmFacts(t *testing.T, args ...string) map[string]string {
	t.Helper()
	facts := map[string]string{}
	for k, format := range map[string]string{
		"name":     `%{NAME} %|EPOCH?{%{EPOCH}:}:{}|%{VERSION}-%{RELEASE} %{ARCH}\n`,
		"files":    `[%{FILENAMES} %{FILEMODES:octal} %{FILEUSERNAME} %{FILEGROUPNAME} %{FILEFLAGS:fflags} %{FILEDIGESTS} %{FILELINKTOS} %{FILEMTIMES} %{FILEVERIFYFLAGS}\n]`,
		"requires": `[%{REQUIRENAME} %{REQUIREFLAGS} %{REQUIREVERSION}\n]`,
		"provides": `[%{PROVIDENAME} %{PROVIDEFLAGS} %{PROVIDEVERSION}\n]`,
	} {
		lines := strings.Split(strings.TrimSpace(run(t, nil, "rpm", append(append([]string{}, args...), "--qf", format)...)), "\n")
		for i := range lines {
			lines[i] = strings.TrimSpace(lines[i])
		}
		slices.Sort(lines)
		facts[k] = strings.Join(lines, "\n")
	}
	facts["scripts"] = run(t, nil, "rpm", append(append([]string{}, args...), "--scripts")...)
	return facts
}

func rpmQuery(t *testing.T, root string) string {
	t.Helper()
	return strings.TrimSpace(run(t, nil, "rpm", "--root", root, "-q", upgrade.Package))
}

// Through lib/upgrade's Rpm with the real rpm: the installed package and
// the .rpm agree (Installed, Inspect, Arch), and the host is found to be
// rpm's; Verify counts a changed mode but not a modification time alone;
// a newer package installs and verifies clean; the package repacked from
// the host is the .rpm it was installed from (name, version,
// architecture, files, scriptlets, dependencies), and installs back over
// the newer one (a rollback: an older version) with rpm -V clean,
// modification times too.
func TestRPMUpgradeInstallsVerifiesRepacksAndRollsBack(t *testing.T) {
	root, dist, p := rpmRoot(t)
	t.Parallel()
	ctx := context.Background()

	m, err := p.Inspect(ctx, dist)
	if err != nil {
		t.Fatal(err)
	}
	installed, st, err := p.Installed(ctx, upgrade.Package)
	if err != nil || st != upgrade.Installed || installed != m {
		t.Fatalf("Installed %+v %s %v, the .rpm says %+v", installed, st, err, m)
	}
	if arch, err := p.Arch(ctx); err != nil || arch != m.Arch {
		t.Errorf("Arch %q %v, the .rpm is for %s", arch, err, m.Arch)
	}
	if got := rpmQuery(t, root); got != m.Name+"-"+m.Version+"."+m.Arch {
		t.Errorf("rpm -q says %s, Inspect %+v", got, m)
	}
	if pk, err := upgrade.HostPackages(ctx, root); err != nil || pk.Format() != "rpm" {
		t.Errorf("HostPackages chose %v (%v), want rpm", pk, err)
	}
	if err := p.Verify(ctx, upgrade.Package); err != nil {
		t.Errorf("the fresh install does not verify: %v", err)
	}
	// What rpm -V reports counts, but a modification time alone.
	health := filepath.Join(root, "usr/libexec/unbounded/health")
	if err := os.Chtimes(health, time.Now(), time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := p.Verify(ctx, upgrade.Package); err != nil {
		t.Errorf("a file whose modification time alone changed does not verify: %v", err)
	}
	if err := os.Chmod(health, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := p.Verify(ctx, upgrade.Package); err == nil || !strings.Contains(err.Error(), "/usr/libexec/unbounded/health") {
		t.Errorf("a file of another mode: Verify says %v", err)
	}
	if err := os.Chmod(health, 0o755); err != nil {
		t.Fatal(err)
	}
	notRPM := filepath.Join(t.TempDir(), "agent.rpm")
	os.WriteFile(notRPM, []byte("not a package\n"), 0o644)
	if _, err := p.Inspect(ctx, notRPM); err == nil || !strings.Contains(err.Error(), "not an rpm package") {
		t.Errorf("Inspect of a file that is not an rpm: %v", err)
	}

	prev := filepath.Join(t.TempDir(), "previous.rpm")
	if err := p.Repack(ctx, upgrade.Package, prev); err != nil {
		t.Fatal(err)
	}
	if got, err := p.Inspect(ctx, prev); err != nil || got != m {
		t.Errorf("the repacked package is %+v (%v), want %+v", got, err, m)
	}
	want, got := rpmFacts(t, "-qp", dist), rpmFacts(t, "-qp", prev)
	for _, k := range []string{"name", "files", "scripts", "requires", "provides"} {
		if got[k] != want[k] {
			t.Errorf("the repacked package's %s differ from the .rpm's:\n got  %s\n want %s", k, got[k], want[k])
		}
	}
	if out := run(t, nil, "rpm", "-Kv", prev); !strings.Contains(out, "Header SHA256 digest: OK") || !strings.Contains(out, "Payload SHA256 digest: OK") {
		t.Errorf("rpm -Kv of the repacked package:\n%s", out)
	}

	newer := newerRPM(t, dist, "9.9.9~up1")
	nm, err := p.Inspect(ctx, newer)
	if err != nil || nm.Version != "9.9.9~up1-1" || !upgrade.VersionIs(nm.Version, "9.9.9~up1") {
		t.Fatalf("the newer package: %+v %v", nm, err)
	}
	if err := p.Install(ctx, newer); err != nil {
		t.Fatal(err)
	}
	if got := rpmQuery(t, root); got != upgrade.Package+"-9.9.9~up1-1."+m.Arch {
		t.Errorf("after the install rpm -q says %s", got)
	}
	if err := p.Verify(ctx, upgrade.Package); err != nil {
		t.Errorf("the newer package does not verify: %v", err)
	}
	marker := filepath.Join(root, "usr/share/doc/unbounded-agent/NEWER")
	if _, err := os.Stat(marker); err != nil {
		t.Errorf("the newer package's file: %v", err)
	}

	// The rollback: the repacked package, older than the installed one.
	if err := p.Install(ctx, prev); err != nil {
		t.Fatal(err)
	}
	if got := rpmQuery(t, root); got != m.Name+"-"+m.Version+"."+m.Arch {
		t.Errorf("after the rollback rpm -q says %s", got)
	}
	if _, err := os.Stat(marker); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the newer package's file is left after the rollback: %v", err)
	}
	if err := p.Verify(ctx, upgrade.Package); err != nil {
		t.Errorf("after the rollback: %v", err)
	}
	if out := run(t, nil, "rpm", "--root", root, "-V", "--nodeps", upgrade.Package); strings.TrimSpace(out) != "" {
		t.Errorf("after the rollback rpm -V (modification times too) says:\n%s", out)
	}
	if installed, st, err := p.Installed(ctx, upgrade.Package); err != nil || st != upgrade.Installed || installed != m {
		t.Errorf("after the rollback Installed says %+v %s %v", installed, st, err)
	}
}

// agentManager is the service manager for a whole upgrade on a scratch
// root: a restart starts the daemon on the multicall executable as it is
// then on disk; one that runs an executable of a crashing version (the
// marker file says which package installed it) never stays active.
type agentManager struct {
	exe, marker, crash string
	running            os.FileInfo
	pid                uint32
}

func (m *agentManager) Reload(context.Context) error { return nil }
func (m *agentManager) StartUnit(ctx context.Context, unit string) error {
	if m.running != nil {
		return nil
	}
	return m.RestartUnit(ctx, unit)
}
func (m *agentManager) RestartUnit(context.Context, string) error {
	fi, err := os.Stat(m.exe)
	m.running, m.pid = fi, m.pid+1
	return err
}

func (m *agentManager) ActiveState(context.Context, string) (string, error) {
	if data, err := os.ReadFile(m.marker); err == nil && m.crash != "" && strings.TrimSpace(string(data)) == m.crash {
		m.pid++
		return "activating", nil
	}
	return "active", nil
}
func (m *agentManager) MainPID(context.Context, string) (uint32, error) { return m.pid, nil }
func (m *agentManager) Close()                                          {}

// stageRPM copies the package into the staging directory with its
// .sha256, as an operator does.
func stageRPM(t *testing.T, p hostpaths.Paths, file string) {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(p.UpgradeStaged(), 0o700); err != nil {
		t.Fatal(err)
	}
	staged := filepath.Join(p.UpgradeStaged(), "agent.rpm")
	sum := sha256.Sum256(data)
	if err := os.WriteFile(staged, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(staged+".sha256", []byte(hex.EncodeToString(sum[:])+"  agent.rpm\n"), 0o600); err != nil {
		t.Fatal(err)
	}
}

// The whole upgrade on an rpm host (Upgrade.Run with the host's package
// manager as cmd/upgrade chooses it; the service manager faked): a staged
// agent.rpm is installed, the installed package repacked into previous/
// first; a second one whose daemon never comes up is rolled back to the
// first, kept in installed/ by the first upgrade, and rpm -V is clean
// after each. On an image-based host (/usr read-only) whose agent rpm
// installed, the upgrade is refused (78) and changes nothing.
func TestRPMHostUpgradeRunsAndRollsBack(t *testing.T) {
	root, dist, _ := rpmRoot(t)
	t.Parallel()
	ctx := context.Background()
	m, err := upgrade.Rpm{}.Inspect(ctx, dist)
	if err != nil {
		t.Fatal(err)
	}
	paths := hostpaths.New(root)
	// What tmpfiles.d makes at boot.
	if err := os.MkdirAll(paths.RunDir(), 0o755); err != nil {
		t.Fatal(err)
	}
	sd := &agentManager{exe: paths.Libexec("unbounded-agent"), marker: filepath.Join(root, "usr/share/doc/unbounded-agent/NEWER")}
	up := func(image bool) *upgrade.Upgrade {
		pk, err := upgrade.HostPackages(ctx, root)
		if err != nil {
			t.Fatal(err)
		}
		return &upgrade.Upgrade{Paths: paths, Packages: pk, Notify: func(string) {},
			Systemd:    func(context.Context) (upgrade.Manager, error) { return sd, nil },
			ImageBased: func() bool { return image },
			Wait: upgrade.Wait{Timeout: 2 * time.Second, Settle: 50 * time.Millisecond, Poll: 5 * time.Millisecond,
				ExeOf: func(uint32) (os.FileInfo, error) { return sd.running, nil }}}
	}

	stageRPM(t, paths, newerRPM(t, dist, "9.9.9~up1"))
	if err := up(false).Run(ctx); err != nil {
		t.Fatal(err)
	}
	if got := rpmQuery(t, root); got != upgrade.Package+"-9.9.9~up1-1."+m.Arch {
		t.Errorf("after the upgrade rpm -q says %s", got)
	}
	previous := filepath.Join(paths.UpgradeDir(), "previous", m.Name+"-"+m.Version+"."+m.Arch+".rpm")
	if got, err := (upgrade.Rpm{}).Inspect(ctx, previous); err != nil || got != m {
		t.Errorf("previous/ holds %+v (%v), want the repacked %+v", got, err, m)
	}
	if u, err := outcome.Read(paths, outcome.Upgrade); err != nil || u == nil || u.State != outcome.Succeeded || u.From != m.Version || u.To != "9.9.9~up1-1" ||
		!upgrade.SameVersion(u.To, "9.9.9-up1") {
		t.Errorf("success signal %+v %v", u, err)
	}
	if out := run(t, nil, "rpm", "--root", root, "-V", "--nodeps", upgrade.Package); strings.TrimSpace(out) != "" {
		t.Errorf("after the upgrade rpm -V says:\n%s", out)
	}

	sd.crash = "9.9.9~up2"
	stageRPM(t, paths, newerRPM(t, dist, "9.9.9~up2"))
	err = up(false).Run(ctx)
	if err == nil || !strings.Contains(err.Error(), "rolled back to 9.9.9~up1-1") {
		t.Fatalf("an upgrade whose daemon never comes up: %v", err)
	}
	if got := rpmQuery(t, root); got != upgrade.Package+"-9.9.9~up1-1."+m.Arch {
		t.Errorf("after the rollback rpm -q says %s", got)
	}
	if f, _ := outcome.Read(paths, outcome.Upgrade); f == nil || !f.RolledBack() || f.To != "9.9.9~up2-1" {
		t.Errorf("failure signal %+v", f)
	}
	if out := run(t, nil, "rpm", "--root", root, "-V", "--nodeps", upgrade.Package); strings.TrimSpace(out) != "" {
		t.Errorf("after the rollback rpm -V says:\n%s", out)
	}

	stageRPM(t, paths, newerRPM(t, dist, "9.9.9~up3"))
	err = up(true).Run(ctx)
	if exitcode.For(err) != exitcode.ConfigInvalid || !errors.Is(err, upgrade.ErrUnsupportedHost) || !strings.Contains(err.Error(), "installed by rpm") {
		t.Errorf("an image-based rpm host: %v (exit %d), want a refusal with 78", err, exitcode.For(err))
	}
	if got := rpmQuery(t, root); got != upgrade.Package+"-9.9.9~up1-1."+m.Arch {
		t.Errorf("after the refusal rpm -q says %s", got)
	}
	if _, err := os.Stat(filepath.Join(paths.UpgradeDir(), "rejected", "agent.rpm")); err != nil {
		t.Errorf("the refused package is not in rejected/: %v", err)
	}
}
