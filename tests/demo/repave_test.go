//go:build demo

package demo_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/kube"
	"unbounded-cloud.io/agent/tests/kubeenv"
	"unbounded-cloud.io/agent/tests/system/harness"
	"unbounded-cloud.io/agent/tests/system/nodestack"
)

const repaveUnit = "unbounded-repave.service"

// repaveDemo is the demo's second act. In mode nspawn (run; runNone is
// mode none's, tests/demo/repave_none_test.go): a new node image in
// agent.toml, then `systemctl start unbounded-repave.service` in the host:
// kube1 -> kube2, blue/green. It prints the repave's steps, the downtime
// (old kubelet stopped -> new kubelet healthy and its Node Ready, from the
// repave's own log lines; and the Node's absence as the API server saw
// it) and the pod moving back to Running. With a bench file it also
// measures a rollback: a node image whose kubelet never runs.
type repaveDemo struct {
	o     *out
	m     *harness.Machine
	env   *kubeenv.Env
	kube  kubernetes.Interface
	reg   *nodestack.Registry
	stage *nodestack.Stage
	// mirrorDir is the directory the artifact mirror serves (mode none
	// serves a second version from it).
	mirrorDir string
	name      string
	ns        string
	bench     *benchOut
	// image is the node image agent.toml names (setImage).
	image string
}

// journalLine is one line of `journalctl -o short-unix`.
type journalLine struct {
	at  time.Time
	msg string
}

// journal is unit's journal since since (a second before it).
func (d *repaveDemo) journal(t *testing.T, unit string, since time.Time) []journalLine {
	t.Helper()
	return unitJournal(t, d.m, unit, since)
}

// unitJournal is unit's journal in m since since (a second before it).
func unitJournal(t *testing.T, m *harness.Machine, unit string, since time.Time) []journalLine {
	t.Helper()
	out, err := m.Run("journalctl", "-q", "--no-pager", "-o", "short-unix", "-u", unit, "--since", "@"+strconv.FormatInt(since.Unix()-1, 10))
	if err != nil {
		t.Fatalf("journalctl: %v\n%s", err, out)
	}
	var lines []journalLine
	for _, l := range strings.Split(out, "\n") {
		ts, rest, ok := strings.Cut(l, " ")
		if !ok {
			continue
		}
		f, err := strconv.ParseFloat(ts, 64)
		if err != nil {
			continue
		}
		// "host repave[457]: message"
		if _, msg, ok := strings.Cut(rest, ": "); ok {
			lines = append(lines, journalLine{at: time.Unix(0, int64(f*1e9)), msg: msg})
		}
	}
	return lines
}

func find(lines []journalLine, prefix string) (journalLine, bool) {
	for _, l := range lines {
		if strings.HasPrefix(l.msg, prefix) {
			return l, true
		}
	}
	return journalLine{}, false
}

// setImage makes agent.toml name ref as the node image.
func (d *repaveDemo) setImage(t *testing.T, ref string) {
	t.Helper()
	file := hostpaths.New(d.m.Root()).ConfigFile()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "image = ") {
			l = fmt.Sprintf("image = %q", ref)
		}
		out = append(out, l)
	}
	if err := os.WriteFile(file, []byte(strings.Join(out, "\n")), 0o644); err != nil {
		t.Fatal(err)
	}
	d.image = ref
}

// certificate approves the daemon's CSR as the cluster side would and
// waits until it is stored: only the daemon's certificate may cordon,
// drain and delete the Node.
func (d *repaveDemo) certificate(t *testing.T, ctx context.Context) {
	t.Helper()
	prefix := "unbounded-agent-" + d.name + "-"
	waitUntil(t, ctx, 2*time.Minute, "the daemon's CSR", func(ctx context.Context) (bool, error) {
		l, err := d.kube.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		for _, c := range l.Items {
			if strings.HasPrefix(c.Name, prefix) {
				if len(c.Status.Conditions) == 0 {
					d.env.ApproveCSR(t, c.Name)
				}
				return true, nil
			}
		}
		return false, nil
	})
	store := kube.CertStore{Dir: hostpaths.New(d.m.Root()).PKIDir()}
	waitUntil(t, ctx, 2*time.Minute, "the daemon's certificate stored", func(context.Context) (bool, error) {
		_, err := store.Load()
		return err == nil, nil
	})
}

// start starts the repave unit and waits for the end of that run (its
// lines since begin); it returns whether it succeeded.
func (d *repaveDemo) start(t *testing.T, ctx context.Context, begin time.Time) bool {
	t.Helper()
	d.m.Systemctl("reset-failed", repaveUnit)
	if out, err := d.m.Systemctl("start", "--no-block", repaveUnit); err != nil {
		t.Fatalf("start %s: %v\n%s", repaveUnit, err, out)
	}
	return d.wait(t, ctx, begin)
}

// wait waits for the end of the repave unit's run started after begin,
// showing its steps as they happen; it returns whether it succeeded. The
// query reaches a second back: the end of a run before this one (the
// daemon's repave of a Node deleted by hand) is not this run's.
func (d *repaveDemo) wait(t *testing.T, ctx context.Context, begin time.Time) bool {
	t.Helper()
	return waitUnitEnd(t, ctx, d.m, repaveUnit, begin, func(l journalLine) {
		if notable(l.msg) {
			d.o.say("  +%5.1fs  %s", l.at.Sub(begin).Seconds(), l.msg)
		}
	})
}

// notable says whether the demo shows a line of the repave's journal.
func notable(msg string) bool {
	for _, s := range []string{"step ", "took=", "Node deleted", "CSINode", "node up", "networking", "removed", "rolling back", "rolled back", "Failed with result"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return strings.HasPrefix(msg, "repave")
}

func (d *repaveDemo) run(t *testing.T, ctx context.Context) {
	t.Helper()
	o := d.o
	o.step("repave: a new node image in agent.toml, then `systemctl start unbounded-repave.service` in the host (kube1 -> kube2, blue/green)")
	d.certificate(t, ctx)
	ref := d.reg.Push(t, "unbounded/node:bookworm-2", d.stage.NodeImage(t))
	d.setImage(t, ref)
	o.say("[nspawn] image = %q (the same node image under a new tag: a new desired config, the same artifacts)", ref)

	// The Node as the API server sees it.
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	w, err := d.kube.CoreV1().Nodes().Watch(wctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", d.name).String()})
	if err != nil {
		t.Fatal(err)
	}
	var deletedAt, readyAt time.Time
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for ev := range w.ResultChan() {
			n, ok := ev.Object.(*corev1.Node)
			if !ok {
				continue
			}
			switch {
			case ev.Type == watch.Deleted:
				deletedAt = time.Now()
			case !deletedAt.IsZero() && readyAt.IsZero():
				for _, c := range n.Status.Conditions {
					if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
						readyAt = time.Now()
					}
				}
			}
		}
	}()

	begin := time.Now()
	if !d.start(t, ctx, begin) {
		t.Fatalf("the repave failed:\n%s", d.m.Journal(repaveUnit))
	}
	unit := time.Since(begin)
	lines := d.journal(t, repaveUnit, begin)
	stopped, ok1 := find(lines, "old node stopped")
	up, ok2 := find(lines, "node up")
	built, ok3 := find(lines, "new slot built while the old node serves")
	var pod corev1.Pod
	waitUntil(t, ctx, 3*time.Minute, "the Deployment's pod Running on the new node", func(ctx context.Context) (bool, error) {
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
	podBack := time.Now()
	stopWatch()
	<-watched
	o.say("repaved in %s (systemctl start to the unit's end)", took(unit))
	if ok1 && ok2 {
		down := up.at.Sub(stopped.at)
		o.say("downtime: old kubelet stopped -> new kubelet healthy and its Node Ready: %s", took(down))
		d.bench.add("repave.downtime", down)
	}
	if !deletedAt.IsZero() && !readyAt.IsZero() {
		o.say("the Node, as the API server saw it: deleted -> registered afresh and Ready: %s", took(readyAt.Sub(deletedAt)))
		d.bench.add("repave.node-gap", readyAt.Sub(deletedAt))
	}
	if ok3 {
		if _, v, ok := strings.Cut(built.msg, "took="); ok {
			if dur, err := time.ParseDuration(strings.Fields(v)[0]); err == nil {
				o.say("slot kube2 built while kube1 served: %s", took(dur))
				d.bench.add("repave.build", dur)
			}
		}
	}
	d.bench.add("repave.unit", unit)
	if csinodeRestarts(lines) > 0 {
		// The kubelet registered its Node after its early CSINode
		// tries; the wait restarted the node stack once (lib/bootstrap
		// ready). The downtime then holds that restart.
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
	d.repaveLoop(t, ctx)
	o.step("bench: a rollback (a node image whose kubelet never runs; the new node is given up after 60 s)")
	bad := d.reg.Push(t, "unbounded/node:never-healthy", nodestack.NeverHealthyNodeImage(t, d.stage.NodeImage(t)))
	good := d.image
	d.setImage(t, bad)
	dropin := "/etc/systemd/system/" + repaveUnit + ".d/bench.conf"
	d.m.WriteFile(dropin, []byte("[Service]\nExecStart=\nExecStart=/usr/libexec/unbounded/repave --ready-timeout=60s\n"), 0o644)
	d.m.Systemctl("daemon-reload")
	begin = time.Now()
	if d.start(t, ctx, begin) {
		t.Fatalf("the repave onto a never-healthy node succeeded:\n%s", d.m.Journal(repaveUnit))
	}
	lines = d.journal(t, repaveUnit, begin)
	failed, ok1 := find(lines, "new node failed; rolling back")
	back, ok2 := find(lines, "rolled back")
	if ok1 && ok2 {
		o.say("rolled back: new node given up -> kube2 running and healthy again: %s", took(back.at.Sub(failed.at)))
		d.bench.add("repave.rollback", back.at.Sub(failed.at))
	}
	os.Remove(d.m.Root() + dropin)
	d.m.Systemctl("daemon-reload")
	// The running node's image again: what comes next (a reset, first
	// boots) starts from the config of the node that runs.
	d.setImage(t, good)
}

// repaveLoop repaves UNBOUNDED_DEMO_REPAVES more times (blue/green back
// and forth, each onto the node image under a new tag), bounded in count,
// and adds to the bench file how many of them restarted the node stack for
// the kubelet's CSINode (the ready wait's guard) and the longest downtime.
func (d *repaveDemo) repaveLoop(t *testing.T, ctx context.Context) {
	t.Helper()
	n, _ := strconv.Atoi(os.Getenv("UNBOUNDED_DEMO_REPAVES"))
	if n <= 0 {
		return
	}
	n = min(n, 100)
	d.o.step("bench: %d more repaves, counting the node stack restarts for the kubelet's CSINode", n)
	img := d.stage.NodeImage(t)
	restarts := 0
	var longest time.Duration
	for i := 1; i <= n; i++ {
		d.setImage(t, d.reg.Push(t, fmt.Sprintf("unbounded/node:loop-%d", i), img))
		begin := time.Now()
		if !d.start(t, ctx, begin) {
			t.Fatalf("repave %d of %d failed:\n%s", i, n, d.m.Journal(repaveUnit))
		}
		lines := d.journal(t, repaveUnit, begin)
		restarts += csinodeRestarts(lines)
		stopped, ok1 := find(lines, "old node stopped")
		up, ok2 := find(lines, "node up")
		if ok1 && ok2 {
			longest = max(longest, up.at.Sub(stopped.at))
		}
	}
	d.o.say("%d repaves: %d CSINode restarts, longest downtime %s", n, restarts, took(longest))
	d.bench.lines = append(d.bench.lines, fmt.Sprintf("repave.loop.runs %d", n), fmt.Sprintf("repave.loop.csinode-restarts %d", restarts))
	d.bench.add("repave.loop.downtime-max", longest)
}
