package daemon

import (
	"context"
	"os"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"unbounded-cloud.io/agent/lib/owed"
	"unbounded-cloud.io/agent/lib/unitnames"
)

// A repave that failed with the API server down owed its uncordon
// (lib/owed): the daemon makes it once the cluster answers, not while
// another repave runs, and settles the record.
func TestDaemonMakesAnOwedUncordonOnceTheClusterAnswers(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	f.env.createReadyNode(t, f.machine)
	if _, err := f.env.kube.CoreV1().Nodes().Patch(ctx, f.machine, types.MergePatchType, []byte(`{"spec":{"unschedulable":true}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := owed.Owe(f.opts.Paths, owed.Write{Kind: owed.Uncordon, Node: f.machine, By: "repave", Why: "test", Since: time.Now()}); err != nil {
		t.Fatal(err)
	}
	unschedulable := func() bool {
		n, err := f.env.kube.CoreV1().Nodes().Get(ctx, f.machine, metav1.GetOptions{})
		return err != nil || n.Spec.Unschedulable
	}
	// While a repave runs, it decides: the daemon waits.
	f.fake.configure(unitnames.Repave, func(u *fakeUnit) { u.st.ActiveState, u.st.SubState = "activating", "start" })
	d := startDaemon(t, f.opts)
	time.Sleep(2 * time.Second)
	if !unschedulable() {
		t.Fatal("the daemon uncordoned the Node while a repave ran")
	}
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
	f.fake.configure(unitnames.Repave, func(u *fakeUnit) { u.st.ActiveState, u.st.SubState = "inactive", "dead" })
	startDaemon(t, f.opts)
	eventually(t, 20*time.Second, "the owed uncordon made and settled", func() bool {
		ws, _ := owed.List(f.opts.Paths)
		return !unschedulable() && len(ws) == 0
	})
	if _, err := os.Stat(f.opts.Paths.OwedDir() + "/uncordon.json"); !os.IsNotExist(err) {
		t.Errorf("the owed record is left: %v", err)
	}
}
