package recovery

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/reprovision"
	"unbounded-cloud.io/agent/lib/state"
	"unbounded-cloud.io/agent/lib/unitjournal"
	"unbounded-cloud.io/agent/lib/units/unitstest"
)

// host is a bootstrapped host under a temporary root: an applied config
// for kube1, the daemon's executable, the generator's link to the daemon.
type host struct {
	p       hostpaths.Paths
	sd      *unitstest.Fake
	reports []Report
	now     time.Time
}

func newHost(t *testing.T) *host {
	t.Helper()
	p := hostpaths.New(t.TempDir())
	if err := os.MkdirAll(p.HostRoot(), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(p.RunDir(), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := state.WriteApplied(p, &state.AppliedConfig{Slot: "kube1", Mode: "nspawn", Machine: "m1"}); err != nil {
		t.Fatal(err)
	}
	bin := p.Libexec("daemon")
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, []byte("#!/bin/true\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	// What the generator needs to start the node and the daemon.
	for _, u := range []string{"unbounded-fence.service", "systemd-nspawn@.service"} {
		if err := os.MkdirAll(p.UnitDir(), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(p.UnitDir(), u), []byte("[Service]\nExecStart=/bin/true\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	link := p.Join("/run/systemd/generator/multi-user.target.wants/" + DaemonUnit)
	if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/usr/lib/systemd/system/"+DaemonUnit, link); err != nil {
		t.Fatal(err)
	}
	sd := &unitstest.Fake{}
	sd.SetStatus(DaemonUnit, UnitStatus{LoadState: "loaded", ActiveState: "active"})
	sd.SetStatus("unbounded-bootstrap.service", UnitStatus{LoadState: "loaded", ActiveState: "failed", Result: "exit-code", ExecMainCode: 1, ExecMainStatus: 1})
	return &host{
		p:   p,
		now: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC),
		sd:  sd,
	}
}

func (h *host) run(t *testing.T, f Failure) error {
	t.Helper()
	return h.recovery(f).Run(context.Background())
}

func (h *host) recovery(f Failure) *Recovery {
	return &Recovery{
		Paths:   h.p,
		Failure: f,
		Host: Host{
			Systemd: func(context.Context) (Systemd, error) { return h.sd, nil },
			Journal: func(_ context.Context, q unitjournal.Query) ([]string, error) {
				return []string{"line 1 of " + q.Unit, "bootstrap: artifact kubelet: checksum mismatch"}, nil
			},
			Report: func(_ context.Context, rep Report) error { h.reports = append(h.reports, rep); return nil },
			Now:    func() time.Time { return h.now },
		},
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
}

func exited(unit string, status int) Failure {
	return Failure{Unit: unit, Result: "exit-code", ExitCode: "exited", ExitStatus: fmt.Sprint(status)}
}

func TestExitsThatAreNotFailuresAreLeftAlone(t *testing.T) {
	for _, c := range []struct {
		name     string
		f        Failure
		subState string
	}{
		{"refused by the fence", exited("unbounded-fence.service", 77), "failed"},
		{"configuration invalid", exited("unbounded-daemon.service", 78), "failed"},
		{"deferred", exited("unbounded-reset.service", 69), "dead"},
		{"temporary and retried", exited("unbounded-bootstrap.service", 75), "auto-restart"},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHost(t)
			h.sd.SetStatus(DaemonUnit, UnitStatus{LoadState: "loaded", ActiveState: "inactive"})
			h.sd.SetStatus(c.f.Unit, UnitStatus{LoadState: "loaded", ActiveState: "failed", SubState: c.subState})
			if err := h.run(t, c.f); err != nil {
				t.Fatalf("Run: %v", err)
			}
			if len(h.reports) != 0 || len(h.sd.CallList()) != 0 {
				t.Errorf("reports %v, systemd calls %v: want none", h.reports, h.sd.CallList())
			}
			if _, err := os.Stat(h.p.Ownership()); !os.IsNotExist(err) {
				t.Errorf("ownership record: %v", err)
			}
		})
	}
}

func TestATemporaryFailureThatIsNotRetriedIsRecovered(t *testing.T) {
	h := newHost(t)
	h.sd.SetStatus("unbounded-bootstrap.service", UnitStatus{LoadState: "loaded", ActiveState: "failed", SubState: "failed"})
	if err := h.run(t, exited("unbounded-bootstrap.service", 75)); err != nil {
		t.Fatal(err)
	}
	if len(h.reports) != 1 {
		t.Fatalf("reports %v, want 1", h.reports)
	}
}

func TestAFailedUnitIsReportedWithItsResultAndLastLinesAndTheDaemonStarted(t *testing.T) {
	h := newHost(t)
	h.sd.SetStatus(DaemonUnit, UnitStatus{LoadState: "loaded", ActiveState: "failed"})
	if err := h.run(t, exited("unbounded-bootstrap.service", 1)); err != nil {
		t.Fatal(err)
	}
	if !h.sd.Called("reset-failed "+DaemonUnit) || !h.sd.Called("start "+DaemonUnit) {
		t.Errorf("systemd calls %v: want the failed daemon reset and started", h.sd.CallList())
	}
	if len(h.reports) != 1 {
		t.Fatalf("reports %v", h.reports)
	}
	rep := h.reports[0]
	text := rep.text(4096)
	for _, w := range []string{"unbounded-bootstrap.service failed", "result exit-code", "exit status 1", "checksum mismatch", DaemonUnit + " was failed: started it"} {
		if !strings.Contains(text, w) {
			t.Errorf("report lacks %q:\n%s", w, text)
		}
	}
	if rep.Reason != ReasonUnitFailed || !rep.Repaired {
		t.Errorf("reason %s repaired %v", rep.Reason, rep.Repaired)
	}
	if _, err := os.Stat(h.p.Ownership()); !os.IsNotExist(err) {
		t.Errorf("the lock was not released: %v", err)
	}
}

// A unit killed by SIGKILL (a crash point) is a failure: reported, never
// started again by recovery.
func TestAKilledUnitIsReportedAndNotStartedAgain(t *testing.T) {
	h := newHost(t)
	err := h.run(t, Failure{Unit: "unbounded-bootstrap.service", Result: "signal", ExitCode: "killed", ExitStatus: "KILL"})
	if err != nil {
		t.Fatal(err)
	}
	if h.sd.Called("start unbounded-bootstrap.service") {
		t.Errorf("recovery started the killed unit: %v", h.sd.CallList())
	}
	if len(h.reports) != 1 || !strings.Contains(h.reports[0].Message, "killed by SIGKILL") {
		t.Errorf("reports %+v", h.reports)
	}
}

func TestAHostOwnedByAnInstallationIsOnlyReported(t *testing.T) {
	h := newHost(t)
	lock, err := state.AcquireOwnership(h.p, "bootstrap", "unbounded-bootstrap.service")
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Release()
	h.sd.SetStatus(DaemonUnit, UnitStatus{LoadState: "loaded", ActiveState: "inactive"})
	err = h.run(t, Failure{Unit: "unbounded-bootstrap.service", Result: "signal", ExitCode: "killed", ExitStatus: "KILL"})
	if !errors.Is(err, state.ErrOwned) {
		t.Fatalf("Run: %v, want ErrOwned", err)
	}
	if h.sd.Called("start " + DaemonUnit) {
		t.Errorf("the daemon was started on an owned host: %v", h.sd.CallList())
	}
	if len(h.reports) != 1 || h.reports[0].Reason != ReasonDeferred {
		t.Errorf("reports %+v", h.reports)
	}
	own, _ := state.ReadOwnership(h.p)
	if own == nil || own.Owner != "bootstrap" {
		t.Errorf("ownership now %+v, want bootstrap's untouched", own)
	}
}

// A live reprovision handoff holds no lock, yet owns the host: the
// generator holds the daemon back while it runs. A failure of the
// isolation change that staged it (killed after the staging) is only
// reported, nothing is repaired (the system scenario found this
// recovery failing on the daemon the generator holds back).
func TestAHostUnderAReprovisionHandoffIsOnlyReported(t *testing.T) {
	h := newHost(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if err := reprovision.Stage(h.p, reprovision.Journal{FromMode: "nspawn", ToMode: "none", Machine: "m1", StartedAt: h.now, Deadline: h.now.Add(time.Hour)},
		json.RawMessage(`{}`), self); err != nil {
		t.Fatal(err)
	}
	h.sd.SetStatus(DaemonUnit, UnitStatus{LoadState: "loaded", ActiveState: "inactive"})
	err = h.run(t, Failure{Unit: "unbounded-isolation.service", Result: "signal", ExitCode: "killed", ExitStatus: "KILL"})
	if !errors.Is(err, state.ErrOwned) {
		t.Fatalf("Run: %v, want ErrOwned", err)
	}
	if h.sd.Called("start " + DaemonUnit) {
		t.Errorf("the daemon was started under a live handoff: %v", h.sd.CallList())
	}
	if len(h.reports) != 1 || h.reports[0].Reason != ReasonDeferred || !strings.Contains(h.reports[0].Message, "reprovision handoff") {
		t.Errorf("reports %+v", h.reports)
	}
	if _, err := os.Stat(filepath.Join(h.p.HostRoot(), "recover")); !os.IsNotExist(err) {
		t.Errorf("recovery wrote its history under a host root the handoff's reset removes (%v)", err)
	}
}

func TestAMaskedDaemonIsUnmaskedAndStarted(t *testing.T) {
	h := newHost(t)
	h.sd.SetStatus(DaemonUnit, UnitStatus{LoadState: "masked", ActiveState: "inactive"})
	if err := h.run(t, exited("unbounded-bootstrap.service", 1)); err != nil {
		t.Fatal(err)
	}
	if !h.sd.Called("unmask "+DaemonUnit) || !h.sd.Called("start "+DaemonUnit) {
		t.Errorf("calls %v", h.sd.CallList())
	}
}

func TestAGoneDaemonExecutableIsReportedAndNotRepaired(t *testing.T) {
	h := newHost(t)
	h.sd.SetStatus(DaemonUnit, UnitStatus{LoadState: "loaded", ActiveState: "failed"})
	if err := os.Remove(h.p.Libexec("daemon")); err != nil {
		t.Fatal(err)
	}
	err := h.run(t, exited("unbounded-daemon.service", 1))
	if !errors.Is(err, ErrUnrepaired) {
		t.Fatalf("Run: %v, want ErrUnrepaired", err)
	}
	if h.sd.Called("start " + DaemonUnit) {
		t.Errorf("started a daemon without its executable: %v", h.sd.CallList())
	}
	if len(h.reports) != 1 || h.reports[0].Reason != ReasonRepairFailed || !strings.Contains(h.reports[0].Message, "/usr/libexec/unbounded/daemon is gone") {
		t.Errorf("reports %+v", h.reports)
	}
}

func TestAUnitFailingInALoopIsRecoveredAtMostBurstTimesPerWindow(t *testing.T) {
	h := newHost(t)
	f := exited("unbounded-bootstrap.service", 1)
	for i := 0; i < 6; i++ {
		if err := h.run(t, f); err != nil {
			t.Fatal(err)
		}
		h.now = h.now.Add(time.Minute)
	}
	var failed, held int
	for _, r := range h.reports {
		switch r.Reason {
		case ReasonUnitFailed:
			failed++
		case ReasonHeldBack:
			held++
		}
	}
	if failed != DefaultLimit.Burst || held != 1 {
		t.Errorf("%d reports of the failure and %d of the hold-back, want %d and 1", failed, held, DefaultLimit.Burst)
	}
	// Another unit has its own budget; the same one, an hour later, again.
	if err := h.run(t, exited("unbounded-reset.service", 1)); err != nil {
		t.Fatal(err)
	}
	h.now = h.now.Add(time.Hour)
	n := len(h.reports)
	if err := h.run(t, f); err != nil {
		t.Fatal(err)
	}
	if len(h.reports) != n+1 || h.reports[n].Reason != ReasonUnitFailed {
		t.Errorf("after the window: %+v", h.reports[n:])
	}
}

func TestReportKeepsTheLastJournalLinesWhenCut(t *testing.T) {
	var lines []string
	for i := 0; i < 100; i++ {
		lines = append(lines, fmt.Sprintf("line %03d of a long failure", i))
	}
	got := Report{Unit: "u", Message: "u failed.", Lines: lines}.text(1024)
	if len(got) > 1024 || !strings.Contains(got, "line 099") || !strings.HasPrefix(got, "u failed.") {
		t.Errorf("text (%d bytes):\n%s", len(got), got)
	}
}

func TestADaemonTheGeneratorHoldsBackIsNotStarted(t *testing.T) {
	h := newHost(t)
	h.sd.SetStatus(DaemonUnit, UnitStatus{LoadState: "loaded", ActiveState: "inactive"})
	if err := os.Remove(filepath.Join(h.p.UnitDir(), "unbounded-fence.service")); err != nil {
		t.Fatal(err)
	}
	err := h.run(t, Failure{Unit: GeneratorInstance})
	if !errors.Is(err, ErrUnrepaired) {
		t.Fatalf("Run: %v", err)
	}
	if h.sd.Called("start "+DaemonUnit) || h.sd.Called("reload") {
		t.Errorf("calls %v: want neither a start of the daemon nor a reload", h.sd.CallList())
	}
	if len(h.reports) != 1 || !strings.Contains(h.reports[0].Message, "unbounded-fence.service") || !strings.Contains(h.reports[0].Message, "generator found") {
		t.Errorf("reports %+v", h.reports)
	}
}

// A recovery killed while it held the lock left its record: the generator
// held the node and the daemon back for it at boot and pulled in that
// recovery again, which takes the record over, removes it and starts what
// was held back.
func TestTheRecordOfAnInterruptedRecoveryIsTakenOverAndTheNodeStarted(t *testing.T) {
	h := newHost(t)
	rec := `{"owner":"recover","unit":"unbounded-recover@unbounded-bootstrap.service.service","since":"2026-12-01T11:00:00Z"}` + "\n"
	if err := state.WriteFileAtomic(h.p.Ownership(), []byte(rec), 0o644); err != nil {
		t.Fatal(err)
	}
	h.sd.SetStatus(DaemonUnit, UnitStatus{LoadState: "loaded", ActiveState: "inactive"})
	if err := h.run(t, Failure{Unit: "unbounded-bootstrap.service"}); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if _, err := os.Stat(h.p.Ownership()); !os.IsNotExist(err) {
		t.Errorf("ownership record still there: %v", err)
	}
	for _, c := range []string{"reload", "enqueue unbounded-node.target", "start " + DaemonUnit} {
		if !h.sd.Called(c) {
			t.Errorf("calls %v: want %q", h.sd.CallList(), c)
		}
	}
}
