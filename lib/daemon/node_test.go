package daemon

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/noderecord"
)

// The daemon hands the Node's Ready condition to unbounded-health through
// /run/unbounded/node.json: written when the condition (its heartbeat
// among it) changes and only then, removed while the watch is not live
// and when the Node is no longer followed.
func TestNodeRecordFollowsReadyAndTheWatch(t *testing.T) {
	p := hostpaths.New(t.TempDir())
	if err := os.MkdirAll(p.RunDir(), 0o755); err != nil {
		t.Fatal(err)
	}
	d := &daemon{p: p, node: "w1", log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		synced: map[kind]bool{}, handled: map[string]bool{}}
	d.followStop = func() {}
	ctx := context.Background()
	node := func(status corev1.ConditionStatus, reason string, heartbeat time.Time) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "w1", UID: "n-uid"},
			Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{
				Type: corev1.NodeReady, Status: status, Reason: reason, Message: reason + " message",
				LastHeartbeatTime: metav1.NewTime(heartbeat), LastTransitionTime: metav1.NewTime(time.Unix(1000, 0)),
			}}}}
	}
	file := noderecord.File(p)
	read := func() *noderecord.Record {
		t.Helper()
		r, err := noderecord.Read(p)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	stat := func() os.FileInfo {
		t.Helper()
		fi, err := os.Stat(file)
		if err != nil {
			t.Fatal(err)
		}
		return fi
	}

	if r := read(); r != nil {
		t.Fatalf("record before any list: %+v", r)
	}
	d.apply(ctx, update{kind: kindNode, sync: true, objs: []any{node(corev1.ConditionTrue, "KubeletReady", time.Unix(2000, 0))}})
	r := read()
	if r == nil || !r.Present || !r.Ready || r.Status != "True" || r.Reason != "KubeletReady" || r.Node != "w1" {
		t.Fatalf("after the list of a Ready Node: %+v", r)
	}
	before := stat()
	other := node(corev1.ConditionTrue, "KubeletReady", time.Unix(2000, 0))
	other.ResourceVersion = "2"
	other.Status.Conditions = append(other.Status.Conditions, corev1.NodeCondition{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse})
	d.apply(ctx, update{kind: kindNode, objs: []any{other}})
	if !os.SameFile(before, stat()) {
		t.Fatal("a Node update that leaves its Ready condition alone rewrote the record")
	}
	// The kubelet's write (at its start, on a change, else every 5 min)
	// is recorded: health tells by it a Ready of the running kubelet.
	d.apply(ctx, update{kind: kindNode, objs: []any{node(corev1.ConditionTrue, "KubeletReady", time.Unix(2010, 0))}})
	if r := read(); r == nil || !r.Ready || !r.Heartbeat.Equal(time.Unix(2010, 0)) {
		t.Fatalf("after the kubelet's write: %+v, want its heartbeat", r)
	}

	d.apply(ctx, update{kind: kindNode, objs: []any{node(corev1.ConditionFalse, "KubeletNotReady", time.Unix(2020, 0))}})
	if r := read(); r == nil || r.Ready || r.Status != "False" || r.Reason != "KubeletNotReady" || r.Message != "KubeletNotReady message" {
		t.Fatalf("after the Node went NotReady: %+v", r)
	}

	d.apply(ctx, update{kind: kindNode, watchDown: true})
	if r := read(); r != nil {
		t.Fatalf("watch not live, record still there: %+v", r)
	}
	d.apply(ctx, update{kind: kindNode, watchUp: true})
	if r := read(); r == nil || r.Ready || r.Reason != "KubeletNotReady" {
		t.Fatalf("watch live again: %+v", r)
	}
	d.apply(ctx, update{kind: kindOps, watchDown: true})
	if read() == nil {
		t.Fatal("the operations watch going down removed the Node record")
	}

	d.apply(ctx, update{kind: kindNode, deleted: true, objs: []any{node(corev1.ConditionFalse, "KubeletNotReady", time.Unix(2030, 0))}})
	if r := read(); r == nil || r.Present || r.Ready {
		t.Fatalf("after the Node was deleted: %+v", r)
	}

	d.unfollow()
	if r := read(); r != nil {
		t.Fatalf("Node no longer followed, record still there: %+v", r)
	}
}

// The watch loop tells the daemon once that its watch failed, however
// often it retries, and once that it works again: no update at all while
// the watch simply runs (the idle daemon stays idle).
func TestWatchLoopReportsDownOnceAndUpOnce(t *testing.T) {
	d := &daemon{log: slog.New(slog.NewTextHandler(io.Discard, nil)), updates: make(chan update)}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var watches atomic.Int64
	open := make(chan watch.Event) // never sends: a watch that runs
	list := func(context.Context) ([]any, string, error) { return nil, "1", nil }
	watchFn := func(context.Context, string) (watch.Interface, error) {
		if watches.Add(1) <= 2 {
			return nil, errors.New("connection refused")
		}
		return watch.NewProxyWatcher(open), nil
	}
	done := make(chan struct{})
	go func() { defer close(done); d.watchLoop(ctx, kindNode, list, watchFn) }()
	var got []string
	deadline := time.After(30 * time.Second)
	for len(got) < 3 {
		select {
		case u := <-d.updates:
			switch {
			case u.sync:
				got = append(got, "sync")
			case u.watchDown:
				got = append(got, "down")
			case u.watchUp:
				got = append(got, "up")
			default:
				got = append(got, "event")
			}
		case <-deadline:
			t.Fatalf("updates so far %v, want sync, down, up within 30s", got)
		}
	}
	if want := []string{"sync", "down", "up"}; !slices.Equal(got, want) {
		t.Fatalf("updates %v, want %v (one down for two failed watches)", got, want)
	}
	select {
	case u := <-d.updates:
		t.Fatalf("an update while the watch runs: %+v", u)
	case <-time.After(200 * time.Millisecond): // no update is the expected outcome; bounded
	}
	cancel()
	<-done
}
