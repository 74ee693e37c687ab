package harness

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// The package layer is built once per test binary and shared read-only by
// every machine that asks for the package.
var shared struct {
	once    sync.Once
	layer   string
	err     error
	cleanup func()
	// Install is how long `dpkg -i` took; Build the whole layer (boot,
	// install, poweroff).
	install, build time.Duration
}

// debInMachine is where the .deb is copied before `dpkg -i`.
const debInMachine = "/var/cache/unbounded-tests/unbounded-agent.deb"

// packageLayer returns a directory that, as an overlay layer over rootfs,
// holds a host on which deb was installed with `dpkg -i` by a running
// systemd and which was then powered off.
func packageLayer(t testing.TB, rootfs, deb string) (string, error) {
	shared.once.Do(func() {
		begin := time.Now()
		shared.layer, shared.err = buildPackageLayer(t.Logf, rootfs, deb)
		shared.build = time.Since(begin)
		if shared.err == nil {
			t.Logf("package layer: %s installed in %v, layer built in %v", filepath.Base(deb),
				shared.install.Round(time.Millisecond), shared.build.Round(time.Millisecond))
		}
	})
	return shared.layer, shared.err
}

func buildPackageLayer(logf func(string, ...any), rootfs, deb string) (string, error) {
	name, err := exec.Command("dpkg-deb", "-f", deb, "Package").Output()
	if err != nil {
		return "", fmt.Errorf("dpkg-deb -f %s Package: %w", deb, err)
	}
	pkg := strings.TrimSpace(string(name))
	data, err := os.ReadFile(deb)
	if err != nil {
		return "", err
	}

	m, err := newMachine([]string{rootfs}, nil, false, logf)
	if m != nil {
		// On success the machine's upper directory lives on as the
		// layer; Main removes it after the run.
		// (Main runs it after every test has ended: nothing may log to
		// the test that built the layer.)
		shared.cleanup = func() {
			m.logf = func(string, ...any) {}
			_ = m.destroy()
		}
	}
	if err != nil {
		return "", err
	}
	if err := writeUnder(m.Root(), debInMachine, data, 0o644); err != nil {
		return "", err
	}
	if err := m.start(); err != nil {
		return "", err
	}
	begin := time.Now()
	out, err := m.run("dpkg", "-i", debInMachine)
	shared.install = time.Since(begin)
	if err != nil {
		m.logDiagnostics()
		return "", fmt.Errorf("%w\n%s", err, out)
	}
	status, err := m.run("dpkg-query", "-W", "-f=${Status}", pkg)
	if err != nil || strings.TrimSpace(status) != "install ok installed" {
		return "", fmt.Errorf("after dpkg -i, %s status is %q (%v)", pkg, status, err)
	}
	logf("dpkg -i %s:\n%s", filepath.Base(deb), out)
	if _, err := m.run("rm", "-f", debInMachine); err != nil {
		return "", err
	}
	if err := m.stop(); err != nil {
		return "", err
	}
	if err := m.unmount(); err != nil {
		return "", err
	}
	upper := filepath.Join(m.dir, "upper")
	// The install boot's journal belongs to that boot only: a scenario's
	// `journalctl -u` must not see it.
	if err := os.RemoveAll(filepath.Join(upper, "var/log/journal")); err != nil {
		return "", err
	}
	// Neither does its machine id, which its first boot committed to
	// /etc/machine-id: left in the shared layer it would be the id of
	// every scenario's machine. Without it the rootfs's empty file shows
	// through, and each machine's first boot makes an id of its own
	// (tests/system/rootfs.sh).
	if err := os.Remove(filepath.Join(upper, "etc/machine-id")); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	return upper, nil
}

// Main runs the tests and removes what the harness shared between them (the
// package layer). Call it from TestMain:
//
//	func TestMain(m *testing.M) { harness.Main(m) }
func Main(m *testing.M) {
	code := m.Run()
	if shared.cleanup != nil {
		shared.cleanup()
	}
	atExit.Lock()
	for _, f := range atExit.fs {
		f()
	}
	atExit.Unlock()
	os.Exit(code)
}

var atExit struct {
	sync.Mutex
	fs []func()
}

// AtExit runs f once every test of the process has ended (Main runs it):
// the cleanup of what a test made for the whole process, such as a layer
// every machine of the run shares.
func AtExit(f func()) {
	atExit.Lock()
	defer atExit.Unlock()
	atExit.fs = append(atExit.fs, f)
}
