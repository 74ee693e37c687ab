package harness

import (
	"bufio"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	sdbus "github.com/coreos/go-systemd/v22/dbus"
	godbus "github.com/godbus/dbus/v5"
)

// Run runs a command inside the running machine (all of its namespaces,
// through nsenter) and returns its standard output. A non-zero exit is an
// error that carries the exit status and standard error; it does not fail
// the test, so that tests can assert on failures.
func (m *Machine) Run(args ...string) (string, error) {
	m.helper()
	if !m.running() {
		m.fatalf("Run %v: machine %s is not running", args, m.Name)
	}
	return m.run(args...)
}

// MustRun is Run that fails the test on any error.
func (m *Machine) MustRun(args ...string) string {
	m.helper()
	out, err := m.Run(args...)
	if err != nil {
		m.fatalf("%v", err)
	}
	return out
}

// Systemctl runs systemctl inside the machine.
func (m *Machine) Systemctl(args ...string) (string, error) {
	m.helper()
	return m.Run(append([]string{"systemctl", "--no-pager"}, args...)...)
}

func (m *Machine) run(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), commandTimeout)
	defer cancel()
	return m.runContext(ctx, args...)
}

func (m *Machine) runContext(ctx context.Context, args ...string) (string, error) {
	leader := m.Leader()
	if leader == 0 {
		return "", errors.New("machine not running")
	}
	cmd := exec.CommandContext(ctx, "nsenter", append([]string{"-t", strconv.Itoa(leader), "-a", "--"}, args...)...)
	cmd.Env = machineEnv()
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		err = fmt.Errorf("%s in %s: %w; stderr: %s", strings.Join(args, " "), m.Name, err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), err
}

// machineEnv is the environment of a command run in the machine: a clean
// one, since the test's own (GOFLAGS, TMPDIR, ...) means nothing there.
func machineEnv() []string {
	return []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8", "SYSTEMD_COLORS=0"}
}

// fsRoot is where the machine's whole file system is reachable from the
// host: through its PID 1 while it runs (which includes /run and the other
// API file systems), else the overlay.
func (m *Machine) fsRoot() string {
	if l := m.Leader(); l != 0 {
		return fmt.Sprintf("/proc/%d/root", l)
	}
	return m.Root()
}

// Lstat is os.Lstat of a path inside the machine, as the machine sees it
// while it runs (its mounts included: a directory bound in from the VM
// is not under Root()).
func (m *Machine) Lstat(name string) (fs.FileInfo, error) {
	r, err := os.OpenRoot(m.fsRoot())
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return r.Lstat(relName(name))
}

// WriteFile writes a file inside the machine, creating parent directories,
// with exactly mode (not masked by the umask). Symlinks that leave the
// machine's root are refused.
func (m *Machine) WriteFile(name string, data []byte, mode os.FileMode) {
	m.helper()
	if err := writeUnder(m.fsRoot(), name, data, mode); err != nil {
		m.fatalf("write %s in %s: %v", name, m.Name, err)
	}
}

// ReadFile reads a file inside the machine.
func (m *Machine) ReadFile(name string) ([]byte, error) {
	r, err := os.OpenRoot(m.fsRoot())
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return r.ReadFile(relName(name))
}

// Readlink reads a symbolic link inside the machine.
func (m *Machine) Readlink(name string) (string, error) {
	r, err := os.OpenRoot(m.fsRoot())
	if err != nil {
		return "", err
	}
	defer r.Close()
	return r.Readlink(relName(name))
}

// ReadDir lists a directory inside the machine.
func (m *Machine) ReadDir(name string) ([]fs.DirEntry, error) {
	r, err := os.OpenRoot(m.fsRoot())
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return fs.ReadDir(r.FS(), relName(name))
}

func relName(name string) string {
	rel := strings.TrimPrefix(path.Clean("/"+name), "/")
	if rel == "" {
		return "."
	}
	return rel
}

func writeUnder(root, name string, data []byte, mode os.FileMode) error {
	r, err := os.OpenRoot(root)
	if err != nil {
		return err
	}
	defer r.Close()
	rel := relName(name)
	if err := r.MkdirAll(path.Dir(rel), 0o755); err != nil {
		return err
	}
	if err := r.WriteFile(rel, data, mode); err != nil {
		return err
	}
	return r.Chmod(rel, mode)
}

// Bus returns a D-Bus connection to the machine's systemd, through the
// machine's system bus socket (/proc/LEADER/root/run/dbus/...). The private
// socket /run/systemd/private refuses peers outside the machine's PID
// namespace. The connection is closed when the machine stops.
func (m *Machine) Bus() *sdbus.Conn {
	m.helper()
	conn, err := m.bus0()
	if err != nil {
		m.fatalf("D-Bus of %s: %v", m.Name, err)
	}
	return conn
}

func (m *Machine) bus0() (*sdbus.Conn, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.bus != nil {
		return m.bus, nil
	}
	if m.leader == 0 {
		return nil, errors.New("machine not running")
	}
	addr := fmt.Sprintf("unix:path=/proc/%d/root/run/dbus/system_bus_socket", m.leader)
	conn, err := sdbus.NewConnection(func() (*godbus.Conn, error) {
		c, err := godbus.Dial(addr)
		if err != nil {
			return nil, err
		}
		if err := c.Auth([]godbus.Auth{godbus.AuthExternal(strconv.Itoa(os.Getuid()))}); err != nil {
			c.Close()
			return nil, err
		}
		if err := c.Hello(); err != nil {
			c.Close()
			return nil, err
		}
		return c, nil
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", addr, err)
	}
	m.bus = conn
	return conn, nil
}

// UnitState is what systemd reports about a unit.
type UnitState struct {
	LoadState   string // loaded, not-found, masked, ...
	ActiveState string // active, inactive, failed, ...
	SubState    string
	Result      string // services only: success, exit-code, ...
}

func (s UnitState) String() string {
	r := s.LoadState + "/" + s.ActiveState + "/" + s.SubState
	if s.Result != "" {
		r += " result=" + s.Result
	}
	return r
}

// UnitState reads a unit's load, active and sub state (and, for a service,
// its result) over D-Bus.
func (m *Machine) UnitState(unit string) UnitState {
	m.helper()
	ctx, cancel := context.WithTimeout(context.Background(), commandTimeout)
	defer cancel()
	props, err := m.Bus().GetUnitPropertiesContext(ctx, unit)
	if err != nil {
		m.fatalf("D-Bus properties of %s: %v", unit, err)
	}
	s := UnitState{
		LoadState:   fmt.Sprint(props["LoadState"]),
		ActiveState: fmt.Sprint(props["ActiveState"]),
		SubState:    fmt.Sprint(props["SubState"]),
	}
	if strings.HasSuffix(unit, ".service") && s.LoadState == "loaded" {
		p, err := m.Bus().GetUnitTypePropertyContext(ctx, unit, "Service", "Result")
		if err != nil {
			m.fatalf("D-Bus Result of %s: %v", unit, err)
		}
		s.Result = fmt.Sprint(p.Value.Value())
	}
	return s
}

// Show reads a unit's properties as `systemctl show UNIT -p P...` prints
// them, over the machine's D-Bus: the tier's waits ask this a few times a
// second, and a D-Bus call costs the VM a fraction of what starting
// nsenter and systemctl in the machine does. While the bus is not up (early
// in a boot, a dbus-daemon restarted) it asks systemctl, which talks to
// the manager's private socket.
func (m *Machine) Show(unit string, props ...string) (map[string]string, error) {
	m.helper()
	if kv, err := m.showBus(unit, props); err == nil {
		return kv, nil
	}
	args := []string{"show", unit}
	for _, p := range props {
		args = append(args, "-p", p)
	}
	out, err := m.Systemctl(args...)
	if err != nil {
		return nil, err
	}
	kv := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if k, v, ok := strings.Cut(l, "="); ok {
			kv[k] = v
		}
	}
	return kv, nil
}

// showBus is Show over D-Bus: the Unit interface's properties, and the
// Service interface's for a service's other ones.
func (m *Machine) showBus(unit string, props []string) (map[string]string, error) {
	conn, err := m.bus0()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), commandTimeout)
	defer cancel()
	all, err := conn.GetUnitPropertiesContext(ctx, unit)
	if err == nil && strings.HasSuffix(unit, ".service") && slices.ContainsFunc(props, func(p string) bool { _, ok := all[p]; return !ok }) {
		var svc map[string]any
		if svc, err = conn.GetUnitTypePropertiesContext(ctx, unit, "Service"); err == nil {
			maps.Copy(all, svc)
		}
	}
	if err != nil {
		// A connection that broke (the machine's dbus-daemon restarted)
		// is dialled again by the next call.
		m.mu.Lock()
		if m.bus == conn {
			m.bus = nil
			defer conn.Close()
		}
		m.mu.Unlock()
		return nil, err
	}
	kv := make(map[string]string, len(props))
	for _, p := range props {
		v, ok := all[p]
		if !ok {
			return nil, fmt.Errorf("%s has no property %s on D-Bus", unit, p)
		}
		kv[p] = showValue(v)
	}
	return kv, nil
}

// showValue formats a property's value as systemctl show does: IDs (byte
// arrays) in hex, booleans yes/no, numbers in decimal.
func showValue(v any) string {
	switch v := v.(type) {
	case []byte:
		return hex.EncodeToString(v)
	case bool:
		if v {
			return "yes"
		}
		return "no"
	case string:
		return v
	default:
		return fmt.Sprint(v)
	}
}

// UnitStrings reads a string-list property of a unit over D-Bus: Wants,
// Requires, After, DropInPaths, ...
func (m *Machine) UnitStrings(unit, property string) []string {
	m.helper()
	ctx, cancel := context.WithTimeout(context.Background(), commandTimeout)
	defer cancel()
	p, err := m.Bus().GetUnitPropertyContext(ctx, unit, property)
	if err != nil {
		m.fatalf("D-Bus %s of %s: %v", property, unit, err)
	}
	v, ok := p.Value.Value().([]string)
	if !ok {
		m.fatalf("D-Bus %s of %s is %T, not a string list", property, unit, p.Value.Value())
	}
	return v
}

// Wants is the unit's Wants= dependencies as systemd loaded them (unit
// files, .wants/ directories, generator output).
func (m *Machine) Wants(unit string) []string {
	m.helper()
	return m.UnitStrings(unit, "Wants")
}

// Journal returns the messages of unit in this boot's journal (-o cat),
// every one the unit wrote before the call: a unit's last lines may
// still be in its output stream, unread by journald, when systemd already
// says the unit ended; SyncJournal first.
func (m *Machine) Journal(unit string) string {
	m.helper()
	m.SyncJournal()
	out, err := m.Run("journalctl", "--no-pager", "-b", "-o", "cat", "-u", unit)
	if err != nil {
		m.fatalf("%v", err)
	}
	return out
}

// SyncJournal returns once the machine's journald has stored every line
// written to it before the call (journalctl --sync: journald handles a
// sync after what its streams and sockets hold), so that a read after it
// sees the last lines of a unit that has ended.
func (m *Machine) SyncJournal() {
	m.helper()
	if out, err := m.Run("journalctl", "--sync"); err != nil {
		m.logf("machine %s: journalctl --sync: %v %s", m.Name, err, out)
	}
}

// WaitJournal waits until a line of the machine's journal from its first
// line or args' cursor (journalctl -q -o cat, with args narrowing it:
// --after-cursor, -b, -u, field matches, --grep) satisfies want, and
// returns that line. It follows the journal (journalctl -f, one process
// for the whole wait, which ends on the line) and, because a follower
// started near a boot's journal flush was seen to miss lines for good,
// also reads it whole every journalFallback. At timeout, or when the
// machine stops, it returns an error with the last lines it saw.
func (m *Machine) WaitJournal(timeout time.Duration, want func(line string) bool, args ...string) (string, error) {
	if m.Leader() == 0 {
		return "", errors.New("machine not running")
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	lines := make(chan string, 256)
	follower := exec.Command("nsenter", append([]string{"-t", strconv.Itoa(m.Leader()), "-a", "--",
		"journalctl", "-f", "--no-tail", "-q", "--no-pager", "-o", "cat"}, args...)...)
	follower.Env = machineEnv()
	// Its own process group: nsenter forks journalctl (the machine's
	// PID namespace), and both must end with the wait.
	follower.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := follower.StdoutPipe()
	if err != nil {
		return "", err
	}
	if err := follower.Start(); err != nil {
		return "", err
	}
	defer func() {
		_ = syscall.Kill(-follower.Process.Pid, syscall.SIGKILL)
		_ = follower.Wait()
	}()
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 64*1024), 1024*1024)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	var seen []string
	tick := time.NewTicker(journalFallback)
	defer tick.Stop()
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				lines = nil // the follower ended: the fallback reads on
				continue
			}
			if want(l) {
				return l, nil
			}
			if seen = append(seen, l); len(seen) > 80 {
				seen = seen[1:]
			}
		case <-tick.C:
			if m.Leader() == 0 {
				return "", fmt.Errorf("journalctl %s: the machine stopped; its last lines:\n%s", strings.Join(args, " "), strings.Join(seen, "\n"))
			}
			whole, _ := m.runContext(ctx, append([]string{"journalctl", "-q", "--no-pager", "-o", "cat"}, args...)...)
			all := strings.Split(strings.TrimSuffix(whole, "\n"), "\n")
			for _, l := range all {
				if want(l) {
					return l, nil
				}
			}
			if len(all) > len(seen) {
				seen = all[max(len(all)-80, 0):]
			}
		case <-ctx.Done():
			return "", fmt.Errorf("journalctl %s: no such line within %v; its last lines:\n%s", strings.Join(args, " "), timeout, strings.Join(seen, "\n"))
		}
	}
}

// journalFallback is how often WaitJournal reads the journal whole beside
// its follower.
const journalFallback = 2 * time.Second

// Kmsg returns every line written to the machine's /dev/kmsg since it was
// created (across reboots), without the "<N>" priority prefix.
//
// Why not the kernel log: systemd-nspawn gives a container no /dev/kmsg at
// all (only a FIFO on /proc/kmsg that nothing writes), and PID 1 runs
// generators with standard output and error on /dev/null, so a generator's
// kmsg line would be lost without a trace. The harness binds a FIFO of its
// own on the machine's /dev/kmsg and reads it: every open-and-write the
// generator does on /dev/kmsg lands here, attributed to this machine only
// (the host's kernel ring buffer is shared by all machines running in
// parallel). journald in the machine writes its own lines here too.
func (m *Machine) Kmsg() []string {
	return m.kmsg.lines()
}

var kmsgPrio = regexp.MustCompile(`^<[0-9]+>`)

// kmsgReader drains a FIFO that stands in for /dev/kmsg. It holds the FIFO
// open for reading and writing, so that a writer never blocks or fails for
// want of a reader, even between boots.
type kmsgReader struct {
	path string
	f    *os.File
	mu   sync.Mutex
	buf  []string
	done chan struct{}
}

func newKmsgReader(p string) (*kmsgReader, error) {
	if err := syscall.Mkfifo(p, 0o600); err != nil {
		return nil, fmt.Errorf("mkfifo %s: %w", p, err)
	}
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	k := &kmsgReader{path: p, f: f, done: make(chan struct{})}
	go func() {
		defer close(k.done)
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			line := kmsgPrio.ReplaceAllString(sc.Text(), "")
			k.mu.Lock()
			k.buf = append(k.buf, line)
			k.mu.Unlock()
		}
	}()
	return k, nil
}

func (k *kmsgReader) lines() []string {
	if k == nil {
		return nil
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]string(nil), k.buf...)
}

func (k *kmsgReader) close() {
	k.f.Close()
	<-k.done
}
