package daemon

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"

	"unbounded-cloud.io/agent/lib/api/identity"
	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/tests/kubeenv"
)

// The tests run against the real API server of tests/kube (started by
// tests/kube/with-env.sh; tests/kubeenv skips or fails them without it),
// with this project's CRDs, RBAC and admission policies installed. The
// daemon uses its real identity: a client certificate for
// unbounded-agent:<machine> signed by the test cluster's CA, with the
// per-machine RBAC applied, so every request it makes is one the real
// grants allow.

const envKubeconfig = kubeenv.EnvKubeconfig

type testEnv struct {
	*kubeenv.Env
	kube kubernetes.Interface
	ops  *cluster // the admin's REST clients
}

var (
	envOnce sync.Once
	envVal  *testEnv
	envErr  error
)

func getEnv(t testing.TB) *testEnv {
	t.Helper()
	e := kubeenv.Get(t)
	envOnce.Do(func() {
		envVal = &testEnv{Env: e, kube: e.Client()}
		envVal.ops, envErr = newCluster(e.RESTConfig())
	})
	if envErr != nil {
		t.Fatal(envErr)
	}
	return envVal
}

// agentConfig is a REST config with the daemon's certificate identity for
// machine, as lib/kube's CSR flow would obtain it.
func (e *testEnv) agentConfig(t testing.TB, machine string) *rest.Config {
	t.Helper()
	cfg := e.CertConfig(e.MintClientCert(t, identity.AgentUserName(machine), identity.AgentGroup))
	cfg.UserAgent = "unbounded-daemon-test"
	// As lib/kube.Credentials sets them; client-go's default (5 QPS)
	// would throttle back-to-back operations to 200 ms a request.
	cfg.QPS, cfg.Burst = 50, 100
	return cfg
}

// newMachine returns a unique machine name with its Machine registered, as
// bootstrap leaves it: the daemon never creates it. The RBAC and policies
// are the constant set the environment was started with.
func (e *testEnv) newMachine(t testing.TB) string {
	t.Helper()
	name := e.newUnregisteredMachine(t)
	e.registerMachine(t, name)
	return name
}

// newUnregisteredMachine is newMachine without the Machine.
func (e *testEnv) newUnregisteredMachine(t testing.TB) string {
	t.Helper()
	return kubeenv.UniqueName(t, "dt")
}

// registerMachine creates the Machine name (isolation nspawn, as newRoot's
// applied config) as bootstrap does, and deletes it when the test ends.
func (e *testEnv) registerMachine(t testing.TB, name string, finalizers ...string) *v1alpha3.Machine {
	t.Helper()
	m := &v1alpha3.Machine{ObjectMeta: metav1.ObjectMeta{Name: name, Finalizers: finalizers}}
	m.Spec.Isolation.Mode = v1alpha3.IsolationNspawn
	created, err := e.ops.machines.Create(context.Background(), m)
	if err != nil {
		t.Fatalf("register Machine %s: %v", name, err)
	}
	t.Cleanup(func() { _ = e.deleteMachine(name) })
	return created
}

// deleteMachine deletes the Machine as the cluster side does when it
// retires the host.
func (e *testEnv) deleteMachine(name string) error {
	return e.ops.ops.Delete().Resource(v1alpha3.ResourceMachines).Name(name).Do(context.Background()).Error()
}

// createOp creates a MachineOperation for machine as the cluster-side
// controller would.
func (e *testEnv) createOp(t testing.TB, machine string, typ v1alpha3.OperationType) *v1alpha3.MachineOperation {
	t.Helper()
	op := &v1alpha3.MachineOperation{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: machine + "-",
			Labels:       map[string]string{v1alpha3.MachineLabel: machine},
		},
		Spec: v1alpha3.MachineOperationSpec{
			MachineRef: v1alpha3.MachineRef{Name: machine},
			Operation:  typ,
		},
	}
	out := &v1alpha3.MachineOperation{}
	err := e.ops.ops.Post().Resource(v1alpha3.ResourceMachineOperations).Body(op).Do(context.Background()).Into(out)
	if err != nil {
		t.Fatalf("create %s operation: %v", typ, err)
	}
	return out
}

func (e *testEnv) getOp(t testing.TB, name string) *v1alpha3.MachineOperation {
	t.Helper()
	op, err := e.ops.getOp(context.Background(), name)
	if err != nil {
		t.Fatalf("get operation %s: %v", name, err)
	}
	return op
}

// waitOp waits until the operation is in a final state and returns it.
func (e *testEnv) waitOp(t testing.TB, name string, timeout time.Duration) *v1alpha3.MachineOperation {
	t.Helper()
	var op *v1alpha3.MachineOperation
	eventually(t, timeout, "operation "+name+" finished", func() bool {
		op = e.getOp(t, name)
		return op.Status.State.Finished()
	})
	return op
}

// createReadyNode registers a Node named name that is Ready, as a kubelet
// would.
func (e *testEnv) createReadyNode(t testing.TB, name string) *corev1.Node {
	t.Helper()
	ctx := context.Background()
	n, err := e.kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create node: %v", err)
	}
	// The node lifecycle controller of the test control plane writes a
	// new Node too (its taints): read again on a conflict, as a kubelet does.
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if n, err = e.kube.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{}); err != nil {
			return err
		}
		n.Status.Conditions = []corev1.NodeCondition{{
			Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
			LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now(),
		}}
		n, err = e.kube.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("set node ready: %v", err)
	}
	t.Cleanup(func() { _ = e.kube.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
	return n
}

func eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for: %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// runningDaemon is a daemon started by a test; stop ends it like SIGTERM
// (or, seen from the cluster and the units, like a kill).
type runningDaemon struct {
	cancel context.CancelFunc
	done   chan struct{} // closed when Run returned
	err    error         // Run's result, once done is closed
}

func (r *runningDaemon) stop(t testing.TB) error {
	t.Helper()
	r.cancel()
	select {
	case <-r.done:
		return r.err
	case <-time.After(30 * time.Second):
		t.Fatal("daemon did not stop within 30s")
		return nil
	}
}

func startDaemon(t testing.TB, opts Options) *runningDaemon {
	t.Helper()
	if opts.Log == nil {
		opts.Log = testLogger(t)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &runningDaemon{cancel: cancel, done: make(chan struct{})}
	go func() {
		r.err = Run(ctx, opts)
		close(r.done)
	}()
	t.Cleanup(func() {
		cancel()
		<-r.done
	})
	return r
}

func testLogger(t testing.TB) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// newRoot is a host root with an active nspawn node in slot kube1, and
// /run/unbounded as systemd-tmpfiles creates it at boot.
func newRoot(t testing.TB, machine string) hostpaths.Paths {
	t.Helper()
	p := hostpaths.New(t.TempDir())
	if err := os.MkdirAll(p.RunDir(), 0o755); err != nil {
		t.Fatal(err)
	}
	writeApplied(t, p, machine, "kube1")
	return p
}

// tokenHost is newRoot with the operator configuration of a host whose
// client certificate is not issued yet: agent.toml naming the test API
// server, its CA, and a bootstrap token of machine's own (0600).
func tokenHost(t testing.TB, env *testEnv, machine string) hostpaths.Paths {
	t.Helper()
	id, secret := kubeenv.RandomTokenID(t)
	token := env.CreateBootstrapToken(t, id, secret, identity.BootstrapAgentsGroup, identity.BootstrapGroup(machine))
	p := newRoot(t, machine)
	for path, f := range map[string]struct {
		data string
		mode os.FileMode
	}{
		"/etc/unbounded/ca.crt":          {string(env.CAPEM(t)), 0o644},
		"/etc/unbounded/bootstrap-token": {token + "\n", 0o600},
		hostpaths.ConfigFileHost: {fmt.Sprintf("machine = %q\nmode = \"nspawn\"\n[cluster]\napi-server = %q\nkubernetes-version = \"1.36.3\"\n",
			machine, env.Host()), 0o644},
	} {
		full := p.Join(path)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(f.data), f.mode); err != nil {
			t.Fatal(err)
		}
	}
	return p
}
