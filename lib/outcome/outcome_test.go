package outcome

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/state"
)

func paths(t *testing.T) hostpaths.Paths {
	t.Helper()
	p := hostpaths.New(t.TempDir())
	if err := os.MkdirAll(p.HostRoot(), 0o700); err != nil {
		t.Fatal(err)
	}
	return p
}

var t0 = time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)

func TestWriteThenReadIsTheRecordAndRemoveLeavesNone(t *testing.T) {
	p := paths(t)
	r := Record{Concern: Repave, UID: "op-uid", Operation: "op", Generation: 7, State: Failed, Reason: "HealthCheckFailed",
		Step: "healthy", Message: "kubelet never Ready", From: "a", To: "b", StartedAt: t0, Time: t0.Add(time.Minute)}
	if err := Write(p, r); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(p.Outcome(Repave))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the record %v %v: want a 0600 file", fi, err)
	}
	got, err := Read(p, Repave)
	if err != nil || got == nil || *got != r {
		t.Fatalf("Read = %+v, %v; want %+v", got, err, r)
	}
	if err := Remove(p, Repave); err != nil {
		t.Fatal(err)
	}
	if got, err := Read(p, Repave); got != nil || err != nil {
		t.Fatalf("after Remove: %+v, %v", got, err)
	}
	if err := Remove(p, Repave); err != nil {
		t.Fatalf("removing what is not there: %v", err)
	}
}

func TestWriteRefusesWhatIsNotARecord(t *testing.T) {
	p := paths(t)
	for _, r := range []Record{
		{Concern: "", State: Succeeded},
		{Concern: "../x", State: Succeeded},
		{Concern: "Upgrade", State: Succeeded},
		{Concern: Upgrade, State: "Running"},
	} {
		if err := Write(p, r); err == nil {
			t.Errorf("Write(%+v) accepted it", r)
		}
	}
	if ents, _ := os.ReadDir(p.OutcomeDir()); len(ents) != 0 {
		t.Errorf("a refused record left %v", ents)
	}
}

func TestALongMessageIsCutOnARuneBoundary(t *testing.T) {
	p := paths(t)
	msg := strings.Repeat("é", MaxMessage)
	if err := Write(p, Record{Concern: Bootstrap, State: Failed, Message: msg, Time: t0}); err != nil {
		t.Fatal(err)
	}
	got, err := Read(p, Bootstrap)
	if err != nil || len(got.Message) > MaxMessage || !strings.HasSuffix(got.Message, "…") || !json.Valid([]byte(`"`+got.Message+`"`)) {
		t.Fatalf("message of %d bytes (%v): want at most %d, cut with an ellipsis", len(got.Message), err, MaxMessage)
	}
}

// An older build's upgrade one-shot writes only failed.json or
// upgraded.json: the record is the newest of what is there, and a
// removal removes them all.
func TestReadTakesTheNewestOfTheRecordAndAnOlderBuildsSignals(t *testing.T) {
	p := paths(t)
	old := Record{Concern: Upgrade, UID: "op-1", State: Failed, Reason: ReasonRolledBack, Step: "activate", Message: "daemon never came up",
		From: "1.0.0", To: "1.1.0", Time: t0}
	if err := Write(p, old); err != nil {
		t.Fatal(err)
	}
	// Then an older build (rolled back to) upgrades again, successfully,
	// and writes only its signal.
	writeJSON(t, p.UpgradeSucceeded(), UpgradeSucceeded{UID: "op-2", Operation: "up-2", From: "1.0.0", To: "1.2.0", At: t0.Add(time.Hour)})
	got, err := Read(p, Upgrade)
	if err != nil || got == nil || got.State != Succeeded || got.UID != "op-2" || got.To != "1.2.0" || !got.Time.Equal(t0.Add(time.Hour)) {
		t.Fatalf("Read = %+v, %v; want the older build's later success", got, err)
	}
	if err := Remove(p, Upgrade); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{p.Outcome(Upgrade), p.UpgradeSucceeded(), p.UpgradeFailed()} {
		if _, err := os.Lstat(f); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s after Remove: %v", f, err)
		}
	}
}

func TestAnOlderBuildsFailureSignalReadsAsAFailedRecord(t *testing.T) {
	p := paths(t)
	writeJSON(t, p.UpgradeFailed(), UpgradeFailed{UID: "op-1", From: "1.0.0", To: "1.1.0", Step: "activate", Message: "m", RolledBack: true, At: t0})
	got, err := Read(p, Upgrade)
	if err != nil || got == nil || got.State != Failed || !got.RolledBack() || got.Step != "activate" || got.Concern != Upgrade {
		t.Fatalf("Read = %+v, %v", got, err)
	}
}

func TestAnOlderBuildsIsolationOutcomeReadsAndGoesWithTheRecord(t *testing.T) {
	p := paths(t)
	data, _ := json.Marshal(isolationOutcome{From: "nspawn", To: "none", Method: "InPlace", State: "Succeeded", StartedAt: t0, EndedAt: t0.Add(time.Minute), Message: "ok"})
	if err := state.WriteVerified(p.LegacyIsolationOutcome(), data, 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := Read(p, Isolation)
	want := Record{Concern: Isolation, State: Succeeded, Message: "ok", From: "nspawn", To: "none", Method: "InPlace", StartedAt: t0, Time: t0.Add(time.Minute)}
	if err != nil || got == nil || *got != want {
		t.Fatalf("Read = %+v, %v; want %+v", got, err, want)
	}
	list, err := List(p)
	if err != nil || len(list) != 1 || list[0] != want {
		t.Fatalf("List = %+v, %v", list, err)
	}
	if err := Remove(p, Isolation); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(hostpaths.Checksum(p.LegacyIsolationOutcome())); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the older record's sidecar after Remove: %v", err)
	}
}

func TestWriteLegacyUpgradeWritesTheOneSignalAnOlderDaemonReads(t *testing.T) {
	p := paths(t)
	ok := Record{Concern: Upgrade, UID: "op-1", State: Succeeded, From: "1.0.0", To: "1.1.0", Time: t0}
	if err := WriteLegacyUpgrade(p, ok); err != nil {
		t.Fatal(err)
	}
	var u UpgradeSucceeded
	if found, err := state.ReadRecord(p.UpgradeSucceeded(), 1<<16, &u); !found || err != nil || u.UID != "op-1" || u.To != "1.1.0" {
		t.Fatalf("upgraded.json %+v %v %v", u, found, err)
	}
	bad := Record{Concern: Upgrade, UID: "op-2", State: Failed, Reason: ReasonRolledBack, Step: "activate", From: "1.1.0", To: "1.2.0", Time: t0.Add(time.Hour)}
	if err := WriteLegacyUpgrade(p, bad); err != nil {
		t.Fatal(err)
	}
	var f UpgradeFailed
	if found, err := state.ReadRecord(p.UpgradeFailed(), 1<<16, &f); !found || err != nil || !f.RolledBack || f.Step != "activate" || f.UID != "op-2" {
		t.Fatalf("failed.json %+v %v %v", f, found, err)
	}
	if _, err := os.Lstat(p.UpgradeSucceeded()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("an earlier success signal stays beside the failure: %v", err)
	}
}

func TestAnUnreadableRecordIsAnErrorNamingItsFileAndDoesNotBlock(t *testing.T) {
	p := paths(t)
	if err := os.MkdirAll(p.OutcomeDir(), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p.Outcome(Repave), []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(p.Outcome(Bootstrap), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Write(p, Record{Concern: Isolation, State: Succeeded, Time: t0}); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(p, Repave); err == nil || !strings.Contains(err.Error(), p.Outcome(Repave)) {
		t.Errorf("a corrupt record: %v; want an error naming %s", err, p.Outcome(Repave))
	}
	done := make(chan struct{})
	var list []Record
	var err error
	go func() { list, err = List(p); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("List blocked on a FIFO in place of a record")
	}
	if err == nil || len(list) != 1 || list[0].Concern != Isolation {
		t.Errorf("List = %+v, %v; want the readable record and an error for the others", list, err)
	}
}

func TestARecordUnderAnotherConcernsNameIsRefused(t *testing.T) {
	p := paths(t)
	writeJSON(t, p.Outcome(Repave), Record{Concern: Upgrade, State: Succeeded, Time: t0})
	if _, err := Read(p, Repave); err == nil {
		t.Fatal("upgrade's record under repave's name was taken")
	}
}

func TestGenerationOf(t *testing.T) {
	for in, want := range map[string]int64{"": 0, "7": 7, "-1": 0, "x": 0, "9223372036854775807": 1<<63 - 1} {
		if got := GenerationOf(map[string]string{ParamGeneration: in}); got != want {
			t.Errorf("GenerationOf(%q) = %d, want %d", in, got, want)
		}
	}
}

func writeJSON(t *testing.T, file string, v any) {
	t.Helper()
	data, _ := json.Marshal(v)
	if err := os.MkdirAll(filepath.Dir(file), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, data, 0o600); err != nil {
		t.Fatal(err)
	}
}
