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
)

type fakeUnits struct {
	calls   []string
	failOn  string // a unit whose restart job fails
	onFail  func()
	states  map[string]string
	healthy bool
}

func (f *fakeUnits) RestartUnit(_ context.Context, u string) error {
	f.calls = append(f.calls, "restart "+u)
	if u == f.failOn {
		if f.onFail != nil {
			f.onFail()
		}
		return errors.New("job for " + u + " finished with result dependency")
	}
	return nil
}
func (f *fakeUnits) StartUnit(_ context.Context, u string) error {
	f.calls = append(f.calls, "start "+u)
	return nil
}
func (f *fakeUnits) StopUnit(_ context.Context, u string) error {
	f.calls = append(f.calls, "stop "+u)
	return nil
}
func (f *fakeUnits) ResetFailed(_ context.Context, u string) error {
	f.calls = append(f.calls, "reset-failed "+u)
	return nil
}
func (f *fakeUnits) EnqueueStart(_ context.Context, u string) error { return nil }
func (f *fakeUnits) ActiveState(_ context.Context, u string) (string, error) {
	if s, ok := f.states[u]; ok {
		return s, nil
	}
	return "active", nil
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
		u := &fakeUnits{healthy: true}
		if err := newRestart(t, mode, u).Run(context.Background()); err != nil {
			t.Fatalf("%s: %v", mode, err)
		}
		if !slices.Equal(u.calls, want) {
			t.Errorf("%s: calls %v, want %v", mode, u.calls, want)
		}
	}
}

func TestRestartFailsWhenTheNodeIsNotHealthyInTime(t *testing.T) {
	u := &fakeUnits{states: map[string]string{"unbounded-kubelet.service": "activating"}}
	err := newRestart(t, "none", u).Run(context.Background())
	if err == nil || exitcode.For(err) != exitcode.Failed || !strings.Contains(err.Error(), "unbounded-kubelet.service is activating") {
		t.Fatalf("Run: %v, want a failure naming what is not up", err)
	}
}

// A restart job refused by the fence (the node unit's Requires=) is 77,
// naming the fence's reason.
func TestRestartRefusedByTheFenceIs77(t *testing.T) {
	u := &fakeUnits{failOn: "systemd-nspawn@kube2.service"}
	r := newRestart(t, "nspawn", u)
	u.onFail = func() {
		_ = record.Write(r.Paths, record.Record{Outcome: record.Refused, Reason: "AllocationFenced", Message: "fenced", At: time.Now()})
	}
	err := r.Run(context.Background())
	if exitcode.For(err) != exitcode.Refused || !strings.Contains(err.Error(), "AllocationFenced") {
		t.Fatalf("Run: %v (exit %d), want 77 naming the reason", err, exitcode.For(err))
	}
}

// Mode none, the fence refusing the restart of containerd: the kubelet
// (which only Wants= containerd) is stopped too, so that the refused node
// is down, not half up; 77 naming the reason.
func TestRestartRefusedByTheFenceInModeNoneStopsTheKubeletToo(t *testing.T) {
	u := &fakeUnits{failOn: "unbounded-containerd.service"}
	r := newRestart(t, "none", u)
	u.onFail = func() {
		_ = record.Write(r.Paths, record.Record{Outcome: record.Refused, Reason: "AllocationFenced", Message: "fenced", At: time.Now()})
	}
	err := r.Run(context.Background())
	if exitcode.For(err) != exitcode.Refused || !strings.Contains(err.Error(), "AllocationFenced") ||
		!strings.Contains(err.Error(), "stopped unbounded-kubelet.service too") {
		t.Fatalf("Run: %v (exit %d), want 77 naming the reason and the kubelet stopped", err, exitcode.For(err))
	}
	want := []string{"reset-failed unbounded-containerd.service", "reset-failed unbounded-kubelet.service",
		"restart unbounded-containerd.service", "stop unbounded-kubelet.service"}
	if !slices.Equal(u.calls, want) {
		t.Fatalf("calls %v, want %v (the kubelet stopped, not restarted, and the node target not started)", u.calls, want)
	}
}

// The health wait includes the Node's Ready condition as the daemon's
// live watch records it: a Node still reported NotReady fails the restart
// naming the condition's reason; Ready passes.
func TestRestartWaitsForTheNodeReady(t *testing.T) {
	u := &fakeUnits{healthy: true}
	r := newRestart(t, "nspawn", u)
	if err := noderecord.Write(r.Paths, noderecord.Record{Node: "w1", Present: true, Status: "False", Reason: "KubeletNotReady"}); err != nil {
		t.Fatal(err)
	}
	err := r.Run(context.Background())
	if err == nil || exitcode.For(err) != exitcode.Failed || !strings.Contains(err.Error(), "Node w1 is not Ready (Ready False, reason KubeletNotReady") {
		t.Fatalf("Run with the Node NotReady: %v", err)
	}
	if err := noderecord.Write(r.Paths, noderecord.Record{Node: "w1", Present: true, Ready: true, Status: "True"}); err != nil {
		t.Fatal(err)
	}
	if err := r.Run(context.Background()); err != nil {
		t.Fatalf("Run with the Node Ready: %v", err)
	}
}

func TestRestartDefersToAnInstallation(t *testing.T) {
	u := &fakeUnits{healthy: true}
	r := newRestart(t, "none", u)
	lock, err := state.AcquireOwnership(r.Paths, "bootstrap", "unbounded-bootstrap.service")
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Release()
	if err := r.Run(context.Background()); exitcode.For(err) != exitcode.Deferred || len(u.calls) != 0 {
		t.Fatalf("Run: %v, calls %v; want 69 and nothing touched", err, u.calls)
	}
}
