//go:build demo

package demo_test

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"unbounded-cloud.io/agent/lib/modes/none"
	"unbounded-cloud.io/agent/tests/system/nodestack"
)

// runNone is the demo's second act in mode none: a second Kubernetes
// version in agent.toml (the loopback mirror serves the staged kubelet
// under it, nodestack.Stage.ServeAsVersion, as the none-mode system test
// tests/system/repave_none_test.go does), then `systemctl start
// unbounded-repave.service` in the host: in place, the new version
// installed beside the running one, the stack stopped, `current`
// flipped, the stack started. It prints the downtime (the old kubelet's
// stop, systemd's journal line, -> the Node registered afresh, a new
// UID, and Ready, as the API server shows it) and the pod moving back to
// Running. With a bench file it also measures the floor (the same stop,
// Node deletion and start by hand, measured the same way) and a rollback
// (a version whose kubelet exits at once).
func (d *repaveDemo) runNone(t *testing.T, ctx context.Context) {
	t.Helper()
	o := d.o
	v1 := d.stage.Versions["kubelet"]
	v2 := bumpPatch(t, v1, 1)
	o.step("repave: kubernetes-version %s -> %s in agent.toml, then `systemctl start unbounded-repave.service` in the host (in place)", v1, v2)
	d.certificate(t, ctx)
	d.stage.ServeAsVersion(t, d.mirrorDir, "kubelet", v2, d.stage.Kubelet)
	nodestack.SetKubernetesVersion(t, d.m, v1, v2)
	o.say("[cluster] kubernetes-version = %q (the mirror serves the staged kubelet under this version too: a new version directory, the same binary)", v2)

	uid := d.nodeUID(t, ctx)
	begin := time.Now()
	ready := d.watchReadyAgain(ctx, uid)
	if !d.start(t, ctx, begin) {
		t.Fatalf("the repave failed:\n%s", d.m.Journal(repaveUnit))
	}
	unit := time.Since(begin)
	lines := d.journal(t, repaveUnit, begin)
	readyAt := d.waitReady(t, ready)
	stopping, stopped := d.kubeletStop(t, begin)
	pod := d.podBack(t, ctx)
	podBack := time.Now()
	o.say("repaved in %s (systemctl start to the unit's end)", took(unit))
	if !stopped.IsZero() {
		down := readyAt.Sub(stopped)
		o.say("downtime: old kubelet stopped -> Node registered afresh (new UID) and Ready: %s", took(down))
		d.bench.add("repave.downtime", down)
	}
	if begun, ok := find(lines, "repave begun"); ok && !stopping.IsZero() {
		// The mode's repave begins with the install; the old
		// kubelet's stop follows it at once.
		o.say("version %s installed beside the running %s while it served: %s", v2, v1, took(stopping.Sub(begun.at)))
		d.bench.add("repave.build", stopping.Sub(begun.at))
	}
	d.bench.add("repave.unit", unit)
	if csinodeRestarts(lines) > 0 {
		o.say("(the new kubelet hit its CSINode retry: the node stack was restarted once, which the downtime above includes)")
	}
	d.bench.kubeletStart(t, ctx, o, d.kube, d.m, "repave", d.name, repaveUnit, begin)
	o.say("pod %s Running again on %s (IP %s), %s after the repave started", pod.Name, pod.Spec.NodeName, pod.Status.PodIP, took(podBack.Sub(begin)))
	st, _ := d.m.Run("unbounded", "status")
	o.say("$ unbounded status")
	o.block(st)
	if d.bench.path == "" {
		return
	}

	// The floor: the payload's own start, measured as the downtime is:
	// kubelet and containerd stopped, the Node deleted and both started
	// again by hand (systemctl), the old kubelet's stop -> the Node
	// registered afresh and Ready.
	o.step("bench: the floor: the same node stack stopped, its Node deleted and started again by hand")
	uid = d.nodeUID(t, ctx)
	begin = time.Now()
	ready = d.watchReadyAgain(ctx, uid)
	if out, err := d.m.Systemctl("stop", none.KubeletUnit, none.ContainerdUnit); err != nil {
		t.Fatalf("stop the node stack by hand: %v\n%s", err, out)
	}
	if err := d.kube.CoreV1().Nodes().Delete(ctx, d.name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete Node: %v", err)
	}
	if out, err := d.m.Systemctl("start", none.ContainerdUnit, none.KubeletUnit); err != nil {
		t.Fatalf("start the node stack by hand: %v\n%s", err, out)
	}
	readyAt = d.waitReady(t, ready)
	if _, stopped := d.kubeletStop(t, begin); !stopped.IsZero() {
		o.say("floor: kubelet stopped -> Node registered afresh and Ready, by hand: %s", took(readyAt.Sub(stopped)))
		d.bench.add("repave.floor", readyAt.Sub(stopped))
	}

	// A rollback: a version whose kubelet exits at once; the repave's
	// ready wait is bounded at 60 s by a drop-in. Once it has begun,
	// agent.toml names the running version again (as an operator reverts
	// a bad change), so that the daemon's repave of the Node the repave
	// deleted finds nothing to do.
	v3 := bumpPatch(t, v1, 2)
	o.step("bench: a rollback (version %s, whose kubelet exits at once; the new node is given up after 60 s)", v3)
	broken := t.TempDir() + "/kubelet"
	if err := os.WriteFile(broken, []byte("#!/bin/sh\necho 'kubelet of a broken release: exiting' >&2\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	d.stage.ServeAsVersion(t, d.mirrorDir, "kubelet", v3, broken)
	nodestack.SetKubernetesVersion(t, d.m, v2, v3)
	dropin := "/etc/systemd/system/" + repaveUnit + ".d/bench.conf"
	d.m.WriteFile(dropin, []byte("[Service]\nExecStart=\nExecStart=/usr/libexec/unbounded/repave --ready-timeout=60s\n"), 0o644)
	d.m.Systemctl("daemon-reload")
	// The floor deleted the Node: the daemon repaves the vanished Node
	// (nothing to do: the version runs); that run ends first.
	waitUntil(t, ctx, 5*time.Minute, "no repave runs", func(context.Context) (bool, error) {
		out, _ := d.m.Systemctl("is-active", repaveUnit)
		s := strings.TrimSpace(out)
		return s != "active" && s != "activating" && s != "deactivating", nil
	})
	begin = time.Now()
	d.m.Systemctl("reset-failed", repaveUnit)
	if out, err := d.m.Systemctl("start", "--no-block", repaveUnit); err != nil {
		t.Fatalf("start %s: %v\n%s", repaveUnit, err, out)
	}
	waitUntil(t, ctx, 5*time.Minute, "the repave begun", func(context.Context) (bool, error) {
		_, ok := find(d.journal(t, repaveUnit, begin), "repave begun")
		return ok, nil
	})
	nodestack.SetKubernetesVersion(t, d.m, v3, v2)
	if d.wait(t, ctx, begin) {
		t.Fatalf("the repave onto a never-healthy version succeeded:\n%s", d.m.Journal(repaveUnit))
	}
	lines = d.journal(t, repaveUnit, begin)
	failed, ok1 := find(lines, "repave failed, rolling back")
	end, ok2 := find(lines, repaveUnit+": Failed with result")
	if ok1 && ok2 {
		o.say("rolled back: new version given up -> %s running and healthy again, %s removed: %s", v2, v3, took(end.at.Sub(failed.at)))
		d.bench.add("repave.rollback", end.at.Sub(failed.at))
	}
	d.m.Run("rm", "-f", dropin)
	d.m.Systemctl("daemon-reload")
	waitUntil(t, ctx, 3*time.Minute, "Node Ready after the rollback", func(ctx context.Context) (bool, error) {
		n, err := d.kube.CoreV1().Nodes().Get(ctx, d.name, metav1.GetOptions{})
		return err == nil && nodestack.IsReady(n), nil
	})
}

func (d *repaveDemo) nodeUID(t *testing.T, ctx context.Context) string {
	t.Helper()
	var uid string
	waitUntil(t, ctx, 3*time.Minute, "Node "+d.name+" registered", func(ctx context.Context) (bool, error) {
		n, err := d.kube.CoreV1().Nodes().Get(ctx, d.name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		uid = string(n.UID)
		return true, nil
	})
	return uid
}

// watchReadyAgain polls the Node (every 200 ms) until one with a UID
// other than uid is Ready, and sends when it saw it.
func (d *repaveDemo) watchReadyAgain(ctx context.Context, uid string) <-chan time.Time {
	done := make(chan time.Time, 1)
	go func() {
		for ctx.Err() == nil {
			n, err := d.kube.CoreV1().Nodes().Get(ctx, d.name, metav1.GetOptions{})
			if err == nil && string(n.UID) != uid && nodestack.IsReady(n) {
				done <- time.Now()
				return
			}
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	return done
}

func (d *repaveDemo) waitReady(t *testing.T, ready <-chan time.Time) time.Time {
	t.Helper()
	select {
	case at := <-ready:
		return at
	case <-time.After(5 * time.Minute):
		t.Fatalf("Node %s not registered afresh and Ready within 5m", d.name)
	}
	return time.Time{}
}

// kubeletStop is when the kubelet's unit began stopping and stopped
// first since begin (systemd's "Stopping" and "Stopped" lines).
func (d *repaveDemo) kubeletStop(t *testing.T, begin time.Time) (stopping, stopped time.Time) {
	t.Helper()
	for _, l := range d.journal(t, none.KubeletUnit, begin) {
		switch {
		case l.at.Before(begin):
		case strings.HasPrefix(l.msg, "Stopping ") && stopping.IsZero():
			stopping = l.at
		case strings.HasPrefix(l.msg, "Stopped ") && stopped.IsZero():
			stopped = l.at
		}
	}
	return stopping, stopped
}

// podBack waits for the Deployment's pod Running on the Node.
func (d *repaveDemo) podBack(t *testing.T, ctx context.Context) corev1.Pod {
	t.Helper()
	var pod corev1.Pod
	waitUntil(t, ctx, 3*time.Minute, "the Deployment's pod Running on the node", func(ctx context.Context) (bool, error) {
		pods, err := d.kube.CoreV1().Pods(d.ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		for _, p := range pods.Items {
			if p.DeletionTimestamp == nil && p.Spec.NodeName == d.name && p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" {
				pod = p
				return true, nil
			}
		}
		return false, nil
	})
	return pod
}

// bumpPatch is v with its patch number raised by n ("1.36.3", 1 ->
// "1.36.4").
func bumpPatch(t *testing.T, v string, n int) string {
	t.Helper()
	parts := strings.SplitN(strings.TrimPrefix(v, "v"), ".", 3)
	if len(parts) != 3 {
		t.Fatalf("version %q is not MAJOR.MINOR.PATCH", v)
	}
	patch, err := strconv.Atoi(parts[2])
	if err != nil {
		t.Fatalf("version %q: %v", v, err)
	}
	return parts[0] + "." + parts[1] + "." + strconv.Itoa(patch+n)
}
