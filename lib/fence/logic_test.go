package fence

// Tests of the fence's own decisions that no API server can provoke on
// demand: a certificate that expires exactly during a call, and the budget
// arithmetic under a clock the test controls. Everything the API server
// decides is tested against a real one in kube_test.go.

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"log/slog"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"unbounded-cloud.io/agent/lib/api/identity"
	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/exitcode"
	"unbounded-cloud.io/agent/lib/kube"
)

type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }
func (c *fakeClock) sleep(_ context.Context, d time.Duration) error {
	c.t = c.t.Add(d)
	return nil
}

// scriptedAPI answers from functions the test sets and counts the calls.
type scriptedAPI struct {
	get     func(cfg *rest.Config) (*v1alpha3.Machine, error)
	review  func(cfg *rest.Config) (*authenticationv1.TokenReviewStatus, error)
	gets    int
	reviews int
	mutates int
}

func (a *scriptedAPI) GetMachine(_ context.Context, cfg *rest.Config, _ string) (*v1alpha3.Machine, error) {
	a.gets++
	return a.get(cfg)
}

func (a *scriptedAPI) ReviewToken(_ context.Context, cfg *rest.Config) (*authenticationv1.TokenReviewStatus, error) {
	a.reviews++
	return a.review(cfg)
}

func (a *scriptedAPI) MutateStatus(context.Context, *rest.Config, string, func(*v1alpha3.Machine) bool) error {
	a.mutates++
	return nil
}

// hostCredentials writes a CA, a bootstrap token and (when certUntil is not
// zero) a client certificate valid until certUntil.
func hostCredentials(t *testing.T, certUntil time.Time) kube.Credentials {
	t.Helper()
	dir := t.TempDir()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "unbounded-agent:w1"},
		NotBefore: certUntil.Add(-time.Hour), NotAfter: certUntil}
	if certUntil.IsZero() {
		tmpl.NotBefore, tmpl.NotAfter = time.Now(), time.Now().Add(time.Hour)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	kd, _ := x509.MarshalECPrivateKey(key)
	cr := kube.Credentials{
		APIServer: "https://127.0.0.1:1",
		CAFile:    filepath.Join(dir, "ca.crt"),
		TokenFile: filepath.Join(dir, "token"),
		Certs:     kube.CertStore{Dir: filepath.Join(dir, "pki")},
		Machine:   "w1",
	}
	os.WriteFile(cr.CAFile, certPEM, 0o644)
	os.WriteFile(cr.TokenFile, []byte("abcdef.0123456789abcdef\n"), 0o600)
	if !certUntil.IsZero() {
		if err := cr.Certs.Save(certPEM, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kd})); err != nil {
			t.Fatal(err)
		}
	}
	return cr
}

func boundMachine() *v1alpha3.Machine {
	m := &v1alpha3.Machine{Spec: v1alpha3.MachineSpec{Allocation: &v1alpha3.AllocationRef{Name: "a1", UID: "uid-1"}}}
	m.Name = "w1"
	return m
}

func TestNoAllocationAllowsWithoutAnyRequest(t *testing.T) {
	api := &scriptedAPI{}
	c := &Check{Machine: "w1", API: api, Credentials: kube.Credentials{APIServer: "https://127.0.0.1:1"}}
	if err := c.Run(context.Background()); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if api.gets+api.reviews+api.mutates != 0 {
		t.Errorf("requests made without an allocation: %+v", api)
	}
	if c.Via() != "" {
		t.Errorf("Via %q without a read, want none", c.Via())
	}
}

func TestCertificateExpiringDuringTheReadMovesOnlyTheNextReadToTheToken(t *testing.T) {
	clock := &fakeClock{t: time.Now()}
	cr := hostCredentials(t, clock.t.Add(30*time.Second))
	certGets := 0
	api := &scriptedAPI{
		get: func(cfg *rest.Config) (*v1alpha3.Machine, error) {
			if cfg.BearerToken != "" {
				// The token path reads the Machine after its TokenReview.
				if len(cfg.CertData) != 0 {
					t.Error("token read of the Machine made with the certificate too")
				}
				return boundMachine(), nil
			}
			certGets++
			clock.t = clock.t.Add(time.Minute) // the certificate expires on the way
			return nil, apierrors.NewUnauthorized("certificate has expired")
		},
		review: func(cfg *rest.Config) (*authenticationv1.TokenReviewStatus, error) {
			if cfg.BearerToken == "" || len(cfg.CertData) != 0 {
				t.Error("token read made with the certificate")
			}
			return &authenticationv1.TokenReviewStatus{Authenticated: true,
				User: authenticationv1.UserInfo{Groups: []string{identity.BootstrapGroup("w1")}}}, nil
		},
	}
	c := &Check{Machine: "w1", AllocationUID: "uid-1", Budget: 2 * time.Minute, Credentials: cr,
		Now: clock.now, Sleep: clock.sleep, API: api, Log: quiet}
	if err := c.Run(context.Background()); err != nil {
		t.Fatalf("Run: %v, want allowed by the token on the second read", err)
	}
	if certGets != 1 || api.reviews != 1 || api.gets != 2 {
		t.Errorf("certificate gets=%d reviews=%d gets=%d, want one certificate read, then one token read (TokenReview and Machine)", certGets, api.reviews, api.gets)
	}
	if c.Via() != ViaToken {
		t.Errorf("allowed via %q, want the token's read", c.Via())
	}
}

func TestRejectedValidCertificateIsFinalAndNeverRescuedByTheToken(t *testing.T) {
	clock := &fakeClock{t: time.Now()}
	api := &scriptedAPI{
		get: func(*rest.Config) (*v1alpha3.Machine, error) {
			return nil, apierrors.NewUnauthorized("unknown certificate authority")
		},
		review: func(*rest.Config) (*authenticationv1.TokenReviewStatus, error) {
			t.Error("fell back to the token")
			return &authenticationv1.TokenReviewStatus{Authenticated: true}, nil
		},
	}
	c := &Check{Machine: "w1", AllocationUID: "uid-1", Credentials: hostCredentials(t, clock.t.Add(time.Hour)),
		Now: clock.now, Sleep: clock.sleep, API: api, Log: quiet}
	err := c.Run(context.Background())
	var r *Refusal
	if !errors.As(err, &r) || r.Reason != v1alpha3.ReasonCertificateRejected || exitcode.For(err) != exitcode.Refused {
		t.Fatalf("Run: %v (exit %d), want a CertificateRejected refusal (exit 77)", err, exitcode.For(err))
	}
	if api.gets != 1 {
		t.Errorf("gets=%d: a final answer was retried", api.gets)
	}
	if c.Via() != ViaCertificate {
		t.Errorf("refused via %q, want the certificate's read", c.Via())
	}
}

func TestNoAnswerIsRetriedWithBackoffUntilTheBudgetThenRefused(t *testing.T) {
	start := time.Now()
	clock := &fakeClock{t: start}
	api := &scriptedAPI{
		get: func(*rest.Config) (*v1alpha3.Machine, error) {
			clock.t = clock.t.Add(10 * time.Millisecond)
			return nil, &os.SyscallError{Syscall: "connect", Err: syscall.ECONNREFUSED}
		},
	}
	c := &Check{Machine: "w1", AllocationUID: "uid-1", Budget: 30 * time.Second,
		Credentials: hostCredentials(t, start.Add(time.Hour)), Now: clock.now, Sleep: clock.sleep, API: api, Log: quiet}
	err := c.Run(context.Background())
	var r *Refusal
	if !errors.As(err, &r) || r.Reason != v1alpha3.ReasonClusterUnreachable {
		t.Fatalf("Run: %v, want a ClusterUnreachable refusal", err)
	}
	if spent := clock.t.Sub(start); spent > 30*time.Second {
		t.Errorf("spent %s of a 30s budget", spent)
	}
	// 0.2+0.4+0.8+1.6+3.2 = 6.2 s, then 5 s steps: about 10 reads in 30 s;
	// far more would mean no backoff, far fewer a stuck sleep.
	if api.gets < 6 || api.gets > 14 {
		t.Errorf("%d reads in a 30s budget, want about 10 (backoff doubling from 200ms, capped at 5s)", api.gets)
	}
}

func TestTokenOfAnotherMachineIsRefused(t *testing.T) {
	api := &scriptedAPI{
		review: func(*rest.Config) (*authenticationv1.TokenReviewStatus, error) {
			return &authenticationv1.TokenReviewStatus{Authenticated: true, User: authenticationv1.UserInfo{
				Username: "system:bootstrap:abcdef", Groups: []string{identity.BootstrapGroup("w2")}}}, nil
		},
	}
	c := &Check{Machine: "w1", AllocationUID: "uid-1", Credentials: hostCredentials(t, time.Time{}), API: api, Log: quiet}
	var r *Refusal
	if err := c.Run(context.Background()); !errors.As(err, &r) || r.Reason != v1alpha3.ReasonAllocationMismatch {
		t.Fatalf("Run: %v, want AllocationMismatch", err)
	}
}

func TestJudgeRefusesDeletingUnboundMismatchedAndFenced(t *testing.T) {
	c := &Check{Machine: "w1", AllocationUID: "uid-1"}
	if r := c.judge(boundMachine()); r != nil {
		t.Fatalf("bound machine refused: %v", r)
	}
	cases := map[string]func(m *v1alpha3.Machine){
		v1alpha3.ReasonAllocationFenced:   func(m *v1alpha3.Machine) { m.Spec.Allocation.Fenced = true },
		v1alpha3.ReasonAllocationMismatch: func(m *v1alpha3.Machine) { m.Spec.Allocation.UID = "uid-2" },
		v1alpha3.ReasonMachineDeleting:    func(m *v1alpha3.Machine) { now := metav1.Now(); m.DeletionTimestamp = &now },
	}
	for want, mut := range cases {
		m := boundMachine()
		mut(m)
		if r := c.judge(m); r == nil || r.Reason != want {
			t.Errorf("%s: got %v", want, r)
		}
	}
	m := boundMachine()
	m.Spec.Allocation = nil
	if r := c.judge(m); r == nil || r.Reason != v1alpha3.ReasonAllocationMismatch {
		t.Errorf("machine without allocation: got %v", r)
	}
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// mutatingAPI is scriptedAPI whose MutateStatus applies the mutation to a
// Machine the test gives, as kube.Machines.MutateStatus does to the one it
// reads.
type mutatingAPI struct {
	scriptedAPI
	stored  *v1alpha3.Machine
	changed bool
}

func (a *mutatingAPI) MutateStatus(_ context.Context, _ *rest.Config, _ string, f func(*v1alpha3.Machine) bool) error {
	a.mutates++
	m := a.stored.DeepCopy()
	if f(m) {
		a.stored, a.changed = m, true
	}
	return nil
}

func refusedEarlier(m *v1alpha3.Machine) *v1alpha3.Machine {
	m.Status.Phase = v1alpha3.MachineRefused
	m.Status.Conditions = []metav1.Condition{{Type: v1alpha3.ConditionAllocationLaunchRefused,
		Status: metav1.ConditionTrue, Reason: v1alpha3.ReasonAllocationFenced, Message: "earlier"}}
	return m
}

// An allow on the TokenReview alone (RBAC does not let the token read the
// Machine) has not seen the allocation: the refusal recorded on the Machine
// stays, and no write is even attempted. No API server lets the token write
// a status it may not read, so this is the fence's own rule, tested here.
func TestTokenOnlyAllowNeverClearsARecordedRefusal(t *testing.T) {
	api := &mutatingAPI{stored: refusedEarlier(boundMachine())}
	api.review = func(*rest.Config) (*authenticationv1.TokenReviewStatus, error) {
		return &authenticationv1.TokenReviewStatus{Authenticated: true,
			User: authenticationv1.UserInfo{Groups: []string{identity.BootstrapGroup("w1")}}}, nil
	}
	api.get = func(*rest.Config) (*v1alpha3.Machine, error) {
		return nil, apierrors.NewForbidden(v1alpha3.Resource(v1alpha3.ResourceMachines), "w1", errors.New("RBAC"))
	}
	c := &Check{Machine: "w1", AllocationUID: "uid-1", Credentials: hostCredentials(t, time.Time{}), API: api, Log: quiet}
	if err := c.Run(context.Background()); err != nil {
		t.Fatalf("Run: %v, want allowed on the TokenReview", err)
	}
	if api.mutates != 0 || api.changed {
		t.Errorf("%d status writes (changed %v) after an allow that did not read the Machine; want none", api.mutates, api.changed)
	}
}

// The clearing write judges the Machine it writes: one fenced between the
// read that allowed and the write keeps its refusal.
func TestClearingWriteKeepsTheRefusalOfAMachineFencedSinceTheRead(t *testing.T) {
	fenced := refusedEarlier(boundMachine())
	fenced.Spec.Allocation.Fenced = true
	api := &mutatingAPI{stored: fenced}
	api.get = func(*rest.Config) (*v1alpha3.Machine, error) { return refusedEarlier(boundMachine()), nil }
	c := &Check{Machine: "w1", AllocationUID: "uid-1", Credentials: hostCredentials(t, time.Now().Add(time.Hour)), API: api, Log: quiet}
	if err := c.Run(context.Background()); err != nil {
		t.Fatalf("Run: %v, want allowed by the read", err)
	}
	if api.mutates != 1 || api.changed {
		t.Errorf("writes=%d changed=%v: the refusal of a Machine fenced since the read was cleared", api.mutates, api.changed)
	}
}

// A disk cloned from host w1 onto host w2 keeps w1's certificate: the
// fence never reads as w1, refuses as for a rejected certificate, and
// reports with w2's own bootstrap token.
func TestAnotherMachinesCertificateIsRefusedWithoutAReadAndReportedWithTheToken(t *testing.T) {
	clock := &fakeClock{t: time.Now()}
	cr := hostCredentials(t, clock.t.Add(time.Hour)) // CN=unbounded-agent:w1
	cr.Machine = "w2"
	api := &scriptedAPI{
		get: func(cfg *rest.Config) (*v1alpha3.Machine, error) {
			t.Errorf("the Machine was read (certificate: %v): the foreign certificate must not be used, and a refusal needs no read", len(cfg.CertData) != 0)
			return boundMachine(), nil
		},
	}
	c := &Check{Machine: "w2", AllocationUID: "uid-1", Credentials: cr,
		Now: clock.now, Sleep: clock.sleep, API: api, Log: quiet}
	err := c.Run(context.Background())
	var r *Refusal
	if !errors.As(err, &r) || r.Reason != v1alpha3.ReasonCertificateRejected || exitcode.For(err) != exitcode.Refused {
		t.Fatalf("Run: %v, want a CertificateRejected refusal (exit 77)", err)
	}
	if c.Via() != ViaCertificate {
		t.Errorf("refused via %q, want the certificate", c.Via())
	}
	if !strings.Contains(r.Message, `"unbounded-agent:w1"`) || !strings.Contains(r.Message, `"w2"`) {
		t.Errorf("the refusal does not name both identities: %s", r.Message)
	}
	if !errors.Is(err, kube.ErrForeignCertificate) {
		t.Errorf("the refusal does not wrap kube.ErrForeignCertificate: %v", err)
	}
	if api.mutates != 1 {
		t.Errorf("%d reports on the Machine, want one (with the token)", api.mutates)
	}
}
