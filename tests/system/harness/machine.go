// Package harness boots a real systemd as PID 1 in a systemd-nspawn
// container, for the system tests of ARCHITECTURE section 9, tier 5.
//
// Each Machine boots the cached Debian rootfs (tests/system/rootfs.sh) under
// its own copy-on-write overlay, so machines never change the cached tree,
// any number of them share it, and what a test writes before boot is in
// place when PID 1 (and therefore the generator) starts. A reboot keeps the
// overlay: state written by one boot is seen by the next, as on a host.
//
// With Options.Package the machine boots with the freshly built .deb
// installed. The package is installed once per test binary, for real, with
// `dpkg -i` inside a booted machine (maintainer scripts, daemon-reload and
// presets run against a live systemd); that machine's overlay then becomes a
// read-only layer under every machine that asks for the package, so each
// scenario starts from "package installed, host rebooted" in one boot.
//
// The environment (see Require):
//
//	UNBOUNDED_TEST_ROOTFS  the rootfs printed by tests/system/rootfs.sh
//	UNBOUNDED_TEST_DEB     the .deb to install (dist/unbounded-agent_*.deb)
//
// Tests that use Options.Package must call Main from their TestMain, which
// removes the shared package layer after the run.
package harness

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	sdbus "github.com/coreos/go-systemd/v22/dbus"
	"golang.org/x/sys/unix"

	"unbounded-cloud.io/agent/tests/tiers"
)

// Environment variables the harness reads.
const (
	EnvRootfs = "UNBOUNDED_TEST_ROOTFS"
	EnvDeb    = "UNBOUNDED_TEST_DEB"
	// EnvMachineTmpfs set to 0 keeps machines' files on the disk's file
	// system (newMachine).
	EnvMachineTmpfs = "UNBOUNDED_TEST_MACHINE_TMPFS"
)

// idleGenerators are the stock systemd generators of the test rootfs that
// have nothing to do in a container (no block devices, no kernel command
// line, no rc.local, no SysV script without a native unit, no terminal the
// tests log in on: the getty generator's console getty); a machine masks
// them. The fstab generator, and the agent's, run. The SysV and getty
// generators ran at each of a tier's 616 host boots and daemon-reloads
// (process accounting of a warm run: 25 CPU-s, with the gettys).
var idleGenerators = []string{
	"systemd-cryptsetup-generator", "systemd-debug-generator", "systemd-getty-generator", "systemd-gpt-auto-generator",
	"systemd-hibernate-resume-generator", "systemd-integritysetup-generator", "systemd-rc-local-generator",
	"systemd-run-generator", "systemd-system-update-generator", "systemd-sysv-generator", "systemd-veritysetup-generator",
}

// idleUnits are the test rootfs's units that a machine masks: e2scrub_reap
// runs e2scrub_all at every boot, which finds no ext4 volume group in a
// container.
var idleUnits = []string{"e2scrub_reap.service"}

// machineTmpfsSize bounds one machine's files in memory (a bound, not a
// reservation: a host with two node trees and its journal takes well
// under 1 GiB).
const machineTmpfsSize = "8g"

// Timeouts. A boot takes about a second here; these are generous so that a
// loaded CI machine fails with a message instead of flaking (a mode none
// host, its node stack stopped, took more than 30 s to power off in a
// cold CI run with other system scenarios beside it on two cores).
const (
	bootTimeout     = 90 * time.Second
	poweroffTimeout = 60 * time.Second
	commandTimeout  = 120 * time.Second
)

// sigPoweroff is SIGRTMIN+4, systemd's "power off" signal (glibc's SIGRTMIN
// is 34).
const sigPoweroff = syscall.Signal(38)

// Options shape a machine.
type Options struct {
	// Package boots the machine with the .deb named by UNBOUNDED_TEST_DEB
	// installed (see the package comment).
	Package bool
	// Files are written into the machine before its first boot.
	Files []File
	// NspawnArgs are appended to the systemd-nspawn command line.
	NspawnArgs []string
	// HostNetwork shares the host's network namespace instead of a
	// private one, so that the machine reaches services on the host's
	// loopback (the test API server of tests/kube).
	HostNetwork bool
	// BootTimeout bounds Start's wait for the boot to finish (default
	// 90 s). A first boot's transaction holds unbounded-bootstrap.service,
	// which runs until the Node is Ready.
	BootTimeout time.Duration
	// Env is added to systemd-nspawn's environment (KEY=VALUE), for its
	// SYSTEMD_NSPAWN_* settings; unlike t.Setenv it leaves the test free
	// to run in parallel.
	Env []string
	// Network, when set, gives the machine a network namespace of the
	// harness's making, new at every start (netns.go), instead of
	// nspawn's --private-network: Network is called with the file that
	// holds it before systemd-nspawn runs (ListenIn opens listeners on
	// the machine's loopback there), and what it returns once the
	// machine has stopped, before the namespace is let go.
	Network func(netns string) (stop func(), err error)
	// Layers are read-only directories laid over the rootfs (and the
	// package layer) as the machine's lowest-but-own layers: files an
	// image builder put into the image, made once and shared by many
	// machines. Their directories can be renamed in the machine (the
	// overlay is mounted with redirect_dir=on), as on the image's own
	// file system.
	Layers []string
}

// File is a file to place in a machine.
type File struct {
	Path string // absolute path inside the machine
	Data []byte
	Mode os.FileMode
}

// Machine is one systemd-nspawn container with systemd as PID 1.
type Machine struct {
	// Name is the machine name (and hostname), unique per machine.
	Name string
	// BootTime is how long the last Start took, from exec of
	// systemd-nspawn to `systemctl is-system-running` answering running
	// or degraded.
	BootTime time.Duration
	// State is what `systemctl is-system-running` answered at the end of
	// the last Start: running or degraded.
	State string

	t      testing.TB // nil for the shared package machine
	logf   func(string, ...any)
	dir    string // per-machine directory: upper, work, root, kmsg, console.log
	lowers []string
	args   []string

	mounted bool
	tmpfs   bool // m.dir is a tmpfs of its own
	kmsg    *kmsgReader
	starts  int // how many times it was started

	mu      sync.Mutex
	cmd     *exec.Cmd
	done    chan struct{}
	waitErr error
	leader  int
	cgDirs  []string
	bus     *sdbus.Conn
	// cpu is the CPU time of its boots that ended (endCgroups).
	cpu time.Duration

	hostNetwork bool
	network     func(netns string) (func(), error)
	netStop     func() // ends this boot's network (Options.Network)
	bootTimeout time.Duration
	env         []string
}

// Require skips t unless the host can boot machines: root, systemd-nspawn,
// nsenter and the cached rootfs; with pkg, also the .deb. Where the system
// tier is required (tests/tiers) it fails t instead. It returns the
// rootfs and the .deb path.
func Require(t testing.TB, pkg bool) (rootfs, deb string) {
	t.Helper()
	if os.Geteuid() != 0 {
		tiers.Skip(t, tiers.System, "system tests need root (systemd-nspawn, overlay mounts, cgroups)")
	}
	for _, bin := range []string{"systemd-nspawn", "nsenter"} {
		if _, err := exec.LookPath(bin); err != nil {
			tiers.Skip(t, tiers.System, "system tests need %s on PATH (apt-get install systemd-container util-linux)", bin)
		}
	}
	rootfs = os.Getenv(EnvRootfs)
	if rootfs == "" {
		tiers.Skip(t, tiers.System, "%s is not set: build the rootfs with tests/system/rootfs.sh and export its output", EnvRootfs)
	}
	if _, err := os.Stat(filepath.Join(rootfs, "usr/lib/systemd/systemd")); err != nil {
		tiers.Skip(t, tiers.System, "%s=%s is not a systemd rootfs (%v): rebuild it with tests/system/rootfs.sh", EnvRootfs, rootfs, err)
	}
	if pkg {
		deb = os.Getenv(EnvDeb)
		if deb == "" {
			tiers.Skip(t, tiers.System, "%s is not set: build the package with `make packages` and export dist/unbounded-agent_*.deb", EnvDeb)
		}
		if _, err := os.Stat(deb); err != nil {
			tiers.Skip(t, tiers.System, "%s=%s: %v (run `make packages`)", EnvDeb, deb, err)
		}
	}
	return rootfs, deb
}

// New prepares a machine without booting it: its root is mounted (see Root)
// and opts.Files are written. Boot it with Start. Everything is torn down
// when the test ends.
func New(t testing.TB, opts Options) *Machine {
	t.Helper()
	rootfs, deb := Require(t, opts.Package)
	lowers := []string{rootfs}
	if opts.Package {
		layer, err := packageLayer(t, rootfs, deb)
		if err != nil {
			t.Fatalf("install %s: %v", deb, err)
		}
		lowers = []string{layer, rootfs}
	}
	m, err := newMachine(append(append([]string(nil), opts.Layers...), lowers...), opts.NspawnArgs, len(opts.Layers) > 0, t.Logf)
	if m != nil {
		m.t = t
		m.hostNetwork = opts.HostNetwork
		m.network = opts.Network
		m.bootTimeout = opts.BootTimeout
		m.env = opts.Env
		t.Cleanup(func() {
			if t.Failed() {
				m.logDiagnostics()
			}
			if err := m.destroy(); err != nil {
				t.Errorf("tear down machine %s: %v", m.Name, err)
			}
		})
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range opts.Files {
		m.WriteFile(f.Path, f.Data, f.Mode)
	}
	return m
}

// Boot prepares and boots a machine; it returns once the boot finished
// (`systemctl is-system-running` says running or degraded).
func Boot(t testing.TB, opts Options) *Machine {
	t.Helper()
	m := New(t, opts)
	m.Start()
	return m
}

func newMachine(lowers, args []string, redirectDirs bool, logf func(string, ...any)) (*Machine, error) {
	var id [4]byte
	if _, err := rand.Read(id[:]); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "unbounded-machine-")
	if err != nil {
		return nil, err
	}
	m := &Machine{
		Name:   "ubt-" + hex.EncodeToString(id[:]),
		logf:   logf,
		dir:    dir,
		lowers: lowers,
		args:   args,
	}
	// The machine's own files (its overlay's upper directory: the node
	// trees a first boot or a repave unpacks, the journal, every atomic
	// write's fsync) live in memory unless UNBOUNDED_TEST_MACHINE_TMPFS=0:
	// a test host's writes need to outlive its power cuts, which they do
	// (the tmpfs is the VM's), not the VM. On the disk's file system
	// they cost the system tier a large part of its kernel time
	// (journalling, writeback, and every machine's shutdown syncing
	// every other machine's writes).
	if os.Getenv(EnvMachineTmpfs) != "0" {
		if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0700,size="+machineTmpfsSize); err != nil {
			return m, fmt.Errorf("mount a tmpfs on %s: %w", dir, err)
		}
		m.tmpfs = true
	}
	for _, d := range []string{"upper", "work", "root"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			return m, err
		}
	}
	// The overlay is mounted in the host's mount namespace so that the test
	// can write into the machine before it boots and between reboots; the
	// lower layers are never written.
	opt := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s",
		strings.Join(lowers, ":"), filepath.Join(dir, "upper"), filepath.Join(dir, "work"))
	if redirectDirs {
		opt += ",redirect_dir=on"
	}
	if err := unix.Mount("overlay", m.Root(), "overlay", 0, opt); err != nil {
		return m, fmt.Errorf("mount overlay (%s): %w", opt, err)
	}
	m.mounted = true

	m.kmsg, err = newKmsgReader(filepath.Join(dir, "kmsg"))
	if err != nil {
		return m, err
	}
	// The harness is the only reader of the machine's /dev/kmsg (see
	// Kmsg): journald would otherwise compete for the same FIFO.
	if err := writeUnder(m.Root(), "/etc/systemd/journald.conf.d/50-unbounded-tests.conf",
		[]byte("# Written by the system test harness: the harness reads /dev/kmsg.\n[Journal]\nReadKMsg=no\n"), 0o644); err != nil {
		return m, err
	}
	// systemd runs every generator at every boot and every daemon-reload
	// (the agent reloads at each hand-over and slot start); these find
	// nothing to do in a container, and masked they cost nothing.
	gens := filepath.Join(m.Root(), "etc/systemd/system-generators")
	if err := os.MkdirAll(gens, 0o755); err != nil {
		return m, err
	}
	for _, g := range idleGenerators {
		// A machine over the package layer has them from it.
		if err := os.Symlink("/dev/null", filepath.Join(gens, g)); err != nil && !errors.Is(err, fs.ErrExist) {
			return m, err
		}
	}
	for _, u := range idleUnits {
		if err := os.Symlink("/dev/null", filepath.Join(m.Root(), "etc/systemd/system", u)); err != nil && !errors.Is(err, fs.ErrExist) {
			return m, err
		}
	}
	return m, nil
}

// TmpfsDir is a directory of the VM's own (not an overlay, so that a
// machine can bind it where a node stack needs a real file system) for the
// machine's files that the test binds into it, on a tmpfs of its own like
// the machine's (EnvMachineTmpfs=0: on the disk): node trees written at
// every slot build (a few hundred MB each, and their removal) cost the
// disk's file system journalling and writeback that a tmpfs does not. It
// is unmounted and removed when the test ends, after the machines the
// test made after it (cleanups run last first).
func TmpfsDir(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	if os.Getenv(EnvMachineTmpfs) == "0" {
		return dir
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755,size="+machineTmpfsSize); err != nil {
		t.Fatalf("mount a tmpfs on %s: %v", dir, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount the tmpfs %s: %v", dir, err)
		}
	})
	return dir
}

// Root is the machine's file system as the host sees it (the overlay's
// merged directory). Files written here before Start are in place when PID 1
// starts, e.g. state written with lib/state through hostpaths.New(m.Root()).
// It does not show the API file systems of a running machine (/run, /proc,
// /dev): use WriteFile and ReadFile for those.
func (m *Machine) Root() string { return filepath.Join(m.dir, "root") }

// Start boots the machine and waits until the boot finished.
func (m *Machine) Start() {
	m.helper()
	if err := m.start(); err != nil {
		m.fatalf("boot %s: %v", m.Name, err)
	}
}

// Stop powers the machine off (SIGRTMIN+4 to PID 1, like `systemctl
// poweroff`), and kills it if it does not stop in time.
func (m *Machine) Stop() {
	m.helper()
	if err := m.stop(); err != nil {
		m.fatalf("stop %s: %v", m.Name, err)
	}
}

// PowerOffThroughLogind powers the machine off as an operator's
// `systemctl poweroff` in it does: a client of its systemd-logind, which
// first tells the holders of delay locks (the kubelet's graceful node
// shutdown) and waits for them, unlike Stop's SIGRTMIN+4, which its
// systemd acts on at once. It returns once the machine is gone, and kills
// it if that takes longer than the poweroff timeout, as Stop does.
func (m *Machine) PowerOffThroughLogind() {
	m.helper()
	if err := m.stopBy(func(int) {
		// The call returns once logind has queued the poweroff; the
		// connection may break as the machine goes down.
		if out, err := m.Run("systemctl", "--no-ask-password", "poweroff"); err != nil {
			m.logf("machine %s: systemctl poweroff: %v: %s", m.Name, err, out)
		}
	}); err != nil {
		m.fatalf("poweroff of %s: %v", m.Name, err)
	}
}

// Reboot powers the machine off and boots it again from the same overlay:
// what was written to its persistent file systems survives, /run does not,
// and generators run again at the new boot.
func (m *Machine) Reboot() {
	m.helper()
	m.Stop()
	m.Start()
}

// PowerCut ends the machine as a power cut would: nspawn and every process
// in the machine's cgroups get SIGKILL, nothing shuts down, no unit
// stops. What was written to its file systems stays (the VM's page cache
// is not lost: a power cut of the machine, not of the VM); /run goes.
// Start boots it again.
func (m *Machine) PowerCut() {
	m.helper()
	if err := m.cut(); err != nil {
		m.fatalf("power cut of %s: %v", m.Name, err)
	}
}

// cut is PowerCut's work: the boot ends at once, nothing shuts down.
func (m *Machine) cut() error {
	m.mu.Lock()
	bus := m.bus
	m.bus = nil
	m.mu.Unlock()
	if bus != nil {
		bus.Close()
	}
	m.kill()
	m.mu.Lock()
	m.cmd, m.done = nil, nil
	m.mu.Unlock()
	return m.endCgroups()
}

// Leader is the host PID of the machine's PID 1 (0 when stopped).
func (m *Machine) Leader() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.leader
}

func (m *Machine) running() bool { return m.Leader() != 0 }

func (m *Machine) start() error {
	if m.running() {
		return errors.New("already running")
	}
	begin := time.Now()
	procs, dirs, err := createCgroups(m.Name)
	m.cgDirs = dirs
	if err != nil {
		return err
	}
	console, err := os.OpenFile(filepath.Join(m.dir, "console.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer console.Close()
	fmt.Fprintf(console, "=== boot at %s\n", begin.Format(time.RFC3339Nano))

	nspawn := []string{"systemd-nspawn", "-q", "-D", m.Root(), "--boot", "-M", m.Name,
		// Both are needed when the host has no systemd (TESTING.md).
		"--register=no", "--keep-unit",
		"--console=read-only",
		"--resolv-conf=off", "--timezone=off", "--link-journal=no",
		// nspawn gives a container no /dev/kmsg; see Kmsg.
		"--bind=" + m.kmsg.path + ":/dev/kmsg",
	}
	// A boot that ended by itself (the machine powered itself off) has
	// not ended its network yet.
	m.endNetwork()
	switch {
	case m.network != nil:
		ns := filepath.Join(m.dir, "netns")
		if err := newNetns(ns); err != nil {
			return err
		}
		stop, err := m.network(ns)
		if err != nil {
			releaseNetns(ns)
			return err
		}
		m.netStop = func() {
			stop()
			if err := releaseNetns(ns); err != nil {
				m.logf("machine %s: %v", m.Name, err)
			}
		}
		nspawn = append(nspawn, "--network-namespace-path="+ns)
	case !m.hostNetwork:
		nspawn = append(nspawn, "--private-network")
	}
	nspawn = append(nspawn, m.args...)
	// The shell joins the machine's cgroups before it becomes nspawn, so
	// that nspawn and everything it starts is in them from the first
	// instruction (joining after exec would race with nspawn's fork).
	script := `IFS=:; for p in $UNBOUNDED_CGROUP_PROCS; do echo $$ >"$p" || exit 1; done; exec "$@"`
	cmd := exec.Command("sh", append([]string{"-c", script, "sh"}, nspawn...)...)
	cmd.Env = append(append(os.Environ(), m.env...), "UNBOUNDED_CGROUP_PROCS="+strings.Join(procs, ":"))
	cmd.Stdout, cmd.Stderr = console, console
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		m.endNetwork()
		return err
	}
	done := make(chan struct{})
	m.mu.Lock()
	m.cmd, m.done = cmd, done
	m.mu.Unlock()
	go func() {
		err := cmd.Wait()
		m.mu.Lock()
		m.waitErr = err
		m.mu.Unlock()
		close(done)
	}()

	leader, err := findLeader(cmd.Process.Pid, done)
	if err != nil {
		m.kill()
		return fmt.Errorf("%w\n%s", err, m.consoleTail(30))
	}
	m.mu.Lock()
	m.leader = leader
	m.mu.Unlock()

	state, err := m.waitBooted(done)
	if err != nil {
		m.kill()
		return fmt.Errorf("%w\n%s", err, m.consoleTail(30))
	}
	m.BootTime = time.Since(begin)
	m.State = state
	m.logf("machine %s: %s after %v (leader PID %d, dir %s)", m.Name, state, m.BootTime.Round(time.Millisecond), leader, m.dir)
	// For the tier summary (tests/tiersum): where a scenario's time went.
	// A machine's first start is its first boot (with agent.toml, the
	// whole bootstrap to a Ready Node); every later start is a boot.
	kind := "boot"
	if m.starts == 0 {
		kind = "first-boot"
	}
	m.starts++
	m.logf("timing: %s %.2fs (machine %s)", kind, m.BootTime.Seconds(), m.Name)
	return nil
}

// findLeader returns the container's PID 1: the child of nspawn whose
// innermost PID (the last NSpid field) is 1.
func findLeader(nspawn int, done <-chan struct{}) (int, error) {
	deadline := time.Now().Add(bootTimeout)
	for time.Now().Before(deadline) {
		select {
		case <-done:
			return 0, errors.New("systemd-nspawn exited before the container started")
		default:
		}
		data, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", nspawn, nspawn))
		for _, f := range strings.Fields(string(data)) {
			pid, err := strconv.Atoi(f)
			if err != nil {
				continue
			}
			if innermostPID(pid) == 1 {
				return pid, nil
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	return 0, errors.New("no container PID 1 found under systemd-nspawn")
}

func innermostPID(pid int) int {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "NSpid:"); ok {
			f := strings.Fields(rest)
			if len(f) == 0 {
				return 0
			}
			n, _ := strconv.Atoi(f[len(f)-1])
			return n
		}
	}
	return 0
}

// waitBooted retries `systemctl is-system-running --wait` until it answers
// running or degraded: right after PID 1 starts, systemctl may fail because
// the manager's bus is not up yet.
func (m *Machine) waitBooted(done <-chan struct{}) (string, error) {
	timeout := bootTimeout
	if m.bootTimeout > 0 {
		timeout = m.bootTimeout
	}
	deadline := time.Now().Add(timeout)
	last := ""
	for time.Now().Before(deadline) {
		select {
		case <-done:
			return "", errors.New("systemd-nspawn exited during boot")
		default:
		}
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		out, err := m.runContext(ctx, "systemctl", "is-system-running", "--wait")
		cancel()
		state := strings.TrimSpace(out)
		if state == "running" || state == "degraded" {
			return state, nil
		}
		last = fmt.Sprintf("%q (%v)", state, err)
		time.Sleep(100 * time.Millisecond)
	}
	return "", fmt.Errorf("boot did not finish within %v; last is-system-running: %s", timeout, last)
}

func (m *Machine) stop() error {
	return m.stopBy(func(leader int) { _ = syscall.Kill(leader, sigPoweroff) })
}

// stopBy is stop with the poweroff asked by poweroff (given the leader).
func (m *Machine) stopBy(poweroff func(leader int)) error {
	m.mu.Lock()
	leader, done, bus := m.leader, m.done, m.bus
	m.bus = nil
	m.mu.Unlock()
	if bus != nil {
		bus.Close()
	}
	if done == nil {
		return nil
	}
	var errs []error
	if leader != 0 {
		poweroff(leader)
	}
	begin := time.Now()
	select {
	case <-done:
	case <-time.After(poweroffTimeout / 2):
		// Slow: what the shutdown waits for, asked while the manager
		// still answers, in case it never ends.
		slow, ours := m.shutdownJobs()
		select {
		case <-done:
			m.logf("machine %s: powered off in %v; halfway it waited for:\n%s", m.Name, time.Since(begin).Round(time.Millisecond), slow)
		case <-time.After(poweroffTimeout - time.Since(begin)):
			msg := fmt.Sprintf("no poweroff within %v; killed; halfway it waited for:\n%s\n%s", poweroffTimeout, slow, m.consoleTail(30))
			if ours {
				// A unit of the agent that does not stop is the
				// product's fault: every one must end on SIGTERM.
				errs = append(errs, errors.New(msg))
			} else {
				// Past its units (systemd-shutdown's final kill
				// and sync, journald's flush on a host busy with
				// the other tests' writes): the machine's, not the
				// agent's; logged, and the machine killed.
				m.logf("machine %s: %s", m.Name, msg)
			}
			m.kill()
		}
	}
	m.mu.Lock()
	werr := m.waitErr
	m.leader, m.cmd, m.done = 0, nil, nil
	m.mu.Unlock()
	m.endNetwork()
	if werr != nil && len(errs) == 0 {
		errs = append(errs, fmt.Errorf("systemd-nspawn: %v", werr))
	}
	if err := m.endCgroups(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// endCgroups adds the CPU time the boot that ended used (its cgroups'
// cpuacct.usage: the machine's processes, its node machines' and pods')
// to m.cpu and removes its cgroups.
func (m *Machine) endCgroups() error {
	m.cpu += cgroupCPU(m.cgDirs)
	err := removeCgroups(m.cgDirs)
	m.cgDirs = nil
	return err
}

// shutdownJobs is what a shutting-down machine's manager still runs: its
// jobs and the units being stopped; ours says whether one of them is an
// agent unit (unbounded-*, not a test's own unbounded-test-* helpers, or
// a node machine, systemd-nspawn@kube1/kube2, whose stop is bounded by
// the node's graceful shutdown period + 15 s and then its units' 10 s).
func (m *Machine) shutdownJobs() (text string, ours bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	jobs, err := m.runContext(ctx, "systemctl", "--no-pager", "--no-legend", "list-jobs")
	units, uerr := m.runContext(ctx, "systemctl", "--no-pager", "--no-legend", "list-units", "--state=deactivating")
	for _, l := range strings.Split(jobs+"\n"+units, "\n") {
		for _, f := range strings.Fields(l) {
			if (strings.HasPrefix(f, "unbounded-") && !strings.HasPrefix(f, "unbounded-test-")) || strings.HasPrefix(f, "systemd-nspawn@kube") {
				ours = true
			}
		}
	}
	return fmt.Sprintf("jobs (%v):\n%s\nstopping (%v):\n%s", err, jobs, uerr, units), ours
}

// kill ends nspawn and everything in the machine's cgroups, and waits for
// nspawn (it is reaped by the Wait goroutine; a zombie would still answer
// kill -0).
func (m *Machine) kill() {
	m.mu.Lock()
	cmd, done := m.cmd, m.done
	m.mu.Unlock()
	if cmd != nil && cmd.Process != nil {
		_ = cmd.Process.Kill()
	}
	for _, d := range m.cgDirs {
		killProcs(filepath.Join(d, "cgroup.procs"))
	}
	if done != nil {
		select {
		case <-done:
		case <-time.After(poweroffTimeout):
		}
	}
	m.mu.Lock()
	m.leader = 0
	m.mu.Unlock()
	m.endNetwork()
}

// endNetwork ends the network of the boot that has ended (Options.Network).
func (m *Machine) endNetwork() {
	if m.netStop != nil {
		m.netStop()
		m.netStop = nil
	}
}

// destroy ends the machine and removes everything it left on the host:
// cgroups, the overlay mount, the per-machine directory. The test is over,
// so the machine is cut, not powered off: a clean poweroff (a node
// machine's kubelet, containerd and pods stopped first, then the host's
// units, systemd-shutdown's unmounts and sync) cost a scenario 1-25 s of
// its place and the tier about 2 CPU-minutes, and tested nothing the
// scenarios' own Stop, Reboot and PowerOffThroughLogind do not (each
// fails when an agent unit does not end on SIGTERM).
func (m *Machine) destroy() error {
	var errs []error
	if err := m.cut(); err != nil {
		errs = append(errs, err)
	}
	if m.cpu > 0 {
		// For the tier summary (tests/tiersum): what the scenario's hosts
		// cost the machine's CPU, which the tier is bound by.
		m.logf("timing: cpu %.2fs (machine %s)", m.cpu.Seconds(), m.Name)
	}
	if m.kmsg != nil {
		m.kmsg.close()
	}
	if err := m.unmount(); err != nil {
		errs = append(errs, err)
	}
	if m.tmpfs {
		if err := unix.Unmount(m.dir, unix.MNT_DETACH); err != nil {
			errs = append(errs, fmt.Errorf("unmount the tmpfs %s: %w", m.dir, err))
		}
		m.tmpfs = false
	}
	if err := os.RemoveAll(m.dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (m *Machine) unmount() error {
	if !m.mounted {
		return nil
	}
	var err error
	for range 50 {
		if err = unix.Unmount(m.Root(), 0); err == nil || errors.Is(err, unix.EINVAL) {
			m.mounted = false
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Still busy: detach it so that the directory can go.
	if derr := unix.Unmount(m.Root(), unix.MNT_DETACH); derr == nil {
		m.mounted = false
		return nil
	}
	return fmt.Errorf("unmount %s: %w", m.Root(), err)
}

func (m *Machine) consoleTail(n int) string {
	data, _ := os.ReadFile(filepath.Join(m.dir, "console.log"))
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "console of " + m.Name + ":\n" + strings.Join(lines, "\n")
}

// logDiagnostics prints what helps to understand a failed test: the tail of
// the console and of this boot's journal.
func (m *Machine) logDiagnostics() {
	m.logf("%s", m.consoleTail(40))
	if m.running() {
		out, _ := m.run("journalctl", "-b", "--no-pager", "-n", "80", "-o", "short-monotonic")
		m.logf("journal of %s (last 80 lines):\n%s", m.Name, out)
	}
	if lines := m.kmsg.lines(); len(lines) > 0 {
		m.logf("kmsg of %s:\n%s", m.Name, strings.Join(lines, "\n"))
	}
}

func (m *Machine) helper() {
	if m.t != nil {
		m.t.Helper()
	}
}

func (m *Machine) fatalf(format string, args ...any) {
	if m.t != nil {
		m.t.Helper()
		m.t.Fatalf(format, args...)
	}
	panic(fmt.Sprintf(format, args...))
}
