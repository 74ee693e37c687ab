package system_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"unbounded-cloud.io/agent/lib/api/identity"
	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/kube"
	"unbounded-cloud.io/agent/lib/state"
	"unbounded-cloud.io/agent/tests/kubeenv"
	"unbounded-cloud.io/agent/tests/system/harness"
)

// The daemon's system scenario: the daemon built from this tree, installed
// with its shipped unit file into a machine whose PID 1 is a real systemd,
// talking to the real API server of tests/kube on the host's loopback
// (the machine shares the host's network). The repave unit is a stand-in
// that logs one marker line per run, sleeps as told and then succeeds or
// fails as told; the journal's count of marker lines is the number of
// times systemd really ran it.

const (
	standInScript = "/usr/local/bin/stand-in-repave"
	standInCtl    = "/etc/unbounded-test"
	runMarker     = "STAND-IN REPAVE RUN uid="
	daemonUnit    = "unbounded-daemon.service"
	repaveUnit    = "unbounded-repave.service"
)

const standIn = `#!/bin/sh
# Stand-in for unbounded-repave: reports the request it was given.
uid=$(sed -n 's/.*"uid": "\(.*\)".*/\1/p' /var/lib/unbounded/requests/repave.json)
echo "` + runMarker + `$uid"
sleep "$(cat ` + standInCtl + `/sleep 2>/dev/null || echo 0)"
if [ "$(cat ` + standInCtl + `/result 2>/dev/null)" = fail ]; then
	echo "stand-in repave: failing as told"
	exit 1
fi
echo "stand-in repave: done"
`

const standInUnit = `[Unit]
Description=Stand-in repave for the daemon's system test
[Service]
Type=oneshot
ExecStart=` + standInScript + `
`

var (
	agentOnce sync.Once
	agentBin  string
	agentErr  error
)

// buildAgent builds the multicall executable from this tree, as make does.
func buildAgent(t *testing.T) string {
	t.Helper()
	agentOnce.Do(func() {
		// The package's directory is the test's working directory (a
		// source path from runtime.Caller is module-relative under
		// -trimpath, which run-tiers sets).
		repo, err := filepath.Abs(filepath.Join("..", ".."))
		if err != nil {
			agentErr = err
			return
		}
		dir, err := os.MkdirTemp("", "unbounded-agent-bin-")
		if err != nil {
			agentErr = err
			return
		}
		agentBin = filepath.Join(dir, "unbounded-agent")
		cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", agentBin, "./cmd/unbounded-agent")
		cmd.Dir = repo
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			agentErr = fmt.Errorf("go build ./cmd/unbounded-agent: %v\n%s", err, out)
		}
	})
	if agentErr != nil {
		t.Fatal(agentErr)
	}
	return agentBin
}

// kubeEnv is tests/kubeenv's environment with what the system scenarios
// (this file's and fence_test.go's) use of it.
type kubeEnv struct {
	*kubeenv.Env
	admin *rest.Config
	caPEM []byte
	kube  kubernetes.Interface
	api   rest.Interface // unbounded-cloud.io/v1alpha3, as the admin
}

func requireKube(t *testing.T) *kubeEnv {
	t.Helper()
	return kubeEnvOf(t, kubeenv.Get(t))
}

// kubeEnvOf is requireKube for a given environment (kubeenv.StartPrivate's).
func kubeEnvOf(t *testing.T, env *kubeenv.Env) *kubeEnv {
	t.Helper()
	e := &kubeEnv{Env: env, admin: env.RESTConfig(), caPEM: env.CAPEM(t), kube: env.Client()}
	c := env.RESTConfig()
	c.GroupVersion = &v1alpha3.SchemeGroupVersion
	c.APIPath = "/apis"
	c.NegotiatedSerializer = serializer.NewCodecFactory(apiruntimeScheme(t)).WithoutConversion()
	var err error
	if e.api, err = rest.RESTClientFor(c); err != nil {
		t.Fatal(err)
	}
	return e
}

// agentCert is the daemon's client certificate and key for machine, as
// lib/kube's CSR flow would have stored them.
func (e *kubeEnv) agentCert(t *testing.T, machine string) (certPEM, keyPEM []byte) {
	t.Helper()
	return e.MintClientCert(t, identity.AgentUserName(machine), identity.AgentGroup)
}

// registerMachine creates the Machine (isolation nspawn) as bootstrap does:
// the daemon never creates it, and acts only while it lives. It is deleted
// when the test ends.
func (e *kubeEnv) registerMachine(t *testing.T, machine string) {
	t.Helper()
	reg := &v1alpha3.Machine{ObjectMeta: metav1.ObjectMeta{Name: machine}}
	reg.Spec.Isolation.Mode = v1alpha3.IsolationNspawn
	if err := e.api.Post().Resource(v1alpha3.ResourceMachines).Body(reg).Do(context.Background()).Error(); err != nil {
		t.Fatalf("register Machine %s: %v", machine, err)
	}
	t.Cleanup(func() {
		e.api.Delete().Resource(v1alpha3.ResourceMachines).Name(machine).Do(context.Background())
	})
}

func (e *kubeEnv) createOp(t *testing.T, machine string, typ v1alpha3.OperationType) *v1alpha3.MachineOperation {
	t.Helper()
	in := &v1alpha3.MachineOperation{
		ObjectMeta: metav1.ObjectMeta{GenerateName: machine + "-", Labels: map[string]string{v1alpha3.MachineLabel: machine}},
		Spec:       v1alpha3.MachineOperationSpec{MachineRef: v1alpha3.MachineRef{Name: machine}, Operation: typ},
	}
	out := &v1alpha3.MachineOperation{}
	if err := e.api.Post().Resource(v1alpha3.ResourceMachineOperations).Body(in).Do(context.Background()).Into(out); err != nil {
		t.Fatalf("create operation: %v", err)
	}
	return out
}

func (e *kubeEnv) waitOp(t *testing.T, m *harness.Machine, name string) *v1alpha3.MachineOperation {
	t.Helper()
	begin := time.Now()
	deadline := begin.Add(60 * time.Second)
	for {
		op := &v1alpha3.MachineOperation{}
		err := e.api.Get().Resource(v1alpha3.ResourceMachineOperations).Name(name).Do(context.Background()).Into(op)
		if err == nil && op.Status.State.Finished() {
			logWait(t, begin, "operation "+name+" finished")
			return op
		}
		if time.Now().After(deadline) {
			t.Fatalf("operation %s not finished after 60s (state %q, err %v); daemon journal:\n%s", name, op.Status.State, err, m.Journal(daemonUnit))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// runs counts the stand-in's runs for uid in this boot's journal.
func runs(m *harness.Machine, uid string) int {
	return strings.Count(m.Journal(repaveUnit), runMarker+uid+"\n")
}

func showProps(t *testing.T, m *harness.Machine, unit string, props ...string) map[string]string {
	t.Helper()
	kv, err := m.Show(unit, props...)
	if err != nil {
		t.Fatalf("systemctl show %s: %v", unit, err)
	}
	return kv
}

func TestDaemonCarriesOutOperationsWithRealSystemd(t *testing.T) {
	env := requireKube(t)
	harness.Require(t, false)
	bin := buildAgent(t)

	machine := kubeenv.UniqueName(t, "sys-daemon")
	env.registerMachine(t, machine)

	binData, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	unitData, err := os.ReadFile(filepath.Join("..", "..", "units", daemonUnit))
	if err != nil {
		t.Fatal(err)
	}
	// The unit's sandbox makes /run/unbounded writable, so it must exist
	// before the daemon starts: the package's tmpfiles.d entry makes it at
	// boot.
	tmpfilesData, err := os.ReadFile(filepath.Join("..", "..", "deb", "unbounded-agent.tmpfiles"))
	if err != nil {
		t.Fatal(err)
	}
	m := harness.New(t, harness.Options{
		HostNetwork: true,
		Files: []harness.File{
			{Path: hostpaths.LibexecDirHost + "/unbounded-agent", Data: binData, Mode: 0o755},
			{Path: hostpaths.UnitDirHost + "/" + daemonUnit, Data: unitData, Mode: 0o644},
			{Path: state.TmpfilesConfHost, Data: tmpfilesData, Mode: 0o644},
			{Path: "/etc/systemd/system/" + repaveUnit, Data: []byte(standInUnit), Mode: 0o644},
			{Path: standInScript, Data: []byte(standIn), Mode: 0o755},
			{Path: hostpaths.ConfigFileHost, Data: []byte(fmt.Sprintf(`machine = %q
mode = "nspawn"

[cluster]
api-server = %q
ca-file = "/etc/unbounded/ca.crt"
bootstrap-token-file = "/etc/unbounded/bootstrap-token"
kubernetes-version = "1.36.3"
`, machine, env.Host())), Mode: 0o644},
			{Path: "/etc/unbounded/ca.crt", Data: env.CAPEM(t), Mode: 0o644},
			// Never used while the certificate is valid; the config
			// requires the file.
			{Path: "/etc/unbounded/bootstrap-token", Data: []byte("abcdef.0123456789abcdef\n"), Mode: 0o600},
		},
	})
	p := hostpaths.New(m.Root())
	// The concern's name on the host is a link to the multicall binary.
	if err := os.Symlink("unbounded-agent", p.Libexec("daemon")); err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM := env.agentCert(t, machine)
	if err := (kube.CertStore{Dir: p.PKIDir()}).Save(certPEM, keyPEM); err != nil {
		t.Fatal(err)
	}
	if err := state.WriteApplied(p, &state.AppliedConfig{Slot: "kube1", Mode: "nspawn", Machine: machine}); err != nil {
		t.Fatal(err)
	}
	m.Start()
	setStandIn := func(sleep, result string) {
		m.WriteFile(standInCtl+"/sleep", []byte(sleep+"\n"), 0o644)
		m.WriteFile(standInCtl+"/result", []byte(result+"\n"), 0o644)
	}

	if out, err := m.Systemctl("start", daemonUnit); err != nil {
		t.Fatalf("systemctl start %s: %v\n%s\n%s", daemonUnit, err, out, m.Journal(daemonUnit))
	}
	if s := m.UnitState(daemonUnit); s.ActiveState != "active" {
		t.Fatalf("%s is %s after start, want active (READY=1 sent)", daemonUnit, s)
	}

	t.Run("the daemon runs in its sandbox", func(t *testing.T) {
		assertSandboxed(t, m, daemonUnit, hostpaths.HostRootHost, hostpaths.RunDirHost)
	})

	t.Run("operation completes when the unit succeeds", func(t *testing.T) {
		setStandIn("0", "ok")
		op := env.createOp(t, machine, v1alpha3.OperationRepave)
		done := env.waitOp(t, m, op.Name)
		if done.Status.State != v1alpha3.OperationComplete {
			t.Fatalf("operation ended %s: %s", done.Status.State, done.Status.Message)
		}
		if n := runs(m, string(op.UID)); n != 1 {
			t.Fatalf("stand-in ran %d times for the operation, want 1; journal:\n%s", n, m.Journal(repaveUnit))
		}
	})

	t.Run("operation fails with the unit's result and journal", func(t *testing.T) {
		setStandIn("0", "fail")
		op := env.createOp(t, machine, v1alpha3.OperationRepave)
		done := env.waitOp(t, m, op.Name)
		if done.Status.State != v1alpha3.OperationFailed || done.Status.Reason != "UnitFailed" {
			t.Fatalf("operation ended %s/%s: %s", done.Status.State, done.Status.Reason, done.Status.Message)
		}
		for _, want := range []string{"result exit-code", "exit status 1", "failing as told"} {
			if !strings.Contains(done.Status.Message, want) {
				t.Errorf("message lacks %q:\n%s", want, done.Status.Message)
			}
		}
		if n := runs(m, string(op.UID)); n != 1 {
			t.Fatalf("stand-in ran %d times, want 1", n)
		}
		// A failed oneshot stays "failed" until reset; the next
		// operation must still be able to start it.
		_, _ = m.Systemctl("reset-failed", repaveUnit)
	})

	t.Run("daemon killed mid-operation does not dispatch twice", func(t *testing.T) {
		// Longer than RestartSec=5s: the restarted daemon finds the unit
		// still running (InvocationID read over real D-Bus) and waits.
		setStandIn("8", "ok")
		before := showProps(t, m, daemonUnit, "NRestarts")["NRestarts"]
		op := env.createOp(t, machine, v1alpha3.OperationRepave)
		deadline := time.Now().Add(30 * time.Second)
		for runs(m, string(op.UID)) == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("stand-in never started; daemon journal:\n%s", m.Journal(daemonUnit))
			}
			time.Sleep(100 * time.Millisecond)
		}
		if out, err := m.Systemctl("kill", "--kill-whom=main", "--signal=KILL", daemonUnit); err != nil {
			t.Fatalf("kill -9 the daemon: %v %s", err, out)
		}
		done := env.waitOp(t, m, op.Name)
		if done.Status.State != v1alpha3.OperationComplete {
			t.Fatalf("operation ended %s: %s", done.Status.State, done.Status.Message)
		}
		if n := runs(m, string(op.UID)); n != 1 {
			t.Fatalf("stand-in ran %d times for one operation, want 1; journal:\n%s", n, m.Journal(repaveUnit))
		}
		if j := m.Journal(daemonUnit); !strings.Contains(j, "resuming: unit still runs for this operation") {
			t.Errorf("the restarted daemon did not find the unit running:\n%s", j)
		}
		if after := showProps(t, m, daemonUnit, "NRestarts")["NRestarts"]; after == before {
			t.Errorf("NRestarts %s -> %s: the daemon was not restarted by systemd", before, after)
		}
	})

	// Goal: an idle daemon under 40 MB resident. What the daemon itself
	// holds is its anonymous memory (heap, stacks); the rest of its RSS is
	// the text of the multicall binary, shared with every other process
	// running it and reclaimable page cache, which recent kernels map in
	// huge folios (FilePmdMapped), so that nearly the whole binary (its
	// size: `make bench`, "binary sizes") shows as resident. The test holds the anonymous part to a bound that
	// a leak or a watch cache would break, and logs the rest.
	t.Run("idle daemon's own memory stays small", func(t *testing.T) {
		time.Sleep(3 * time.Second) // settled: watches open, status reported
		pid := showProps(t, m, daemonUnit, "MainPID")["MainPID"]
		rollup, err := m.Run("cat", "/proc/"+pid+"/smaps_rollup")
		if err != nil || pid == "0" {
			t.Fatalf("daemon not running (MainPID %s): %v", pid, err)
		}
		kb := map[string]int{}
		for _, l := range strings.Split(rollup, "\n") {
			k, v, _ := strings.Cut(l, ":")
			var n int
			if _, err := fmt.Sscan(v, &n); err == nil {
				kb[k] = n
			}
		}
		t.Logf("idle daemon: RSS %.1f MiB = anonymous %.1f MiB + file-backed %.1f MiB (of which %.1f MiB in 2 MB folios); binary %.1f MiB",
			mib(kb["Rss"]), mib(kb["Anonymous"]), mib(kb["Pss_File"]), mib(kb["FilePmdMapped"]), float64(len(binData))/(1<<20))
		if kb["Rss"] == 0 || kb["Anonymous"] > 16*1024 {
			t.Errorf("idle daemon holds %d kB of anonymous memory, want under 16 MiB", kb["Anonymous"])
		}
	})

	t.Run("owned host leaves the daemon inactive with exit 69", func(t *testing.T) {
		if out, err := m.Systemctl("stop", daemonUnit); err != nil {
			t.Fatalf("stop: %v %s", err, out)
		}
		m.WriteFile(hostpaths.HostRootHost+"/ownership", []byte(`{"owner":"reprovision","unit":"unbounded-reprovision.service","since":"2026-01-02T03:04:05Z"}`+"\n"), 0o644)

		// The binary itself: exit 69, nothing printed.
		out, err := m.Run("sh", "-c", hostpaths.LibexecDirHost+"/daemon >/tmp/daemon.out 2>&1; echo $?; cat /tmp/daemon.out")
		if err != nil || out != "69\n" {
			t.Fatalf("daemon on an owned host printed exit status and output %q (%v), want \"69\" and nothing", out, err)
		}

		// The unit: the start succeeds and leaves it inactive, not
		// failed, and systemd does not restart it. (systemd unloads an
		// inactive unit that ended well, so its ExecMainStatus cannot be
		// read afterwards; the binary's status is checked above.)
		before := showProps(t, m, daemonUnit, "NRestarts")["NRestarts"]
		if out, err := m.Systemctl("start", daemonUnit); err != nil {
			t.Fatalf("systemctl start on an owned host: %v %s\n%s", err, out, m.Journal(daemonUnit))
		}
		// systemd decides at the main process's exit: a restart to come
		// shows at once as SubState auto-restart (for RestartSec), no
		// restart as dead. Wait for that decision, not for a quiet period.
		var props map[string]string
		deadline := time.Now().Add(30 * time.Second)
		for {
			props = showProps(t, m, daemonUnit, "ActiveState", "SubState", "Result", "NRestarts")
			if s := props["SubState"]; s == "dead" || s == "failed" || s == "auto-restart" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("daemon unit on an owned host still %v after 30s\n%s", props, m.Journal(daemonUnit))
			}
			time.Sleep(100 * time.Millisecond)
		}
		if props["ActiveState"] != "inactive" || props["SubState"] != "dead" || props["Result"] != "success" || props["NRestarts"] != before {
			t.Fatalf("daemon unit on an owned host: %v, want inactive, result success, NRestarts %s\n%s", props, before, m.Journal(daemonUnit))
		}
		// PID 1's own line about the exit reaches the journal
		// asynchronously: wait for it.
		var tail string
		for deadline := time.Now().Add(30 * time.Second); ; {
			j := m.Journal(daemonUnit)
			tail = j[max(strings.LastIndex(j, "Starting unbounded-daemon.service"), 0):]
			if strings.Contains(tail, "Deactivated successfully") || time.Now().After(deadline) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if !strings.Contains(tail, "Deactivated successfully") || strings.Contains(tail, "level=ERROR") || strings.Contains(tail, "Scheduled restart") {
			t.Fatalf("journal of the deferred start:\n%s", tail)
		}
	})

	// Everything above ran in the unit's sandbox (sandbox_test.go).
	assertNoSandboxDenials(t, m, daemonUnit)
	assertNoSandboxDenials(t, m, repaveUnit)
}

func mib(kb int) float64 { return float64(kb) / 1024 }

func apiruntimeScheme(t *testing.T) *k8sruntime.Scheme {
	t.Helper()
	s := k8sruntime.NewScheme()
	if err := v1alpha3.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	return s
}
