package system_test

import (
	"context"
	"os"
	"testing"
	"time"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/bootstrap"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/state"
)

// TestPowerCutsAtFirstBootsRecordLeaveOneRecordAndTheMachineSucceeded:
// the whole host loses power at the two moments of first boot's record
// where a half-done write could be left. Between the staged record pair
// and its renames: the next boot runs the node from the staged pair and
// puts it under its own name. Between the record and its Succeeded
// report: the Machine would say Running for good; the daemon of the next
// boot reports it. Each time: one valid record under its real name,
// nothing staged left, and the Machine Succeeded within a minute. Then,
// on the same host, the power cuts of its operations
// (powerCutsOfOperations): no outcome and no owed write is lost.
func TestPowerCutsAtFirstBootsRecordLeaveOneRecordAndTheMachineSucceeded(t *testing.T) {
	defer scenario(t)()
	f := newFirstBoot(t, firstBootOptions{})
	rec := f.paths.AppliedConfig("kube1")
	staged := []string{rec + ".next", hostpaths.Checksum(rec + ".next")}

	converged := func(when string) {
		t.Helper()
		cut := time.Now()
		waitUntil(t, time.Minute, when+": the Machine reports the bootstrap Succeeded", func(context.Context) (bool, error) {
			m := f.machine(t)
			return m.Status.Bootstrap != nil && m.Status.Bootstrap.State == v1alpha3.BootstrapSucceeded, nil
		})
		t.Logf("%s: Machine Succeeded %v after the boot", when, time.Since(cut).Round(time.Millisecond))
		f.wantBootstrapped(t, "nspawn", "systemd-nspawn@kube1.service")
		wantOneSlot(t, f)
		for _, p := range staged {
			if _, err := os.Lstat(p); !os.IsNotExist(err) {
				t.Errorf("%s: %s is left (%v)", when, f.paths.Rel(p), err)
			}
		}
		if _, err := state.ReadApplied(f.paths, "kube1"); err != nil {
			t.Errorf("%s: the record: %v", when, err)
		}
	}

	// 1. Cut after the staging, before the renames.
	setCrashPoint(t, f, bootstrapUnit, state.CrashAfterStagedApplied)
	f.m.Start()
	wantCrashedAt(t, f, bootstrapUnit, state.CrashAfterStagedApplied, waitUnitDone(t, f, bootstrapUnit, "", 8*time.Minute))
	if _, err := os.Stat(rec); !os.IsNotExist(err) {
		t.Fatalf("crashed after the staging, the record is under its name already (%v)", err)
	}
	for _, p := range staged {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("crashed after the staging: %v", err)
		}
	}
	setCrashPoint(t, f, bootstrapUnit, "")
	f.m.PowerCut()
	f.m.Start()
	converged("power cut between the staged record and its renames")
	if t.Failed() {
		return
	}

	// 2. Cut after the record, before its report: a reset, then the
	// bootstrap again (it reports Running first).
	if out, err := f.m.Run("unbounded", "reset", "--yes"); err != nil {
		t.Fatalf("unbounded reset --yes: %v\n%s", err, out)
	}
	startAndCrash(t, f, bootstrapUnit, bootstrap.CrashAfterApplied, 8*time.Minute)
	if m := f.machine(t); m.Status.Bootstrap == nil || m.Status.Bootstrap.State != v1alpha3.BootstrapRunning {
		t.Fatalf("crashed between the record and its report: Machine status.bootstrap %+v, want Running", m.Status.Bootstrap)
	}
	setCrashPoint(t, f, bootstrapUnit, "")
	f.m.PowerCut()
	f.m.Start()
	converged("power cut between the record and its report")
	if t.Failed() {
		return
	}

	// 3. The operations of the booted host (op_powercut_test.go).
	f.waitAgentCertificate(t)
	powerCutsOfOperations(t, f, f.runPod(t))
}
