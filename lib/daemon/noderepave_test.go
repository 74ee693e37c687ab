package daemon

import (
	"context"
	"strings"
	"sync"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The repave of a vanished Node has no MachineOperation to carry its
// progress: once its unit was started, a retry (here: the unit's state
// could not be read after the run) must resume it, not start the unit again.
func TestRepaveOfVanishedNodeRetriedAfterItsUnitRanIsNotStartedAgain(t *testing.T) {
	f := newFixture(t)
	f.env.createReadyNode(t, f.machine)
	var once sync.Once
	f.fake.onStart = func(string) {
		once.Do(func() {
			f.fake.mu.Lock()
			f.fake.stateErrs = 1 // the first look at the unit after its run fails
			f.fake.mu.Unlock()
		})
	}
	startDaemon(t, f.opts)
	eventually(t, opTimeout, "daemon saw its Node", func() bool {
		m, err := f.env.ops.machines.Get(context.Background(), f.machine)
		return err == nil && m.Status.NodeName == f.machine
	})
	if err := f.env.kube.CoreV1().Nodes().Delete(context.Background(), f.machine, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, opTimeout, "repave started", func() bool { return f.fake.startCount("unbounded-repave.service") >= 1 })
	// The retry comes 5s after the failed look.
	eventually(t, opTimeout, "event OperationComplete on the Machine", func() bool {
		return strings.Contains(strings.Join(f.machineEvents(t), ","), "OperationComplete")
	})
	f.settled(t)
	if n := f.fake.startCount("unbounded-repave.service"); n != 1 {
		t.Fatalf("unbounded-repave.service started %d times, want 1", n)
	}
}
