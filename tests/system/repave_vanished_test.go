package system_test

import (
	"context"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"unbounded-cloud.io/agent/lib/daemon"
)

// TestRepaveOfANodeThatVanishedWhileTheDaemonWasDown (ARCHITECTURE
// section 7): a Machine whose Node is gone is repaved, also
// when it went while the daemon was down. On a first-booted nspawn host
// the daemon and the node machine are stopped (no kubelet left to
// register the Node again), the Node is deleted in the API server, and the
// daemon is started: it finds no Node, gives a starting kubelet its grace,
// then repaves; the Node comes back Ready under the same name (a new
// object), the repave's run says it was for the vanished Node, and the
// daemon records the NodeGone Event.
func TestRepaveOfANodeThatVanishedWhileTheDaemonWasDown(t *testing.T) {
	defer scenario(t)()
	f := newFirstBoot(t, firstBootOptions{prepared: true})
	ns := f.bootNode(t)
	ctx := context.Background()
	before := f.nodeObject(t)

	// The health timer would restart a node that is down, and a kubelet
	// that starts registers its Node itself: that is the other way back,
	// not the one under test.
	for _, u := range []string{"unbounded-health.timer", daemonUnit, "systemd-nspawn@kube1.service"} {
		if out, err := f.m.Systemctl("stop", u); err != nil {
			t.Fatalf("stop %s: %v\n%s", u, err, out)
		}
	}
	if err := f.env.kube.CoreV1().Nodes().Delete(ctx, f.name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete Node %s: %v", f.name, err)
	}
	waitUntil(t, time.Minute, "Node "+f.name+" gone", func(ctx context.Context) (bool, error) {
		_, err := f.env.kube.CoreV1().Nodes().Get(ctx, f.name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})

	cursor := journalCursor(t, f)
	begin := time.Now()
	if out, err := f.m.Systemctl("start", daemonUnit); err != nil {
		t.Fatalf("start %s: %v\n%s", daemonUnit, err, out)
	}
	// The grace, then the repave (the old node is not running: nothing to
	// drain), bounded generously.
	if _, err := f.m.WaitJournal(daemon.DefaultNodeGoneGrace+3*time.Minute, func(string) bool { return true },
		"-u", repaveService, "--after-cursor", cursor); err != nil {
		t.Fatalf("%s started by the daemon: %v", repaveService, err)
	}
	t.Logf("the daemon started the repave %v after its own start", time.Since(begin).Round(time.Millisecond))
	p := waitUnitDone(t, f, repaveService, cursor, 10*time.Minute)
	j, _ := f.m.Run("journalctl", "-q", "--no-pager", "-o", "cat", "-u", repaveService, "--after-cursor", cursor)
	if p["ExecMainStatus"] != "0" || p["ActiveState"] != "inactive" {
		t.Fatalf("repave of the vanished Node: %v\n%s\ndaemon:\n%s", p, j, f.m.Journal(daemonUnit))
	}
	t.Logf("daemon start -> repave of the vanished Node done: %v", time.Since(begin).Round(time.Millisecond))
	wantSays(t, "the repave's journal", j, "this repave is for the vanished Node")
	wantSays(t, "the daemon's journal", f.m.Journal(daemonUnit), "vanished while the daemon was down", "Node was Ready and is gone: repaving")

	waitUntil(t, 3*time.Minute, "Node Ready again", f.nodeReady)
	after := f.nodeObject(t)
	if after.UID == before.UID {
		t.Errorf("Node %s has its old UID %s: not registered afresh", f.name, after.UID)
	}
	f.wantSlot(t, "kube2", "")
	f.wantMachineSlot(t, "kube2")
	evs, err := f.env.kube.CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("involvedObject.name", f.name).String()})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	found := false
	for _, e := range evs.Items {
		got = append(got, e.Reason+": "+e.Message)
		if e.Reason == daemon.ReasonNodeGone && strings.Contains(e.Message, "repave of vanished Node "+f.name) {
			found = true
		}
	}
	if !found {
		t.Errorf("no %s Event on Machine %s; events: %q", daemon.ReasonNodeGone, f.name, got)
	}
	pod := f.waitPodRunning(t, ns, 4*time.Minute)
	t.Logf("the Deployment's pod %s runs again on the repaved node", pod.Name)
	if failed := failedUnits(t, f.m, "unbounded*"); len(failed) != 0 {
		t.Errorf("failed units after the repave: %v", failed)
	}
}
