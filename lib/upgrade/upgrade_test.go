package upgrade

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coreos/go-systemd/v22/unit"

	"unbounded-cloud.io/agent/lib/artifacts"
	"unbounded-cloud.io/agent/lib/exitcode"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/outcome"
	"unbounded-cloud.io/agent/lib/request"
	"unbounded-cloud.io/agent/lib/state"
)

// host is a fake package-managed host: the package database is a map, a
// package file is "NAME VERSION ARCH\n" plus padding, an install rewrites
// the multicall executable (a new inode, as dpkg's rename does), and the
// daemon's main process runs whatever file was there at its last restart.
type host struct {
	t         *testing.T
	p         hostpaths.Paths
	installed Meta
	installs  []string
	repacks   int
	// format is the package manager's ("deb" when "").
	format string
	// crashVersion: a daemon started on this version never stays active.
	crashVersion string
	running      os.FileInfo
	runningVer   string
	pid          uint32
	// status is the package database's; an install leaves it
	// HalfInstalled until its configuration (at CrashAfterUnpack, crash
	// calls, when set). unconfigurable: Repair leaves it so.
	status         Status
	crash          func(string)
	unconfigurable bool
	// calls are the package manager's and the daemon's starts, in order:
	// "install VERSION", "repair", "start".
	calls []string
}

func newHost(t *testing.T) *host {
	t.Helper()
	root := t.TempDir()
	p := hostpaths.New(root)
	for _, d := range []string{p.HostRoot(), p.RunDir(), filepath.Dir(p.Libexec("x"))} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	h := &host{t: t, p: p, installed: Meta{Package, "1.0.0", "amd64"}, status: Installed}
	h.writeExe("1.0.0")
	return h
}

func (h *host) writeExe(version string) {
	exe := h.p.Libexec("unbounded-agent")
	tmp := exe + ".new"
	if err := os.WriteFile(tmp, []byte("agent "+version), 0o755); err != nil {
		h.t.Fatal(err)
	}
	if err := os.Rename(tmp, exe); err != nil {
		h.t.Fatal(err)
	}
}

// pkg writes a package file of m into dir and returns it and its sum.
func pkg(t *testing.T, dir string, m Meta) (file, sum string) {
	t.Helper()
	file = filepath.Join(dir, m.Name+"_"+m.Version+".deb")
	data := []byte(fmt.Sprintf("%s %s %s\n%s", m.Name, m.Version, m.Arch, strings.Repeat("x", 4096)))
	if err := os.WriteFile(file, data, 0o644); err != nil {
		t.Fatal(err)
	}
	s := sha256.Sum256(data)
	return file, hex.EncodeToString(s[:])
}

func (h *host) Inspect(_ context.Context, file string) (Meta, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return Meta{}, err
	}
	f := strings.Fields(strings.SplitN(string(data), "\n", 2)[0])
	if len(f) != 3 {
		return Meta{}, fmt.Errorf("%s is not a Debian package", file)
	}
	return Meta{f[0], f[1], f[2]}, nil
}

func (h *host) Format() string {
	if h.format == "" {
		return "deb"
	}
	return h.format
}

func (h *host) Installed(context.Context, string) (Meta, Status, error) {
	return h.installed, h.status, nil
}
func (h *host) Arch(context.Context) (string, error) { return "amd64", nil }
func (h *host) Verify(context.Context, string) error { return nil }

// Install unpacks (the files of the new version, the package
// half-installed), then configures, as dpkg's does.
func (h *host) Install(ctx context.Context, file string) error {
	m, err := h.Inspect(ctx, file)
	if err != nil {
		return err
	}
	h.installs = append(h.installs, m.Version)
	h.calls = append(h.calls, "install "+m.Version)
	h.installed, h.status = m, HalfInstalled
	h.writeExe(m.Version)
	if h.crash != nil {
		h.crash(CrashAfterUnpack)
	}
	h.status = Installed
	return nil
}

func (h *host) Repair(context.Context, string) error {
	h.calls = append(h.calls, "repair")
	if h.status == HalfInstalled && h.unconfigurable {
		return errors.New("dpkg --audit unbounded-agent: the package is half-configured")
	}
	if h.status == HalfInstalled {
		h.status = Installed
	}
	return nil
}

func (h *host) Repack(_ context.Context, _ string, dst string) error {
	h.repacks++
	_, sum := pkg(h.t, filepath.Dir(dst), h.installed)
	_ = sum
	return os.Rename(filepath.Join(filepath.Dir(dst), h.installed.Name+"_"+h.installed.Version+".deb"), dst)
}

// The service manager.
func (h *host) Reload(context.Context) error { return nil }

// StartUnit starts the daemon when it is down.
func (h *host) StartUnit(ctx context.Context, unit string) error {
	h.calls = append(h.calls, "start")
	if h.running != nil {
		return nil
	}
	return h.RestartUnit(ctx, unit)
}

// RestartUnit starts the daemon on the executable its unit runs: the
// image's, or the staged one an override's drop-in binds over it.
func (h *host) RestartUnit(context.Context, string) error {
	exe := h.p.Libexec("unbounded-agent")
	if data, err := os.ReadFile(h.p.Join("/etc/systemd/system/unbounded-daemon.service.d/" + OverrideDropIn)); err == nil {
		_, bind, _ := strings.Cut(string(data), "BindReadOnlyPaths=")
		src, _, _ := strings.Cut(bind, ":")
		exe = filepath.Join(h.p.Join(src), "unbounded-agent")
	}
	fi, err := os.Stat(exe)
	if err != nil {
		return err
	}
	data, _ := os.ReadFile(exe)
	h.running, h.runningVer = fi, strings.TrimPrefix(strings.TrimSpace(string(data)), "agent ")
	h.pid++
	return nil
}

func (h *host) ActiveState(context.Context, string) (string, error) {
	if h.running == nil {
		return "inactive", nil
	}
	if h.runningVer == h.crashVersion {
		h.pid++ // restarted by systemd, again and again
		return "activating", nil
	}
	return "active", nil
}
func (h *host) MainPID(context.Context, string) (uint32, error) { return h.pid, nil }
func (h *host) Close()                                          {}

func (h *host) upgrade() *Upgrade {
	return &Upgrade{
		Paths: h.p, Packages: h, Notify: func(string) {},
		Systemd: func(context.Context) (Manager, error) { return h, nil },
		Wait: Wait{Timeout: 2 * time.Second, Settle: 50 * time.Millisecond, Poll: 5 * time.Millisecond,
			ExeOf: func(uint32) (os.FileInfo, error) { return h.running, nil }},
	}
}

func (h *host) stage(m Meta, sum string) string {
	h.t.Helper()
	if err := os.MkdirAll(h.p.UpgradeStaged(), 0o700); err != nil {
		h.t.Fatal(err)
	}
	file, real := pkg(h.t, h.p.UpgradeStaged(), m)
	if sum == "" {
		sum = real
	}
	if err := os.WriteFile(file+".sha256", []byte(sum+"  "+filepath.Base(file)+"\n"), 0o644); err != nil {
		h.t.Fatal(err)
	}
	return file
}

func exists(p string) bool { _, err := os.Lstat(p); return err == nil }

// A staged package with its .sha256: the installed one is kept (repacked:
// no package file of it is on the host), the new one installed, the
// daemon restarted on it; the success signal is left for the daemon, the
// staging directory is empty (the path unit does not trigger again) and
// no journal remains.
func TestStagedPackageUpgradesAndKeepsThePreviousForARollback(t *testing.T) {
	h := newHost(t)
	staged := h.stage(Meta{Package, "1.1.0", "amd64"}, "")
	if err := h.upgrade().Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	if h.installed.Version != "1.1.0" || h.runningVer != "1.1.0" || h.repacks != 1 {
		t.Errorf("installed %s, daemon runs %s, %d repacks: want 1.1.0 on both and the old package repacked once", h.installed.Version, h.runningVer, h.repacks)
	}
	if !exists(filepath.Join(h.p.UpgradeDir(), "previous", Package+"_1.0.0_amd64.deb")) {
		t.Error("the previous package is not kept")
	}
	if !exists(filepath.Join(h.p.UpgradeDir(), "installed", filepath.Base(staged))) {
		t.Error("the installed package is not kept for the next upgrade")
	}
	if ents, _ := os.ReadDir(h.p.UpgradeStaged()); len(ents) != 0 {
		t.Errorf("staging directory not empty: %v", ents)
	}
	u, err := readUpgraded(h.p)
	if err != nil || u == nil || u.From != "1.0.0" || u.To != "1.1.0" {
		t.Errorf("success signal %+v %v", u, err)
	}
	if InProgress(h.p) || exists(h.p.UpgradeFailed()) {
		t.Error("a journal or a failure signal remains")
	}

	// The next upgrade keeps the package the first one installed, as it
	// is: no repack.
	h.stage(Meta{Package, "1.2.0", "amd64"}, "")
	if err := h.upgrade().Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	if h.repacks != 1 || !exists(filepath.Join(h.p.UpgradeDir(), "previous", Package+"_1.1.0_amd64.deb")) {
		t.Errorf("second upgrade: %d repacks, previous/ %v", h.repacks, exists(filepath.Join(h.p.UpgradeDir(), "previous", Package+"_1.1.0_amd64.deb")))
	}
}

// Refused before anything changed: the checksum (naming both sums), and
// packages of another name, architecture or version than asked. Nothing
// is installed, the daemon is not restarted, the staged files are in
// rejected/, and the failure signal says why.
func TestAPackageThatIsNotTheOneAskedForIsRefusedAndChangesNothing(t *testing.T) {
	for _, tc := range []struct {
		name  string
		m     Meta
		sum   string
		words []string
	}{
		{"checksum", Meta{Package, "1.1.0", "amd64"}, strings.Repeat("ab", 32), []string{"checksum mismatch", "want sha256 " + strings.Repeat("ab", 32), "got "}},
		{"name", Meta{"other-agent", "1.1.0", "amd64"}, "", []string{"is other-agent, not unbounded-agent"}},
		{"arch", Meta{Package, "1.1.0", "arm64"}, "", []string{"architecture arm64, this host is amd64"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHost(t)
			staged := h.stage(tc.m, tc.sum)
			err := h.upgrade().Run(context.Background())
			for _, w := range tc.words {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("error %v, want it to say %q", err, w)
				}
			}
			if len(h.installs) != 0 || h.pid != 0 {
				t.Errorf("installed %v, daemon restarted %d times: want nothing", h.installs, h.pid)
			}
			f, _ := readFailed(h.p)
			if f == nil || f.Step != StepVerify || f.RolledBack || !strings.Contains(f.Message, tc.words[0]) {
				t.Errorf("failure signal %+v", f)
			}
			if exists(staged) || exists(staged+".sha256") || !exists(filepath.Join(h.p.UpgradeDir(), "rejected", filepath.Base(staged))) {
				t.Error("the staged files are not moved to rejected/")
			}
			if InProgress(h.p) {
				t.Error("a journal remains")
			}
		})
	}
}

// A new daemon that never stays up: the kept package goes back, the
// daemon runs the old version again, and the failure signal says it
// rolled back.
func TestADaemonThatDoesNotStayUpIsRolledBack(t *testing.T) {
	h := newHost(t)
	h.crashVersion = "1.1.0"
	h.stage(Meta{Package, "1.1.0", "amd64"}, "")
	err := h.upgrade().Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "rolled back to 1.0.0") || !strings.Contains(err.Error(), "step activate") {
		t.Fatalf("error %v, want the activate step's failure and the rollback named", err)
	}
	if strings.Join(h.installs, " ") != "1.1.0 1.0.0" || h.runningVer != "1.0.0" {
		t.Errorf("installs %v, daemon runs %s: want 1.1.0 then 1.0.0 again, the daemon on 1.0.0", h.installs, h.runningVer)
	}
	if f, _ := readFailed(h.p); f == nil || !f.RolledBack || f.From != "1.0.0" || f.To != "1.1.0" || f.Step != StepActivate {
		t.Errorf("failure signal %+v", f)
	}
	if exists(h.p.UpgradeSucceeded()) || InProgress(h.p) {
		t.Error("a success signal or a journal remains")
	}
}

// The daemon's request: the package is fetched from an https URL,
// resuming a download an earlier run left (a range request), checked and
// installed; the request is taken. A request without its parameters, or
// with a sum that is not one, is refused with nothing fetched.
func TestARequestFetchesResumablyOverHTTPSAndInstalls(t *testing.T) {
	h := newHost(t)
	src := t.TempDir()
	file, sum := pkg(t, src, Meta{Package, "1.1.0", "amd64"})
	var ranges []string
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ranges = append(ranges, r.Header.Get("Range"))
		http.ServeFile(w, r, file)
	}))
	defer srv.Close()
	writeRequest(t, h.p, "op-1", map[string]string{"version": "1.1.0", "url": srv.URL + "/pkg.deb", "sha256": sum})
	// An earlier run got the first 100 bytes.
	data, _ := os.ReadFile(file)
	os.MkdirAll(h.p.UpgradeStaged(), 0o700)
	if err := os.WriteFile(filepath.Join(h.p.UpgradeStaged(), Package+"_1.1.0.deb.part"), data[:100], 0o600); err != nil {
		t.Fatal(err)
	}
	u := h.upgrade()
	u.HTTP = srv.Client()
	if err := u.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(ranges) != 1 || ranges[0] != "bytes=100-" || h.installed.Version != "1.1.0" {
		t.Errorf("requests with ranges %q, installed %s: want one resumed at byte 100, 1.1.0", ranges, h.installed.Version)
	}
	if !request.Taken(h.p, Concern, "op-1") {
		t.Error("the request is not taken")
	}
	if u, _ := readUpgraded(h.p); u == nil || u.UID != "op-1" {
		t.Errorf("success signal %+v", u)
	}

	for _, params := range []map[string]string{
		{"version": "1.2.0", "url": srv.URL},
		{"version": "1.2.0", "url": srv.URL, "sha256": "nothex"},
		{"version": "1.2.0", "url": "http://127.0.0.1:1/pkg.deb", "sha256": sum},
		{"version": "../../etc", "url": srv.URL, "sha256": sum},
	} {
		h := newHost(t)
		writeRequest(t, h.p, "op-2", params)
		ranges = nil
		if err := h.upgrade().Run(context.Background()); err == nil || len(h.installs) != 0 || len(ranges) != 0 {
			t.Errorf("request %v: %v, installs %v, %d fetches: want a refusal with nothing fetched", params, err, h.installs, len(ranges))
		}
		if f, _ := readFailed(h.p); f == nil || f.UID != "op-2" {
			t.Errorf("request %v: failure signal %+v", params, f)
		}
	}
}

func writeRequest(t *testing.T, p hostpaths.Paths, uid string, params map[string]string) {
	t.Helper()
	if err := request.Write(p, Concern, &request.Request{UID: uid, Operation: uid, Type: "AgentUpgrade", Machine: "m", Parameters: params}); err != nil {
		t.Fatal(err)
	}
}

// Nothing staged and no request, or the version installed already: not a
// failure, nothing changes.
func TestNothingToDo(t *testing.T) {
	h := newHost(t)
	if err := h.upgrade().Run(context.Background()); !errors.Is(err, ErrNothingToDo) {
		t.Errorf("nothing staged: %v", err)
	}
	staged := h.stage(Meta{Package, "1.0.0", "amd64"}, "")
	if err := h.upgrade().Run(context.Background()); !errors.Is(err, ErrNothingToDo) || len(h.installs) != 0 || exists(staged) || exists(h.p.UpgradeFailed()) {
		t.Errorf("the installed version staged: %v, installs %v", err, h.installs)
	}
}

// A second upgrade while one holds the installation lock is refused (69).
func TestAnUpgradeWhileAnotherInstallationOwnsTheHostIsDeferred(t *testing.T) {
	h := newHost(t)
	lock, err := state.AcquireOwnership(h.p, "repave", "unbounded-repave.service")
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Release()
	h.stage(Meta{Package, "1.1.0", "amd64"}, "")
	if err := h.upgrade().Run(context.Background()); !errors.Is(err, state.ErrOwned) || len(h.installs) != 0 {
		t.Errorf("%v, installs %v: want ErrOwned and nothing installed", err, h.installs)
	}
}

type crashed string

// runCrashingAt runs u until the crash point at, as a kill there would end
// it (the deferred lock release aside: the kernel drops a dead process's
// flock).
func runCrashingAt(t *testing.T, u *Upgrade, at string) {
	t.Helper()
	u.CrashPoint = func(name string) {
		if name == at {
			panic(crashed(name))
		}
	}
	defer func() {
		if r := recover(); r != crashed(at) {
			t.Fatalf("run did not reach the crash point %s (%v)", at, r)
		}
	}()
	u.Run(context.Background())
}

// A run cut after the install is finished by the next one (the daemon
// restarted on the new version, the record written); one cut in its
// rollback rolls back again, never on to the record.
func TestAnUpgradeCutAfterTheInstallOrInItsRollbackIsFinishedByTheNextRun(t *testing.T) {
	h := newHost(t)
	h.stage(Meta{Package, "1.1.0", "amd64"}, "")
	runCrashingAt(t, h.upgrade(), "upgrade/after-install")
	if h.installed.Version != "1.1.0" || h.runningVer == "1.1.0" || !InProgress(h.p) {
		t.Fatalf("after the cut: installed %s, daemon runs %q, journal %v", h.installed.Version, h.runningVer, InProgress(h.p))
	}
	if err := h.upgrade().Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	if h.runningVer != "1.1.0" || InProgress(h.p) {
		t.Errorf("resumed: daemon runs %s, journal %v", h.runningVer, InProgress(h.p))
	}
	if u, _ := readUpgraded(h.p); u == nil || u.To != "1.1.0" {
		t.Errorf("success signal %+v", u)
	}

	h.crashVersion = "1.2.0"
	h.stage(Meta{Package, "1.2.0", "amd64"}, "")
	runCrashingAt(t, h.upgrade(), "upgrade/rolling-back")
	h.crashVersion = "" // whatever the next run finds, it must roll back
	err := h.upgrade().Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "rolled back to 1.1.0") {
		t.Fatalf("resumed rollback: %v", err)
	}
	if h.installed.Version != "1.1.0" || h.runningVer != "1.1.0" || InProgress(h.p) || exists(h.p.UpgradeSucceeded()) {
		t.Errorf("after the resumed rollback: installed %s, daemon runs %s, journal %v", h.installed.Version, h.runningVer, InProgress(h.p))
	}
	if f, _ := readFailed(h.p); f == nil || !f.RolledBack || f.To != "1.2.0" {
		t.Errorf("failure signal %+v", f)
	}
}

// debPkg builds a real package with dpkg-deb of version, its multicall
// executable saying "agent VERSION", staged with its .sha256.
func (h *host) stageDeb(version string) {
	h.t.Helper()
	tree := h.t.TempDir()
	lib := filepath.Join(tree, "usr/libexec/unbounded")
	os.MkdirAll(lib, 0o755)
	os.MkdirAll(filepath.Join(tree, "DEBIAN"), 0o755)
	os.WriteFile(filepath.Join(tree, "DEBIAN/control"), []byte("Package: unbounded-agent\nVersion: "+version+"\nArchitecture: "+debArch()+"\nMaintainer: m <m@example.com>\nDescription: d\n"), 0o644)
	os.WriteFile(filepath.Join(lib, "unbounded-agent"), []byte("agent "+version+"\n"), 0o755)
	os.Symlink("unbounded-agent", filepath.Join(lib, "daemon"))
	os.MkdirAll(h.p.UpgradeStaged(), 0o700)
	deb := filepath.Join(h.p.UpgradeStaged(), "agent-"+version+".deb")
	if out, err := exec.Command("dpkg-deb", "--root-owner-group", "--build", tree, deb).CombinedOutput(); err != nil {
		h.t.Fatalf("dpkg-deb: %v\n%s", err, out)
	}
	sum, _ := artifacts.HashFile(deb)
	os.WriteFile(deb+".sha256", []byte(sum+"\n"), 0o644)
}

// On an image-based host (/usr read-only) nothing is installed: the
// package's one-shots are staged and a drop-in binds them over
// /usr/libexec/unbounded for each unit that runs one (not for the none
// mode's node units); a failed upgrade goes back to the override it
// replaced; a newer image supersedes the override and removes it all.
func TestImageBasedHostUpgradesThroughAnOverride(t *testing.T) {
	if _, err := exec.LookPath("dpkg-deb"); err != nil {
		t.Skip("dpkg-deb not on this machine: it builds the packages this test stages")
	}
	h := newHost(t)
	units := h.p.Join("/usr/lib/systemd/system")
	os.MkdirAll(units, 0o755)
	for name, exec := range map[string]string{
		"unbounded-daemon.service":     "/usr/libexec/unbounded/daemon",
		"unbounded-fence.service":      "/usr/libexec/unbounded/fence",
		"unbounded-lifecycle.service":  "/usr/libexec/unbounded/lifecycle",
		"unbounded-containerd.service": "/var/lib/unbounded/versions/current/bin/containerd",
	} {
		os.WriteFile(filepath.Join(units, name), []byte("[Service]\nExecStart="+exec+"\n"), 0o644)
	}
	image := func() bool { return true }
	up := func() *Upgrade { u := h.upgrade(); u.ImageBased = image; return u }

	h.stageDeb("1.1.0")
	if err := up().Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	o, err := state.ReadAgentOverride(h.p)
	if err != nil || o == nil || o.Version != "1.1.0" || strings.Join(o.Units, " ") != "unbounded-daemon.service unbounded-fence.service unbounded-lifecycle.service" {
		t.Fatalf("override %+v %v", o, err)
	}
	// Every overridden unit but lifecycle starts after lifecycle, which
	// may take the override away at boot.
	for _, u := range o.Units {
		f, err := os.Open(h.p.Join("/etc/systemd/system/" + u + ".d/" + OverrideDropIn))
		if err != nil {
			t.Fatal(err)
		}
		opts, err := unit.DeserializeOptions(f)
		f.Close()
		if err != nil {
			t.Fatalf("%s's drop-in: %v", u, err)
		}
		var after []string
		for _, opt := range opts {
			if opt.Section == "Unit" && opt.Name == "After" {
				after = append(after, opt.Value)
			}
		}
		if want := u != "unbounded-lifecycle.service"; slices.Contains(after, "unbounded-lifecycle.service") != want {
			t.Errorf("%s's drop-in orders it After= %v; after lifecycle wanted: %v", u, after, want)
		}
	}
	if h.runningVer != "1.1.0" || len(h.installs) != 0 {
		t.Errorf("daemon runs %s, package installs %v: want the staged 1.1.0 and no install", h.runningVer, h.installs)
	}
	if exists(h.p.Join("/etc/systemd/system/unbounded-containerd.service.d/" + OverrideDropIn)) {
		t.Error("the none mode's containerd unit got a drop-in")
	}

	h.crashVersion = "1.2.0"
	h.stageDeb("1.2.0")
	if err := up().Run(context.Background()); err == nil || !strings.Contains(err.Error(), "rolled back") {
		t.Fatalf("an override whose daemon never comes up: %v", err)
	}
	if o, _ := state.ReadAgentOverride(h.p); o == nil || o.Version != "1.1.0" || h.runningVer != "1.1.0" {
		t.Errorf("after the rollback: override %+v, daemon runs %s: want 1.1.0 again", o, h.runningVer)
	}
	if exists(filepath.Dir(stagedLibexec(h.p, "1.2.0"))) {
		t.Error("the failed version's staged agent is left")
	}

	if o, err := Supersede(h.p, "1.0.9"); err != nil || o != nil {
		t.Errorf("an older image superseded the override: %+v %v", o, err)
	}
	if o, err := Supersede(h.p, "1.1.0"); err != nil || o == nil {
		t.Fatalf("an image as new as the override did not supersede it: %+v %v", o, err)
	}
	if o, _ := state.ReadAgentOverride(h.p); o != nil || exists(h.p.Join("/etc/systemd/system/unbounded-daemon.service.d/"+OverrideDropIn)) || exists(filepath.Dir(stagedLibexec(h.p, "1.1.0"))) {
		t.Errorf("after the supersede: override %+v, or its drop-in or staged agent, is left", o)
	}
}

// A .sha256 that holds no sum is refused like a wrong one, its files
// moved out of the staging directory (the path unit does not start the
// upgrade again for them).
func TestAStagedSumThatIsNotOneIsRefusedAndMovedOut(t *testing.T) {
	h := newHost(t)
	staged := h.stage(Meta{Package, "1.1.0", "amd64"}, "not-a-sum")
	err := h.upgrade().Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "not a SHA-256") || len(h.installs) != 0 {
		t.Errorf("%v, installs %v", err, h.installs)
	}
	if exists(staged+".sha256") || !exists(filepath.Join(h.p.UpgradeDir(), "rejected", filepath.Base(staged)+".sha256")) {
		t.Error("the staged files are not moved to rejected/")
	}
	if f, _ := readFailed(h.p); f == nil {
		t.Error("no failure signal")
	}
}

// With LockWait, a run waits for the installation that owns the host and
// then goes on.
func TestAnUpgradeWaitsForTheInstallationThatOwnsTheHost(t *testing.T) {
	h := newHost(t)
	lock, err := state.AcquireOwnership(h.p, "repave", "unbounded-repave.service")
	if err != nil {
		t.Fatal(err)
	}
	h.stage(Meta{Package, "1.1.0", "amd64"}, "")
	u := h.upgrade()
	u.LockWait, u.LockPoll = 10*time.Second, 10*time.Millisecond
	go func() { time.Sleep(200 * time.Millisecond); lock.Release() }()
	if err := u.Run(context.Background()); err != nil || h.installed.Version != "1.1.0" {
		t.Errorf("%v, installed %s: want the upgrade done once the repave released the host", err, h.installed.Version)
	}
}

// On an rpm host a package's version has a release: the request asks for
// the version without it and gets the package of that version (fetched
// to an .rpm), the installed package is kept under rpm's name for it,
// and the success signal names the package's version, which the new
// daemon takes for its own. A package of another release than one asked
// with it is refused.
func TestAnRpmHostUpgradesToThePackageOfTheVersionAsked(t *testing.T) {
	h := newHost(t)
	h.format, h.installed = "rpm", Meta{Package, "1.0.0-1", "amd64"}
	file, sum := pkg(t, t.TempDir(), Meta{Package, "1.1.0-1", "amd64"})
	writeRequest(t, h.p, "op-1", map[string]string{"version": "1.1.0", "url": file, "sha256": sum})
	if err := h.upgrade().Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	if h.installed.Version != "1.1.0-1" || strings.Join(h.installs, " ") != "1.1.0-1" {
		t.Errorf("installed %s (installs %v), want 1.1.0-1", h.installed.Version, h.installs)
	}
	if !exists(filepath.Join(h.p.UpgradeDir(), "previous", Package+"-1.0.0-1.amd64.rpm")) {
		t.Error("the previous package is not kept under rpm's name")
	}
	if !exists(filepath.Join(h.p.UpgradeDir(), "installed", Package+"_1.1.0.rpm")) {
		t.Error("the fetched package is not kept in installed/ as an .rpm")
	}
	u, _ := readUpgraded(h.p)
	if u == nil || u.From != "1.0.0-1" || u.To != "1.1.0-1" || !SameVersion(u.To, "1.1.0") {
		t.Errorf("success signal %+v: want from 1.0.0-1 to 1.1.0-1, the new daemon's version", u)
	}

	file, sum = pkg(t, t.TempDir(), Meta{Package, "1.2.0-1", "amd64"})
	writeRequest(t, h.p, "op-2", map[string]string{"version": "1.2.0-2", "url": file, "sha256": sum})
	err := h.upgrade().Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "is version 1.2.0-1, the operation asks for 1.2.0-2") || len(h.installs) != 1 {
		t.Errorf("a package of another release: %v, installs %v", err, h.installs)
	}
}

// An image-based host whose agent rpm installed is not served: a staged
// package and a request are refused with 78 before anything is fetched
// or changed, the failure signal says why and the staged files go to
// rejected/.
func TestAnImageBasedRpmHostIsRefused(t *testing.T) {
	h := newHost(t)
	h.format, h.installed = "rpm", Meta{Package, "1.0.0-1", "amd64"}
	up := func() *Upgrade { u := h.upgrade(); u.ImageBased = func() bool { return true }; return u }
	staged := h.stage(Meta{Package, "1.1.0-1", "amd64"}, "")
	err := up().Run(context.Background())
	if !errors.Is(err, ErrUnsupportedHost) || exitcode.For(err) != exitcode.ConfigInvalid || !strings.Contains(err.Error(), "installed by rpm") {
		t.Errorf("staged: %v (exit %d), want ErrUnsupportedHost, 78", err, exitcode.For(err))
	}
	if len(h.installs) != 0 || h.pid != 0 || exists(staged) || !exists(filepath.Join(h.p.UpgradeDir(), "rejected", filepath.Base(staged))) {
		t.Errorf("installs %v, restarts %d, staged file left %v: want nothing changed and the package in rejected/", h.installs, h.pid, exists(staged))
	}
	if f, _ := readFailed(h.p); f == nil || !strings.Contains(f.Message, "image-based") {
		t.Errorf("failure signal %+v", f)
	}

	fetched := 0
	srv := httptest.NewTLSServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { fetched++ }))
	defer srv.Close()
	writeRequest(t, h.p, "op-1", map[string]string{"version": "1.1.0", "url": srv.URL + "/agent.rpm", "sha256": strings.Repeat("ab", 32)})
	u := up()
	u.HTTP = srv.Client()
	if err := u.Run(context.Background()); exitcode.For(err) != exitcode.ConfigInvalid || fetched != 0 {
		t.Errorf("request: %v, %d fetches: want 78 and nothing fetched", err, fetched)
	}
	if f, _ := readFailed(h.p); f == nil || f.UID != "op-1" || !request.Taken(h.p, Concern, "op-1") {
		t.Errorf("request: failure signal %+v, or the request is not taken", f)
	}
}

// fakeManager is a package manager that has the agent installed or not.
type fakeManager struct {
	format          string
	installed, half bool
	err             error
}

func (f fakeManager) Format() string { return f.format }
func (f fakeManager) Installed(context.Context, string) (Meta, Status, error) {
	switch {
	case f.half:
		return Meta{Package, "1.0.0", "amd64"}, HalfInstalled, f.err
	case f.installed:
		return Meta{Package, "1.0.0", "amd64"}, Installed, f.err
	}
	return Meta{}, NotInstalled, f.err
}
func (fakeManager) Repair(context.Context, string) error          { return nil }
func (fakeManager) Inspect(context.Context, string) (Meta, error) { return Meta{}, nil }
func (fakeManager) Arch(context.Context) (string, error)          { return "", nil }
func (fakeManager) Install(context.Context, string) error         { return nil }
func (fakeManager) Repack(context.Context, string, string) error  { return nil }
func (fakeManager) Verify(context.Context, string) error          { return nil }

// The host's package manager is the one that installed the agent, dpkg
// asked first, also when the agent is half-installed (a cut dpkg run);
// with neither, dpkg's (the image-based path reads a .deb);
// a manager that cannot answer is an error, not a guess.
func TestTheHostsPackageManagerIsTheOneThatInstalledTheAgent(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name      string
		dpkg, rpm fakeManager
		want      string
	}{
		{"dpkg", fakeManager{format: "deb", installed: true}, fakeManager{format: "rpm", installed: true}, "deb"},
		{"rpm", fakeManager{format: "deb"}, fakeManager{format: "rpm", installed: true}, "rpm"},
		{"dpkg half-installed", fakeManager{format: "deb", half: true}, fakeManager{format: "rpm", installed: true}, "deb"},
		{"neither", fakeManager{format: "deb"}, fakeManager{format: "rpm"}, "deb"},
	} {
		if got, err := firstInstalled(ctx, tc.dpkg, tc.rpm); err != nil || got.Format() != tc.want {
			t.Errorf("%s: chose %v (%v), want %s", tc.name, got, err, tc.want)
		}
	}
	if _, err := firstInstalled(ctx, fakeManager{format: "deb", err: errors.New("database locked")}, fakeManager{format: "rpm", installed: true}); err == nil || !strings.Contains(err.Error(), "database locked") {
		t.Errorf("dpkg cannot answer: %v", err)
	}
	// The host's own: nothing is installed in an empty root.
	if got, err := HostPackages(ctx, t.TempDir()); err != nil || got.Format() != "deb" {
		t.Errorf("an empty root: %v (%v), want dpkg's image-based path", got, err)
	}
}

// cutAt runs u until the crash point at and cuts it there as a power cut
// does, then boots the host again: the run stops where it is (its
// goroutine never goes on, so no deferred function runs and the
// installation lock's record stays), /run is emptied (with it the lock's
// file, whose flock the stopped run holds) and the daemon is down, as
// the generator boots a host the upgrade owns: the daemon is the
// upgrade's to start.
func (h *host) cutAt(u *Upgrade, at string) {
	h.t.Helper()
	reached := make(chan struct{})
	hook := func(name string) {
		if name == at {
			close(reached)
			select {} // the power is gone
		}
	}
	u.CrashPoint, h.crash = hook, hook
	done := make(chan error, 1)
	go func() { done <- u.Run(context.Background()) }()
	select {
	case <-reached:
	case err := <-done:
		h.t.Fatalf("the run ended (%v) without reaching the crash point %s", err, at)
	case <-time.After(20 * time.Second):
		h.t.Fatalf("the run did not reach the crash point %s", at)
	}
	h.crash = nil
	if err := os.RemoveAll(h.p.RunDir()); err != nil {
		h.t.Fatal(err)
	}
	if err := os.MkdirAll(h.p.RunDir(), 0o755); err != nil {
		h.t.Fatal(err)
	}
	h.running, h.runningVer = nil, ""
}

// upgradeOwns says whether the installation lock's record is the
// upgrade's (the generator starts no daemon then).
func (h *host) upgradeOwns() bool {
	h.t.Helper()
	own, err := state.ReadOwnership(h.p)
	if err != nil {
		h.t.Fatal(err)
	}
	return own != nil && own.Owner == Operation
}

// A run cut in its record, after the record's last write (the package in
// installed/, upgraded.json, the request taken) and before its journal's
// removal, is finished by the next run: the record again, nothing
// verified (the staged package has moved), installed or rolled back; the
// daemon, left to the upgrade at boot, runs the new version, and the host
// is released.
func TestAnUpgradeCutInItsRecordIsFinishedWithoutARollback(t *testing.T) {
	h := newHost(t)
	file, sum := pkg(t, t.TempDir(), Meta{Package, "1.1.0", "amd64"})
	writeRequest(t, h.p, "op-1", map[string]string{"version": "1.1.0", "url": file, "sha256": sum})
	staged := filepath.Join(h.p.UpgradeStaged(), Package+"_1.1.0.deb")
	h.cutAt(h.upgrade(), CrashAfterRequestTaken)
	if !InProgress(h.p) || exists(staged) || !exists(h.p.UpgradeSucceeded()) || !request.Taken(h.p, Concern, "op-1") || !h.upgradeOwns() {
		t.Fatalf("after the cut: journal %v, staged %v, success signal %v, request taken %v, owned %v: want the record done but for its journal's removal",
			InProgress(h.p), exists(staged), exists(h.p.UpgradeSucceeded()), request.Taken(h.p, Concern, "op-1"), h.upgradeOwns())
	}
	if err := h.upgrade().Run(context.Background()); err != nil {
		t.Fatalf("resumed: %v", err)
	}
	if strings.Join(h.installs, " ") != "1.1.0" || h.installed.Version != "1.1.0" || h.runningVer != "1.1.0" {
		t.Errorf("installs %v, installed %s, daemon runs %q: want 1.1.0 once and the daemon on it", h.installs, h.installed.Version, h.runningVer)
	}
	if u, _ := readUpgraded(h.p); u == nil || u.UID != "op-1" || u.From != "1.0.0" || u.To != "1.1.0" {
		t.Errorf("success signal %+v", u)
	}
	if f, _ := readFailed(h.p); f != nil || !request.Taken(h.p, Concern, "op-1") {
		t.Errorf("failure signal %+v, or the request is not taken", f)
	}
	if !exists(filepath.Join(h.p.UpgradeDir(), "installed", filepath.Base(staged))) {
		t.Error("the installed package is not kept in installed/")
	}
	if InProgress(h.p) || h.upgradeOwns() {
		t.Errorf("journal %v, owned %v: want neither", InProgress(h.p), h.upgradeOwns())
	}
}

// A run cut after its end (its journal removed, or never written: a
// refusal) and before the lock's release leaves the host owned by the
// upgrade: at boot the generator starts the upgrade and no daemon. The
// next run, with nothing to do, releases the host and starts the daemon,
// as an upgrade's end does.
func TestAnUpgradeCutBeforeItsReleaseHandsTheHostBack(t *testing.T) {
	for _, tc := range []struct {
		name, sum, runs string
	}{
		{"upgraded", "", "1.1.0"},
		{"refused", strings.Repeat("ab", 32), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHost(t)
			h.stage(Meta{Package, "1.1.0", "amd64"}, tc.sum)
			h.cutAt(h.upgrade(), CrashBeforeRelease)
			if InProgress(h.p) || !h.upgradeOwns() {
				t.Fatalf("after the cut: journal %v, owned %v: want the run over but the host owned", InProgress(h.p), h.upgradeOwns())
			}
			if err := h.upgrade().Run(context.Background()); !errors.Is(err, ErrNothingToDo) {
				t.Fatalf("resumed: %v, want nothing to do", err)
			}
			if h.upgradeOwns() {
				t.Error("the host is still owned by the upgrade")
			}
			if h.running == nil || !slices.Contains(h.calls, "start") {
				t.Fatalf("the daemon is down (calls %v): want it started", h.calls)
			}
			if want := tc.runs; want == "" {
				if h.runningVer != "1.0.0" {
					t.Errorf("daemon runs %s, want 1.0.0", h.runningVer)
				}
			} else if h.runningVer != want {
				t.Errorf("daemon runs %s, want %s", h.runningVer, want)
			}
		})
	}
	// A run that did not take over a record of a cut one starts nothing.
	h := newHost(t)
	if err := h.upgrade().Run(context.Background()); !errors.Is(err, ErrNothingToDo) || len(h.calls) != 0 {
		t.Errorf("nothing to do on a host nobody owned: %v, calls %v", err, h.calls)
	}
}

// An upgrade whose every run is cut after the daemon's restart on the new
// version (a new agent that takes the host down) is resumed MaxResumes
// times; the run after that rolls back (the previous package installed,
// the daemon on it), leaves the failure signal saying why, rejects the
// package and takes the request: it is not tried again.
func TestAnUpgradeResumedTooOftenIsRolledBackAndNotTriedAgain(t *testing.T) {
	h := newHost(t)
	staged := h.stage(Meta{Package, "1.1.0", "amd64"}, "")
	for i := 0; i <= MaxResumes; i++ {
		h.cutAt(h.upgrade(), CrashAfterDaemonRestart)
	}
	if strings.Join(h.installs, " ") != "1.1.0" || h.pid != MaxResumes+1 {
		t.Fatalf("after %d cut runs: installs %v, %d daemon restarts: want 1.1.0 once, a restart per run", MaxResumes+1, h.installs, h.pid)
	}
	err := h.upgrade().Run(context.Background())
	if !errors.Is(err, ErrResumedTooOften) || !strings.Contains(err.Error(), fmt.Sprintf("resumed %d times", MaxResumes)) || !strings.Contains(err.Error(), "rolled back to 1.0.0") {
		t.Fatalf("run %d: %v, want the bound named and a rollback to 1.0.0", MaxResumes+2, err)
	}
	if strings.Join(h.installs, " ") != "1.1.0 1.0.0" || h.installed.Version != "1.0.0" || h.runningVer != "1.0.0" {
		t.Errorf("installs %v, installed %s, daemon runs %q: want 1.0.0 back and the daemon on it", h.installs, h.installed.Version, h.runningVer)
	}
	f, _ := readFailed(h.p)
	if f == nil || !f.RolledBack || f.From != "1.0.0" || f.To != "1.1.0" || f.Step != StepActivate || !strings.Contains(f.Message, "resumed") {
		t.Errorf("failure signal %+v", f)
	}
	if InProgress(h.p) || h.upgradeOwns() || exists(h.p.UpgradeSucceeded()) || exists(staged) {
		t.Errorf("journal %v, owned %v, success signal %v, staged %v: want none", InProgress(h.p), h.upgradeOwns(), exists(h.p.UpgradeSucceeded()), exists(staged))
	}
	if err := h.upgrade().Run(context.Background()); !errors.Is(err, ErrNothingToDo) || len(h.installs) != 2 {
		t.Errorf("the next run: %v, installs %v: want nothing to do", err, h.installs)
	}
}

// A run cut inside the package manager's install (unpacked, not
// configured) leaves the package half-installed. The next run repairs it
// before anything else (the package manager's repair; a package it
// cannot configure is installed again from its kept file), then finishes
// the upgrade. A half-installed agent is the package manager's: the next
// upgrade, with no journal, takes the package path from the repaired
// version, never the image-based one.
func TestAHalfInstalledPackageIsRepairedFirst(t *testing.T) {
	for _, unconfigurable := range []bool{false, true} {
		t.Run(fmt.Sprintf("unconfigurable=%v", unconfigurable), func(t *testing.T) {
			h := newHost(t)
			h.stage(Meta{Package, "1.1.0", "amd64"}, "")
			h.cutAt(h.upgrade(), CrashAfterUnpack)
			if h.status != HalfInstalled || h.installed.Version != "1.1.0" {
				t.Fatalf("after the cut: %s %s, want 1.1.0 half-installed", h.installed.Version, h.status)
			}
			h.unconfigurable, h.calls = unconfigurable, nil
			if err := h.upgrade().Run(context.Background()); err != nil {
				t.Fatalf("resumed: %v", err)
			}
			want := []string{"repair", "install 1.1.0"}
			if unconfigurable {
				want = []string{"repair", "install 1.1.0", "install 1.1.0"} // the repair's reinstall, then the install step's
			}
			if len(h.calls) < len(want) || !slices.Equal(h.calls[:len(want)], want) {
				t.Errorf("calls %v, want %v first", h.calls, want)
			}
			if h.status != Installed || h.runningVer != "1.1.0" {
				t.Errorf("%s, daemon runs %q: want installed, 1.1.0", h.status, h.runningVer)
			}
			if u, _ := readUpgraded(h.p); u == nil || u.To != "1.1.0" {
				t.Errorf("success signal %+v", u)
			}
		})
	}

	// No journal: the package was left half-installed by a run nothing
	// resumes. Repaired first, it is the previous of the next upgrade.
	h := newHost(t)
	h.installed, h.status = Meta{Package, "1.1.0", "amd64"}, HalfInstalled
	h.stage(Meta{Package, "1.2.0", "amd64"}, "")
	if err := h.upgrade().Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(h.calls) == 0 || h.calls[0] != "repair" || strings.Join(h.installs, " ") != "1.2.0" {
		t.Errorf("calls %v, installs %v: want the repair first, then 1.2.0 installed", h.calls, h.installs)
	}
	if o, _ := state.ReadAgentOverride(h.p); o != nil {
		t.Errorf("the upgrade staged an override %+v on a host dpkg installed the agent on", o)
	}
	if u, _ := readUpgraded(h.p); u == nil || u.From != "1.1.0" || u.To != "1.2.0" {
		t.Errorf("success signal %+v, want from the repaired 1.1.0", u)
	}

	// Half-installed and nothing to install it again from: an error,
	// nothing else done.
	h = newHost(t)
	h.installed, h.status, h.unconfigurable = Meta{Package, "1.1.0", "amd64"}, HalfInstalled, true
	h.stage(Meta{Package, "1.2.0", "amd64"}, "")
	if err := h.upgrade().Run(context.Background()); err == nil || !strings.Contains(err.Error(), "half-installed") || len(h.installs) != 0 {
		t.Errorf("%v, installs %v: want the half-installed package named, nothing installed", err, h.installs)
	}
}

// dpkg's status, as dpkg-query shows it: only "not installed" and a
// removed package's kept configuration are not installed; every state a
// cut dpkg run leaves is half-installed, never "not installed".
func TestDpkgStatusTellsHalfInstalledFromNotInstalled(t *testing.T) {
	for abbrev, want := range map[string]Status{
		"ii ": Installed, "hi ": Installed, "iU ": HalfInstalled, "iF ": HalfInstalled, "iH ": HalfInstalled,
		"iW ": HalfInstalled, "it ": HalfInstalled, "iiR": HalfInstalled, "rc ": NotInstalled, "un ": NotInstalled,
	} {
		m, st, err := parseDpkgStatus(Package + "\t1.1.0\tamd64\t" + abbrev + "\n")
		if err != nil || st != want || (want != NotInstalled && m != (Meta{Package, "1.1.0", "amd64"})) {
			t.Errorf("%q: %+v %s %v, want %s", abbrev, m, st, err, want)
		}
	}
	for _, out := range []string{"", "garbage\n", Package + "\t1\tamd64\tii \n" + Package + "\t1\tarm64\tii \n"} {
		if _, _, err := parseDpkgStatus(out); err == nil {
			t.Errorf("%q: no error", out)
		}
	}
}

// With the real dpkg on a scratch root: an install cut between its unpack
// and its configuration leaves the package half-installed, which
// Installed says (and HostPackages takes dpkg for it); Repair configures
// it, and dpkg --audit has nothing to say.
func TestDpkgInstallCutAfterTheUnpackIsHalfInstalledAndRepaired(t *testing.T) {
	for _, tool := range []string{"dpkg", "dpkg-deb", "dpkg-query"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not on this machine", tool)
		}
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: dpkg --root installs files owned by root")
	}
	ctx := context.Background()
	root := t.TempDir()
	for _, d := range []string{"var/lib/dpkg/info", "var/lib/dpkg/updates"} {
		os.MkdirAll(filepath.Join(root, d), 0o755)
	}
	os.WriteFile(filepath.Join(root, "var/lib/dpkg/status"), nil, 0o644)
	deb := func(version string) string {
		tree := t.TempDir()
		lib := filepath.Join(tree, "usr/libexec/unbounded")
		os.MkdirAll(lib, 0o755)
		os.MkdirAll(filepath.Join(tree, "DEBIAN"), 0o755)
		arch, _ := Dpkg{}.Arch(ctx)
		os.WriteFile(filepath.Join(tree, "DEBIAN/control"), []byte("Package: "+Package+"\nVersion: "+version+"\nArchitecture: "+arch+"\nMaintainer: m <m@example.com>\nDescription: d\n"), 0o644)
		os.WriteFile(filepath.Join(lib, "unbounded-agent"), []byte("agent "+version+"\n"), 0o755)
		file := filepath.Join(t.TempDir(), "agent.deb")
		if out, err := exec.Command("dpkg-deb", "--root-owner-group", "--build", tree, file).CombinedOutput(); err != nil {
			t.Fatalf("dpkg-deb: %v\n%s", err, out)
		}
		return file
	}
	d := Dpkg{Root: root}
	if _, st, err := d.Installed(ctx, Package); err != nil || st != NotInstalled {
		t.Fatalf("an empty database: %s %v", st, err)
	}
	if err := d.Install(ctx, deb("1.0.0")); err != nil {
		t.Fatal(err)
	}
	if m, st, err := d.Installed(ctx, Package); err != nil || st != Installed || m.Version != "1.0.0" {
		t.Fatalf("installed: %+v %s %v", m, st, err)
	}
	next := deb("1.1.0")
	func() {
		defer func() {
			if r := recover(); r != crashed(CrashAfterUnpack) {
				t.Fatalf("the install did not reach %s (%v)", CrashAfterUnpack, r)
			}
		}()
		cut := Dpkg{Root: root, CrashPoint: func(name string) {
			if name == CrashAfterUnpack {
				panic(crashed(name))
			}
		}}
		cut.Install(ctx, next)
	}()
	if m, st, err := d.Installed(ctx, Package); err != nil || st != HalfInstalled || m.Version != "1.1.0" {
		t.Fatalf("cut after the unpack: %+v %s %v, want 1.1.0 half-installed", m, st, err)
	}
	if pk, err := HostPackages(ctx, root); err != nil || pk.Format() != "deb" {
		t.Errorf("HostPackages on the half-installed agent: %v %v, want dpkg", pk, err)
	}
	if err := d.Repair(ctx, Package); err != nil {
		t.Fatal(err)
	}
	if m, st, err := d.Installed(ctx, Package); err != nil || st != Installed || m.Version != "1.1.0" {
		t.Errorf("repaired: %+v %s %v, want 1.1.0 installed", m, st, err)
	}
	if err := d.Verify(ctx, Package); err != nil {
		t.Errorf("repaired: %v", err)
	}
}

// readFailed is the upgrade's outcome when it failed, as the signal of
// builds before lib/outcome (nil otherwise); readUpgraded when it
// succeeded. Each also holds the legacy file the upgrade still writes to
// the same outcome: the daemon of an older build a rollback starts reads
// only that file.
func readFailed(p hostpaths.Paths) (*outcome.UpgradeFailed, error) {
	f, _, err := readSignals(p)
	return f, err
}

func readUpgraded(p hostpaths.Paths) (*outcome.UpgradeSucceeded, error) {
	_, u, err := readSignals(p)
	return u, err
}

func readSignals(p hostpaths.Paths) (*outcome.UpgradeFailed, *outcome.UpgradeSucceeded, error) {
	o, err := outcome.Read(p, outcome.Upgrade)
	if o == nil || err != nil {
		return nil, nil, err
	}
	f, u := o.UpgradeSignals()
	var lf outcome.UpgradeFailed
	var lu outcome.UpgradeSucceeded
	okF, errF := state.ReadRecord(p.UpgradeFailed(), 64<<10, &lf)
	okU, errU := state.ReadRecord(p.UpgradeSucceeded(), 64<<10, &lu)
	switch {
	case errF != nil || errU != nil:
		return nil, nil, errors.Join(errF, errU)
	case f != nil && (!okF || okU || lf != *f):
		return nil, nil, fmt.Errorf("the failure record %+v: legacy failed.json %v %+v, upgraded.json %v", *f, okF, lf, okU)
	case u != nil && (!okU || okF || lu != *u):
		return nil, nil, fmt.Errorf("the success record %+v: legacy upgraded.json %v %+v, failed.json %v", *u, okU, lu, okF)
	}
	return f, u, nil
}
