package restart

import (
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"unbounded-cloud.io/agent/lib/exitcode"
	"unbounded-cloud.io/agent/lib/fence/record"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/noderecord"
	"unbounded-cloud.io/agent/lib/state"
	"unbounded-cloud.io/agent/lib/units/unitstest"
)

// fakeUnits is the service manager (every unit active unless set
// otherwise) and whether the kubelet's healthz answers.
type fakeUnits struct {
	*unitstest.Fake
	healthy bool
}

func newUnits(healthy bool) *fakeUnits {
	return &fakeUnits{Fake: &unitstest.Fake{Default: "active"}, healthy: healthy}
}

// failOn makes unit's start and restart jobs fail, running then first.
func (f *fakeUnits) failOn(unit string, then func()) {
	f.OnStart = func(u string) error {
		if u != unit {
			return nil
		}
		then()
		return errors.New("job for " + u + " finished with result dependency")
	}
}

func newRestart(t *testing.T, mode string, u *fakeUnits) *Restart {
	t.Helper()
	p := hostpaths.New(t.TempDir())
	if err := os.MkdirAll(p.RunDir(), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := state.WriteApplied(p, &state.AppliedConfig{Slot: "kube2", Mode: mode, Machine: "w1"}); err != nil {
		t.Fatal(err)
	}
	return &Restart{Paths: p, Timeout: 50 * time.Millisecond, Settle: 3 * time.Millisecond, PollInterval: time.Millisecond, Units: u,
		Healthz: func(context.Context) error {
			if u.healthy {
				return nil
			}
			return errors.New("connection refused")
		}}
}

// Mode none: containerd, then the kubelet, each reset-failed first (a
// payload that kept dying hit its start limit), then the node target,
// then healthy. Mode nspawn: the slot's machine.
func TestRestartRestartsTheModesUnitsInOrderAndWaitsHealthy(t *testing.T) {
	for mode, want := range map[string][]string{
		"none": {"reset-failed unbounded-containerd.service", "reset-failed unbounded-kubelet.service",
			"restart unbounded-containerd.service", "restart unbounded-kubelet.service", "start unbounded-node.target"},
		"nspawn": {"reset-failed systemd-nspawn@kube2.service", "restart systemd-nspawn@kube2.service", "start unbounded-node.target"},
	} {
		u := newUnits(true)
		if err := newRestart(t, mode, u).Run(context.Background()); err != nil {
			t.Fatalf("%s: %v", mode, err)
		}
		if !slices.Equal(u.CallList(), want) {
			t.Errorf("%s: calls %v, want %v", mode, u.CallList(), want)
		}
	}
}

func TestRestartFailsWhenTheNodeIsNotHealthyInTime(t *testing.T) {
	u := newUnits(false)
	u.StartsTo = map[string]string{"unbounded-kubelet.service": "activating"}
	err := newRestart(t, "none", u).Run(context.Background())
	if err == nil || exitcode.For(err) != exitcode.Failed || !strings.Contains(err.Error(), "unbounded-kubelet.service is activating") {
		t.Fatalf("Run: %v, want a failure naming what is not up", err)
	}
}

// A restart job refused by the fence (the node unit's Requires=) is 77,
// naming the fence's reason.
func TestRestartRefusedByTheFenceIs77(t *testing.T) {
	u := newUnits(false)
	r := newRestart(t, "nspawn", u)
	u.failOn("systemd-nspawn@kube2.service", func() {
		_ = record.Write(r.Paths, record.Record{Outcome: record.Refused, Reason: "AllocationFenced", Message: "fenced", At: time.Now()})
	})
	err := r.Run(context.Background())
	if exitcode.For(err) != exitcode.Refused || !strings.Contains(err.Error(), "AllocationFenced") {
		t.Fatalf("Run: %v (exit %d), want 77 naming the reason", err, exitcode.For(err))
	}
}

// Mode none, the fence refusing the restart of containerd: the kubelet
// (which only Wants= containerd) is stopped too, so that the refused node
// is down, not half up; 77 naming the reason.
func TestRestartRefusedByTheFenceInModeNoneStopsTheKubeletToo(t *testing.T) {
	u := newUnits(false)
	r := newRestart(t, "none", u)
	u.failOn("unbounded-containerd.service", func() {
		_ = record.Write(r.Paths, record.Record{Outcome: record.Refused, Reason: "AllocationFenced", Message: "fenced", At: time.Now()})
	})
	err := r.Run(context.Background())
	if exitcode.For(err) != exitcode.Refused || !strings.Contains(err.Error(), "AllocationFenced") ||
		!strings.Contains(err.Error(), "stopped unbounded-kubelet.service too") {
		t.Fatalf("Run: %v (exit %d), want 77 naming the reason and the kubelet stopped", err, exitcode.For(err))
	}
	want := []string{"reset-failed unbounded-containerd.service", "reset-failed unbounded-kubelet.service",
		"restart unbounded-containerd.service", "stop unbounded-kubelet.service"}
	if !slices.Equal(u.CallList(), want) {
		t.Fatalf("calls %v, want %v (the kubelet stopped, not restarted, and the node target not started)", u.CallList(), want)
	}
}

// The health wait includes the Node's Ready condition as the daemon's
// live watch records it: a Node still reported NotReady fails the restart
// naming the condition's reason; a Ready the cluster kept from the kubelet
// before the restart fails too; Ready written after the restart passes.
func TestRestartWaitsForTheNodeReadyOfTheRestartedKubelet(t *testing.T) {
	u := newUnits(true)
	restarted := time.Unix(10000, 0)
	u.Now = func() time.Time { return restarted }
	r := newRestart(t, "nspawn", u)
	for _, c := range []struct {
		rec  noderecord.Record
		want string
	}{
		{noderecord.Record{Node: "w1", Present: true, Status: "False", Reason: "KubeletNotReady", Heartbeat: restarted.Add(time.Second)},
			"Node w1 is not Ready (Ready False, reason KubeletNotReady"},
		{noderecord.Record{Node: "w1", Present: true, Ready: true, Status: "True", Heartbeat: restarted.Add(-time.Minute)},
			"Node w1 is Ready from before its kubelet's start"},
		{noderecord.Record{Node: "w1", Present: true, Ready: true, Status: "True", Heartbeat: restarted.Add(time.Second)}, ""},
	} {
		if err := noderecord.Write(r.Paths, c.rec); err != nil {
			t.Fatal(err)
		}
		err := r.Run(context.Background())
		if c.want == "" && err != nil || c.want != "" && (exitcode.For(err) != exitcode.Failed || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("Run with %+v: %v, want %q", c.rec, err, c.want)
		}
	}
}

func TestRestartDefersToAnInstallation(t *testing.T) {
	u := newUnits(true)
	r := newRestart(t, "none", u)
	lock, err := state.AcquireOwnership(r.Paths, "bootstrap", "unbounded-bootstrap.service")
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Release()
	if err := r.Run(context.Background()); exitcode.For(err) != exitcode.Deferred || len(u.CallList()) != 0 {
		t.Fatalf("Run: %v, calls %v; want 69 and nothing touched", err, u.CallList())
	}
}

// The older agent's node, not adopted yet, is not this agent's to
// restart: deferred (69) until unbounded-lifecycle.service adopts it.
func TestRestartDefersToTheAdoptionOfAnOlderAgentsNode(t *testing.T) {
	u := newUnits(true)
	r := newRestart(t, "nspawn", u)
	f := r.Paths.LegacyAppliedConfig("kube1")
	os.MkdirAll(r.Paths.LegacyStateDir(), 0o755)
	os.WriteFile(f, []byte("{}"), 0o600)
	err := r.Run(context.Background())
	if exitcode.For(err) != exitcode.Deferred || !errors.Is(err, state.ErrNotAdopted) {
		t.Fatalf("%v, want a deferral to the adoption", err)
	}
	if c := u.CallList(); len(c) != 0 {
		t.Errorf("calls %q", c)
	}
}
