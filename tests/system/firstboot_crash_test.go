package system_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"unbounded-cloud.io/agent/lib/bootstrap"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/hostprep"
	"unbounded-cloud.io/agent/lib/modes/container/bundle"
	stack "unbounded-cloud.io/agent/lib/modes/nodestack"
	"unbounded-cloud.io/agent/lib/reset"
)

// Reset and crashes on a real first-boot host (newFirstBoot, nspawn
// mode): the host after `unbounded reset` is the host before its first
// boot, file for file, and bootstrap and reset killed at any of their
// crash points converge when started again.

const resetUnit = "unbounded-reset.service"

// apiFileSystems are not walked at all: the running host's, never on its
// disk.
var apiFileSystems = []string{"/proc", "/sys", "/dev", "/run", "/tmp"}

// manifestExclusions are what may differ on the test host's root after
// a reset, each with the reason: what a booted systemd changes on any
// container's root, with or without the agent, and the fixture's own
// mount point. hostID is the test host's machine ID. Nothing else is
// excused: the logged list of excused differences shows each is needed.
func manifestExclusions(hostID string) []struct {
	re  *regexp.Regexp
	why string
} {
	type ex = struct {
		re  *regexp.Regexp
		why string
	}
	return []ex{
		{regexp.MustCompile(`^/etc/machine-id$`), "written by systemd at the first boot (the image ships it empty)"},
		{regexp.MustCompile(`^/var/log/wtmp$`), "systemd-update-utmp's boot and shutdown records"},
		{regexp.MustCompile(`^/var/log/journal/` + regexp.QuoteMeta(hostID) + `(/.*)?$`), "the test host's own journal"},
		{regexp.MustCompile(`^/var/tmp/systemd-private-[0-9a-f]+-systemd-[a-z-]+\.service-[^/]+(/.*)?$`), "PrivateTmp= of systemd's own services (systemd-logind)"},
		{regexp.MustCompile(`^/var/lib/unbounded/slots$`), "the fixture's: systemd-nspawn makes the mount point of newFirstBoot's --bind (reset empties it and keeps it, as it does an operator's mount there)"},
	}
}

// rootManifest describes every file, directory and link of the root at dir
// (but manifestExcluded): type, permissions, owner, and the content's
// SHA-256 or the link's target. Directory times are left out (creating and
// removing an entry changes them; nothing the operator sees).
func rootManifest(t *testing.T, dir string) map[string]string {
	t.Helper()
	begin := time.Now()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel := "/" + strings.TrimPrefix(strings.TrimPrefix(p, dir), "/")
		if slices.Contains(apiFileSystems, rel) {
			return filepath.SkipDir
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		st, _ := fi.Sys().(*syscall.Stat_t)
		desc := fmt.Sprintf("%s %o %d:%d", fi.Mode().Type(), fi.Mode().Perm()|fi.Mode()&(fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky), st.Uid, st.Gid)
		switch {
		case fi.Mode().IsRegular():
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			h := sha256.New()
			_, err = io.Copy(h, f)
			f.Close()
			if err != nil {
				return err
			}
			desc += " " + hex.EncodeToString(h.Sum(nil))
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			desc += " -> " + target
		}
		out[rel] = desc
		return nil
	})
	if err != nil {
		t.Fatalf("manifest of %s: %v", dir, err)
	}
	t.Logf("manifest of the host's root: %d entries in %v", len(out), time.Since(begin).Round(time.Millisecond))
	return out
}

// rootManifestDiff lists what differs between two manifests, sorted.
func rootManifestDiff(before, after map[string]string) []string {
	var diff []string
	for p, b := range before {
		a, ok := after[p]
		switch {
		case !ok:
			diff = append(diff, "gone:    "+p+" ("+b+")")
		case a != b:
			diff = append(diff, "changed: "+p+" ("+b+" -> "+a+")")
		}
	}
	for p, a := range after {
		if _, ok := before[p]; !ok {
			diff = append(diff, "new:     "+p+" ("+a+")")
		}
	}
	sort.Strings(diff)
	return diff
}

// wantManifest fails the test when the host's root is not as before.
func wantManifest(t *testing.T, f *firstBoot, before map[string]string, when string) {
	t.Helper()
	id, err := os.ReadFile(filepath.Join(f.m.Root(), "etc/machine-id"))
	if err != nil {
		t.Fatal(err)
	}
	exclusions := manifestExclusions(strings.TrimSpace(string(id)))
	var diff, excused []string
	for _, d := range rootManifestDiff(before, rootManifest(t, f.m.Root())) {
		p := strings.Fields(d)[1]
		reason := ""
		for _, ex := range exclusions {
			if ex.re.MatchString(p) {
				reason = ex.why
			}
		}
		if reason == "" {
			diff = append(diff, d)
		} else {
			excused = append(excused, d+": "+reason)
		}
	}
	// What the exclusions let through is logged, so that the list stays
	// honest (an exclusion nothing needs is one to drop).
	t.Logf("%s, changed on the host's root but excluded (%d):\n  %s", when, len(excused), strings.Join(excused, "\n  "))
	if len(diff) != 0 {
		t.Errorf("%s, the host's root differs from before the first boot (%d entries):\n  %s", when, len(diff), strings.Join(diff, "\n  "))
	} // Nor is anything of the node left in the host's network: the
	// node-local DNS cache's interface goes with the node.
	if f.m.Leader() != 0 {
		if out, err := f.m.Run("ip", "-o", "link", "show", "dev", stack.LocalDNSInterface); err == nil {
			t.Errorf("%s, the node-local DNS cache's interface is still there:\n%s", when, out)
		}
	}
}

// sysctl reads a kernel parameter inside the test host, by a process of
// its network namespace: net.* sysctls are per namespace, and
// /proc/sys/net shows the reader's, not the mount's.
func sysctl(t *testing.T, f *firstBoot, key string) string {
	t.Helper()
	out, err := f.m.Run("cat", "/proc/sys/"+strings.ReplaceAll(key, ".", "/"))
	if err != nil {
		t.Fatalf("sysctl %s: %v", key, err)
	}
	return strings.TrimSpace(out)
}

// hostPrepRecord reads the host preparation record bootstrap left, and
// checks what an uninterrupted run records: every change once, and each
// sysctl's previous value the host's own (never the value Prepare set,
// which a rerun after a crash between the change and its record would
// take for the original).
func hostPrepRecord(t *testing.T, f *firstBoot) *hostprep.Record {
	t.Helper()
	r, err := hostprep.ReadRecord(f.paths)
	if err != nil || r == nil {
		t.Fatalf("host preparation record: %v (record %v)", err, r)
	}
	seen := map[string]bool{}
	for _, c := range r.Changes {
		k := c.Kind + " " + c.Name
		if seen[k] {
			t.Errorf("host preparation record has %s twice: %+v", k, r.Changes)
		}
		seen[k] = true
		if c.Kind == hostprep.KindSysctl {
			if c.Previous == nil || *c.Previous == c.Value {
				t.Errorf("record of %s: previous %v, set %q: the host's own value is lost", c.Name, c.Previous, c.Value)
			}
			if got := sysctl(t, f, c.Name); got != c.Value {
				t.Errorf("sysctl %s = %s after bootstrap, want %s", c.Name, got, c.Value)
			}
		}
	}
	var changes []string
	for _, c := range r.Changes {
		changes = append(changes, c.String())
	}
	t.Logf("host preparation: %s", strings.Join(changes, "; "))
	return r
}

// wantHostPrepUndone checks the record's changes are undone: sysctls at
// their previous values, modules that Prepare loaded unloaded or named by
// reset as left (in use by the VM: the module list is the kernel's, not
// the test host's).
func wantHostPrepUndone(t *testing.T, f *firstBoot, r *hostprep.Record, resetLog string) {
	t.Helper()
	mods, _ := f.m.ReadFile("/proc/modules")
	for _, c := range r.Changes {
		switch c.Kind {
		case hostprep.KindSysctl:
			if got := sysctl(t, f, c.Name); got != *c.Previous {
				t.Errorf("sysctl %s = %s after reset, want %s (before bootstrap)", c.Name, got, *c.Previous)
			}
		case hostprep.KindModule:
			loaded := slices.ContainsFunc(strings.Split(string(mods), "\n"), func(l string) bool { return strings.HasPrefix(l, c.Name+" ") })
			if loaded && !strings.Contains(resetLog, c.Name) {
				t.Errorf("module %s that bootstrap loaded is still loaded and reset did not say why:\n%s", c.Name, resetLog)
			}
		}
	}
	if _, err := os.Stat(f.paths.HostPrepRecord()); !os.IsNotExist(err) {
		t.Errorf("host preparation record after reset: %v", err)
	}
}

// wantNothingOfOursRunning: no unit of ours active or failed, no machine
// of the node running.
func wantNothingOfOursRunning(t *testing.T, f *firstBoot) {
	t.Helper()
	out, _ := f.m.Systemctl("list-units", "--all", "--plain", "--no-legend", "--state=active,activating,failed", "unbounded*", "systemd-nspawn@*")
	var left []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		// The fixture's units (unbounded-test-*: forwarders to the
		// test's servers, the kubelet socket the API server reaches the
		// node by) are not ours.
		if l != "" && !strings.HasPrefix(l, "unbounded-test-") {
			left = append(left, l)
		}
	}
	if len(left) != 0 {
		t.Errorf("after reset, units of ours are still active or failed:\n%s", strings.Join(left, "\n"))
	}
	if out, _ := f.m.Run("machinectl", "list", "--no-legend"); strings.Contains(out, "kube") {
		t.Errorf("after reset, a node machine still runs:\n%s", out)
	}
}

// journalCursor is the test host's journal position now.
func journalCursor(t *testing.T, f *firstBoot) string {
	t.Helper()
	out, err := f.m.Run("journalctl", "-q", "-n", "0", "--show-cursor")
	_, c, ok := strings.Cut(out, "-- cursor: ")
	if err != nil || !ok {
		t.Fatalf("journal cursor: %v %q", err, out)
	}
	return strings.TrimSpace(c)
}

// waitUnitDone waits until a oneshot's run has ended, and returns its
// properties. With a cursor, the run is the one systemd journaled after
// it: a oneshot that succeeded and that nothing references is unloaded at
// once (its InvocationID gone), so its end is read from the journal.
//
// The journal is read before the properties, never after: between a
// `start --no-block` and the moment the job runs, the unit still shows
// the run before it (after a reset-failed: inactive, Result=success, and
// the earlier crash's code=killed status=9), and properties read then
// beside a journal read a moment later that already has the new run's
// end described a run that had not begun (CI-8's one failure). systemd
// journals a run's end and sets the unit's state in one step of its event
// loop, so properties read after that line are the run's.
func waitUnitDone(t *testing.T, f *firstBoot, unit, cursor string, timeout time.Duration) map[string]string {
	t.Helper()
	var p map[string]string
	begin := time.Now()
	var err error
	if cursor != "" {
		// The run's end in the journal, followed (one journalctl, ending
		// on the line); then its properties, which a moment of the
		// manager's loop may still owe.
		_, err = f.m.WaitJournal(timeout, func(l string) bool {
			return strings.Contains(l, unit+": Deactivated successfully.") || strings.Contains(l, "Failed with result")
		}, "-u", unit, "--after-cursor", cursor)
	}
	if err == nil && cursor != "" {
		// The run's own last lines come through its output stream, which
		// journald may read after the manager's line about its end:
		// a sync returns once journald has stored what it had been sent
		// (it handles a sync after the streams), so that the run's lines
		// read next (lastRunJournal, Journal) are all there.
		f.m.SyncJournal()
	}
	if err == nil {
		err = wait.PollUntilContextTimeout(context.Background(), 250*time.Millisecond, max(timeout-time.Since(begin), 10*time.Second), true, func(context.Context) (bool, error) {
			p = showProps(t, f.m, unit, "ActiveState", "SubState", "Result", "ExecMainCode", "ExecMainStatus", "ExecMainPID", "InvocationID", "NRestarts")
			if p["ActiveState"] != "inactive" && p["ActiveState"] != "failed" {
				return false, nil
			}
			return cursor != "" || p["InvocationID"] != "", nil
		})
	}
	if err != nil {
		// Why the run did not end (or never began): its lines and the
		// daemon's (which starts most runs) since the cursor.
		args := []string{"journalctl", "-q", "--no-pager", "-o", "short-precise", "-u", unit, "-u", daemonUnit}
		if cursor != "" {
			args = append(args, "--after-cursor", cursor)
		}
		j, _ := f.m.Run(append([]string{"sh", "-c", `"$@" | tail -n 80`, "sh"}, args...)...)
		t.Fatalf("%s ended: not within %v: %v; %v\n%s and the daemon since the run was asked for (last lines):\n%s", unit, timeout, err, p, unit, j)
	}
	return p
}

// setCrashPoint puts (point != "") or removes the unit's crash drop-in.
func setCrashPoint(t *testing.T, f *firstBoot, unit, point string) {
	t.Helper()
	dropin := "/etc/systemd/system/" + unit + ".d/crash.conf"
	if point == "" {
		// Only the crash point's drop-in: the test's others stay (the
		// upgrade scenario's --timeout).
		os.Remove(filepath.Join(f.m.Root(), dropin))
		os.Remove(filepath.Join(f.m.Root(), filepath.Dir(dropin))) // when empty
	} else {
		f.m.WriteFile(dropin, []byte("[Service]\nEnvironment=UNBOUNDED_CRASHPOINT="+point+"\n"), 0o644)
	}
	if f.m.Leader() != 0 {
		if out, err := f.m.Systemctl("daemon-reload"); err != nil {
			t.Fatalf("daemon-reload: %v\n%s", err, out)
		}
	}
}

// wantCrashedAt checks the unit's last run was killed at point, and says
// so in its journal.
func wantCrashedAt(t *testing.T, f *firstBoot, unit, point string, p map[string]string) {
	t.Helper()
	if p["ExecMainCode"] != "2" || p["ExecMainStatus"] != "9" || p["ActiveState"] != "failed" {
		t.Fatalf("%s with crash point %s: %v, want killed by SIGKILL (failed, code=killed status=9)\n%s", unit, point, p, f.m.Journal(unit))
	}
	// The run's lines by its invocation, or by its main process: the
	// crash point's line is written just before the SIGKILL, and journald
	// often cannot attribute a line of a process that is gone by the time
	// it reads it to its unit (no _SYSTEMD_INVOCATION_ID); _PID is the
	// kernel's, always there.
	match := []string{"-b", "_SYSTEMD_INVOCATION_ID=" + p["InvocationID"]}
	if pid := p["ExecMainPID"]; pid != "" && pid != "0" {
		match = append(match, "+", "_PID="+pid)
	}
	f.waitJournalLine(t, "crash point "+point+" reached", crashLineLag, match...)
}

// startAndCrash starts the unit with the crash point set and checks it
// died there.
func startAndCrash(t *testing.T, f *firstBoot, unit, point string, timeout time.Duration) {
	t.Helper()
	begin := time.Now()
	setCrashPoint(t, f, unit, point)
	f.m.Systemctl("reset-failed", unit)
	cursor := journalCursor(t, f)
	if out, err := f.m.Systemctl("start", "--no-block", unit); err != nil {
		t.Fatalf("start %s: %v\n%s", unit, err, out)
	}
	p := waitUnitDone(t, f, unit, cursor, timeout)
	wantCrashedAt(t, f, unit, point, p)
	t.Logf("%s crashed at %s after %v", unit, point, time.Since(begin).Round(time.Millisecond))
}

// runToSuccess starts the unit without a crash point and waits until it
// ends with 0.
func runToSuccess(t *testing.T, f *firstBoot, unit string, timeout time.Duration) {
	t.Helper()
	begin := time.Now()
	setCrashPoint(t, f, unit, "")
	f.m.Systemctl("reset-failed", unit)
	cursor := journalCursor(t, f)
	if out, err := f.m.Systemctl("start", "--no-block", unit); err != nil {
		t.Fatalf("start %s: %v\n%s", unit, err, out)
	}
	p := waitUnitDone(t, f, unit, cursor, timeout)
	if p["ActiveState"] != "inactive" || p["ExecMainStatus"] != "0" {
		t.Fatalf("%s: %v, want success\n%s", unit, p, f.m.Journal(unit))
	}
	t.Logf("%s succeeded in %v", unit, time.Since(begin).Round(time.Millisecond))
}

// nodeObject reads the Node.
func (f *firstBoot) nodeObject(t *testing.T) *corev1.Node {
	t.Helper()
	n, err := f.env.kube.CoreV1().Nodes().Get(context.Background(), f.name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("Node %s: %v", f.name, err)
	}
	return n
}

// waitReadySince waits until the kubelet reports the Node Ready after t0.
func (f *firstBoot) waitReadySince(t *testing.T, t0 time.Time, timeout time.Duration) {
	t.Helper()
	waitUntil(t, timeout, "Node Ready reported since "+t0.Format(time.TimeOnly), func(ctx context.Context) (bool, error) {
		n, err := f.env.kube.CoreV1().Nodes().Get(ctx, f.name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady {
				return c.Status == corev1.ConditionTrue && c.LastHeartbeatTime.Time.After(t0), nil
			}
		}
		return false, nil
	})
}

// wantOneSlot: the converged host has exactly slot kube1, with its one
// applied config and its node's tree, and nothing an interrupted build
// left beside it (machines of mode nspawn, the bundle's temporary and
// old trees of mode container).
func wantOneSlot(t *testing.T, f *firstBoot) {
	t.Helper()
	f.wantSlot(t, bootstrap.FirstSlot, "")
	wantOnly := func(dir string, want ...string) {
		t.Helper()
		out, err := f.m.Run("ls", "-A", dir)
		if err != nil {
			t.Fatalf("ls -A %s: %v\n%s", dir, err, out)
		}
		var names []string
		for _, n := range strings.Fields(out) {
			// systemd-nspawn's lock of the image it runs.
			if !strings.HasPrefix(n, ".#") {
				names = append(names, n)
			}
		}
		if !slices.Equal(names, want) {
			t.Errorf("%s holds %v, want only %v", dir, names, want)
		}
	}
	if f.mode != "container" {
		wantOnly(hostpaths.MachinesDirHost, bootstrap.FirstSlot)
		return
	}
	// Through the running host: the slots are on a directory bound into
	// it (nodestack.FirstBootHost). Beside the bundle, the slot's
	// containerd store and devices record, and no tree an interrupted
	// build left (".bundle.tmp-*", ".bundle.old-*").
	slot := hostpaths.New("/").SlotDir(bootstrap.FirstSlot)
	wantOnly(filepath.Dir(slot), bootstrap.FirstSlot)
	out, err := f.m.Run("ls", "-A", slot)
	if err != nil || !slices.Contains(strings.Fields(out), filepath.Base(bundle.Dir(hostpaths.New("/"), bootstrap.FirstSlot))) {
		t.Errorf("%s holds %q (%v), want the bundle", slot, out, err)
	}
	for _, n := range strings.Fields(out) {
		if strings.HasPrefix(n, ".bundle.") {
			t.Errorf("%s/%s is left of an interrupted build", slot, n)
		}
	}
}

// TestResetThenBootstrapAgainUnderTheSameName: a Ready Node with a pod is
// reset with the operator's command; the host is then as it was before
// its first boot (file for file, the sysctls bootstrap set back at their
// values), and a bootstrap under the same Machine name joins as the same
// Node with no cleanup on the cluster side, and runs the pod again.
func TestResetThenBootstrapAgainUnderTheSameName(t *testing.T) {
	defer scenario(t)()
	f := newFirstBoot(t, firstBootOptions{})
	before := rootManifest(t, f.m.Root())
	begin := time.Now()
	f.m.Start()
	p := waitUnitDone(t, f, bootstrapUnit, "", 8*time.Minute)
	if p["ExecMainStatus"] != "0" || p["ActiveState"] != "inactive" {
		t.Fatalf("first boot: %v\n%s", p, f.m.Journal(bootstrapUnit))
	}
	t.Logf("first boot to a bootstrapped host: %v", time.Since(begin).Round(time.Millisecond))
	f.wantBootstrapped(t, "nspawn", "systemd-nspawn@kube1.service")
	ns := f.runPod(t)
	if t.Failed() {
		return
	}
	oldPod := f.waitPodRunning(t, ns, time.Minute)
	node := f.nodeObject(t)
	rec := hostPrepRecord(t, f)

	// The operator's path: `unbounded reset --yes`.
	resetAt := time.Now()
	out, err := f.m.Run("unbounded", "reset", "--yes")
	if err != nil {
		t.Fatalf("unbounded reset --yes: %v\n%s", err, out)
	}
	t.Logf("unbounded reset --yes: %v\n%s", time.Since(resetAt).Round(time.Millisecond), out)
	resetLog, _ := f.m.Run("journalctl", "-q", "--no-pager", "-o", "cat", "--since", "@"+fmt.Sprint(resetAt.Unix()), "-t", "reset", "-t", "unbounded")
	wantNothingOfOursRunning(t, f)
	wantHostPrepUndone(t, f, rec, out+resetLog)
	wantManifest(t, f, before, "after `unbounded reset --yes`")
	// A second reset finds nothing to do and changes nothing.
	if out, err := f.m.Run("unbounded", "reset", "--yes"); err != nil {
		t.Errorf("a second reset: %v\n%s", err, out)
	}
	wantManifest(t, f, before, "after a second reset")
	if t.Failed() {
		return
	}

	// Bootstrap again under the same name; the cluster is left as it is
	// (the Node, its pod, the Machine, the approved CSRs).
	again := time.Now()
	runToSuccess(t, f, bootstrapUnit, 8*time.Minute)
	f.wantBootstrapped(t, "nspawn", "systemd-nspawn@kube1.service")
	f.waitReadySince(t, again, 2*time.Minute)
	n := f.nodeObject(t)
	if n.UID != node.UID {
		t.Errorf("Node %s was replaced (uid %s, was %s): the new kubelet must register as the same Node", f.name, n.UID, node.UID)
	}
	waitUntil(t, 4*time.Minute, "the pod's container started again on the new node", func(ctx context.Context) (bool, error) {
		pods, err := f.env.kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		for _, p := range pods.Items {
			cs := p.Status.ContainerStatuses
			if p.Spec.NodeName == f.name && len(cs) == 1 && cs[0].State.Running != nil && cs[0].ContainerID != oldPod.Status.ContainerStatuses[0].ContainerID {
				return true, nil
			}
		}
		return false, nil
	})
	t.Logf("bootstrap again to a Ready Node running the pod: %v", time.Since(again).Round(time.Millisecond))
	if j := f.m.Journal(bootstrapUnit); strings.Contains(j, "password") || strings.Contains(j, "already exists") {
		t.Errorf("the second bootstrap's journal shows a name conflict:\n%s", j)
	}
}

// crashBootstrapAtEveryPoint boots the fresh host f with bootstrap
// killed at each of its crash points in run order (the host
// preparation's inside it), each run resuming what the last left, one of
// them resumed by a reboot (the generator sees the ownership record naming
// the bootstrap unit); then a run without a crash point, which must
// succeed. The mode's own steps are inside the phases (its Prepare in the
// slot phase, its Start in the start phase), so the chain is every mode's.
func crashBootstrapAtEveryPoint(t *testing.T, f *firstBoot) {
	t.Helper()
	chain := time.Now()
	var points []string
	for _, p := range bootstrap.CrashPoints {
		points = append(points, p)
		if p == "bootstrap/after-"+bootstrap.PhaseConfig {
			points = append(points, "hostprep/after-record", "hostprep/after-change")
		}
	}
	// The first point is hit at the first boot.
	setCrashPoint(t, f, bootstrapUnit, points[0])
	f.m.Start()
	wantCrashedAt(t, f, bootstrapUnit, points[0], waitUnitDone(t, f, bootstrapUnit, "", 5*time.Minute))
	t.Logf("first boot crashed at %s after %v", points[0], time.Since(chain).Round(time.Millisecond))
	for i, point := range points[1:] {
		if point == "bootstrap/after-"+bootstrap.PhaseFence {
			// A reboot after the crash at after-slot: the generator
			// resumes bootstrap at boot (its ownership record names the
			// unit), which crashes at the next point.
			setCrashPoint(t, f, bootstrapUnit, point)
			rb := time.Now()
			f.m.Reboot()
			wantCrashedAt(t, f, bootstrapUnit, point, waitUnitDone(t, f, bootstrapUnit, "", 5*time.Minute))
			t.Logf("reboot after the crash at %s: bootstrap resumed at boot, crashed at %s; %v", points[i], point, time.Since(rb).Round(time.Millisecond))
			continue
		}
		startAndCrash(t, f, bootstrapUnit, point, 8*time.Minute)
	}
	runToSuccess(t, f, bootstrapUnit, 8*time.Minute)
	t.Logf("bootstrap chain of %d crash points and a reboot, converged: %v", len(points), time.Since(chain).Round(time.Millisecond))
}

// TestBootstrapAndResetCrashAtEveryPointConverge chains, on one host, a
// bootstrap killed at each of its crash points in run order (the host
// preparation's inside it), each run resuming what the last left, one of
// them resumed by a reboot (the generator sees the ownership record naming
// the bootstrap unit); then a run without a crash point converges to what
// an uninterrupted first boot gives. The same for reset, ending in the
// host as it was before its first boot.
func TestBootstrapAndResetCrashAtEveryPointConverge(t *testing.T) {
	defer scenario(t)()
	f := newFirstBoot(t, firstBootOptions{})
	before := rootManifest(t, f.m.Root())
	crashBootstrapAtEveryPoint(t, f)
	f.wantBootstrapped(t, "nspawn", "systemd-nspawn@kube1.service")
	wantOneSlot(t, f)
	rec := hostPrepRecord(t, f)
	if t.Failed() {
		return
	}

	resetChain := time.Now()
	rpoints := []string{}
	for _, p := range reset.CrashPoints {
		if p == "reset/after-hostprep" {
			rpoints = append(rpoints, "hostprep/after-undo")
		}
		rpoints = append(rpoints, p)
	}
	for i, point := range rpoints {
		if i > 0 && rpoints[i-1] == "reset/after-node" {
			// A reboot in the middle of a reset: the generator resumes
			// reset at boot and starts no node.
			setCrashPoint(t, f, resetUnit, point)
			rb := time.Now()
			f.m.Reboot()
			wantCrashedAt(t, f, resetUnit, point, waitUnitDone(t, f, resetUnit, "", 5*time.Minute))
			t.Logf("reboot after the crash at %s: reset resumed at boot, crashed at %s; %v", rpoints[i-1], point, time.Since(rb).Round(time.Millisecond))
			if isActive(f.m, "systemd-nspawn@kube1.service") == "active" || isActive(f.m, bootstrapUnit) == "active" {
				t.Errorf("a node or a bootstrap runs on a host whose reset was interrupted")
			}
			continue
		}
		startAndCrash(t, f, resetUnit, point, 5*time.Minute)
	}
	runToSuccess(t, f, resetUnit, 5*time.Minute)
	t.Logf("reset chain of %d crash points and a reboot, converged: %v", len(rpoints), time.Since(resetChain).Round(time.Millisecond))
	resetLog := f.m.Journal(resetUnit)
	wantNothingOfOursRunning(t, f)
	wantHostPrepUndone(t, f, rec, resetLog)
	setCrashPoint(t, f, bootstrapUnit, "")
	setCrashPoint(t, f, resetUnit, "")
	wantManifest(t, f, before, "after the reset chain")
}
