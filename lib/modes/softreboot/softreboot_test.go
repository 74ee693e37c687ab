package softreboot

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
)

type fakeUnits struct {
	calls  []string
	failOn string
	cancel context.CancelFunc // called when failOn fails, as a SIGTERM would
}

func (f *fakeUnits) RestartUnit(_ context.Context, u string) error {
	f.calls = append(f.calls, "restart "+u)
	if u == f.failOn {
		if f.cancel != nil {
			f.cancel()
		}
		return errors.New("restart " + u + ": job dependency")
	}
	return nil
}

func (f *fakeUnits) StopUnit(_ context.Context, u string) error {
	f.calls = append(f.calls, "stop "+u)
	return nil
}

// A unit whose restart fails leaves the node stack down: the units after
// it are stopped (none: a fence refusing containerd's restart stops the
// kubelet too), and nothing is stopped when the run itself was stopped.
func TestRestartFailureStopsTheUnitsAfterTheFailedOne(t *testing.T) {
	for _, c := range []struct {
		name, mode, failOn string
		cancelled          bool
		want               []string
		wantMsg            string
	}{
		{name: "none, containerd refused", mode: "none", failOn: "unbounded-containerd.service",
			want:    []string{"restart unbounded-containerd.service", "stop unbounded-kubelet.service"},
			wantMsg: "stopped unbounded-kubelet.service too"},
		{name: "none, kubelet fails", mode: "none", failOn: "unbounded-kubelet.service",
			want: []string{"restart unbounded-containerd.service", "restart unbounded-kubelet.service"}},
		{name: "nspawn, machine refused", mode: "nspawn", failOn: "systemd-nspawn@kube1.service",
			want: []string{"restart systemd-nspawn@kube1.service"}},
		{name: "none, stopped while restarting containerd", mode: "none", failOn: "unbounded-containerd.service", cancelled: true,
			want: []string{"restart unbounded-containerd.service"}},
		{name: "none, all fine", mode: "none",
			want: []string{"restart unbounded-containerd.service", "restart unbounded-kubelet.service"}},
	} {
		ctx, cancel := context.WithCancel(context.Background())
		f := &fakeUnits{failOn: c.failOn}
		if c.cancelled {
			f.cancel = cancel
		}
		err := Restart(ctx, f, c.mode, "kube1")
		cancel()
		if !slices.Equal(f.calls, c.want) {
			t.Errorf("%s: calls %v, want %v", c.name, f.calls, c.want)
		}
		if (err != nil) != (c.failOn != "") || (c.wantMsg != "" && !strings.Contains(err.Error(), c.wantMsg)) {
			t.Errorf("%s: error %v, want one saying %q", c.name, err, c.wantMsg)
		}
	}
}
