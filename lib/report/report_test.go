package report

// The reporter against the real API server of tests/kube: the Machine it
// creates, the admission policy and RBAC it runs into, and the status
// subresource are the server's.

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"unbounded-cloud.io/agent/lib/api/identity"
	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/kube"
	"unbounded-cloud.io/agent/lib/kube/clustertest"
)

type fixture struct {
	env    *clustertest.Env
	r      *Reporter
	secret string
	log    bytes.Buffer
}

// newFixture gives a host with a bootstrap token for a fresh machine name
// (no Machine yet); without grant, the token lacks the agents' bootstrap
// group, so RBAC grants it nothing (a token the provisioning side issued
// without the groups of identity.BootstrapExtraGroups).
func newFixture(t *testing.T, grant bool) *fixture {
	t.Helper()
	env := clustertest.Get(t)
	f := &fixture{env: env}
	name := clustertest.UniqueName("report")
	var token, secret string
	if grant {
		token, secret = env.BootstrapToken(t, name)
	} else {
		token, secret = env.BootstrapTokenWithGroups(t, identity.BootstrapGroup(name))
	}
	f.secret = secret
	t.Cleanup(func() { env.DeleteMachine(name) })
	dir := t.TempDir()
	tf := filepath.Join(dir, "bootstrap-token")
	os.WriteFile(tf, []byte(token), 0o600)
	f.r = &Reporter{Machine: name, Mode: v1alpha3.IsolationNone,
		Credentials: kube.Credentials{APIServer: env.Host(), CAFile: env.CAFile(), TokenFile: tf,
			Certs: kube.CertStore{Dir: filepath.Join(dir, "pki")}, Machine: name},
		Timeout: 5 * time.Second,
		Log:     slog.New(slog.NewTextHandler(&f.log, nil))}
	return f
}

func (f *fixture) machine(t *testing.T) *v1alpha3.Machine {
	t.Helper()
	m, err := f.env.Machines(t).Get(context.Background(), f.r.Machine)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func (f *fixture) want(t *testing.T, phase v1alpha3.MachinePhase, state v1alpha3.BootstrapState, cond metav1.ConditionStatus, reason string) {
	t.Helper()
	m := f.machine(t)
	if m.Status.Phase != phase {
		t.Errorf("phase %q, want %q", m.Status.Phase, phase)
	}
	if m.Status.Bootstrap == nil || m.Status.Bootstrap.State != state {
		t.Errorf("status.bootstrap %+v, want state %s", m.Status.Bootstrap, state)
	}
	c := meta.FindStatusCondition(m.Status.Conditions, v1alpha3.ConditionBootstrapped)
	if c == nil || c.Status != cond || c.Reason != reason {
		t.Errorf("Bootstrapped = %+v, want %s/%s", c, cond, reason)
	}
}

func TestReporterCreatesTheMachineAndReportsRunningFailedSucceeded(t *testing.T) {
	f := newFixture(t, true)
	ctx := context.Background()
	if err := f.r.Running(ctx); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(f.log.String(), "Machine created") {
		t.Errorf("no Machine created:\n%s", f.log.String())
	}
	m := f.machine(t)
	if m.Spec.Isolation.Mode != v1alpha3.IsolationNone || m.Spec.Allocation != nil {
		t.Errorf("created spec %+v", m.Spec)
	}
	f.want(t, v1alpha3.MachineBootstrapping, v1alpha3.BootstrapRunning, metav1.ConditionFalse, ReasonRunning)

	if err := f.r.Failed(ctx, "ArtifactDownloadFailed", "kubelet: 404 from the mirror"); err != nil {
		t.Fatal(err)
	}
	f.want(t, v1alpha3.MachineFailed, v1alpha3.BootstrapFailed, metav1.ConditionFalse, "ArtifactDownloadFailed")
	if m := f.machine(t); m.Status.Bootstrap.Reason != "ArtifactDownloadFailed" || m.Status.Bootstrap.Message != "kubelet: 404 from the mirror" {
		t.Errorf("failure detail %+v", m.Status.Bootstrap)
	}

	// A reason that is not a condition reason does not break the report.
	if err := f.r.Failed(ctx, "disk full!", "no space left"); err != nil {
		t.Fatal(err)
	}
	f.want(t, v1alpha3.MachineFailed, v1alpha3.BootstrapFailed, metav1.ConditionFalse, ReasonFailed)

	if err := f.r.Succeeded(ctx); err != nil {
		t.Fatal(err)
	}
	f.want(t, v1alpha3.MachineReady, v1alpha3.BootstrapSucceeded, metav1.ConditionTrue, ReasonSucceeded)
	if m := f.machine(t); m.Status.Agent == nil || m.Status.Agent.Version == "" {
		t.Errorf("agent version not reported: %+v", m.Status.Agent)
	}
}

func TestReporterWithoutRBACLogsOneLineAndLetsTheBootstrapGoOn(t *testing.T) {
	f := newFixture(t, false)
	if err := f.r.Running(context.Background()); err != nil {
		t.Fatalf("Running: %v, want nil (best effort)", err)
	}
	out := f.log.String()
	if n := strings.Count(out, "\n"); n != 1 || !strings.Contains(out, "RBAC does not allow it") {
		t.Errorf("want exactly one line naming RBAC, got:\n%s", out)
	}
}

func TestReporterWithAnUnreachableClusterLogsOneLineAndLetsTheBootstrapGoOn(t *testing.T) {
	f := newFixture(t, true)
	p := f.env.ProxyFront(t)
	f.r.Credentials.APIServer = p.Host()
	p.Close()
	start := time.Now()
	if err := f.r.Running(context.Background()); err != nil {
		t.Fatalf("Running: %v, want nil", err)
	}
	if took := time.Since(start); took > 6*time.Second {
		t.Errorf("took %s, want within the 5s report timeout", took)
	}
	out := f.log.String()
	if n := strings.Count(out, "\n"); n != 1 || !strings.Contains(out, "did not answer") {
		t.Errorf("want exactly one line saying the cluster did not answer, got:\n%s", out)
	}
}

func TestReporterStopsTheBootstrapWhenTheTokenIsRejected(t *testing.T) {
	f := newFixture(t, true)
	f.env.RevokeToken(t, f.secret)
	err := f.r.Running(context.Background())
	if !errors.Is(err, kube.ErrBootstrapTokenRejected) {
		t.Fatalf("Running with a revoked token: %v, want ErrBootstrapTokenRejected", err)
	}
}

func TestMissingMachineAPIIsNotTakenForAMissingMachine(t *testing.T) {
	env := clustertest.Get(t)
	rc := env.Client(t).Discovery().RESTClient()
	// The server's own 404 for a resource type it does not serve, as for
	// Machines when the CRD is not installed.
	err := rc.Get().AbsPath("/apis", v1alpha3.GroupName, v1alpha3.Version, "nosuchresources", "x").Do(context.Background()).Error()
	if err == nil {
		t.Fatal("no error for an unknown resource")
	}
	if isMissingObject(err, "x") {
		t.Errorf("a missing resource type was taken for a missing object: %v", err)
	}
	ms := env.Machines(t)
	_, err = ms.Get(context.Background(), "absent-machine-for-report-test")
	if !isMissingObject(err, "absent-machine-for-report-test") {
		t.Errorf("a missing Machine was not recognised: %v", err)
	}
	var lb bytes.Buffer
	r := &Reporter{Machine: "x", Log: slog.New(slog.NewTextHandler(&lb, nil))}
	if r.explain(err, v1alpha3.BootstrapRunning, true) != nil || !strings.Contains(lb.String(), "no Machine API") {
		t.Errorf("explain: %s", lb.String())
	}
}
