// Package testhost is the scratch host of the tests of the one-shot
// concerns that install, replace and remove a node (bootstrap, reset,
// repave, adopt, lifecycle, reprovision): a temporary root with a config,
// a CA, a token and the offline artifacts, and the seams of lib/bootstrap (service manager, mode,
// reporter, node probe) backed by files under that root, so that a run in
// a child process that crashes (lib/crashpoint) leaves its fake systemd
// and cluster where the next run finds them. Host preparation and
// artifacts are the real packages on the root. Tests only.
package testhost

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"unbounded-cloud.io/agent/lib/artifacts"
	"unbounded-cloud.io/agent/lib/bootstrap"
	"unbounded-cloud.io/agent/lib/config"
	"unbounded-cloud.io/agent/lib/crashpoint"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/hostprep"
	"unbounded-cloud.io/agent/lib/modes"
	"unbounded-cloud.io/agent/lib/modes/facts"
	"unbounded-cloud.io/agent/lib/readiness"
	"unbounded-cloud.io/agent/lib/state"
	"unbounded-cloud.io/agent/lib/steps"
	"unbounded-cloud.io/agent/lib/unitnames"
	"unbounded-cloud.io/agent/lib/units"
)

// Machine is the world's machine name.
const Machine = "site-w1"

// Config is the world's agent.toml.
const Config = `machine = "site-w1"
mode = "nspawn"

[cluster]
api-server = "https://127.0.0.1:6443"
kubernetes-version = "1.36.3"

[nspawn]
image = "registry.example/node:1.36.3"
`

// World is one fake host under Root.
type World struct {
	Root string
	P    hostpaths.Paths
	// started is when the fake service manager last started each unit
	// (unit name -> time.Time): kept out of the files, which are the
	// host's end state.
	started sync.Map
}

// New makes a fresh host under root (a test's TempDir).
func New(root string) (*World, error) {
	w := &World{Root: root, P: hostpaths.New(root)}
	files := map[string]string{
		"/proc/sys/net/ipv4/ip_forward":                 "0\n",
		"/proc/sys/net/bridge/bridge-nf-call-iptables":  "0\n",
		"/proc/sys/net/bridge/bridge-nf-call-ip6tables": "0\n",
		"/proc/filesystems":                             "nodev\tsysfs\nnodev\tproc\n\text4\n",
		"/proc/swaps":                                   "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n/dev/vda2                               partition\t1048572\t\t0\t\t-2\n",
		"/etc/unbounded/agent.toml":                     Config,
		"/etc/unbounded/bootstrap-token":                "abcdef.0123456789abcdef\n",
	}
	for _, d := range []string{"/sys/module/ext4", "/sys/module/br_netfilter", "/etc/sysctl.d", "/var/lib/unbounded", "/run/unbounded", "/fake/units"} {
		if err := os.MkdirAll(w.P.Join(d), 0o755); err != nil {
			return nil, err
		}
	}
	ca, err := selfSignedCA()
	if err != nil {
		return nil, err
	}
	files["/etc/unbounded/ca.crt"] = ca
	for p, c := range files {
		if err := w.Write(p, c); err != nil {
			return nil, err
		}
	}
	if err := os.Chmod(w.P.Join("/etc/unbounded/bootstrap-token"), 0o600); err != nil {
		return nil, err
	}
	return w, w.stageArtifacts()
}

// Write writes a file of the host, making its directories.
func (w *World) Write(p, content string) error {
	if err := os.MkdirAll(filepath.Dir(w.P.Join(p)), 0o755); err != nil {
		return err
	}
	return os.WriteFile(w.P.Join(p), []byte(content), 0o644)
}

func selfSignedCA() (string, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return "", err
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})), nil
}

// stageArtifacts puts every artifact the config asks for into the offline
// directory with its SHA256SUMS.
func (w *World) stageArtifacts() error {
	cfg, err := config.Load(w.P)
	if err != nil {
		return err
	}
	var sums []string
	for _, a := range artifacts.FromConfig(cfg, runtime.GOARCH) {
		body := "artifact " + a.Name + " " + a.Version + "\n"
		if err := w.Write(cfg.Artifacts.OfflineDir+"/"+a.Path, body); err != nil {
			return err
		}
		sum := sha256.Sum256([]byte(body))
		sums = append(sums, hex.EncodeToString(sum[:])+"  "+a.Path)
	}
	return w.Write(cfg.Artifacts.OfflineDir+"/SHA256SUMS", strings.Join(sums, "\n")+"\n")
}

// OfflineFile is where artifact name is staged.
func (w *World) OfflineFile(name string) (string, error) {
	cfg, err := config.Load(w.P)
	if err != nil {
		return "", err
	}
	for _, a := range artifacts.FromConfig(cfg, runtime.GOARCH) {
		if a.Name == name {
			return cfg.Resolve(cfg.Artifacts.OfflineDir + "/" + a.Path), nil
		}
	}
	return "", fmt.Errorf("no artifact %s", name)
}

func (w *World) fake(name string) string { return filepath.Join(w.Root, "fake", name) }

// Log appends one line to the world's call log.
func (w *World) Log(line string) {
	f, err := os.OpenFile(w.fake("calls"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		panic(err)
	}
	defer f.Close()
	fmt.Fprintln(f, line)
}

// Calls is the call log, one entry per call.
func (w *World) Calls() []string {
	data, _ := os.ReadFile(w.fake("calls"))
	if len(data) == 0 {
		return nil
	}
	return strings.Split(strings.TrimSpace(string(data)), "\n")
}

// ClearCalls empties the call log.
func (w *World) ClearCalls() { os.Remove(w.fake("calls")) }

// UnitState is the fake unit's ActiveState.
func (w *World) UnitState(unit string) string {
	data, err := os.ReadFile(filepath.Join(w.fake("units"), unit))
	if err != nil {
		return "inactive"
	}
	return strings.TrimSpace(string(data))
}

// SetUnitState sets a fake unit's ActiveState.
func (w *World) SetUnitState(unit, st string) {
	if err := os.WriteFile(filepath.Join(w.fake("units"), unit), []byte(st+"\n"), 0o644); err != nil {
		panic(err)
	}
}

// SetFenceExit makes the fence exit with code (0: allowed).
func (w *World) SetFenceExit(code int) {
	os.WriteFile(w.fake("fence-exit"), []byte(strconv.Itoa(code)), 0o644)
}

func (w *World) fenceExit() int {
	data, err := os.ReadFile(w.fake("fence-exit"))
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(data)))
	return n
}

// SetNodeReady says whether the fake API server shows the Node Ready once
// its units run.
func (w *World) SetNodeReady(ready bool) {
	if ready {
		os.Remove(w.fake("node-not-ready"))
		return
	}
	os.WriteFile(w.fake("node-not-ready"), nil, 0o644)
}

// SetCSINodePending makes the fake Node NotReady because the kubelet's
// CSINode is not initialized, until the mode restarts the node stack
// (sticky: not even then).
func (w *World) SetCSINodePending(sticky bool) {
	os.WriteFile(w.fake("csinode-pending"), nil, 0o644)
	if sticky {
		os.WriteFile(w.fake("csinode-sticky"), nil, 0o644)
	}
}

// Reports are the bootstrap status reports, in order.
func (w *World) Reports() []string {
	data, _ := os.ReadFile(w.fake("reports"))
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if l != "" {
			out = append(out, l)
		}
	}
	return out
}

func (w *World) report(line string) {
	f, err := os.OpenFile(w.fake("reports"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		panic(err)
	}
	defer f.Close()
	fmt.Fprintln(f, line)
}

// Bootstrap is a lib/bootstrap run on the world: real host preparation
// (with modprobe and swap faked on the root's /proc and /sys) and real
// artifacts from the offline directory; the rest through the fakes.
func (w *World) Bootstrap(log *slog.Logger) *bootstrap.Bootstrap {
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return &bootstrap.Bootstrap{
		Host: steps.Host{Paths: w.P, Systemd: func(context.Context) (units.Manager, error) { return &Manager{w}, nil }, Notify: func(string) {}, Log: log},
		Mode: w.Mode,
		HostPrep: func(ctx context.Context) error {
			_, err := w.HostPrep(log).Prepare(ctx, hostprep.DefaultPlan())
			return err
		},
		Reporter: func(*config.Config) bootstrap.Reporter { return reporter{w} },
		Probe: func(cfg *config.Config, mode, slot string) bootstrap.Probe {
			up := func() bool {
				for _, u := range facts.Supervising(mode, slot) {
					if w.UnitState(u) != "active" {
						return false
					}
				}
				return true
			}
			return bootstrap.Probe{
				Healthz: func(context.Context) error {
					if !up() {
						return errors.New("connection refused")
					}
					return nil
				},
				// The node-local DNS cache serves while the node units
				// run (it is part of the node stack).
				DNSReady: func(context.Context) error {
					if !up() {
						return errors.New("connection refused")
					}
					return nil
				},
				Node: func(context.Context) (readiness.Node, error) {
					if !up() {
						return readiness.Node{Known: true}, nil
					}
					n := readiness.Node{Known: true, Present: true, Status: "False", Reason: "KubeletNotReady", Heartbeat: time.Now()}
					if _, err := os.Stat(w.fake("csinode-pending")); err == nil {
						n.Message = "CSINode is not yet initialized"
						return n, nil
					}
					if _, err := os.Stat(w.fake("node-not-ready")); err == nil {
						n.Message = "container runtime network not ready"
						return n, nil
					}
					n.Ready, n.Status, n.Reason = true, "True", "KubeletReady"
					return n, nil
				},
			}
		},
		ReadyTimeout: 2 * time.Second,
		PollInterval: 10 * time.Millisecond,
		CSINodeGrace: 100 * time.Millisecond,
		Backoff:      -1,
	}
}

// HostPrep is lib/hostprep on the world's root.
func (w *World) HostPrep(log *slog.Logger) *hostprep.Host {
	return &hostprep.Host{
		Paths:      w.P,
		Log:        log,
		CrashPoint: crashpoint.Hit,
		Modprobe: func(ctx context.Context, args ...string) error {
			w.Log("modprobe " + strings.Join(args, " "))
			if args[0] == "-r" {
				return os.RemoveAll(w.P.Join("/sys/module/" + args[1]))
			}
			return os.MkdirAll(w.P.Join("/sys/module/"+args[0]), 0o755)
		},
		Swapoff: func(ctx context.Context, path string) error {
			w.Log("swapoff " + path)
			return os.WriteFile(w.P.Join(hostpaths.ProcSwapsHost), []byte("Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n"), 0o644)
		},
		Swapon: func(ctx context.Context, path string, prio int) error {
			w.Log(fmt.Sprintf("swapon %s %d", path, prio))
			return os.WriteFile(w.P.Join(hostpaths.ProcSwapsHost), []byte(fmt.Sprintf("Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n%-40spartition\t1048572\t\t0\t\t%d\n", path, prio)), 0o644)
		},
	}
}

type reporter struct{ w *World }

func (r reporter) Running(context.Context) error   { r.w.report("Running"); return nil }
func (r reporter) Succeeded(context.Context) error { r.w.report("Succeeded"); return nil }
func (r reporter) Failed(_ context.Context, reason, msg string) error {
	r.w.report("Failed " + reason + ": " + msg)
	return nil
}

// Manager is the fake service manager: unit states in files.
type Manager struct{ w *World }

// Systemd is the world's service manager, as the operations' Systemd
// field takes it.
func (w *World) Systemd(context.Context) (units.Manager, error) { return &Manager{w}, nil }

func (m *Manager) Close() {}

func (m *Manager) Reload(context.Context) error { m.w.Log("reload"); return nil }

func (m *Manager) owned() string {
	if _, err := os.Stat(m.w.P.Ownership()); err == nil {
		return "(owned)"
	}
	return ""
}

func (m *Manager) StartUnit(_ context.Context, unit string) error {
	m.w.Log("start " + unit + m.owned())
	if unit == unitnames.Fence {
		if code := m.w.fenceExit(); code != 0 {
			m.w.SetUnitState(unit, "failed")
			return fmt.Errorf("start %s: job failed", unit)
		}
		m.w.SetUnitState(unit, "inactive")
		return nil
	}
	m.w.SetUnitState(unit, "active")
	m.w.started.Store(unit, time.Now())
	return nil
}

// MainStartedAt is when StartUnit last started unit.
func (m *Manager) MainStartedAt(_ context.Context, unit string) (time.Time, error) {
	if at, ok := m.w.started.Load(unit); ok {
		return at.(time.Time), nil
	}
	return time.Time{}, nil
}

func (m *Manager) RestartUnit(ctx context.Context, unit string) error { return m.StartUnit(ctx, unit) }

func (m *Manager) StopUnit(_ context.Context, unit string) error {
	m.w.Log("stop " + unit)
	m.w.SetUnitState(unit, "inactive")
	return nil
}

func (m *Manager) EnqueueStart(_ context.Context, unit string) error {
	m.w.Log("enqueue " + unit + m.owned())
	return nil
}

func (m *Manager) ActiveState(_ context.Context, unit string) (string, error) {
	return m.w.UnitState(unit), nil
}

func (m *Manager) ExecMainStatus(_ context.Context, unit string) (int, error) {
	if unit == unitnames.Fence {
		return m.w.fenceExit(), nil
	}
	return 0, nil
}

func (m *Manager) ResetFailed(context.Context, string) error { return nil }

// Mode is a fake isolation mode of the given name: the slot is a
// directory under /var/lib/machines holding what it was prepared from,
// and its supervising units are fake units.
func (w *World) Mode(name string) (modes.Mode, error) {
	if name != "nspawn" && name != "none" {
		return nil, fmt.Errorf("mode %s not in this fake", name)
	}
	return &fakeMode{w: w, name: name}, nil
}

type fakeMode struct {
	w    *World
	name string
}

func (f *fakeMode) Name() string { return f.name }

func (f *fakeMode) NodeRoot(slot string) string {
	if f.name == "none" {
		return f.w.P.Join("/")
	}
	return f.dir(slot)
}

func (f *fakeMode) InPlace() bool { return f.name == "none" }

// Installed: a slot's directory exists (both fake modes keep their slots
// there).
func (f *fakeMode) Installed() bool {
	for _, s := range hostpaths.Slots {
		if _, err := os.Lstat(f.dir(s)); err == nil {
			return true
		}
	}
	return false
}

func (f *fakeMode) dir(slot string) string { return f.w.P.MachineDir(slot) }

func (f *fakeMode) Prepare(_ context.Context, s modes.Slot) error {
	f.w.Log("prepare " + s.Name)
	if err := s.Check(); err != nil {
		return err
	}
	for _, u := range facts.Supervising(f.name, s.Name) {
		if unitnames.Running(f.w.UnitState(u)) {
			return modes.ErrSlotActive
		}
	}
	var lines []string
	for _, p := range []string{s.Artifacts.Kubelet, s.Artifacts.Containerd, s.Artifacts.Runc, s.Artifacts.CNIPlugins} {
		lines = append(lines, f.w.P.Rel(p))
	}
	lines = append(lines, "node "+s.Node.Name, "image "+s.Image.Ref)
	return state.WriteFileAtomic(filepath.Join(f.dir(s.Name), "prepared"), []byte(strings.Join(lines, "\n")+"\n"), 0o644)
}

func (f *fakeMode) Start(ctx context.Context, slot string) error {
	m := &Manager{f.w}
	m.Reload(ctx)
	for _, u := range facts.Supervising(f.name, slot) {
		if err := m.StartUnit(ctx, u); err != nil {
			return err
		}
	}
	return nil
}

func (f *fakeMode) Restart(ctx context.Context, slot string) error {
	f.w.Log("restart " + slot)
	if _, err := os.Stat(f.w.fake("csinode-sticky")); err != nil {
		os.Remove(f.w.fake("csinode-pending"))
	}
	return f.Start(ctx, slot)
}

func (f *fakeMode) Repave(context.Context, string, modes.Slot, modes.RepaveHooks) error {
	return modes.ErrNotImplemented
}

func (f *fakeMode) EnsureHooks(context.Context, string) error { return modes.ErrNotImplemented }

func (f *fakeMode) Stop(ctx context.Context, slot string) error {
	f.w.Log("stop " + slot)
	m := &Manager{f.w}
	for _, u := range facts.Supervising(f.name, slot) {
		m.StopUnit(ctx, u)
	}
	return nil
}

func (f *fakeMode) Destroy(ctx context.Context, slot string) error {
	f.w.Log("destroy " + slot)
	m := &Manager{f.w}
	for _, u := range facts.Supervising(f.name, slot) {
		m.StopUnit(ctx, u)
	}
	return modes.RemoveVerified(f.dir(slot))
}

// Snapshot is every file, directory and link under the root with its
// content, mode or target, except the fakes' own bookkeeping of calls and
// reports, and with the applied config's time left out (a rerun records
// its own).
func (w *World) Snapshot() (map[string]string, error) {
	out := map[string]string{}
	err := filepath.WalkDir(w.Root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(w.Root, p)
		if rel == "fake/calls" || rel == "fake/reports" {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			t, _ := os.Readlink(p)
			out[rel] = "-> " + t
		case fi.IsDir():
			out[rel] = "dir " + fi.Mode().Perm().String()
		default:
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			// The root's own path ends up in files (the config's
			// file list in the applied config); two worlds differ
			// there by construction.
			s := strings.ReplaceAll(string(data), w.Root, "$ROOT")
			if strings.Contains(rel, "applied-config") || strings.HasSuffix(rel, ".json.sha256") {
				s = dropLines(s, "applied-at")
				if strings.HasSuffix(rel, ".sha256") {
					s = "(sidecar)"
				}
			}
			out[rel] = fi.Mode().Perm().String() + " " + s
		}
		return nil
	})
	return out, err
}

func dropLines(s, key string) string {
	var keep []string
	for _, l := range strings.Split(s, "\n") {
		if !strings.Contains(l, key) {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}

// Diff lists the differences between two snapshots, sorted.
func Diff(a, b map[string]string) []string {
	var out []string
	for k, v := range a {
		if w, ok := b[k]; !ok {
			out = append(out, "only before: "+k)
		} else if w != v {
			out = append(out, fmt.Sprintf("%s: %q != %q", k, clip(v), clip(w)))
		}
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			out = append(out, "only after: "+k)
		}
	}
	sort.Strings(out)
	return out
}

func clip(s string) string {
	if len(s) > 300 {
		return s[:300] + "..."
	}
	return s
}

// RunChild runs this test binary again as a child process (-test.run=^$:
// no test, its TestMain does the work) with env added to its environment,
// and returns its exit code and output. A child killed by a signal (a
// crash point's SIGKILL) is crashpoint.ExitCode.
func RunChild(t testing.TB, env ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, string(out)
	case errors.As(err, &ee):
		if ee.ExitCode() < 0 {
			return crashpoint.ExitCode, string(out)
		}
		return ee.ExitCode(), string(out)
	}
	t.Fatal(err)
	return 0, ""
}
