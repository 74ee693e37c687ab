package recovery

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"unbounded-cloud.io/agent/lib/crashpoint"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/lifecycle"
	"unbounded-cloud.io/agent/lib/modes/facts"
	"unbounded-cloud.io/agent/lib/modes/none"
	"unbounded-cloud.io/agent/lib/state"
	"unbounded-cloud.io/agent/lib/unitnames"
	"unbounded-cloud.io/agent/lib/units/unitstest"
)

// twoRecords makes h a host with both slots recorded (kube1 by newHost,
// kube2 here), the daemon failed, and the node target as given.
func twoRecords(t *testing.T, h *host, running ...string) {
	t.Helper()
	if err := state.WriteApplied(h.p, &state.AppliedConfig{Slot: "kube2", Mode: "nspawn", Machine: "m1", KubernetesVersion: "1.32.1"}); err != nil {
		t.Fatal(err)
	}
	h.sd.SetStatus(DaemonUnit, UnitStatus{LoadState: "loaded", ActiveState: "failed"})
	for _, s := range running {
		h.sd.SetStatus("systemd-nspawn@"+s+".service", UnitStatus{LoadState: "loaded", ActiveState: "active"})
	}
	if len(running) > 0 {
		h.sd.SetStatus(unitnames.NodeTarget, UnitStatus{LoadState: "loaded", ActiveState: "active"})
	}
}

// hostRootFiles are the applied records (with sidecars) in the host root,
// and the files in the stale directory.
func recordFiles(t *testing.T, p hostpaths.Paths) (records, stale []string) {
	t.Helper()
	records, _ = filepath.Glob(filepath.Join(p.HostRoot(), "kube*-applied-config.json*"))
	for i := range records {
		records[i] = filepath.Base(records[i])
	}
	ents, err := os.ReadDir(StaleDir(p))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	for _, e := range ents {
		stale = append(stale, e.Name())
	}
	sort.Strings(records)
	return records, stale
}

func TestTwoAppliedConfigsTheRecordOfTheSlotThatDoesNotRunIsMovedAsideAndTheDaemonStarted(t *testing.T) {
	h := newHost(t)
	twoRecords(t, h, "kube2")
	old, err := os.ReadFile(h.p.AppliedConfig("kube1"))
	if err != nil {
		t.Fatal(err)
	}
	if err := h.run(t, exited("unbounded-test.service", 1)); err != nil {
		t.Fatalf("Run: %v (reports %+v)", err, h.reports)
	}
	records, stale := recordFiles(t, h.p)
	want := "kube1-applied-config.json.20261201T120000Z"
	if strings.Join(records, " ") != "kube2-applied-config.json kube2-applied-config.json.sha256" ||
		strings.Join(stale, " ") != want+" "+want+".sha256" {
		t.Fatalf("host root %v, stale %v: want only kube2's record left, kube1's in the stale directory", records, stale)
	}
	moved, err := os.ReadFile(filepath.Join(StaleDir(h.p), want))
	if err != nil || !bytes.Equal(moved, old) {
		t.Errorf("the moved record differs from the one that was there (%v)", err)
	}
	if fi, err := os.Stat(StaleDir(h.p)); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("stale directory: %v %v, want 0700", fi.Mode(), err)
	}
	a, err := state.ReadActive(h.p)
	if err != nil || a == nil || a.Slot != "kube2" {
		t.Errorf("ReadActive after recovery: %+v, %v", a, err)
	}
	if !h.sd.Called("start " + DaemonUnit) {
		t.Errorf("calls %v: the daemon was not started", h.sd.CallList())
	}
	if h.sd.Called("enqueue " + unitnames.NodeTarget) {
		t.Errorf("calls %v: the running node's target was started again", h.sd.CallList())
	}
	if len(h.reports) != 1 {
		t.Fatalf("reports %+v", h.reports)
	}
	rep := h.reports[0]
	for _, w := range []string{"kube2's node runs (systemd-nspawn@kube2.service active)",
		"kube1's record did not describe a running node (systemd-nspawn@kube1.service inactive)",
		"moved /var/lib/unbounded/kube1-applied-config.json and its sidecar to /var/lib/unbounded/recover/stale/" + want,
		DaemonUnit + " was failed: started it"} {
		if !strings.Contains(rep.Message, w) {
			t.Errorf("report lacks %q:\n%s", w, rep.Message)
		}
	}
	if !rep.Repaired || rep.Reason != ReasonUnitFailed {
		t.Errorf("report %+v", rep)
	}
	if _, err := os.Stat(h.p.Ownership()); !os.IsNotExist(err) {
		t.Errorf("the lock was not released: %v", err)
	}
	// The same again within the same second: a name of its own, nothing
	// moved over the first.
	if err := state.WriteApplied(h.p, &state.AppliedConfig{Slot: "kube1", Mode: "nspawn", Machine: "m1"}); err != nil {
		t.Fatal(err)
	}
	if err := h.run(t, exited("unbounded-test.service", 1)); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if _, stale := recordFiles(t, h.p); strings.Join(stale, " ") != want+" "+want+"-2 "+want+"-2.sha256 "+want+".sha256" {
		t.Errorf("stale directory after a second move in the same second: %v", stale)
	}
}

// refused runs recovery on h and checks that it repaired nothing: not
// repaired, both records where they were, the daemon not started, and the
// message saying words.
func refused(t *testing.T, h *host, words ...string) {
	t.Helper()
	before, _ := recordFiles(t, h.p)
	err := h.run(t, exited("unbounded-test.service", 1))
	if !errors.Is(err, ErrUnrepaired) {
		t.Errorf("Run: %v, want ErrUnrepaired", err)
	}
	after, stale := recordFiles(t, h.p)
	if strings.Join(after, " ") != strings.Join(before, " ") || len(stale) != 0 {
		t.Errorf("records %v -> %v, stale %v: want nothing moved", before, after, stale)
	}
	if h.sd.Called("start " + DaemonUnit) {
		t.Errorf("calls %v: the daemon was started", h.sd.CallList())
	}
	if len(h.reports) != 1 {
		t.Fatalf("reports %+v", h.reports)
	}
	for _, w := range append(words, "NOT REPAIRED") {
		if !strings.Contains(h.reports[0].Message, w) {
			t.Errorf("report lacks %q:\n%s", w, h.reports[0].Message)
		}
	}
}

func TestTwoAppliedConfigsWithARepaveJournalAreLeftToTheRepave(t *testing.T) {
	for _, j := range RepaveJournals {
		t.Run(j, func(t *testing.T) {
			h := newHost(t)
			twoRecords(t, h, "kube2")
			if err := state.WriteJournal(h.p, j, map[string]string{"step": "switch"}); err != nil {
				t.Fatal(err)
			}
			refused(t, h, "/var/lib/unbounded/journal/"+j+".json", "`systemctl start unbounded-repave.service` finishes or rolls it back now",
				"the node that runs is slot kube2 (systemd-nspawn@kube2.service active)")
		})
	}
}

func TestTwoAppliedConfigsAreLeftAloneUnlessExactlyOneNodeRuns(t *testing.T) {
	t.Run("none", func(t *testing.T) {
		h := newHost(t)
		twoRecords(t, h)
		refused(t, h, "no slot's node runs (systemd-nspawn@kube1.service inactive, systemd-nspawn@kube2.service inactive), so recovery cannot tell which record describes the node and moves neither", "out of /var/lib/unbounded, then")
	})
	t.Run("both", func(t *testing.T) {
		h := newHost(t)
		twoRecords(t, h, "kube1", "kube2")
		refused(t, h, "both slots' nodes run (systemd-nspawn@kube1.service active, systemd-nspawn@kube2.service active)")
	})
	t.Run("mode none", func(t *testing.T) {
		h := newHost(t)
		for _, s := range hostpaths.Slots {
			if err := state.WriteApplied(h.p, &state.AppliedConfig{Slot: s, Mode: "none", Machine: "m1"}); err != nil {
				t.Fatal(err)
			}
		}
		h.sd.SetStatus(DaemonUnit, UnitStatus{LoadState: "loaded", ActiveState: "failed"})
		for _, u := range facts.Supervising("none", "kube1") {
			h.sd.SetStatus(u, UnitStatus{LoadState: "loaded", ActiveState: "active"})
		}
		refused(t, h, "in mode none both slots' records name the same units, which run (unbounded-containerd.service active, unbounded-kubelet.service active)")
	})
}

func TestARecordWhoseChecksumDoesNotMatchIsNotMovedAside(t *testing.T) {
	h := newHost(t)
	twoRecords(t, h, "kube2")
	rec := h.p.AppliedConfig("kube1")
	data, err := os.ReadFile(rec)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(rec, append(data, ' '), 0o600); err != nil {
		t.Fatal(err)
	}
	refused(t, h, "SHA-256 does not match", "the node that runs is slot kube2", "remove the record that does not describe the running node")
}

// The journal names recovery checks are the repave's own.
func TestRepaveJournalsAreTheRepavesNames(t *testing.T) {
	if strings.Join(RepaveJournals, " ") != lifecycle.RepaveJournal+" "+none.JournalName {
		t.Errorf("RepaveJournals %v, want [%s %s]", RepaveJournals, lifecycle.RepaveJournal, none.JournalName)
	}
}

// crashRootEnv names the host root of TestHelperRecoveryThatCrashes.
const crashRootEnv = "RECOVER_TEST_CRASH_ROOT"

// TestMain runs the package's tests, or, in the process that
// TestARecoveryKilledBetweenTheTwoRenamesIsFinishedByTheNext starts
// (crashRootEnv set), the recovery that crashes.
func TestMain(m *testing.M) {
	if root := os.Getenv(crashRootEnv); root != "" {
		recoveryThatCrashes(root)
	}
	os.Exit(m.Run())
}

// recoveryThatCrashes is the recovery that
// TestARecoveryKilledBetweenTheTwoRenamesIsFinishedByTheNext runs in a
// process of its own, so that its crash point kills it as a power cut
// would (no deferred release of the lock; the kernel drops the flock).
// Not killed, it exits 3 (the test wants SIGKILL).
func recoveryThatCrashes(root string) {
	h := &host{p: hostpaths.New(root), now: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC), sd: &unitstest.Fake{}}
	h.sd.SetStatus(DaemonUnit, UnitStatus{LoadState: "loaded", ActiveState: "failed"})
	h.sd.SetStatus("systemd-nspawn@kube2.service", UnitStatus{LoadState: "loaded", ActiveState: "active"})
	r := h.recovery(exited("unbounded-test.service", 1))
	err := r.Run(context.Background())
	fmt.Fprintf(os.Stderr, "recovery was not killed at %s: %v\n", CrashAfterSidecarMoved, err)
	os.Exit(3)
}

func TestARecoveryKilledBetweenTheTwoRenamesIsFinishedByTheNext(t *testing.T) {
	h := newHost(t)
	twoRecords(t, h, "kube2")
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), crashRootEnv+"="+h.p.Root, crashpoint.Env+"="+CrashAfterSidecarMoved)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("the crashing recovery ended with %v, want killed by SIGKILL:\n%s", err, out)
	}
	// What the crash left: kube1's record without its sidecar (corrupt to
	// every reader), the sidecar in the stale directory, recovery's
	// ownership record.
	records, stale := recordFiles(t, h.p)
	want := "kube1-applied-config.json.20261201T120000Z"
	if strings.Join(records, " ") != "kube1-applied-config.json kube2-applied-config.json kube2-applied-config.json.sha256" ||
		strings.Join(stale, " ") != want+".sha256" {
		t.Fatalf("after the crash: host root %v, stale %v", records, stale)
	}
	if _, err := state.ReadActive(h.p); !errors.Is(err, state.ErrCorrupt) {
		t.Fatalf("ReadActive after the crash: %v, want ErrCorrupt", err)
	}
	if own, _ := state.ReadOwnership(h.p); own == nil || own.Owner != Owner {
		t.Fatalf("ownership after the crash: %+v, want recovery's record", own)
	}
	// The next boot: the generator held the node back (recovery's
	// record), so nothing runs, and it pulls in recovery.
	h.sd.SetStatus("systemd-nspawn@kube2.service", UnitStatus{LoadState: "loaded", ActiveState: "inactive"})
	// The generator wrote its safe state: no link to the daemon; a
	// reload runs it again, and it links the daemon once the state reads
	// sound.
	link := h.p.Join("/run/systemd/generator/multi-user.target.wants/" + DaemonUnit)
	if err := os.Remove(link); err != nil {
		t.Fatal(err)
	}
	h.sd.OnReload = func() {
		if a, err := state.ReadActive(h.p); err == nil && a != nil {
			os.Symlink("/usr/lib/systemd/system/"+DaemonUnit, link)
		}
	}
	if err := h.run(t, Failure{Unit: GeneratorInstance}); err != nil {
		t.Fatalf("the next recovery: %v (reports %+v)", err, h.reports)
	}
	records, stale = recordFiles(t, h.p)
	if strings.Join(records, " ") != "kube2-applied-config.json kube2-applied-config.json.sha256" ||
		strings.Join(stale, " ") != want+" "+want+".sha256" {
		t.Fatalf("after the next recovery: host root %v, stale %v", records, stale)
	}
	if a, err := state.ReadActive(h.p); err != nil || a.Slot != "kube2" {
		t.Errorf("ReadActive: %+v %v", a, err)
	}
	// The interrupted recovery's record is taken over (a reload, a start
	// of the node target that still has nothing to start); once the move
	// is finished another reload pulls the node in, and its target is
	// started again.
	last := func(c string) int {
		n := -1
		for i, x := range h.sd.CallList() {
			if x == c {
				n = i
			}
		}
		return n
	}
	if r, e, d := last("reload"), last("enqueue "+unitnames.NodeTarget), last("start "+DaemonUnit); r < 0 || e < r || d < 0 ||
		strings.Count(strings.Join(h.sd.CallList(), ","), "enqueue "+unitnames.NodeTarget) != 2 {
		t.Errorf("calls %v: want the node target started after the reload that follows the move, and the daemon started", h.sd.CallList())
	}
	if _, err := os.Stat(h.p.Ownership()); !os.IsNotExist(err) {
		t.Errorf("ownership record: %v", err)
	}
	if len(h.reports) != 1 || !strings.Contains(h.reports[0].Message, "An earlier recovery was interrupted while it moved kube1's record aside") ||
		!strings.Contains(h.reports[0].Message, "to /var/lib/unbounded/recover/stale/"+want) {
		t.Errorf("reports %+v", h.reports)
	}
	// Once more: nothing left to move.
	h.now = h.now.Add(time.Hour)
	if err := h.run(t, exited("unbounded-test.service", 1)); err != nil {
		t.Fatal(err)
	}
	if r2, s2 := recordFiles(t, h.p); strings.Join(r2, " ") != strings.Join(records, " ") || strings.Join(s2, " ") != strings.Join(stale, " ") {
		t.Errorf("a third recovery changed the records: %v %v", r2, s2)
	}
}
