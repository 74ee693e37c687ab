package hostprep

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"unbounded-cloud.io/agent/lib/exitcode"
	"unbounded-cloud.io/agent/lib/hostpaths"
)

const fstab = "UUID=1234 / ext4 defaults 0 1\n/dev/vda2 none swap sw 0 0\n/var/swap\\040file none swap sw,pri=5 0 0\n"

// fakeHost is a temporary root laid out like a host's /proc, /sys and
// /etc, with modprobe, swapoff and swapon acting on it the way the kernel
// would: loading br_netfilter makes net.bridge.* appear, swapoff removes
// the line from /proc/swaps.
type fakeHost struct {
	t     *testing.T
	root  string
	p     hostpaths.Paths
	calls []string
	// fail makes the named call ("modprobe overlay") fail.
	fail map[string]error
}

func newFakeHost(t *testing.T) *fakeHost {
	f := &fakeHost{t: t, root: t.TempDir(), fail: map[string]error{}}
	f.p = hostpaths.New(f.root)
	f.write("/proc/sys/net/ipv4/ip_forward", "0\n")
	f.write("/proc/sys/vm/max_map_count", "65530\n")
	f.write("/proc/filesystems", "nodev\tsysfs\nnodev\tproc\n\text4\n")
	f.write("/proc/swaps", "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n"+
		"/dev/vda2                               partition\t1048572\t\t0\t\t-2\n"+
		"/var/swap\\040file                       file\t\t524284\t\t0\t\t5\n")
	// br_netfilter loaded already, with the bridge sysctls off (as a
	// host that ran Docker with them disabled has them); overlay not.
	f.mkdir("/sys/module/ext4")
	f.mkdir("/sys/module/br_netfilter")
	f.write("/proc/sys/net/bridge/bridge-nf-call-iptables", "0\n")
	f.write("/proc/sys/net/bridge/bridge-nf-call-ip6tables", "0\n")
	f.write("/etc/fstab", fstab)
	f.mkdir("/etc/sysctl.d")
	f.mkdir("/var/lib/unbounded")
	return f
}

func (f *fakeHost) path(p string) string { return f.p.Join(p) }

func (f *fakeHost) write(p, content string) {
	f.t.Helper()
	if err := os.MkdirAll(filepath.Dir(f.path(p)), 0o755); err != nil {
		f.t.Fatal(err)
	}
	if err := os.WriteFile(f.path(p), []byte(content), 0o644); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fakeHost) read(p string) string {
	f.t.Helper()
	b, err := os.ReadFile(f.path(p))
	if err != nil {
		f.t.Fatal(err)
	}
	return string(b)
}

func (f *fakeHost) mkdir(p string) {
	if err := os.MkdirAll(f.path(p), 0o755); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fakeHost) call(c string) error {
	f.calls = append(f.calls, c)
	return f.fail[c]
}

func (f *fakeHost) host() *Host {
	return &Host{
		Paths: f.p,
		Log:   slog.New(slog.NewTextHandler(io.Discard, nil)),
		Modprobe: func(ctx context.Context, args ...string) error {
			if err := f.call("modprobe " + strings.Join(args, " ")); err != nil {
				return err
			}
			if args[0] == "-r" {
				os.RemoveAll(f.path("/sys/module/" + args[1]))
				if args[1] == "br_netfilter" {
					os.RemoveAll(f.path("/proc/sys/net/bridge"))
				}
				return nil
			}
			f.mkdir("/sys/module/" + args[0])
			return nil
		},
		Swapoff: func(ctx context.Context, path string) error {
			if err := f.call("swapoff " + path); err != nil {
				return err
			}
			var keep []string
			for _, line := range strings.SplitAfter(f.read("/proc/swaps"), "\n") {
				if fs := strings.Fields(line); len(fs) == 0 || unescapeOctal(fs[0]) != path {
					keep = append(keep, line)
				}
			}
			f.write("/proc/swaps", strings.Join(keep, ""))
			return nil
		},
		Swapon: func(ctx context.Context, path string, prio int) error {
			if err := f.call(fmt.Sprintf("swapon %s %d", path, prio)); err != nil {
				return err
			}
			// The kernel's line for it; priorities it chose come back
			// as the next negative ones, which is what swapon does.
			name := strings.ReplaceAll(path, " ", `\040`)
			size, kind := "1048572", "partition"
			if strings.Contains(path, "file") {
				size, kind = "524284", "file"
			}
			f.write("/proc/swaps", f.read("/proc/swaps")+fmt.Sprintf("%-40s%s\t%s\t\t0\t\t%d\n", name, kind, size, prio))
			return nil
		},
	}
}

// snapshot is every file, directory and link under the root with its
// content, mode or target, and /proc/swaps as a set of (path, priority)
// (its line order is the kernel's business).
func (f *fakeHost) snapshot() map[string]string {
	f.t.Helper()
	snap := map[string]string{}
	filepath.WalkDir(f.root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			f.t.Fatal(err)
		}
		rel := strings.TrimPrefix(p, f.root)
		fi, _ := d.Info()
		switch {
		case rel == "/proc/swaps":
			h := &Host{Paths: f.p}
			swaps, _ := h.activeSwaps()
			slices.SortFunc(swaps, func(a, b Swap) int { return strings.Compare(a.Path, b.Path) })
			snap[rel] = fmt.Sprint(swaps)
		case d.Type()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			snap[rel] = "-> " + target
		case d.IsDir():
			snap[rel] = "dir " + fi.Mode().String()
		default:
			b, _ := os.ReadFile(p)
			snap[rel] = fi.Mode().String() + " " + string(b)
		}
		return nil
	})
	return snap
}

func diff(a, b map[string]string) string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(a)) {
		if bv, ok := b[k]; !ok {
			out = append(out, "- "+k)
		} else if bv != a[k] {
			out = append(out, fmt.Sprintf("~ %s: %q -> %q", k, a[k], bv))
		}
	}
	for _, k := range slices.Sorted(maps.Keys(b)) {
		if _, ok := a[k]; !ok {
			out = append(out, "+ "+k)
		}
	}
	return strings.Join(out, "\n")
}

func TestPrepareMakesThePlanTrueAndRecordsWhatItReplaced(t *testing.T) {
	f := newFakeHost(t)
	changed, err := f.host().Prepare(context.Background(), DefaultPlan())
	if err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]string{
		"/proc/sys/net/ipv4/ip_forward":                 "1\n",
		"/proc/sys/net/bridge/bridge-nf-call-iptables":  "1\n",
		"/proc/sys/net/bridge/bridge-nf-call-ip6tables": "1\n",
		"/proc/swaps": "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n",
		"/etc/fstab":  fstab, // never edited
	} {
		if got := f.read(key); got != want {
			t.Errorf("%s = %q, want %q", key, got, want)
		}
	}
	if _, err := os.Stat(f.path("/sys/module/overlay")); err != nil {
		t.Errorf("overlay not loaded: %v", err)
	}
	if target, err := os.Readlink(f.path("/etc/systemd/system/swap.target")); err != nil || target != "/dev/null" {
		t.Errorf("swap.target not masked: %q %v", target, err)
	}
	if got := f.read(hostpaths.ModulesLoadFileHost); !strings.HasSuffix(got, "\noverlay\nbr_netfilter\n") {
		t.Errorf("modules-load.d file:\n%s", got)
	}
	if got := f.read(hostpaths.SysctlFileHost); !strings.Contains(got, "net.ipv4.ip_forward = 1\nnet.bridge.bridge-nf-call-iptables = 1\nnet.bridge.bridge-nf-call-ip6tables = 1\n") {
		t.Errorf("sysctl.d file:\n%s", got)
	}
	if want := []string{"modprobe overlay", "swapoff /dev/vda2", "swapoff /var/swap file"}; !slices.Equal(f.calls, want) {
		t.Errorf("calls = %q, want %q (br_netfilter was loaded already)", f.calls, want)
	}

	rec, err := ReadRecord(f.p)
	if err != nil || rec == nil {
		t.Fatalf("record: %v %v", rec, err)
	}
	if len(changed) != len(rec.Changes) {
		t.Errorf("Prepare returned %d changes, the record holds %d", len(changed), len(rec.Changes))
	}
	got := map[string]string{}
	for _, c := range rec.Changes {
		v := ""
		if c.Previous != nil {
			v = *c.Previous
		}
		if c.Kind == KindSwap {
			v = fmt.Sprint(c.Priority)
		}
		got[c.Kind+" "+c.Name] = v
	}
	want := map[string]string{
		"module overlay":                             "",
		"file " + hostpaths.ModulesLoadFileHost:      "",
		"sysctl net.ipv4.ip_forward":                 "0",
		"sysctl net.bridge.bridge-nf-call-iptables":  "0",
		"sysctl net.bridge.bridge-nf-call-ip6tables": "0",
		"file " + hostpaths.SysctlFileHost:           "",
		"swap /dev/vda2":                             "-2",
		"swap /var/swap file":                        "5",
		"mask swap.target":                           "",
	}
	if !maps.Equal(got, want) {
		t.Errorf("record:\n%v\nwant\n%v", got, want)
	}
	if fi, err := os.Stat(f.p.HostPrepRecord()); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("record mode: %v %v", fi, err)
	}
}

func TestPrepareTwiceChangesNothingTheSecondTime(t *testing.T) {
	f := newFakeHost(t)
	h := f.host()
	if _, err := h.Prepare(context.Background(), DefaultPlan()); err != nil {
		t.Fatal(err)
	}
	before, calls := f.snapshot(), len(f.calls)
	changed, err := h.Prepare(context.Background(), DefaultPlan())
	if err != nil {
		t.Fatal(err)
	}
	if len(changed) != 0 || len(f.calls) != calls {
		t.Errorf("second Prepare changed %v and called %q", changed, f.calls[calls:])
	}
	if d := diff(before, f.snapshot()); d != "" {
		t.Errorf("second Prepare changed the host or the record:\n%s", d)
	}
}

func TestPrepareAgainAfterDriftKeepsTheOriginalPreviousValue(t *testing.T) {
	f := newFakeHost(t)
	h := f.host()
	plan := Plan{Sysctls: []Sysctl{{"vm.max_map_count", "262144"}}}
	if _, err := h.Prepare(context.Background(), plan); err != nil {
		t.Fatal(err)
	}
	f.write("/proc/sys/vm/max_map_count", "100000\n") // someone set it back
	changed, err := h.Prepare(context.Background(), plan)
	if err != nil || len(changed) != 1 {
		t.Fatalf("after drift: changed %v, %v", changed, err)
	}
	rec, _ := ReadRecord(f.p)
	if c := rec.find(KindSysctl, "vm.max_map_count"); c == nil || *c.Previous != "65530" {
		t.Fatalf("record after drift: %+v; want the original 65530", c)
	}
	if _, err := h.Undo(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := f.read("/proc/sys/vm/max_map_count"); got != "65530\n" {
		t.Errorf("Undo restored %q, want the original 65530", got)
	}
}

func TestUndoRestoresTheHostExactly(t *testing.T) {
	f := newFakeHost(t)
	h := f.host()
	original := f.snapshot()
	if _, err := h.Prepare(context.Background(), DefaultPlan()); err != nil {
		t.Fatal(err)
	}
	f.calls = nil
	left, err := h.Undo(context.Background())
	if err != nil || len(left) != 0 {
		t.Fatalf("Undo: leftovers %q, %v", left, err)
	}
	if d := diff(original, f.snapshot()); d != "" {
		t.Errorf("host after Prepare+Undo differs from before:\n%s", d)
	}
	// Swaps come back with the priority they had; a kernel-chosen one
	// (negative) is left to the kernel; br_netfilter, loaded before,
	// stays loaded.
	want := []string{"swapon /var/swap file 5", "swapon /dev/vda2 -2", "modprobe -r overlay"}
	if !slices.Equal(f.calls, want) {
		t.Errorf("Undo calls = %q, want %q", f.calls, want)
	}
	if left, err := h.Undo(context.Background()); err != nil || len(left) != 0 {
		t.Errorf("second Undo: %q %v", left, err)
	}
}

func TestUndoLeavesWhatChangedSinceAndSaysSo(t *testing.T) {
	f := newFakeHost(t)
	h := f.host()
	plan := DefaultPlan()
	plan.Sysctls = append(plan.Sysctls, Sysctl{"vm.max_map_count", "262144"})
	if _, err := h.Prepare(context.Background(), plan); err != nil {
		t.Fatal(err)
	}
	f.write("/proc/sys/vm/max_map_count", "100000\n")
	f.write(hostpaths.SysctlFileHost, "# the operator's now\n")
	f.fail["modprobe -r overlay"] = errors.New("modprobe: FATAL: Module overlay is in use")
	left, err := h.Undo(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	joined := strings.Join(left, "\n")
	for _, s := range []string{"vm.max_map_count is 100000", hostpaths.SysctlFileHost + " changed", "overlay stays loaded: modprobe: FATAL: Module overlay is in use"} {
		if !strings.Contains(joined, s) {
			t.Errorf("leftovers do not say %q:\n%s", s, joined)
		}
	}
	if f.read("/proc/sys/vm/max_map_count") != "100000\n" || f.read(hostpaths.SysctlFileHost) != "# the operator's now\n" {
		t.Error("Undo overrode values set after Prepare")
	}
	if f.read("/proc/sys/net/ipv4/ip_forward") != "0\n" {
		t.Error("Undo did not restore what was still ours")
	}
	if rec, _ := ReadRecord(f.p); rec != nil {
		t.Error("record kept after Undo")
	}
}

// crashed is the panic value of a simulated crash.
type crashed struct{ point string }

// crashAt returns a CrashPoint that panics at its n-th call, and a
// pointer to the number of calls so far.
func crashAt(n int) (func(string), *int) {
	calls := 0
	return func(point string) {
		calls++
		if calls == n {
			panic(crashed{point})
		}
	}, &calls
}

// runUntilCrash runs f and reports whether it crashed (a crashed panic).
func runUntilCrash(t *testing.T, f func() error) (crash bool) {
	t.Helper()
	defer func() {
		if r := recover(); r != nil {
			if _, ok := r.(crashed); !ok {
				panic(r)
			}
			crash = true
		}
	}()
	if err := f(); err != nil {
		t.Fatal(err)
	}
	return false
}

func TestCrashAtEveryPointOfPrepareConverges(t *testing.T) {
	// The end state of an uninterrupted Prepare, to compare with.
	ref := newFakeHost(t)
	if _, err := ref.host().Prepare(context.Background(), DefaultPlan()); err != nil {
		t.Fatal(err)
	}
	prepared := ref.snapshot()
	refRec := ref.read(hostpaths.HostRootHost + "/hostprep.json")

	for n := 1; ; n++ {
		f := newFakeHost(t)
		original := f.snapshot()
		h := f.host()
		cp, _ := crashAt(n)
		h.CrashPoint = cp
		if !runUntilCrash(t, func() error { _, err := h.Prepare(context.Background(), DefaultPlan()); return err }) {
			if n < 10 {
				t.Fatalf("only %d crash points reached; the plan makes 9 changes", n-1)
			}
			break
		}
		// Rerun: converges to the uninterrupted end state, same record.
		h.CrashPoint = nil
		if _, err := h.Prepare(context.Background(), DefaultPlan()); err != nil {
			t.Fatalf("crash %d: rerun: %v", n, err)
		}
		if d := diff(prepared, f.snapshot()); d != "" {
			t.Errorf("crash %d then Prepare: differs from an uninterrupted run:\n%s", n, d)
		}
		if got := f.read(hostpaths.HostRootHost + "/hostprep.json"); got != refRec {
			t.Errorf("crash %d then Prepare: record differs:\n%s\nwant\n%s", n, got, refRec)
		}
		if _, err := h.Undo(context.Background()); err != nil {
			t.Fatal(err)
		}
		if d := diff(original, f.snapshot()); d != "" {
			t.Errorf("crash %d, Prepare, Undo: host differs from before:\n%s", n, d)
		}

		// Or a reset right after the crash: Undo alone restores it.
		g := newFakeHost(t)
		hg := g.host()
		hg.CrashPoint, _ = crashAt(n)
		runUntilCrash(t, func() error { _, err := hg.Prepare(context.Background(), DefaultPlan()); return err })
		hg.CrashPoint = nil
		if _, err := hg.Undo(context.Background()); err != nil {
			t.Fatalf("crash %d then Undo: %v", n, err)
		}
		if d := diff(original, g.snapshot()); d != "" {
			t.Errorf("crash %d then Undo: host differs from before:\n%s", n, d)
		}
	}
}

func TestCrashAtEveryPointOfUndoConverges(t *testing.T) {
	for n := 1; ; n++ {
		f := newFakeHost(t)
		original := f.snapshot()
		h := f.host()
		if _, err := h.Prepare(context.Background(), DefaultPlan()); err != nil {
			t.Fatal(err)
		}
		h.CrashPoint, _ = crashAt(n)
		if !runUntilCrash(t, func() error { _, err := h.Undo(context.Background()); return err }) {
			if n < 10 {
				t.Fatalf("only %d undo crash points reached for 9 changes", n-1)
			}
			break
		}
		h.CrashPoint = nil
		if left, err := h.Undo(context.Background()); err != nil || len(left) != 0 {
			t.Fatalf("crash %d in Undo, then Undo: %q %v", n, left, err)
		}
		if d := diff(original, f.snapshot()); d != "" {
			t.Errorf("crash %d in Undo, then Undo: host differs from before:\n%s", n, d)
		}
	}
}

func TestPrepareRefusesAnOperatorSwapTargetBeforeChangingAnything(t *testing.T) {
	f := newFakeHost(t)
	f.write("/etc/systemd/system/swap.target", "[Unit]\nDescription=the operator's\n")
	before := f.snapshot()
	_, err := f.host().Prepare(context.Background(), DefaultPlan())
	if !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "/etc/systemd/system/swap.target") {
		t.Fatalf("want ErrConflict naming the file, got %v", err)
	}
	if exitcode.For(err) != exitcode.Failed {
		t.Errorf("exit %d, want 1", exitcode.For(err))
	}
	if d := diff(before, f.snapshot()); d != "" || len(f.calls) != 0 {
		t.Errorf("a refused Prepare changed the host (calls %q):\n%s", f.calls, d)
	}
}

func TestPrepareKeepsAnExistingMask(t *testing.T) {
	f := newFakeHost(t)
	f.mkdir("/etc/systemd/system")
	os.Symlink("/dev/null", f.path("/etc/systemd/system/swap.target"))
	h := f.host()
	if _, err := h.Prepare(context.Background(), DefaultPlan()); err != nil {
		t.Fatal(err)
	}
	if rec, _ := ReadRecord(f.p); rec.find(KindMask, "swap.target") != nil {
		t.Error("a mask that was there is recorded as ours")
	}
	h.Undo(context.Background())
	if _, err := os.Readlink(f.path("/etc/systemd/system/swap.target")); err != nil {
		t.Error("Undo removed the operator's mask")
	}
}

func TestPrepareFailingModprobeNamesTheModuleAndUndoStillRestores(t *testing.T) {
	f := newFakeHost(t)
	original := f.snapshot()
	f.fail["modprobe overlay"] = errors.New("modprobe: FATAL: Module overlay not found")
	h := f.host()
	_, err := h.Prepare(context.Background(), DefaultPlan())
	if err == nil || !strings.Contains(err.Error(), "load kernel module overlay") || !strings.Contains(err.Error(), "not found") {
		t.Fatalf("want an error naming overlay and why, got %v", err)
	}
	if _, err := h.Undo(context.Background()); err != nil {
		t.Fatal(err)
	}
	if d := diff(original, f.snapshot()); d != "" {
		t.Errorf("failed Prepare then Undo: host differs:\n%s", d)
	}
}

func TestPrepareOnBuiltinModulesCallsNoModprobe(t *testing.T) {
	f := newFakeHost(t)
	// Built in: no /sys/module entry, but the filesystem and the bridge
	// sysctls are there (this is how the test VMs' kernel looks).
	os.RemoveAll(f.path("/sys/module/br_netfilter"))
	f.write("/proc/filesystems", "nodev\tsysfs\nnodev\toverlay\n")
	f.fail["modprobe overlay"] = errors.New("modprobe must not run")
	f.fail["modprobe br_netfilter"] = errors.New("modprobe must not run")
	h := f.host()
	if _, err := h.Prepare(context.Background(), DefaultPlan()); err != nil {
		t.Fatal(err)
	}
	if slices.ContainsFunc(f.calls, func(c string) bool { return strings.HasPrefix(c, "modprobe") }) {
		t.Errorf("modprobe called for built-in modules: %q", f.calls)
	}
}

func TestPrepareMissingSysctlSaysWhichFile(t *testing.T) {
	f := newFakeHost(t)
	os.RemoveAll(f.path("/sys/module/br_netfilter"))
	os.RemoveAll(f.path("/proc/sys/net/bridge"))
	h := f.host()
	h.Modprobe = func(ctx context.Context, args ...string) error { return nil } // "loads" nothing
	_, err := h.Prepare(context.Background(), DefaultPlan())
	if err == nil || !strings.Contains(err.Error(), "/proc/sys/net/bridge/bridge-nf-call-iptables does not exist") {
		t.Fatalf("want an error naming the missing /proc/sys file, got %v", err)
	}
}

func TestPrepareRefusesAnInvalidPlanBeforeChangingAnything(t *testing.T) {
	f := newFakeHost(t)
	before := f.snapshot()
	for _, plan := range []Plan{
		{Modules: []string{"../x"}},
		{Sysctls: []Sysctl{{"net/ipv4/ip_forward", "1"}}},
		{Sysctls: []Sysctl{{"net.ipv4.ip_forward", "1\nvm.x=2"}}},
	} {
		if _, err := f.host().Prepare(context.Background(), plan); err == nil {
			t.Errorf("%+v accepted", plan)
		}
	}
	if d := diff(before, f.snapshot()); d != "" {
		t.Errorf("invalid plans changed the host:\n%s", d)
	}
}

func TestActiveSwapsDecodesEscapedPaths(t *testing.T) {
	f := newFakeHost(t)
	swaps, err := (&Host{Paths: f.p}).activeSwaps()
	if err != nil {
		t.Fatal(err)
	}
	want := []Swap{{"/dev/vda2", -2}, {"/var/swap file", 5}}
	if !slices.Equal(swaps, want) {
		t.Errorf("swaps = %v, want %v", swaps, want)
	}
}
