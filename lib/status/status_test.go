package status

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"unbounded-cloud.io/agent/lib/devices"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/owed"
	"unbounded-cloud.io/agent/lib/reprovision"
	"unbounded-cloud.io/agent/lib/state"
)

// An operator runs status when things are broken: garbage in every state
// file must give a report, never a panic.
func TestGatherReportsGarbageInEveryStateFile(t *testing.T) {
	p := hostpaths.New(t.TempDir())
	for _, f := range []string{
		p.AppliedConfig("kube1"), hostpaths.Checksum(p.AppliedConfig("kube1")),
		p.AppliedConfig("kube2"), p.Ownership(), p.Journal("isolation"),
	} {
		if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f, []byte("\x00\xff{garbage"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// A directory where a journal file is expected.
	if err := os.MkdirAll(p.Journal("repave"), 0o755); err != nil {
		t.Fatal(err)
	}
	r := Gather(p)
	if r.State != Corrupt || !strings.HasPrefix(r.Message, "state corrupt: ") {
		t.Errorf("state = %q, message = %q", r.State, r.Message)
	}
	if len(r.Applied) != 2 || r.Applied[0].Error == "" || r.Applied[1].Error == "" {
		t.Errorf("applied = %+v", r.Applied)
	}
	if r.Ownership == nil || r.Ownership.Owner != "unknown" {
		t.Errorf("ownership = %+v, want owned by unknown (fail closed)", r.Ownership)
	}
	if len(r.Journals) != 2 || r.Journals[0].Operation != "isolation" || r.Journals[0].Error == "" ||
		r.Journals[1].Operation != "repave" || !strings.Contains(r.Journals[1].Error, "not a regular file") {
		t.Errorf("journals = %+v", r.Journals)
	}
	var out bytes.Buffer
	r.Text(&out)
	if !strings.Contains(out.String(), "state corrupt") || !strings.Contains(out.String(), "held by unknown") {
		t.Errorf("text:\n%s", out.String())
	}
}

// An uncordon a failed repave owes the cluster is listed until the daemon
// makes it; a garbage record is named, the others still listed.
func TestStatusListsTheWritesOwedToTheCluster(t *testing.T) {
	p := hostpaths.New(t.TempDir())
	var out bytes.Buffer
	Gather(p).Text(&out)
	if !strings.Contains(out.String(), "owed:        nothing owed to the cluster") {
		t.Errorf("without owed writes:\n%s", out.String())
	}
	since := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	if err := owed.Owe(p, owed.Write{Kind: owed.Uncordon, Node: "site-w1", By: "repave", Why: "the repave failed", Since: since}); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(p.OwedDir(), "other.json"), []byte("{garbage"), 0o600)
	r := Gather(p)
	out.Reset()
	r.Text(&out)
	if len(r.Owed) != 1 || r.Owed[0].Node != "site-w1" || !strings.Contains(r.OwedError, "other.json") {
		t.Errorf("owed = %+v, error %q", r.Owed, r.OwedError)
	}
	if !strings.Contains(out.String(), "uncordon Node site-w1 (owed by repave since 2026-12-01T10:00:00Z: the repave failed)") || !strings.Contains(out.String(), "unreadable") {
		t.Errorf("text:\n%s", out.String())
	}
}

// The devices the active nspawn node was given are listed from the
// slot's record; a node in mode none lists none (it is the host).
func TestStatusListsTheDevicesTheNodeHas(t *testing.T) {
	p := hostpaths.New(t.TempDir())
	if err := state.WriteApplied(p, &state.AppliedConfig{Slot: "kube2", Mode: "nspawn", AppliedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 12, 3, 8, 0, 0, 0, time.UTC)
	if err := devices.WriteRecord(p, "kube2", devices.Record{At: at, Found: devices.Found{
		Devices:     []devices.Device{{Path: "/dev/kvm", Major: 10, Minor: 232, Why: "kvm"}, {Path: "/dev/loop7", Block: true, Major: 7, Minor: 7, Why: "allow"}},
		DriverFiles: []string{"/usr/lib/x86_64-linux-gnu/libcuda.so.1"}, GPUs: []string{"/dev/nvidia0"},
	}}); err != nil {
		t.Fatal(err)
	}
	r := Gather(p)
	var out bytes.Buffer
	r.Text(&out)
	if r.Devices == nil || len(r.Devices.Found) != 2 || !r.Devices.FoundAt.Equal(at) {
		t.Fatalf("devices = %+v", r.Devices)
	}
	for _, want := range []string{"device:      /dev/kvm (char 10:232, kvm)", "device:      /dev/loop7 (block 7:7, allow)", "1 NVIDIA driver file bound read-only"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("text lacks %q:\n%s", want, out.String())
		}
	}
	if b, _ := json.Marshal(r); !strings.Contains(string(b), `"devices":{"found":[{"path":"/dev/kvm"`) {
		t.Errorf("json: %s", b)
	}

	q := hostpaths.New(t.TempDir())
	state.WriteApplied(q, &state.AppliedConfig{Slot: "kube1", Mode: "none", AppliedAt: time.Now()})
	if r := Gather(q); r.Devices != nil {
		t.Errorf("mode none: devices %+v, want none listed", r.Devices)
	}
}

// What the self-upgrade left for the daemon to report, and what is
// staged, are listed; nothing at all is no row.
func TestStatusListsTheUpgradesOutcomeNotReportedYet(t *testing.T) {
	p := hostpaths.New(t.TempDir())
	if r := Gather(p); r.Upgrade != nil {
		t.Errorf("no upgrade: %+v", r.Upgrade)
	}
	os.MkdirAll(p.UpgradeStaged(), 0o700)
	os.WriteFile(p.UpgradeFailed(), []byte(`{"from":"1.0.0","to":"1.1.0","step":"verify","message":"checksum mismatch","rolledBack":false}`), 0o600)
	os.WriteFile(filepath.Join(p.UpgradeStaged(), "agent.deb"), []byte("x"), 0o600)
	os.MkdirAll(filepath.Join(p.HostRoot(), "agent"), 0o700)
	os.WriteFile(filepath.Join(p.HostRoot(), "agent", "override.json"), []byte(`{"version":"1.1.0","dir":"/var/lib/unbounded/agent/1.1.0/libexec","units":["unbounded-daemon.service"]}`), 0o600)
	r := Gather(p)
	var out bytes.Buffer
	r.Text(&out)
	if r.Upgrade == nil || r.Upgrade.Failed == nil || r.Upgrade.Failed.Step != "verify" || len(r.Upgrade.Staged) != 1 {
		t.Fatalf("upgrade = %+v", r.Upgrade)
	}
	for _, w := range []string{"failed at step verify (1.0.0 -> 1.1.0, rolled back: false), not reported yet: checksum mismatch", "staged: agent.deb",
		"override active: the agent's units run 1.1.0 from /var/lib/unbounded/agent/1.1.0/libexec"} {
		if !strings.Contains(out.String(), w) {
			t.Errorf("text lacks %q:\n%s", w, out.String())
		}
	}
}

// An older agent's node: detected (and not adopted yet) while its records
// are there, "adopted" with where from and when once lib/adopt took it
// over; the JSON form carries the adoption's record.
func TestStatusSaysTheLegacyRootIsDetectedThenAdopted(t *testing.T) {
	p := hostpaths.New(t.TempDir())
	f := p.LegacyAppliedConfig("kube1")
	os.MkdirAll(filepath.Dir(f), 0o755)
	os.WriteFile(f, []byte("{}"), 0o600)
	var out bytes.Buffer
	Gather(p).Text(&out)
	if !strings.Contains(out.String(), "legacy root: detected, not adopted yet") || !strings.Contains(out.String(), "/etc/unbounded/agent/kube1-applied-config.json") {
		t.Errorf("text:\n%s", out.String())
	}
	os.RemoveAll(filepath.Dir(f))
	at := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	if err := state.WriteAdopted(p, &state.Adopted{Slot: "kube1", Machine: "site-w1", From: []string{"/etc/unbounded/agent/kube1-applied-config.json"}, At: at}); err != nil {
		t.Fatal(err)
	}
	r := Gather(p)
	out.Reset()
	r.Text(&out)
	want := "legacy root: adopted: the older agent's node in slot kube1 (machine site-w1) from /etc/unbounded/agent/kube1-applied-config.json at 2026-12-01T10:00:00Z"
	if !strings.Contains(out.String(), want) || strings.Contains(out.String(), "not detected") {
		t.Errorf("text:\n%s\nwant %q", out.String(), want)
	}
	data, _ := json.Marshal(r)
	var j struct {
		Legacy struct {
			Detected bool
			Adopted  *struct {
				Slot string
				From []string
			}
		}
	}
	json.Unmarshal(data, &j)
	if j.Legacy.Detected || j.Legacy.Adopted == nil || j.Legacy.Adopted.Slot != "kube1" || len(j.Legacy.Adopted.From) != 1 {
		t.Errorf("JSON legacy: %s", data)
	}
}

// An isolation change under way is shown with its modes, method, step and
// the slot whose node runs (the journal lib/repave writes for it).
func TestStatusShowsAnIsolationChangeInProgress(t *testing.T) {
	p := hostpaths.New(t.TempDir())
	j := map[string]any{"from": "kube1", "to": "kube2", "mode": "none", "from-mode": "nspawn", "method": "InPlace",
		"running-slot": "kube1", "step": "drain", "config": map[string]any{}}
	if err := state.WriteJournal(p, "isolation", j); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	Gather(p).Text(&out)
	if want := "isolation: nspawn -> none InPlace, running slot kube1; step drain"; !strings.Contains(out.String(), want) {
		t.Errorf("status does not say %q:\n%s", want, out.String())
	}
}

// A reprovision handoff in progress is shown with its attempt, the next
// one and the time until it gives up; an ended one with its outcome.
func TestStatusShowsAReprovisionHandoff(t *testing.T) {
	p := hostpaths.New(t.TempDir())
	exe := filepath.Join(t.TempDir(), "exe")
	os.WriteFile(exe, []byte("x"), 0o755)
	began := time.Now().UTC()
	j := reprovision.Journal{FromMode: "nspawn", ToMode: "none", StartedAt: began, Deadline: began.Add(90 * time.Minute)}
	if err := reprovision.Stage(p, j, []byte(`{}`), exe); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	Gather(p).Text(&out)
	for _, want := range []string{"handoff:", "reprovision nspawn -> none in progress", "attempt 0", "gives up at " + j.Deadline.Format(time.RFC3339)} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("status does not say %q:\n%s", want, out.String())
		}
	}
}

func TestStatusSaysWhetherTheNodeRunsTheLocalDNSCache(t *testing.T) {
	p := hostpaths.New(t.TempDir())
	if r := Gather(p); r.LocalDNS != nil {
		t.Errorf("not bootstrapped: local-dns %v, want null", *r.LocalDNS)
	}
	for _, c := range []struct {
		config, want string
		on           bool
	}{
		{`{"Node":{"LocalDNS":true}}`, "local DNS:   on:", true},
		{`{"Node":{"LocalDNS":false}}`, "local DNS:   off:", false},
	} {
		if err := state.WriteApplied(p, &state.AppliedConfig{Slot: "kube1", Mode: "nspawn", AppliedAt: time.Now(), Config: json.RawMessage(c.config)}); err != nil {
			t.Fatal(err)
		}
		r := Gather(p)
		var out strings.Builder
		if err := r.Text(&out); err != nil {
			t.Fatal(err)
		}
		if r.LocalDNS == nil || *r.LocalDNS != c.on || !strings.Contains(out.String(), c.want) {
			t.Errorf("%s: local-dns %v, text:\n%s", c.config, r.LocalDNS, out.String())
		}
	}
}
