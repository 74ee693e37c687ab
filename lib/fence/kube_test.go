package fence_test

// The fence's matrix of answers, against the real API server of tests/kube:
// every answer here (RBAC, TokenReview, a revoked token, a deleting
// Machine, the status subresource) is the server's, not a fake's.

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"unbounded-cloud.io/agent/lib/api/identity"
	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/exitcode"
	"unbounded-cloud.io/agent/lib/fence"
	"unbounded-cloud.io/agent/lib/kube"
	"unbounded-cloud.io/agent/lib/kube/clustertest"
)

// host is one simulated host with its Machine in the cluster.
type host struct {
	env         *clustertest.Env
	machine     string
	uid         string
	tokenSecret string
	creds       kube.Credentials
	log         bytes.Buffer
}

// newHost creates a Machine bound to a fresh allocation (as the cluster
// side would), its per-machine RBAC, a bootstrap token, and the host's
// files (CA, token) in a temporary directory.
func newHost(t testing.TB, mutate func(*v1alpha3.Machine)) *host {
	t.Helper()
	return newHostGrant(t, mutate, true)
}

// newHostGrant is newHost; without grant, the bootstrap token may create
// TokenReviews but not read its Machine, as in a cluster whose RBAC predates
// the agents' read grant: the token carries only its per-machine group, to
// which the test grants TokenReviews alone.
func newHostGrant(t testing.TB, mutate func(*v1alpha3.Machine), grant bool) *host {
	t.Helper()
	env := clustertest.Get(t)
	h := &host{env: env, machine: clustertest.UniqueName("fence"), uid: clustertest.NewUID()}
	m := &v1alpha3.Machine{Spec: v1alpha3.MachineSpec{Allocation: &v1alpha3.AllocationRef{Name: "alloc-" + h.machine, UID: h.uid}}}
	m.Name = h.machine
	if mutate != nil {
		mutate(m)
	}
	ms := env.Machines(t)
	if _, err := ms.Create(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// A test may have left a finalizer holding the Machine.
		if cur, err := ms.Get(context.Background(), h.machine); err == nil && len(cur.Finalizers) > 0 {
			cur.Finalizers = nil
			ms.Update(context.Background(), cur)
		}
		env.DeleteMachine(h.machine)
	})
	var token, secret string
	if grant {
		token, secret = env.BootstrapToken(t, h.machine)
	} else {
		grantTokenReviewsOnly(t, env, identity.BootstrapGroup(h.machine))
		token, secret = env.BootstrapTokenWithGroups(t, identity.BootstrapGroup(h.machine))
	}
	h.tokenSecret = secret
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "bootstrap-token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	h.creds = kube.Credentials{
		APIServer: env.Host(),
		CAFile:    env.CAFile(),
		TokenFile: tokenFile,
		Certs:     kube.CertStore{Dir: filepath.Join(dir, "pki")},
		Machine:   h.machine,
	}
	return h
}

// storeCert stores a client certificate for cn valid from nb to na.
func (h *host) storeCert(t testing.TB, cn string, orgs []string, nb, na time.Time) {
	t.Helper()
	c, k := h.env.MintClientCert(t, cn, orgs, nb, na)
	if err := h.creds.Certs.Save(c, k); err != nil {
		t.Fatal(err)
	}
}

// validCert stores the host's own certificate, valid for an hour.
func (h *host) validCert(t testing.TB) {
	h.storeCert(t, identity.AgentUserName(h.machine), []string{identity.AgentGroup}, time.Now().Add(-time.Minute), time.Now().Add(time.Hour))
}

func (h *host) check(budget time.Duration) *fence.Check {
	return &fence.Check{
		Machine:       h.machine,
		AllocationUID: h.uid,
		Budget:        budget,
		Credentials:   h.creds,
		ReportTimeout: time.Second,
		Log:           slog.New(slog.NewTextHandler(&h.log, nil)),
	}
}

// run runs the check and returns its exit code, how long it took and its
// error.
func (h *host) run(t *testing.T, c *fence.Check) (int, time.Duration, error) {
	t.Helper()
	start := time.Now()
	err := c.Run(context.Background())
	took := time.Since(start)
	t.Logf("fence: %v (exit %d, via %q) after %s\n%s", err, exitcode.For(err), c.Via(), took.Round(time.Millisecond), h.log.String())
	return exitcode.For(err), took, err
}

// wantReason wants err to be a refusal for reason.
func wantReason(t *testing.T, err error, reason string) {
	t.Helper()
	var r *fence.Refusal
	if !errors.As(err, &r) || r.Reason != reason {
		t.Errorf("Run: %v, want a refusal %s", err, reason)
	}
}

// wantVia wants the outcome of c's last run to rest on a read with
// credential via.
func wantVia(t *testing.T, c *fence.Check, via fence.Credential) {
	t.Helper()
	if got := c.Via(); got != via {
		t.Errorf("the deciding read used %q, want %q", got, via)
	}
}

// countRetries makes c count its waits between reads (one after each read
// that got no answer, and none otherwise); the waits themselves are real.
func countRetries(c *fence.Check) *atomic.Int32 {
	var n atomic.Int32
	c.Sleep = func(ctx context.Context, d time.Duration) error {
		n.Add(1)
		timer := time.NewTimer(d)
		defer timer.Stop()
		select {
		case <-timer.C:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return &n
}

// condition is AllocationLaunchRefused as the admin reads it (nil: absent).
func (h *host) condition(t *testing.T) *metav1.Condition {
	t.Helper()
	m, err := h.env.Machines(t).Get(context.Background(), h.machine)
	if err != nil {
		t.Fatal(err)
	}
	return meta.FindStatusCondition(m.Status.Conditions, v1alpha3.ConditionAllocationLaunchRefused)
}

func (h *host) wantRefused(t *testing.T, reason string) {
	t.Helper()
	c := h.condition(t)
	if c == nil || c.Status != metav1.ConditionTrue || c.Reason != reason {
		t.Errorf("AllocationLaunchRefused = %+v, want True with reason %s", c, reason)
	}
}

func (h *host) wantNoCondition(t *testing.T, why string) {
	t.Helper()
	if c := h.condition(t); c != nil {
		t.Errorf("AllocationLaunchRefused = %+v, want none (%s)", c, why)
	}
}

func TestFenceAllowsABoundMachineWithTheCertificateAndClearsAnEarlierRefusal(t *testing.T) {
	h := newHost(t, nil)
	h.validCert(t)
	// An earlier refusal, as the condition a previous boot left.
	_, err := h.env.Machines(t).MutateStatus(context.Background(), h.machine, func(m *v1alpha3.Machine) bool {
		meta.SetStatusCondition(&m.Status.Conditions, metav1.Condition{Type: v1alpha3.ConditionAllocationLaunchRefused,
			Status: metav1.ConditionTrue, Reason: v1alpha3.ReasonAllocationFenced, Message: "earlier"})
		m.Status.Phase = v1alpha3.MachineRefused
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	c := h.check(5 * time.Second)
	if code, _, _ := h.run(t, c); code != exitcode.OK {
		t.Fatalf("exit %d, want 0", code)
	}
	wantVia(t, c, fence.ViaCertificate)
	if c := h.condition(t); c == nil || c.Status != metav1.ConditionFalse || c.Reason != v1alpha3.ReasonAllowed {
		t.Errorf("AllocationLaunchRefused = %+v, want False/Allowed after an allow", c)
	}
}

func TestFenceAllowsWithTheBootstrapTokenWhenNoCertificateIsStored(t *testing.T) {
	h := newHost(t, nil)
	c := h.check(5 * time.Second)
	if code, _, _ := h.run(t, c); code != exitcode.OK {
		t.Fatalf("exit %d, want 0", code)
	}
	wantVia(t, c, fence.ViaToken)
	h.wantNoCondition(t, "nothing was refused")
}

func TestFenceRefusesAFencedAllocation(t *testing.T) {
	h := newHost(t, func(m *v1alpha3.Machine) { m.Spec.Allocation.Fenced = true })
	h.validCert(t)
	if code, took, _ := h.run(t, h.check(30*time.Second)); code != exitcode.Refused || took > 5*time.Second {
		t.Fatalf("exit %d after %s, want 77 at once", code, took)
	}
	h.wantRefused(t, v1alpha3.ReasonAllocationFenced)
	m, _ := h.env.Machines(t).Get(context.Background(), h.machine)
	if m.Status.Phase != v1alpha3.MachineRefused {
		t.Errorf("phase %q, want Refused", m.Status.Phase)
	}
}

func TestFenceRefusesAMachineBeingDeleted(t *testing.T) {
	h := newHost(t, func(m *v1alpha3.Machine) { m.Finalizers = []string{"unbounded-cloud.io/test-hold"} })
	h.validCert(t)
	if err := h.env.DeleteMachine(h.machine); err != nil {
		t.Fatal(err)
	}
	m, err := h.env.Machines(t).Get(context.Background(), h.machine)
	if err != nil || m.DeletionTimestamp == nil {
		t.Fatalf("machine not in deletion: %v %v", err, m.DeletionTimestamp)
	}
	if code, took, _ := h.run(t, h.check(30*time.Second)); code != exitcode.Refused || took > 5*time.Second {
		t.Fatalf("exit %d after %s, want 77 at once", code, took)
	}
	h.wantRefused(t, v1alpha3.ReasonMachineDeleting)
}

func TestFenceRefusesAMachineBoundToAnotherAllocation(t *testing.T) {
	h := newHost(t, nil)
	h.validCert(t)
	c := h.check(30 * time.Second)
	c.AllocationUID = "some-other-allocation-uid"
	if code, _, _ := h.run(t, c); code != exitcode.Refused {
		t.Fatalf("exit %d, want 77", code)
	}
	h.wantRefused(t, v1alpha3.ReasonAllocationMismatch)
}

func TestFenceRefusesARevokedBootstrapToken(t *testing.T) {
	h := newHost(t, nil)
	h.env.RevokeToken(t, h.tokenSecret)
	c := h.check(30 * time.Second)
	code, took, err := h.run(t, c)
	if code != exitcode.Refused || took > 5*time.Second {
		t.Fatalf("exit %d after %s, want 77 at once", code, took)
	}
	wantReason(t, err, v1alpha3.ReasonBootstrapTokenRejected)
	wantVia(t, c, fence.ViaToken)
	// The host's only credential is gone: it cannot write the condition.
	h.wantNoCondition(t, "no credential left to write it with")
}

func TestFenceRetriesAnUnreachableAPIServerUntilTheBudgetThenRefuses(t *testing.T) {
	h := newHost(t, nil)
	h.validCert(t)
	p := h.env.ProxyFront(t)
	h.creds.APIServer = p.Host()
	p.Close()
	const budget = 2 * time.Second
	c := h.check(budget)
	retries := countRetries(c)
	code, took, err := h.run(t, c)
	if code != exitcode.Refused {
		t.Fatalf("exit %d, want 77", code)
	}
	if took < budget-300*time.Millisecond || took > budget+2*time.Second {
		t.Errorf("took %s, want about the budget %s", took, budget)
	}
	if n := retries.Load(); n < 3 {
		t.Errorf("%d retries, want several with backoff", n)
	}
	wantReason(t, err, v1alpha3.ReasonClusterUnreachable)
	var r *fence.Refusal
	if errors.As(err, &r) && !r.NoAnswer {
		t.Error("an unreachable server's refusal is not one for lack of an answer")
	}
	wantVia(t, c, fence.ViaCertificate)
	h.wantNoCondition(t, "the cluster was unreachable")
}

func TestFenceRefusesAtOnceWhenRBACForbidsTheRead(t *testing.T) {
	h := newHost(t, nil)
	// A valid certificate of this host's identity without rights on
	// Machines: not in the agents' group (every agent may read every
	// Machine). (Another machine's identity is refused before any read:
	// TestAnotherMachinesCertificateIsRefusedWithoutAReadAndReportedWithTheToken.)
	h.storeCert(t, identity.AgentUserName(h.machine), nil,
		time.Now().Add(-time.Minute), time.Now().Add(time.Hour))
	const budget = 30 * time.Second
	c := h.check(budget)
	code, took, err := h.run(t, c)
	if code != exitcode.Refused {
		t.Fatalf("exit %d, want 77", code)
	}
	if took > 3*time.Second {
		t.Errorf("took %s: a 403 is final and must not wait for the %s budget", took, budget)
	}
	wantReason(t, err, v1alpha3.ReasonForbidden)
	wantVia(t, c, fence.ViaCertificate)
	// The certificate's identity may not write this Machine; the host's
	// bootstrap token may, and records the refusal (reportRefusal falls
	// back to the token when the certificate is rejected or forbidden).
	h.wantRefused(t, v1alpha3.ReasonForbidden)
}

func TestFenceUsesTheTokenWhenTheStoredCertificateExpired(t *testing.T) {
	h := newHost(t, nil)
	h.storeCert(t, identity.AgentUserName(h.machine), []string{identity.AgentGroup},
		time.Now().Add(-2*time.Hour), time.Now().Add(-time.Minute))
	c := h.check(5 * time.Second)
	retries := countRetries(c)
	code, _, _ := h.run(t, c)
	if code != exitcode.OK {
		t.Fatalf("exit %d, want 0 through the token", code)
	}
	// Allowed by a token read without a retry: the only read was the
	// token's, none was made with the expired certificate.
	wantVia(t, c, fence.ViaToken)
	if n := retries.Load(); n != 0 {
		t.Errorf("%d retries before the token's read, want none", n)
	}
}

func TestFenceHonoursTheBudgetAgainstASlowAPIServer(t *testing.T) {
	h := newHost(t, nil)
	h.validCert(t)
	p := h.env.ProxyFront(t)
	h.creds.APIServer = p.Host()
	p.SetDelay(10 * time.Second)
	const budget = 2 * time.Second
	c := h.check(budget)
	code, took, _ := h.run(t, c)
	if code != exitcode.Refused {
		t.Fatalf("exit %d, want 77", code)
	}
	// The reads stop at the budget; the condition write gets ReportTimeout.
	if limit := budget + c.ReportTimeout + 500*time.Millisecond; took > limit {
		t.Errorf("took %s, want at most %s (budget %s + report %s + margin)", took, limit, budget, c.ReportTimeout)
	}
	var r *fence.Refusal
	if err := c.Run(context.Background()); !errors.As(err, &r) || r.Reason != v1alpha3.ReasonClusterUnreachable {
		t.Errorf("second run: %v, want ClusterUnreachable", err)
	}
}

// grantTokenReviewsOnly lets group create TokenReviews and nothing else, and
// waits until the authorizer honours it (RBAC learns of bindings through an
// informer, a moment after the create).
func grantTokenReviewsOnly(t testing.TB, env *clustertest.Env, group string) {
	t.Helper()
	ctx := context.Background()
	rb := env.Client(t).RbacV1()
	name := "fence-test:tokenreviews:" + group
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{"authentication.k8s.io"}, Resources: []string{"tokenreviews"}, Verbs: []string{"create"}}}}
	if _, err := rb.ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rb.ClusterRoles().Delete(context.Background(), name, metav1.DeleteOptions{}) })
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "Group", Name: group}}}
	if _, err := rb.ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rb.ClusterRoleBindings().Delete(context.Background(), name, metav1.DeleteOptions{}) })
	err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		r, err := env.Client(t).AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
			Spec: authorizationv1.SubjectAccessReviewSpec{User: "system:bootstrap:probe", Groups: []string{group},
				ResourceAttributes: &authorizationv1.ResourceAttributes{Group: "authentication.k8s.io", Resource: "tokenreviews", Verb: "create"}}},
			metav1.CreateOptions{})
		return err == nil && r.Status.Allowed, nil
	})
	if err != nil {
		t.Fatalf("TokenReview grant for %s not effective within 10s", group)
	}
}
