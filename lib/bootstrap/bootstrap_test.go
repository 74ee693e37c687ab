package bootstrap_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"unbounded-cloud.io/agent/lib/bootstrap"
	"unbounded-cloud.io/agent/lib/crashpoint"
	"unbounded-cloud.io/agent/lib/exitcode"
	"unbounded-cloud.io/agent/lib/hostprep"
	"unbounded-cloud.io/agent/lib/state"
	"unbounded-cloud.io/agent/lib/testhost"
)

// childEnv makes the test binary run one bootstrap on the world whose root
// it names, and exit with its code: a crash point then kills a real
// process (SIGKILL), with no deferred function run and the ownership
// lock's flock released only by the kernel.
const childEnv = "BOOTSTRAP_TEST_CHILD_ROOT"

func TestMain(m *testing.M) {
	if root := os.Getenv(childEnv); root != "" {
		w := &testhost.World{Root: root}
		w.P.Root = root
		b := w.Bootstrap(slog.New(slog.NewTextHandler(os.Stderr, nil)))
		os.Exit(exitcode.For(b.Run(context.Background())))
	}
	os.Exit(m.Run())
}

func newWorld(t *testing.T) *testhost.World {
	t.Helper()
	w, err := testhost.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func run(t *testing.T, w *testhost.World) error {
	t.Helper()
	return w.Bootstrap(slog.New(slog.NewTextHandler(tWriter{t}, nil))).Run(context.Background())
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func index(calls []string, c string) int {
	return slices.Index(calls, c)
}

func TestFirstBootStartsTheNodeBehindTheFenceAndRecordsItOnlyOnceReady(t *testing.T) {
	w := newWorld(t)
	b := w.Bootstrap(slog.New(slog.NewTextHandler(tWriter{t}, nil)))
	var notes []string
	b.Notify = func(s string) { notes = append(notes, s) }
	if err := b.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	// `systemctl status` shows each phase as it runs (STATUS=).
	for _, phase := range bootstrap.Phases {
		if !slices.ContainsFunc(notes, func(n string) bool { return strings.HasPrefix(n, "STATUS=phase "+phase+": ") }) {
			t.Errorf("no STATUS= for phase %s in %q", phase, notes)
		}
	}
	calls := w.Calls()
	t.Logf("calls: %q", calls)
	fence := index(calls, "start unbounded-fence.service(owned)")
	node := index(calls, "start systemd-nspawn@kube1.service(owned)")
	target := index(calls, "enqueue unbounded-node.target")
	daemon := index(calls, "start unbounded-daemon.service")
	if fence < 0 || node < 0 || fence > node {
		t.Errorf("the fence must run (while bootstrap owns the host) before the node starts: %q", calls)
	}
	if index(calls, "modprobe overlay") < 0 || index(calls, "modprobe overlay") > index(calls, "prepare kube1") {
		t.Errorf("host preparation must come before the slot: %q", calls)
	}
	// The node target and the daemon come after the release of the lock
	// (the generator wires nothing and the daemon exits 69 while owned),
	// after a reload, the daemon last.
	reload := slices.Index(calls[node+1:], "reload") + node + 1
	if target < 0 || daemon < 0 || !(node < reload && reload < target && target < daemon) {
		t.Errorf("want reload, node target queued, daemon started, unowned, in that order after the node: %q", calls)
	}
	a, err := state.ReadApplied(w.P, "kube1")
	if err != nil {
		t.Fatalf("applied config: %v", err)
	}
	if a.Mode != "nspawn" || a.Machine != testhost.Machine || a.KubernetesVersion != "1.36.3" || len(a.Config) == 0 {
		t.Errorf("applied config %+v", a)
	}
	if o, _ := state.ReadOwnership(w.P); o != nil {
		t.Errorf("ownership still held: %+v", o)
	}
	if _, err := os.Stat(w.P.Journal(bootstrap.Operation)); !os.IsNotExist(err) {
		t.Errorf("journal left after success: %v", err)
	}
	if r := w.Reports(); !slices.Equal(r, []string{"Running", "Succeeded"}) {
		t.Errorf("reports %q", r)
	}
	rec, err := hostprep.ReadRecord(w.P)
	if err != nil || rec == nil || len(rec.Changes) == 0 {
		t.Errorf("host preparation not recorded: %v %v", rec, err)
	}
	if data, err := os.ReadFile(w.P.MachineDir("kube1") + "/prepared"); err != nil || !strings.Contains(string(data), "var/lib/unbounded/artifacts/kubelet/1.36.3/kubelet") {
		t.Errorf("slot not prepared from the verified kubelet in the cache: %q %v", data, err)
	}
}

func TestBootstrappedHostIsHandedOverNotBootstrappedAgain(t *testing.T) {
	w := newWorld(t)
	if err := run(t, w); err != nil {
		t.Fatal(err)
	}
	before, _ := w.Snapshot()
	w.ClearCalls()
	// As after a boot where the generator saw /var unmounted: bootstrap
	// runs again on a host that has its record.
	if err := run(t, w); err != nil {
		t.Fatal(err)
	}
	want := []string{"reload", "enqueue unbounded-node.target", "start unbounded-daemon.service"}
	if got := w.Calls(); !slices.Equal(got, want) {
		t.Errorf("calls %q, want only %q", got, want)
	}
	after, _ := w.Snapshot()
	if d := testhost.Diff(before, after); len(d) > 0 {
		t.Errorf("the hand-over changed the host:\n%s", strings.Join(d, "\n"))
	}
}

// A host the older agent installed, started by hand with bootstrap: its
// node is adopted (lib/adopt) and handed over, never bootstrapped over
// (no slot prepared, no fence run, no node started).
func TestBootstrapOnAnOlderAgentsHostAdoptsItsNodeInsteadOfBootstrapping(t *testing.T) {
	w := newWorld(t)
	older := `{"MachineName": "site-w1", "Cluster": {"Version": "v1.36.3"}, "Kubelet": {"ApiServer": "https://127.0.0.1:6443"}}`
	for f, c := range map[string]string{
		"/etc/unbounded/agent/kube1-applied-config.json": older,
		"/var/lib/machines/kube1/etc/os-release":         "ID=debian\n",
	} {
		if err := w.Write(f, c); err != nil {
			t.Fatal(err)
		}
	}
	w.SetUnitState("systemd-nspawn@kube1.service", "active")
	w.ClearCalls()
	if err := run(t, w); err != nil {
		t.Fatal(err)
	}
	if a, err := state.ReadActive(w.P); err != nil || a == nil || a.Slot != "kube1" {
		t.Fatalf("record %+v, %v", a, err)
	}
	for _, c := range w.Calls() {
		if strings.HasPrefix(c, "prepare") || strings.HasPrefix(c, "start unbounded-fence") || strings.HasPrefix(c, "start systemd-nspawn") {
			t.Errorf("bootstrapped over the older agent's node: %q", w.Calls())
		}
	}
	if got := w.Calls(); got[len(got)-1] != "start unbounded-daemon.service" {
		t.Errorf("calls %q: the node not handed over", got)
	}
}

func TestChecksumMismatchExits1NamingTheArtifactAndBothSumsWithoutARecord(t *testing.T) {
	w := newWorld(t)
	f, err := w.OfflineFile("runc")
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(f, []byte("not the runc the mirror meant\n"), 0o644)
	err = run(t, w)
	if code := exitcode.For(err); code != exitcode.Failed {
		t.Fatalf("exit %d (%v), want 1", code, err)
	}
	msg := err.Error()
	if !strings.Contains(msg, "runc") || strings.Count(msg, "sha256")+strings.Count(msg, "SHA-256") == 0 {
		t.Errorf("error does not name the artifact and the sums: %s", msg)
	}
	if _, err := state.ReadActive(w.P); err != nil {
		t.Error(err)
	}
	if a, _ := state.ReadActive(w.P); a != nil {
		t.Error("applied config recorded after a failure")
	}
	if o, _ := state.ReadOwnership(w.P); o != nil {
		t.Errorf("lock not released: %+v", o)
	}
	// `unbounded status` shows the journal's step: where and why.
	var j bootstrap.Journal
	if ok, err := state.ReadJournal(w.P, bootstrap.Operation, &j); !ok || err != nil {
		t.Errorf("journal: %v %v", ok, err)
	} else if !strings.HasPrefix(j.Step, "artifacts failed: ") || !strings.Contains(j.Step, "runc") {
		t.Errorf("journal step %q, want the phase and the error", j.Step)
	}
	r := w.Reports()
	if len(r) != 2 || !strings.HasPrefix(r[1], "Failed ArtifactChecksumMismatch: ") {
		t.Errorf("reports %q", r)
	}
	for _, c := range w.Calls() {
		if strings.HasPrefix(c, "start ") || strings.HasPrefix(c, "prepare ") {
			t.Errorf("%s after a failed artifact phase", c)
		}
	}
}

func TestFenceRefusalExits77AndNoNodeRuns(t *testing.T) {
	w := newWorld(t)
	w.SetFenceExit(exitcode.Refused)
	err := run(t, w)
	if code := exitcode.For(err); code != exitcode.Refused {
		t.Fatalf("exit %d (%v), want 77", code, err)
	}
	if st := w.UnitState("systemd-nspawn@kube1.service"); st != "inactive" {
		t.Errorf("node unit %s after a refusal", st)
	}
	r := w.Reports()
	if len(r) != 2 || !strings.HasPrefix(r[1], "Failed AllocationLaunchRefused: ") {
		t.Errorf("reports %q", r)
	}
	if a, _ := state.ReadActive(w.P); a != nil {
		t.Error("applied config recorded after a refusal")
	}
	// The cluster changes its mind: the next start converges.
	w.SetFenceExit(0)
	if err := run(t, w); err != nil {
		t.Fatal(err)
	}
	if a, _ := state.ReadActive(w.P); a == nil {
		t.Error("no applied config after the fence allowed")
	}
}

func TestNodeNeverReadyTimesOutSayingWhatIsMissingAndStopsTheNode(t *testing.T) {
	w := newWorld(t)
	w.SetNodeReady(false)
	err := run(t, w)
	if code := exitcode.For(err); code != exitcode.Failed {
		t.Fatalf("exit %d (%v), want 1", code, err)
	}
	if !strings.Contains(err.Error(), "still missing: Node site-w1 is not Ready (Ready False, reason KubeletNotReady") {
		t.Errorf("timeout error does not say what was missing: %v", err)
	}
	if st := w.UnitState("systemd-nspawn@kube1.service"); st != "inactive" {
		t.Errorf("node unit %s after a failed bootstrap: a node without a record must not run", st)
	}
	if a, _ := state.ReadActive(w.P); a != nil {
		t.Error("applied config recorded for a node that never got Ready")
	}
	if r := w.Reports(); len(r) != 2 || !strings.HasPrefix(r[1], "Failed NodeNotReady: ") {
		t.Errorf("reports %q", r)
	}
	if slices.Contains(w.Calls(), "restart kube1") {
		t.Errorf("the node stack was restarted for a Node NotReady for another reason than its CSINode: %q", w.Calls())
	}
	// Once the node gets Ready, a rerun resumes: the slot is not built
	// again.
	w.SetNodeReady(true)
	w.ClearCalls()
	if err := run(t, w); err != nil {
		t.Fatal(err)
	}
	if slices.Contains(w.Calls(), "prepare kube1") {
		t.Errorf("the slot was prepared again although the journal says it is done: %q", w.Calls())
	}
}

func TestInvalidConfigExits78AndChangesNothing(t *testing.T) {
	w := newWorld(t)
	w.Write("/etc/unbounded/agent.toml", testhost.Config+"\n[cluster]\nbogus = 1\n")
	before, _ := w.Snapshot()
	err := run(t, w)
	if code := exitcode.For(err); code != exitcode.ConfigInvalid {
		t.Fatalf("exit %d (%v), want 78", code, err)
	}
	if !strings.Contains(err.Error(), "agent.toml") {
		t.Errorf("error does not name the file: %v", err)
	}
	after, _ := w.Snapshot()
	// The ownership lock's file under /run is the only trace.
	delete(after, "run/unbounded/ownership.lock")
	if d := testhost.Diff(before, after); len(d) > 0 {
		t.Errorf("an invalid config changed the host:\n%s", strings.Join(d, "\n"))
	}
}

func TestNspawnModeWithoutAnImageExits78BeforeTheHostIsChanged(t *testing.T) {
	w := newWorld(t)
	w.Write("/etc/unbounded/agent.toml", strings.Replace(testhost.Config, "image = \"registry.example/node:1.36.3\"", "", 1))
	before, _ := w.Snapshot()
	err := run(t, w)
	if code := exitcode.For(err); code != exitcode.ConfigInvalid || !strings.Contains(err.Error(), "[nspawn] image") || !strings.Contains(err.Error(), "agent.toml") {
		t.Fatalf("exit %d: %v", code, err)
	}
	after, _ := w.Snapshot()
	delete(after, "run/unbounded/ownership.lock")
	if d := testhost.Diff(before, after); len(d) > 0 {
		t.Errorf("the host changed:\n%s", strings.Join(d, "\n"))
	}
}

// A node.ip that is not an address of this host is a configuration
// error at its line, said before the host is changed.
func TestNodeIPThatIsNotTheHostsExits78AtItsLineBeforeTheHostIsChanged(t *testing.T) {
	w := newWorld(t)
	w.Write("/etc/unbounded/agent.toml.d/50-ip.toml", "[node]\nip = \"2001:db8::dead\"\n")
	before, _ := w.Snapshot()
	err := run(t, w)
	if code := exitcode.For(err); code != exitcode.ConfigInvalid || !strings.Contains(err.Error(), "50-ip.toml:2: node.ip: 2001:db8::dead is not an address of this host") {
		t.Fatalf("exit %d: %v", code, err)
	}
	after, _ := w.Snapshot()
	delete(after, "run/unbounded/ownership.lock")
	if d := testhost.Diff(before, after); len(d) > 0 {
		t.Errorf("the host changed:\n%s", strings.Join(d, "\n"))
	}
}

func TestAnotherInstallationOwningTheHostDefers(t *testing.T) {
	w := newWorld(t)
	lock, err := state.AcquireOwnership(w.P, "reset", "unbounded-reset.service")
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Release()
	w.SetUnitState("unbounded-reset.service", "activating") // the reset runs
	if code := exitcode.For(run(t, w)); code != exitcode.Deferred {
		t.Fatalf("exit %d, want 69", code)
	}
	if len(w.Calls()) != 0 {
		t.Errorf("a deferred bootstrap did %q", w.Calls())
	}
}

// A host with a separate /var that lost power mid-repave: the generator
// ran before /var was mounted, took the host for a fresh one and pulled in
// bootstrap. Bootstrap finds the repave's ownership record, defers (69),
// and queues the repave's unit, which resumes from its journal; it changes
// nothing else.
func TestBootstrapOnAHostARepaveOwnsResumesTheRepave(t *testing.T) {
	w := newWorld(t)
	if err := state.WriteFileAtomic(w.P.Ownership(), []byte(`{"owner":"repave","unit":"unbounded-repave.service","pid":4242,"since":"2026-12-01T12:00:00Z"}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	before, _ := w.Snapshot()
	if code := exitcode.For(run(t, w)); code != exitcode.Deferred {
		t.Fatalf("exit %d, want 69", code)
	}
	if got := w.Calls(); len(got) != 1 || got[0] != "enqueue unbounded-repave.service(owned)" {
		t.Errorf("calls %q, want only the repave's unit queued", got)
	}
	after, _ := w.Snapshot()
	delete(after, "run/unbounded/ownership.lock") // the flock's file
	if d := testhost.Diff(before, after); len(d) > 0 {
		t.Errorf("the host changed:\n%s", strings.Join(d, "\n"))
	}

	// Its unit runs already: nothing queued a second time.
	w.ClearCalls()
	w.SetUnitState("unbounded-repave.service", "activating")
	if code := exitcode.For(run(t, w)); code != exitcode.Deferred {
		t.Fatalf("exit %d, want 69", code)
	}
	if got := w.Calls(); len(got) != 0 {
		t.Errorf("calls %q with the repave running, want none", got)
	}
}

func TestTemporaryFailureExits75AndTheRetryWaitsLonger(t *testing.T) {
	w := newWorld(t)
	b := w.Bootstrap(nil)
	b.Fetch = nil
	// A mirror that refuses connections and no offline copy of kubelet.
	f, _ := w.OfflineFile("kubelet")
	os.Remove(f)
	w.Write("/etc/unbounded/agent.toml.d/50-mirror.toml", "[artifacts]\nbase-url = \"http://127.0.0.1:1\"\n")
	err := b.Run(context.Background())
	if code := exitcode.For(err); code != exitcode.TempFail {
		t.Fatalf("exit %d (%v), want 75", code, err)
	}
	var j bootstrap.Journal
	if ok, err := state.ReadJournal(w.P, bootstrap.Operation, &j); !ok || err != nil {
		t.Fatalf("journal: %v %v", ok, err)
	}
	if j.TempFailures != 1 || j.LastError == "" {
		t.Errorf("journal %+v", j)
	}
	// `unbounded status` shows the journal's step.
	if !strings.HasPrefix(j.Step, "artifacts failed for now (retry 1 follows): ") {
		t.Errorf("journal step %q, want the phase, the retry and the error", j.Step)
	}
	if r := w.Reports(); len(r) != 1 {
		t.Errorf("a temporary failure is not reported as Failed: %q", r)
	}
	for n, want := range map[int]time.Duration{1: 10 * time.Second, 2: 20 * time.Second, 3: 40 * time.Second, 10: bootstrap.MaxBackoff} {
		if got := bootstrap.Backoff(0, n); got != want {
			t.Errorf("Backoff(%d) = %s, want %s", n, got, want)
		}
	}
	// The next run waits out the backoff before it works again: a
	// cancelled context ends that wait as a temporary failure, and
	// nothing else ran.
	b.Backoff = time.Hour
	w.ClearCalls()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	err = b.Run(ctx)
	if exitcode.For(err) != exitcode.TempFail || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("run during the backoff: %v", err)
	}
	if len(w.Calls()) != 0 {
		t.Errorf("work done during the backoff: %q", w.Calls())
	}
}

// crashPoints are every point a bootstrap passes, its own and lib/hostprep's.
func crashPoints() []string {
	return append([]string{"hostprep/after-record", "hostprep/after-change"}, bootstrap.CrashPoints...)
}

func child(t *testing.T, w *testhost.World, point string) (int, string) {
	t.Helper()
	return testhost.RunChild(t, childEnv+"="+w.Root, crashpoint.Env+"="+point)
}

func TestCrashAtEveryPointThenRerunEndsAsAnUninterruptedRun(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a child process per crash point; skipped with -short")
	}
	ref := newWorld(t)
	if code, out := child(t, ref, ""); code != 0 {
		t.Fatalf("uninterrupted run: exit %d\n%s", code, out)
	}
	want, _ := ref.Snapshot()
	for _, point := range crashPoints() {
		t.Run(strings.ReplaceAll(point, "/", "_"), func(t *testing.T) {
			w := newWorld(t)
			code, out := child(t, w, point)
			if code != crashpoint.ExitCode {
				t.Fatalf("crash at %s: exit %d, want %d\n%s", point, code, crashpoint.ExitCode, out)
			}
			if !strings.Contains(out, "crash point "+point) {
				t.Fatalf("crashed elsewhere than %s:\n%s", point, out)
			}
			if code, out := child(t, w, ""); code != 0 {
				t.Fatalf("rerun after the crash at %s: exit %d\n%s", point, code, out)
			}
			got, _ := w.Snapshot()
			if d := testhost.Diff(normalize(want, ref), normalize(got, w)); len(d) > 0 {
				t.Errorf("end state after a crash at %s differs from an uninterrupted run's:\n%s", point, strings.Join(d, "\n"))
			}
			calls := w.Calls()
			if !slices.Contains(calls, "start unbounded-daemon.service") {
				t.Errorf("daemon never started: %q", calls)
			}
		})
	}
}

// normalize drops what differs between two worlds by construction: the
// CA (a new key per world), the fake units' state of the fence, and the
// time in the outcome record (a run resumed after a cut ends later).
var outcomeTimeRE = regexp.MustCompile(`"time": "[^"]*"`)

func normalize(s map[string]string, w *testhost.World) map[string]string {
	out := map[string]string{}
	for k, v := range s {
		switch {
		case k == "etc/unbounded/ca.crt":
			v = "(ca)"
		case k == "fake/units/unbounded-fence.service":
			continue
		case strings.HasPrefix(k, "var/lib/unbounded/outcome/"):
			v = outcomeTimeRE.ReplaceAllString(v, `"time": "(end)"`)
		}
		out[k] = v
	}
	_ = fmt.Sprint(w.Root)
	return out
}

// The kubelet's CSINode race (lib/bootstrap ready): a registered Node that
// waits for its CSINode past the grace gets one restart of the node
// stack, and comes up; one that stays so is not restarted again.
func TestNodeWaitingForItsCSINodeGetsOneRestartOfTheNodeStack(t *testing.T) {
	for _, sticky := range []bool{false, true} {
		t.Run(fmt.Sprintf("sticky=%v", sticky), func(t *testing.T) {
			w := newWorld(t)
			w.SetCSINodePending(sticky)
			err := run(t, w)
			restarts := 0
			for _, c := range w.Calls() {
				if c == "restart kube1" {
					restarts++
				}
			}
			if restarts != 1 {
				t.Errorf("%d restarts of the node stack, want 1: %q", restarts, w.Calls())
			}
			if sticky {
				if code := exitcode.For(err); code != exitcode.Failed || !strings.Contains(err.Error(), "CSINode") {
					t.Errorf("exit %d (%v), want 1 naming the CSINode", code, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if a, _ := state.ReadActive(w.P); a == nil {
				t.Error("no applied config after the node came up")
			}
		})
	}
}

// previousJournal is the bootstrap journal as the build before lib/steps
// declared it, field for field: a host upgraded mid-bootstrap resumes
// what that build wrote.
type previousJournal struct {
	Input           string    `json:"input"`
	Mode            string    `json:"mode"`
	Slot            string    `json:"slot"`
	Done            []string  `json:"done"`
	Step            string    `json:"step,omitempty"`
	TempFailures    int       `json:"temp-failures,omitempty"`
	LastTempFailure time.Time `json:"last-temp-failure,omitzero"`
	LastError       string    `json:"last-error,omitempty"`
}

func TestAJournalOfThePreviousBuildResumesWithoutRedoingItsPhases(t *testing.T) {
	w := newWorld(t)
	point := "bootstrap/after-" + bootstrap.PhaseSlot
	if code, out := child(t, w, point); code != crashpoint.ExitCode {
		t.Fatalf("crash at %s: exit %d\n%s", point, code, out)
	}
	var j bootstrap.Journal
	if ok, err := state.ReadJournal(w.P, bootstrap.Operation, &j); !ok || err != nil {
		t.Fatalf("journal after the crash: %v %v", ok, err)
	}
	old := previousJournal{Input: j.Input, Mode: j.Mode, Slot: j.Slot, Step: bootstrap.PhaseSlot,
		Done: []string{bootstrap.PhaseConfig, bootstrap.PhaseHostPrep, bootstrap.PhaseArtifacts, bootstrap.PhaseSlot}}
	if err := state.WriteJournal(w.P, bootstrap.Operation, old); err != nil {
		t.Fatal(err)
	}
	w.ClearCalls()
	if err := run(t, w); err != nil {
		t.Fatalf("resumed bootstrap: %v", err)
	}
	for _, c := range []string{"prepare kube1", "modprobe overlay"} {
		if slices.Contains(w.Calls(), c) {
			t.Errorf("%q again although the journal says its phase is done: %q", c, w.Calls())
		}
	}
	if a, _ := state.ReadActive(w.P); a == nil {
		t.Error("no applied config after the resumed bootstrap")
	}
}
