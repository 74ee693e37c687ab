// Package hostprep prepares a host for a node stack and undoes exactly that
// preparation at reset: kernel modules (overlay, br_netfilter), the sysctls
// the kubelet and CNI need (IPv4 forwarding, bridged traffic seen by
// iptables), and swap off, now and across reboots (ARCHITECTURE section 4).
// Host.Prepare says what it changes and records, Host.Undo what it gives
// back; Record is the host preparation record. Errors are exit 1
// (lib/exitcode's default): nothing here is temporary.
package hostprep

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/state"
)

// ErrConflict: the host holds something of the operator's where Prepare
// would write (an /etc/systemd/system/swap.target that is not a mask).
// Prepare refuses before changing anything. Exit 1.
var ErrConflict = errors.New("host preparation conflicts with the host's own configuration")

// Sysctl is one kernel parameter and the value the node stack needs.
type Sysctl struct {
	Key   string // dotted, as sysctl(8) names it: net.ipv4.ip_forward
	Value string
}

// Plan is what Prepare makes true.
type Plan struct {
	Modules []string
	Sysctls []Sysctl
	SwapOff bool
}

// DefaultPlan is what a kubelet with containerd and a bridge CNI needs:
// overlay for containerd's snapshotter, br_netfilter so that bridged pod
// traffic passes iptables (kube-proxy's Services), forwarding for pod
// traffic leaving the node, and swap off (the kubelet refuses to start
// with swap on by default).
func DefaultPlan() Plan {
	return Plan{
		Modules: []string{"overlay", "br_netfilter"},
		Sysctls: []Sysctl{
			{"net.ipv4.ip_forward", "1"},
			{"net.bridge.bridge-nf-call-iptables", "1"},
			{"net.bridge.bridge-nf-call-ip6tables", "1"},
		},
		SwapOff: true,
	}
}

// Kinds of Change.
const (
	KindModule = "module"
	KindFile   = "file"
	KindSysctl = "sysctl"
	KindSwap   = "swap"
	KindMask   = "mask"
)

// Change is one recorded change with what it replaced.
type Change struct {
	Kind string `json:"kind"`
	// Name: the module, the file (host path), the sysctl key, the swap
	// (path as /proc/swaps names it) or the masked unit.
	Name string `json:"name"`
	// Previous: a sysctl's previous value, a file's previous content;
	// nil: the file did not exist.
	Previous *string `json:"previous,omitempty"`
	// Value: what Prepare set (sysctl value, file content).
	Value string `json:"value,omitempty"`
	// Priority: a swap's priority (negative: the kernel chose it).
	Priority int `json:"priority,omitempty"`
	// CreatedDirs: directories (host paths) made for a file or mask,
	// outermost first; Undo removes them when empty.
	CreatedDirs []string `json:"created-dirs,omitempty"`
}

func (c Change) String() string {
	switch c.Kind {
	case KindSysctl:
		prev := "?"
		if c.Previous != nil {
			prev = *c.Previous
		}
		return fmt.Sprintf("sysctl %s: %s -> %s", c.Name, prev, c.Value)
	case KindModule:
		return "module " + c.Name + " loaded"
	case KindSwap:
		return "swap " + c.Name + " off"
	case KindMask:
		return "unit " + c.Name + " masked"
	}
	return "file " + c.Name + " written"
}

// Record is the host preparation record: every change Prepare made on this
// host, in order, in /var/lib/unbounded/hostprep.json with a SHA-256
// sidecar (written through lib/state before each change).
type Record struct {
	Changes []Change `json:"changes"`
}

func (r *Record) find(kind, name string) *Change {
	for i := range r.Changes {
		if r.Changes[i].Kind == kind && r.Changes[i].Name == name {
			return &r.Changes[i]
		}
	}
	return nil
}

// ReadRecord returns the host preparation record, nil when there is none.
// A record that does not verify wraps state.ErrCorrupt.
func ReadRecord(p hostpaths.Paths) (*Record, error) {
	data, err := state.ReadVerified(p.HostPrepRecord())
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var r Record
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", state.ErrCorrupt, p.HostPrepRecord(), err)
	}
	return &r, nil
}

func writeRecord(p hostpaths.Paths, r *Record) error {
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return state.WriteVerified(p.HostPrepRecord(), append(data, '\n'), 0o600)
}

// Host is the host being prepared. The zero value of every field but Paths
// is the real host; tests replace them.
type Host struct {
	// Paths locates the files Prepare writes and its record.
	Paths hostpaths.Paths
	// Kernel, when set, is the root /proc and /sys are read (and /proc/sys
	// written) under instead of Paths: a test that changes real sysctls
	// in a network namespace of its own keeps its files in a temporary
	// directory.
	Kernel *hostpaths.Paths
	// Modprobe runs modprobe(8) with args ("NAME", or "-r", "NAME").
	Modprobe func(ctx context.Context, args ...string) error
	// Swapoff and Swapon run swapoff(8) and swapon(8) on a swap path;
	// Swapon gets the priority to restore (negative: the kernel's choice).
	Swapoff func(ctx context.Context, path string) error
	Swapon  func(ctx context.Context, path string, priority int) error
	// WriteSysctl writes value to the sysctl key (default: its file under
	// /proc/sys, which must exist).
	WriteSysctl func(key, value string) error
	// CrashPoint is called at each named crash point ("hostprep/after-record",
	// "hostprep/after-change", "hostprep/after-undo"); the bootstrap and
	// reset wire UNBOUNDED_CRASHPOINT to it.
	CrashPoint func(name string)
	// Log gets one line per change and per leftover; nil: slog.Default.
	Log *slog.Logger
}

func (h *Host) kernel() hostpaths.Paths {
	if h.Kernel != nil {
		return *h.Kernel
	}
	return h.Paths
}

func (h *Host) log() *slog.Logger {
	if h.Log != nil {
		return h.Log
	}
	return slog.Default()
}

func (h *Host) crash(name string) {
	if h.CrashPoint != nil {
		h.CrashPoint(name)
	}
}

func run(ctx context.Context, name string, args ...string) error {
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		msg := strings.TrimSpace(string(out))
		if msg == "" {
			return fmt.Errorf("%s %s: %w", name, strings.Join(args, " "), err)
		}
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, msg)
	}
	return nil
}

func (h *Host) modprobe(ctx context.Context, args ...string) error {
	if h.Modprobe != nil {
		return h.Modprobe(ctx, args...)
	}
	return run(ctx, "modprobe", args...)
}

func (h *Host) swapoff(ctx context.Context, path string) error {
	if h.Swapoff != nil {
		return h.Swapoff(ctx, path)
	}
	return run(ctx, "swapoff", path)
}

func (h *Host) swapon(ctx context.Context, path string, prio int) error {
	if h.Swapon != nil {
		return h.Swapon(ctx, path, prio)
	}
	if prio >= 0 {
		return run(ctx, "swapon", "-p", strconv.Itoa(prio), path)
	}
	return run(ctx, "swapon", path)
}

func (h *Host) sysctlFile(key string) string {
	return filepath.Join(h.kernel().Join(hostpaths.ProcSysHost), strings.ReplaceAll(key, ".", "/"))
}

func (h *Host) writeSysctl(key, value string) error {
	if h.WriteSysctl != nil {
		return h.WriteSysctl(key, value)
	}
	// No O_CREATE: a sysctl that does not exist is an error, never a file.
	f, err := os.OpenFile(h.sysctlFile(key), os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(value + "\n"); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// readSysctl returns the value with its whitespace normalised (the kernel
// separates the fields of a multi-value sysctl with tabs).
func (h *Host) readSysctl(key string) (string, error) {
	data, err := os.ReadFile(h.sysctlFile(key))
	if err != nil {
		return "", err
	}
	return strings.Join(strings.Fields(string(data)), " "), nil
}

var (
	moduleRE = regexp.MustCompile(`^[a-zA-Z0-9_-]+$`)
	sysctlRE = regexp.MustCompile(`^[a-zA-Z0-9_-]+(\.[a-zA-Z0-9_-]+)+$`)
)

func (p Plan) check() error {
	for _, m := range p.Modules {
		if !moduleRE.MatchString(m) {
			return fmt.Errorf("module name %q is not valid", m)
		}
	}
	for _, s := range p.Sysctls {
		if !sysctlRE.MatchString(s.Key) {
			return fmt.Errorf("sysctl key %q is not valid", s.Key)
		}
		if strings.TrimSpace(s.Value) == "" || strings.ContainsAny(s.Value, "\n") {
			return fmt.Errorf("sysctl %s: value %q is not valid", s.Key, s.Value)
		}
	}
	return nil
}

// builtinProbes tell a module built into the kernel (no /sys/module entry
// without parameters, and modprobe may be absent) by what it provides.
var builtinProbes = map[string]func(k hostpaths.Paths) bool{
	"overlay": func(k hostpaths.Paths) bool {
		data, err := os.ReadFile(k.Join(hostpaths.ProcFilesystemsHost))
		if err != nil {
			return false
		}
		for _, line := range strings.Split(string(data), "\n") {
			if f := strings.Fields(line); len(f) > 0 && f[len(f)-1] == "overlay" {
				return true
			}
		}
		return false
	},
	"br_netfilter": func(k hostpaths.Paths) bool {
		_, err := os.Stat(filepath.Join(k.Join(hostpaths.ProcSysHost), "net/bridge/bridge-nf-call-iptables"))
		return err == nil
	},
}

// moduleLoaded: loaded as a module (unloadable), or present otherwise
// (built in).
func (h *Host) moduleLoaded(name string) (module, present bool) {
	if _, err := os.Stat(filepath.Join(h.kernel().Join(hostpaths.SysModuleHost), name)); err == nil {
		return true, true
	}
	if probe := builtinProbes[name]; probe != nil && probe(h.kernel()) {
		return false, true
	}
	return false, false
}

// Swap is an active swap as /proc/swaps lists it.
type Swap struct {
	Path     string
	Priority int
}

// activeSwaps parses /proc/swaps: a header, then "path type size used
// priority", spaces in the path written as \040.
func (h *Host) activeSwaps() ([]Swap, error) {
	data, err := os.ReadFile(h.kernel().Join(hostpaths.ProcSwapsHost))
	if err != nil {
		return nil, err
	}
	var swaps []Swap
	for i, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if i == 0 || len(f) < 5 {
			continue
		}
		prio, err := strconv.Atoi(f[4])
		if err != nil {
			return nil, fmt.Errorf("%s line %d: priority %q", hostpaths.ProcSwapsHost, i+1, f[4])
		}
		swaps = append(swaps, Swap{Path: unescapeOctal(f[0]), Priority: prio})
	}
	return swaps, nil
}

func unescapeOctal(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

const swapTarget = "swap.target"

func (h *Host) unitFile(unit string) string {
	return filepath.Join(h.Paths.Join(hostpaths.UnitDirEtcHost), unit)
}

// masked reports whether unit is masked in /etc/systemd/system; err is
// ErrConflict when something else is there.
func (h *Host) masked(unit string) (bool, error) {
	file := h.unitFile(unit)
	fi, err := os.Lstat(file)
	if os.IsNotExist(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if fi.Mode()&os.ModeSymlink != 0 {
		if target, err := os.Readlink(file); err == nil && target == hostpaths.DevNullHost {
			return true, nil
		}
	}
	return false, fmt.Errorf("%w: %s exists and is not a mask; unbounded masks %s there to keep swap off across reboots and does not replace an operator's unit", ErrConflict, h.Paths.Rel(file), unit)
}

func fileHeader(what string) string {
	return "# Written by unbounded-agent (host preparation): the node stack needs\n# " + what + ". `unbounded reset` removes this file.\n"
}

func (p Plan) modulesFile() string {
	return fileHeader("these kernel modules at every boot") + strings.Join(p.Modules, "\n") + "\n"
}

func (p Plan) sysctlFile() string {
	var b strings.Builder
	b.WriteString(fileHeader("these kernel parameters at every boot"))
	for _, s := range p.Sysctls {
		fmt.Fprintf(&b, "%s = %s\n", s.Key, s.Value)
	}
	return b.String()
}

// Prepare makes plan true on the host, recording each change in the host
// preparation record before it is made. It returns the changes made by this
// call (none on a prepared host). It changes, and records:
//
//   - a module that was not loaded: modprobe'd, recorded as loaded by us;
//     persisted in /etc/modules-load.d/unbounded.conf;
//   - a sysctl whose value differs: its previous value recorded, the new
//     one written to /proc/sys; persisted in /etc/sysctl.d/90-unbounded.conf
//     (systemd-sysctl runs after systemd-modules-load at boot, and udev
//     re-applies net.bridge.* when br_netfilter loads later);
//   - each active swap (from /proc/swaps): recorded with its priority, then
//     swapoff'd; swap.target is masked (/etc/systemd/system/swap.target ->
//     /dev/null) so that no swap unit (from fstab, zram-generator,
//     gpt-auto) is started at the next boot. /etc/fstab is never edited:
//     the operator's file stays as written, and Undo gives the swaps back
//     by unmasking and swapon, not by rewriting it;
//   - each file it writes: its previous content (or its absence) and the
//     directories it had to create.
//
// A second Prepare changes nothing, and a change that is needed again
// (someone set a sysctl back) keeps the original previous value in the
// record. The record names a change before it is made, and Undo restores a
// thing only where it still holds the value Prepare set, so a crash between
// any two steps leaves a record that a new Prepare completes or Undo
// reverts. The caller reloads systemd after Prepare and after Undo (masks
// are unit files); a mask only matters at the next boot, so Prepare itself
// does not reload.
func (h *Host) Prepare(ctx context.Context, plan Plan) ([]Change, error) {
	if err := plan.check(); err != nil {
		return nil, err
	}
	rec, err := ReadRecord(h.Paths)
	if err != nil {
		return nil, err
	}
	if rec == nil {
		rec = &Record{}
	}
	// Refuse before changing anything.
	if plan.SwapOff {
		if _, err := h.masked(swapTarget); err != nil {
			return nil, err
		}
	}
	p := &preparer{h: h, rec: rec}

	for _, m := range plan.Modules {
		if _, present := h.moduleLoaded(m); present {
			continue
		}
		if err := p.change(ctx, Change{Kind: KindModule, Name: m}, func() error {
			if err := h.modprobe(ctx, m); err != nil {
				return fmt.Errorf("load kernel module %s: %w", m, err)
			}
			return nil
		}); err != nil {
			return p.done, err
		}
	}
	if len(plan.Modules) > 0 {
		if err := p.file(ctx, hostpaths.ModulesLoadFileHost, plan.modulesFile()); err != nil {
			return p.done, err
		}
	}
	for _, s := range plan.Sysctls {
		cur, err := h.readSysctl(s.Key)
		if err != nil {
			if os.IsNotExist(err) {
				return p.done, fmt.Errorf("sysctl %s: %s does not exist on this kernel (is the module that provides it loaded?)", s.Key, h.kernel().Rel(h.sysctlFile(s.Key)))
			}
			return p.done, fmt.Errorf("sysctl %s: %w", s.Key, err)
		}
		if cur == s.Value {
			continue
		}
		if err := p.change(ctx, Change{Kind: KindSysctl, Name: s.Key, Previous: &cur, Value: s.Value}, func() error {
			if err := h.writeSysctl(s.Key, s.Value); err != nil {
				return fmt.Errorf("set sysctl %s=%s: %w", s.Key, s.Value, err)
			}
			return nil
		}); err != nil {
			return p.done, err
		}
	}
	if len(plan.Sysctls) > 0 {
		if err := p.file(ctx, hostpaths.SysctlFileHost, plan.sysctlFile()); err != nil {
			return p.done, err
		}
	}
	if plan.SwapOff {
		swaps, err := h.activeSwaps()
		if err != nil {
			return p.done, fmt.Errorf("list active swaps: %w", err)
		}
		for _, sw := range swaps {
			if err := p.change(ctx, Change{Kind: KindSwap, Name: sw.Path, Priority: sw.Priority}, func() error {
				if err := h.swapoff(ctx, sw.Path); err != nil {
					return fmt.Errorf("swap off %s: %w", sw.Path, err)
				}
				return nil
			}); err != nil {
				return p.done, err
			}
		}
		if err := p.mask(ctx, swapTarget); err != nil {
			return p.done, err
		}
	}
	return p.done, nil
}

type preparer struct {
	h    *Host
	rec  *Record
	done []Change
}

// change records c (unless a change of that kind and name is recorded
// already: the original previous value stays), then applies it.
func (p *preparer) change(ctx context.Context, c Change, apply func() error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if p.rec.find(c.Kind, c.Name) == nil {
		p.rec.Changes = append(p.rec.Changes, c)
		if err := writeRecord(p.h.Paths, p.rec); err != nil {
			return fmt.Errorf("record %s: %w", c, err)
		}
	}
	p.h.crash("hostprep/after-record")
	if err := apply(); err != nil {
		return err
	}
	p.h.log().Info("host prepared", "change", c.String())
	p.done = append(p.done, c)
	p.h.crash("hostprep/after-change")
	return nil
}

// missingDirs are the directories (host paths) above hostFile that do
// not exist, outermost first.
func (p *preparer) missingDirs(hostFile string) []string {
	var dirs []string
	for d := filepath.Dir(hostFile); d != "/" && d != "."; d = filepath.Dir(d) {
		if _, err := os.Lstat(p.h.Paths.Join(d)); err == nil {
			break
		}
		dirs = append([]string{d}, dirs...)
	}
	return dirs
}

func (p *preparer) file(ctx context.Context, hostFile, content string) error {
	file := p.h.Paths.Join(hostFile)
	c := Change{Kind: KindFile, Name: hostFile, Value: content}
	cur, err := os.ReadFile(file)
	switch {
	case err == nil && string(cur) == content:
		return nil
	case err == nil:
		s := string(cur)
		c.Previous = &s
	case !os.IsNotExist(err):
		return err
	}
	c.CreatedDirs = p.missingDirs(hostFile)
	if prev := p.rec.find(KindFile, hostFile); prev != nil && len(c.CreatedDirs) > 0 {
		// Re-created after a crash: the record already names the dirs.
		prev.CreatedDirs = mergeDirs(prev.CreatedDirs, c.CreatedDirs)
		if err := writeRecord(p.h.Paths, p.rec); err != nil {
			return err
		}
	}
	return p.change(ctx, c, func() error {
		return state.WriteFileAtomic(file, []byte(content), 0o644)
	})
}

func (p *preparer) mask(ctx context.Context, unit string) error {
	ok, err := p.h.masked(unit)
	if err != nil || ok {
		return err
	}
	hostFile := filepath.Join(hostpaths.UnitDirEtcHost, unit)
	c := Change{Kind: KindMask, Name: unit, CreatedDirs: p.missingDirs(hostFile)}
	if prev := p.rec.find(KindMask, unit); prev != nil && len(c.CreatedDirs) > 0 {
		prev.CreatedDirs = mergeDirs(prev.CreatedDirs, c.CreatedDirs)
		if err := writeRecord(p.h.Paths, p.rec); err != nil {
			return err
		}
	}
	return p.change(ctx, c, func() error {
		file := p.h.unitFile(unit)
		if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
			return err
		}
		// systemctl mask's link, made atomically: a symlink beside it,
		// renamed over the name.
		tmp := file + ".unbounded-tmp"
		os.Remove(tmp)
		if err := os.Symlink(hostpaths.DevNullHost, tmp); err != nil {
			return err
		}
		if err := os.Rename(tmp, file); err != nil {
			os.Remove(tmp)
			return err
		}
		return state.SyncDir(filepath.Dir(file))
	})
}

func mergeDirs(a, b []string) []string {
	out := slices.Clone(a)
	for _, d := range b {
		if !slices.Contains(out, d) {
			out = append(out, d)
		}
	}
	slices.SortFunc(out, func(x, y string) int { return strings.Count(x, "/") - strings.Count(y, "/") })
	return out
}
