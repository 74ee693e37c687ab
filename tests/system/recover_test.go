package system_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/kube"
	"unbounded-cloud.io/agent/lib/state"
)

// Recovery on a bootstrapped host (the first-boot fixture, nspawn): agent
// one-shots that fail start unbounded-recover@.service by themselves
// through OnFailure=, and recovery reports them on the Machine and repairs
// the daemon. The failing one-shots are the test's own units (named
// unbounded-test-*, with the OnFailure= line every agent service has): a
// shipped one-shot cannot be made to fail on purpose without changing what
// it does, and units/graph_test.go checks that every shipped service
// carries the line.

// recoverOf is the recovery instance systemd starts for unit.
func recoverOf(unit string) string { return "unbounded-recover@" + unit + ".service" }

// testOneShot is a oneshot that prints two lines and exits with code.
func testOneShot(code int) []byte {
	return fmt.Appendf(nil, `[Unit]
Description=recovery test one-shot (exit %d)
OnFailure=unbounded-recover@%%n.service
[Service]
Type=oneshot
ExecStart=/bin/sh -c 'echo "test one-shot: step 1 done"; echo "test one-shot: the disk is on fire (exit %d)" >&2; exit %d'
`, code, code, code)
}

// failAndRecover starts unit, which fails, and waits (bounded) until the
// recovery run that its failure started has finished; it returns that
// run's properties.
func failAndRecover(t *testing.T, f *firstBoot, unit string) map[string]string {
	t.Helper()
	rec := recoverOf(unit)
	before := showProps(t, f.m, rec, "InvocationID")["InvocationID"]
	begin := time.Now()
	if out, err := f.m.Systemctl("start", unit); err == nil {
		t.Fatalf("systemctl start %s succeeded; the test unit must fail:\n%s", unit, out)
	}
	var p map[string]string
	waitUntil(t, 2*time.Minute, "recovery of "+unit+" finished", func(context.Context) (bool, error) {
		p = showProps(t, f.m, rec, "InvocationID", "ActiveState", "Result", "ExecMainStatus")
		return p["InvocationID"] != "" && p["InvocationID"] != before && (p["ActiveState"] == "inactive" || p["ActiveState"] == "failed"), nil
	})
	t.Logf("%s failed and its recovery ran in %v: %v", unit, time.Since(begin).Round(time.Millisecond), p)
	return p
}

// recoveryEvents are the Events recovery recorded on the Machine about
// unit, oldest first.
func recoveryEvents(t *testing.T, f *firstBoot, unit string) []corev1.Event {
	t.Helper()
	l, err := f.env.kube.CoreV1().Events(metav1.NamespaceDefault).List(context.Background(),
		metav1.ListOptions{FieldSelector: "involvedObject.name=" + f.name})
	if err != nil {
		t.Fatalf("list events: %v", err)
	}
	var out []corev1.Event
	for _, e := range l.Items {
		if e.Source.Component == "unbounded-recover" && strings.HasPrefix(e.Message, unit+" failed") {
			out = append(out, e)
		}
	}
	return out
}

// recovered returns the Machine's Recovered condition (nil when unset).
func recovered(t *testing.T, f *firstBoot) *metav1.Condition {
	t.Helper()
	m := f.machine(t)
	for i := range m.Status.Conditions {
		if m.Status.Conditions[i].Type == v1alpha3.ConditionRecovered {
			return &m.Status.Conditions[i]
		}
	}
	return nil
}

func wantSays(t *testing.T, what, text string, words ...string) {
	t.Helper()
	for _, w := range words {
		if !strings.Contains(text, w) {
			t.Errorf("%s does not say %q:\n%s", what, w, text)
		}
	}
}

func TestRecoveryReportsAFailedOneShotAndRepairsTheDaemon(t *testing.T) {
	defer scenario(t)()
	f := newFirstBoot(t, firstBootOptions{})
	units := map[string]int{
		"unbounded-test-fails.service":    1,
		"unbounded-test-refused.service":  77,
		"unbounded-test-invalid.service":  78,
		"unbounded-test-disabled.service": 1,
		"unbounded-test-masked.service":   1,
		"unbounded-test-nobinary.service": 1,
		"unbounded-test-flapping.service": 1,
		"unbounded-test-stale.service":    1,
		"unbounded-test-crash.service":    1,
		"unbounded-test-resume.service":   1,
	}
	for u, code := range units {
		f.m.WriteFile("/etc/systemd/system/"+u, testOneShot(code), 0o644)
	}
	// Killed by SIGKILL, as a crash point or the OOM killer does it ("$$$$"
	// is the shell's "$$" in a unit file).
	f.m.WriteFile("/etc/systemd/system/unbounded-test-killed.service", []byte(`[Unit]
Description=recovery test one-shot (SIGKILL)
OnFailure=unbounded-recover@%n.service
[Service]
Type=oneshot
ExecStart=/bin/sh -c 'echo "test one-shot: about to be killed"; kill -9 $$$$'
`), 0o644)
	// A temporary failure (75) that the unit retries, then a success.
	f.m.WriteFile("/etc/systemd/system/unbounded-test-retried.service", []byte(`[Unit]
Description=recovery test one-shot (75 once, retried)
OnFailure=unbounded-recover@%n.service
StartLimitIntervalSec=0
[Service]
Type=oneshot
Restart=on-failure
RestartSec=100ms
ExecStart=/bin/sh -c 'if [ -e /run/test-retried ]; then exit 0; fi; touch /run/test-retried; exit 75'
`), 0o644)
	begin := time.Now()
	f.m.Start()
	waitUntil(t, 8*time.Minute, "bootstrap finished and the daemon active", func(context.Context) (bool, error) {
		p := showProps(t, f.m, bootstrapUnit, "ActiveState", "ExecMainStatus", "InvocationID")
		if p["ActiveState"] == "failed" {
			return false, fmt.Errorf("bootstrap failed: %v\n%s", p, f.m.Journal(bootstrapUnit))
		}
		return p["InvocationID"] != "" && p["ActiveState"] == "inactive" && isActive(f.m, "unbounded-daemon.service") == "active", nil
	})
	t.Logf("first boot to the daemon active: %v", time.Since(begin).Round(time.Millisecond))
	// The Recovered condition is written with the agent's client
	// certificate (the cluster keeps the bootstrap token to the
	// bootstrap's conditions), which each recovery run loads from the
	// host's certificate store: approve the daemon's CSR, as the cluster
	// side does, and wait until the store holds a certificate that
	// recovery would use (this Machine's identity, unexpired).
	approveAgentCSR(t, f.env, f.m, f.name)
	store := kube.CertStore{Dir: f.paths.PKIDir()}
	waitUntil(t, 2*time.Minute, "the daemon's certificate stored in "+store.Dir, func(context.Context) (bool, error) {
		pair, err := store.Load()
		if err != nil {
			return false, nil // not stored yet
		}
		return kube.CheckIdentity(pair.Cert, f.name) == nil && time.Now().Before(pair.Cert.NotAfter), nil
	})

	t.Run("AFailedOneShotIsReportedWithItsResultAndLastLines", func(t *testing.T) {
		u := "unbounded-test-fails.service"
		p := failAndRecover(t, f, u)
		if p["Result"] != "success" {
			t.Errorf("recovery: %v\n%s", p, f.m.Journal(recoverOf(u)))
		}
		c := recovered(t, f)
		if c == nil || c.Status != metav1.ConditionTrue || c.Reason != "UnitFailed" {
			t.Fatalf("Machine condition Recovered = %+v, want True UnitFailed", c)
		}
		t.Logf("Recovered=%s %s: %s", c.Status, c.Reason, c.Message)
		wantSays(t, "the Recovered condition", c.Message, u+" failed", "result exit-code", "exit status 1",
			"the disk is on fire (exit 1)", "unbounded-daemon.service runs")
		if !strings.Contains(c.Message, "the disk is on fire") {
			// Where the line went: its fields as journald stored them.
			out, err := f.m.Run("journalctl", "--no-pager", "-o", "verbose", "-g", "disk is on fire|step 1 done")
			t.Logf("the failed unit's own lines in the journal (%v):\n%s", err, out)
			out, _ = f.m.Run("systemctl", "show", "-p", "InactiveExitTimestamp,ExecMainPID,ExecMainStartTimestamp,InvocationID", u)
			t.Logf("%s", out)
		}
		ev := recoveryEvents(t, f, u)
		if len(ev) != 1 || ev[0].Type != corev1.EventTypeWarning || ev[0].Reason != "UnitFailed" {
			t.Fatalf("recovery's Events about %s: %+v, want one Warning UnitFailed", u, ev)
		}
		wantSays(t, "the Event", ev[0].Message, "result exit-code", "exit status 1", "the disk is on fire (exit 1)")
		wantSays(t, "recovery's journal", f.m.Journal(recoverOf(u)), "recovery reported on the Machine")
		assertNoSandboxDenials(t, f.m, recoverOf(u))
	})

	t.Run("ExitsSeventySevenAndSeventyEightAreNotReported", func(t *testing.T) {
		for _, u := range []string{"unbounded-test-refused.service", "unbounded-test-invalid.service"} {
			p := failAndRecover(t, f, u)
			if p["Result"] != "success" {
				t.Errorf("recovery of %s: %v", u, p)
			}
			wantSays(t, "recovery's journal", f.m.Journal(recoverOf(u)), "nothing to recover")
			if ev := recoveryEvents(t, f, u); len(ev) != 0 {
				t.Errorf("recovery reported %s: %+v", u, ev)
			}
			if c := recovered(t, f); c != nil && strings.Contains(c.Message, u) {
				t.Errorf("the Recovered condition names %s: %s", u, c.Message)
			}
		}
	})

	t.Run("ATemporaryFailureTheUnitRetriesStartsNoRecovery", func(t *testing.T) {
		u := "unbounded-test-retried.service"
		// The start job of a oneshot fails with its first run; systemd
		// then restarts the unit (auto-restart) on its own.
		out, err := f.m.Systemctl("start", u)
		t.Logf("systemctl start %s: %v %s", u, err, out)
		// (NRestarts is back at 0 once the restarted run succeeded: the
		// journal says that the restart happened.)
		waitUntil(t, time.Minute, u+" retried and succeeded", func(context.Context) (bool, error) {
			p := showProps(t, f.m, u, "Result", "ActiveState")
			return p["Result"] == "success" && p["ActiveState"] == "inactive" &&
				strings.Contains(f.m.Journal(u), "Scheduled restart job"), nil
		})
		if p := showProps(t, f.m, recoverOf(u), "InvocationID"); p["InvocationID"] != "" {
			t.Errorf("recovery ran for a 75 the unit retried:\n%s", f.m.Journal(recoverOf(u)))
		}
	})

	t.Run("AKilledOneShotIsReportedAndNotStartedAgain", func(t *testing.T) {
		u := "unbounded-test-killed.service"
		p := failAndRecover(t, f, u)
		if p["Result"] != "success" {
			t.Errorf("recovery: %v\n%s", p, f.m.Journal(recoverOf(u)))
		}
		if s := showProps(t, f.m, u, "ActiveState", "NRestarts"); s["ActiveState"] != "failed" || s["NRestarts"] != "0" {
			t.Errorf("%s after recovery: %v, want still failed, never started again", u, s)
		}
		ev := recoveryEvents(t, f, u)
		if len(ev) != 1 {
			t.Fatalf("Events about %s: %+v", u, ev)
		}
		wantSays(t, "the Event", ev[0].Message, "result signal", "killed by SIGKILL", "its next run finishes or rolls back its work", "about to be killed")
	})

	t.Run("AStoppedAndDisabledDaemonIsStartedAgain", func(t *testing.T) {
		out, err := f.m.Systemctl("disable", "--now", "unbounded-daemon.service")
		t.Logf("systemctl disable --now unbounded-daemon.service: %v %s", err, out)
		if a := isActive(f.m, "unbounded-daemon.service"); a == "active" {
			t.Fatalf("the daemon is still %s", a)
		}
		u := "unbounded-test-disabled.service"
		failAndRecover(t, f, u)
		if a := isActive(f.m, "unbounded-daemon.service"); a != "active" {
			t.Errorf("the daemon is %s after recovery, want active\n%s", a, f.m.Journal(recoverOf(u)))
		}
		c := recovered(t, f)
		if c == nil || c.Status != metav1.ConditionTrue {
			t.Fatalf("Recovered = %+v", c)
		}
		wantSays(t, "the Recovered condition", c.Message, u+" failed", "unbounded-daemon.service was inactive: started it")
	})

	t.Run("AMaskedDaemonIsUnmaskedAndStarted", func(t *testing.T) {
		if out, err := f.m.Systemctl("mask", "--now", "unbounded-daemon.service"); err != nil {
			t.Fatalf("mask: %v %s", err, out)
		}
		u := "unbounded-test-masked.service"
		failAndRecover(t, f, u)
		if s := f.m.UnitState("unbounded-daemon.service"); s.ActiveState != "active" || s.LoadState != "loaded" {
			t.Errorf("the daemon is %s after recovery, want loaded and active\n%s", s, f.m.Journal(recoverOf(u)))
		}
		c := recovered(t, f)
		if c == nil || c.Status != metav1.ConditionTrue {
			t.Fatalf("Recovered = %+v", c)
		}
		wantSays(t, "the Recovered condition", c.Message, "unbounded-daemon.service was masked: unmasked it", "started it")
	})

	t.Run("AMissingDaemonExecutableIsReportedAsNotRepaired", func(t *testing.T) {
		bin := f.paths.Libexec("daemon")
		link, err := os.Readlink(bin)
		if err != nil {
			t.Fatalf("the package's %s: %v", f.paths.Rel(bin), err)
		}
		if out, err := f.m.Systemctl("stop", "unbounded-daemon.service"); err != nil {
			t.Fatalf("stop: %v %s", err, out)
		}
		if err := os.Remove(bin); err != nil {
			t.Fatal(err)
		}
		defer func() {
			os.Symlink(link, bin)
			f.m.Systemctl("start", "unbounded-daemon.service")
		}()
		u := "unbounded-test-nobinary.service"
		p := failAndRecover(t, f, u)
		if p["Result"] != "exit-code" || p["ExecMainStatus"] != "1" {
			t.Errorf("recovery that cannot repair: %v, want failed with exit status 1", p)
		}
		if a := isActive(f.m, "unbounded-daemon.service"); a == "active" {
			t.Errorf("the daemon is %s without its executable", a)
		}
		c := recovered(t, f)
		if c == nil || c.Status != metav1.ConditionFalse || c.Reason != "RepairFailed" {
			t.Fatalf("Recovered = %+v, want False RepairFailed", c)
		}
		wantSays(t, "the Recovered condition", c.Message, u+" failed", "/usr/libexec/unbounded/daemon is gone", "reinstall the unbounded-agent package")
		wantSays(t, "recovery's journal", f.m.Journal(recoverOf(u)), "NOT REPAIRED", "/usr/libexec/unbounded/daemon is gone")
		if ev := recoveryEvents(t, f, u); len(ev) != 1 || ev[0].Reason != "RepairFailed" {
			t.Errorf("Events: %+v", ev)
		}
	})

	t.Run("AUnitFailingInALoopIsRecoveredAtMostThreeTimes", func(t *testing.T) {
		u := "unbounded-test-flapping.service"
		for i := 0; i < 5; i++ {
			failAndRecover(t, f, u)
		}
		var failed, held int
		for _, e := range recoveryEvents(t, f, u) {
			switch e.Reason {
			case "UnitFailed":
				failed++
			case "RecoveryHeldBack":
				held++
			}
		}
		if failed != 3 || held != 1 {
			t.Errorf("%d reports of the failure and %d of the hold-back after 5 failures, want 3 and 1", failed, held)
		}
		// The run's end is systemd's; its last lines reach the journal
		// through journald's stream a moment later (CI-5 read the journal
		// before the fifth run's line was in it): waited for, bounded.
		var j string
		n := 0
		err := wait.PollUntilContextTimeout(context.Background(), 250*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
			j = f.m.Journal(recoverOf(u))
			n = strings.Count(j, "Recovery held back: 3 recoveries of "+u)
			return n >= 2, nil
		})
		if n != 2 {
			t.Errorf("recovery said it held back %d times, want 2 (%v):\n%s", n, err, j)
		}
	})

	// Both slots have a valid applied record and no journal says which
	// runs (a record restored by hand, say): the daemon cannot read its
	// config. Recovery asks the mode which node runs and moves the other
	// record aside, then starts the daemon.
	t.Run("TwoAppliedConfigsTheRecordOfTheSlotThatDoesNotRunIsMovedAside", func(t *testing.T) {
		active, err := state.ReadActive(f.paths)
		if err != nil || active == nil {
			t.Fatalf("the active record: %+v %v", active, err)
		}
		other := "kube2"
		if active.Slot == other {
			other = "kube1"
		}
		// Health reads the applied state every 30 s; its failure would
		// start a recovery of its own that races this one (the same move,
		// reported under another unit). Held off for the subtest.
		for _, u := range []string{"unbounded-health.timer", "unbounded-health.service"} {
			if out, err := f.m.Systemctl("stop", u); err != nil {
				t.Fatalf("stop %s: %v %s", u, err, out)
			}
		}
		defer f.m.Systemctl("start", "unbounded-health.timer")
		if out, err := f.m.Systemctl("stop", "unbounded-daemon.service"); err != nil {
			t.Fatalf("stop the daemon: %v %s", err, out)
		}
		// The active record's JSON with the other slot's name, and a
		// sidecar in sha256sum's format, as lib/state writes them.
		file := f.paths.AppliedConfig(other)
		secondRecord := func(note string) []byte {
			data, err := os.ReadFile(f.paths.AppliedConfig(active.Slot))
			if err != nil {
				t.Fatal(err)
			}
			var rec map[string]any
			if err := json.Unmarshal(data, &rec); err != nil {
				t.Fatal(err)
			}
			rec["slot"] = other
			rec["agent-version"] = note
			data, err = json.MarshalIndent(rec, "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			data = append(data, '\n')
			if err := os.WriteFile(file, data, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(hostpaths.Checksum(file), state.ChecksumLine(data, filepath.Base(file)), 0o600); err != nil {
				t.Fatal(err)
			}
			return data
		}
		data := secondRecord("restored by hand")
		if _, err := state.ReadActive(f.paths); err == nil {
			t.Fatalf("two valid records read as one active config: the scenario is not set up")
		}
		if out, err := f.m.Run("unbounded", "status"); err == nil {
			t.Logf("unbounded status with two records succeeded:\n%s", out)
		}
		u := "unbounded-test-stale.service"
		p := failAndRecover(t, f, u)
		if p["Result"] != "success" {
			t.Errorf("recovery: %v\n%s", p, f.m.Journal(recoverOf(u)))
		}
		stale := filepath.Join(f.paths.HostRoot(), "recover", "stale")
		moved, _ := filepath.Glob(filepath.Join(stale, filepath.Base(file)+".*"))
		if len(moved) != 2 || !strings.HasSuffix(moved[1], ".sha256") || moved[1] != hostpaths.Checksum(moved[0]) {
			t.Fatalf("the stale directory holds %v, want %s's record and its sidecar\n%s", moved, other, f.m.Journal(recoverOf(u)))
		}
		if got, err := os.ReadFile(moved[0]); err != nil || string(got) != string(data) {
			t.Errorf("the moved record is not the one written (%v)", err)
		}
		if fi, err := os.Stat(stale); err != nil || fi.Mode().Perm() != 0o700 {
			t.Errorf("%s: %v %v, want mode 0700", f.paths.Rel(stale), fi.Mode(), err)
		}
		for _, gone := range []string{file, hostpaths.Checksum(file)} {
			if _, err := os.Lstat(gone); !os.IsNotExist(err) {
				t.Errorf("%s is still there (%v)", f.paths.Rel(gone), err)
			}
		}
		if a, err := state.ReadActive(f.paths); err != nil || a == nil || a.Slot != active.Slot {
			t.Errorf("the applied state after recovery: %+v %v, want %s's", a, err, active.Slot)
		}
		if out, err := f.m.Run("unbounded", "status"); err != nil || !strings.Contains(out, active.Slot) {
			t.Errorf("unbounded status after recovery: %v\n%s", err, out)
		}
		if a := isActive(f.m, "unbounded-daemon.service"); a != "active" {
			t.Errorf("the daemon is %s after recovery, want active\n%s", a, f.m.Journal(recoverOf(u)))
		}
		c := recovered(t, f)
		if c == nil || c.Status != metav1.ConditionTrue || c.Reason != "UnitFailed" {
			t.Fatalf("Recovered = %+v, want True UnitFailed", c)
		}
		t.Logf("Recovered=%s %s: %s", c.Status, c.Reason, c.Message)
		movedSays := fmt.Sprintf("moved %s and its sidecar to %s", hostpaths.New("").AppliedConfig(other), f.paths.Rel(moved[0]))
		// The move is the first recovery's that sees the two records: the
		// test unit's, unless another agent unit failed on them first (a
		// unit this test stops in the middle of its run can: its recovery
		// then does the move and reports it, and the test unit's finds
		// the daemon running). Either way it is reported once, on the
		// Machine, by the recovery that did it.
		mover, msg := u, c.Message
		if !strings.Contains(c.Message, movedSays) {
			l, err := f.env.kube.CoreV1().Events(metav1.NamespaceDefault).List(context.Background(),
				metav1.ListOptions{FieldSelector: "involvedObject.name=" + f.name})
			if err != nil {
				t.Fatalf("list events: %v", err)
			}
			for _, e := range l.Items {
				if e.Source.Component == "unbounded-recover" && strings.Contains(e.Message, movedSays) {
					mover, _, _ = strings.Cut(e.Message, " failed")
					mover, msg = strings.TrimSpace(mover), e.Message
				}
			}
			ul, _ := f.m.Run("systemctl", "list-units", "--all", "--no-legend", "unbounded-recover@*")
			t.Logf("the move was reported by the recovery of %s, not of %s; recovery units:\n%s\n%s", mover, u, ul, f.m.Journal(recoverOf(mover)))
		}
		wantSays(t, "the report of the move", msg, mover+" failed",
			fmt.Sprintf("%s's node runs (systemd-nspawn@%s.service active)", active.Slot, active.Slot),
			fmt.Sprintf("%s's record did not describe a running node", other),
			movedSays)
		if mover == u {
			wantSays(t, "the Recovered condition", msg, "unbounded-daemon.service was inactive: started it")
		}
		wantSays(t, "recovery's journal", f.m.Journal(recoverOf(mover)), "moved a stale applied record aside")
		assertNoSandboxDenials(t, f.m, recoverOf(u))

		// Again, and recovery killed between its two renames (the
		// sidecar moved, the record not yet): the record without its
		// sidecar reads as corrupt, recovery's ownership record stays;
		// the next recovery takes that over and finishes the move.
		if out, err := f.m.Systemctl("stop", "unbounded-daemon.service"); err != nil {
			t.Fatalf("stop the daemon: %v %s", err, out)
		}
		data = secondRecord("restored by hand, twice")
		if out, err := f.m.Systemctl("set-environment", "UNBOUNDED_CRASHPOINT=recover/after-sidecar-moved"); err != nil {
			t.Fatalf("set-environment: %v %s", err, out)
		}
		u = "unbounded-test-crash.service"
		p = failAndRecover(t, f, u)
		if out, err := f.m.Systemctl("unset-environment", "UNBOUNDED_CRASHPOINT"); err != nil {
			t.Fatalf("unset-environment: %v %s", err, out)
		}
		if p["Result"] != "signal" {
			t.Errorf("recovery with the crash point: %v, want killed\n%s", p, f.m.Journal(recoverOf(u)))
		}
		if _, err := os.Lstat(file); err != nil {
			t.Errorf("after the crash %s is gone (%v), want it there without its sidecar", f.paths.Rel(file), err)
		}
		if _, err := os.Lstat(hostpaths.Checksum(file)); !os.IsNotExist(err) {
			t.Errorf("after the crash the sidecar is still in the host root (%v)", err)
		}
		if own, err := state.ReadOwnership(f.paths); own == nil || own.Owner != "recover" {
			t.Errorf("after the crash the ownership record is %+v (%v), want recovery's", own, err)
		}
		u = "unbounded-test-resume.service"
		p = failAndRecover(t, f, u)
		if p["Result"] != "success" {
			t.Errorf("the recovery after the crash: %v\n%s", p, f.m.Journal(recoverOf(u)))
		}
		moved, _ = filepath.Glob(filepath.Join(stale, filepath.Base(file)+".*"))
		if len(moved) != 4 {
			t.Fatalf("the stale directory holds %v, want two records with their sidecars\n%s", moved, f.m.Journal(recoverOf(u)))
		}
		var second string
		for _, m := range moved {
			if got, err := os.ReadFile(m); err == nil && string(got) == string(data) {
				second = m
			}
		}
		if second == "" || !slices.Contains(moved, hostpaths.Checksum(second)) {
			t.Errorf("the second record is not in the stale directory with its sidecar: %v", moved)
		}
		for _, gone := range []string{file, hostpaths.Checksum(file), f.paths.Ownership()} {
			if _, err := os.Lstat(gone); !os.IsNotExist(err) {
				t.Errorf("%s is still there (%v)", f.paths.Rel(gone), err)
			}
		}
		if a := isActive(f.m, "unbounded-daemon.service"); a != "active" {
			t.Errorf("the daemon is %s after the second recovery, want active\n%s", a, f.m.Journal(recoverOf(u)))
		}
		c = recovered(t, f)
		if c == nil || c.Status != metav1.ConditionTrue {
			t.Fatalf("Recovered = %+v", c)
		}
		t.Logf("Recovered=%s %s: %s", c.Status, c.Reason, c.Message)
		wantSays(t, "the Recovered condition", c.Message, u+" failed",
			"Removed the ownership record an interrupted recovery left",
			fmt.Sprintf("An earlier recovery was interrupted while it moved %s's record aside", other),
			"unbounded-daemon.service was inactive: started it")
	})

	if _, err := os.Stat(f.paths.Ownership()); !os.IsNotExist(err) {
		t.Errorf("recovery left the ownership record (%v)", err)
	}

	// The applied record no longer matches its checksum (a torn or
	// tampered write): at the next boot the generator starts neither the
	// node nor the daemon and pulls in recovery, which cannot guess which
	// node to run and says so on the Machine.
	t.Run("CorruptStateAtBootIsReportedByTheGeneratorsRecovery", func(t *testing.T) {
		record := f.paths.AppliedConfig("kube1")
		data, err := os.ReadFile(record)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(record, append(data, ' '), 0o600); err != nil {
			t.Fatal(err)
		}
		begin := time.Now()
		f.m.Reboot()
		t.Logf("reboot: %v", time.Since(begin).Round(time.Millisecond))
		rec := "unbounded-recover@generator.service"
		p := waitFinished(t, f.m, rec, "Result", "ExecMainStatus")
		if p["Result"] != "exit-code" || p["ExecMainStatus"] != "1" {
			t.Errorf("%s: %v, want failed with 1 (nothing it may repair)\n%s", rec, p, f.m.Journal(rec))
		}
		for _, u := range []string{"unbounded-node.target", "systemd-nspawn@kube1.service", "unbounded-daemon.service"} {
			if a := isActive(f.m, u); a == "active" || a == "activating" {
				t.Errorf("%s is %s on a host whose state is corrupt", u, a)
			}
		}
		c := recovered(t, f)
		if c == nil || c.Status != metav1.ConditionFalse || c.Reason != "RepairFailed" {
			t.Fatalf("Recovered = %+v, want False RepairFailed", c)
		}
		wantSays(t, "the Recovered condition", c.Message, "the generator found this host's state unusable",
			hostpaths.New("").AppliedConfig("kube1"), "NOT REPAIRED")
		l, err := f.env.kube.CoreV1().Events(metav1.NamespaceDefault).List(context.Background(),
			metav1.ListOptions{FieldSelector: "involvedObject.name=" + f.name})
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, e := range l.Items {
			if e.Source.Component == "unbounded-recover" && strings.HasPrefix(e.Message, "the generator found") {
				n++
			}
		}
		if n != 1 {
			t.Errorf("%d Events from the generator's recovery, want 1", n)
		}
		assertNoSandboxDenials(t, f.m, rec)
	})
}
