package controller

// The approver against the real API server of tests/kube (kube tier): the
// agent's own certificate flow (lib/kube) gets its certificate with no
// test approving anything, and requests the rules refuse are denied once,
// each with its reason, an Event and a metric; a client request that is
// no agent's is left alone. The approver here judges only this test's
// requests (by name): the API server is shared with every other package's
// tests, which approve their own by hand.

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	certificatesv1 "k8s.io/api/certificates/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"unbounded-cloud.io/agent/lib/api/identity"
	"unbounded-cloud.io/agent/lib/api/manifests"
	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/csrapproval"
	"unbounded-cloud.io/agent/lib/kube"
	"unbounded-cloud.io/agent/lib/kube/clustertest"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// startApprover runs a manager with the approver, judging only the
// requests whose name contains prefix, until the test ends.
func startApprover(t *testing.T, e *clustertest.Env, prefix string) {
	t.Helper()
	startApproverAs(t, e.Admin, prefix, "")
}

// startApproverAs is startApprover with cfg's credentials and, with
// leaseNamespace, leader election in it.
func startApproverAs(t *testing.T, cfg *rest.Config, prefix, leaseNamespace string) {
	t.Helper()
	startManager(t, cfg, lease{namespace: leaseNamespace}, func(mgr ctrl.Manager) error {
		a := &CSRApprover{Client: mgr.GetClient(), Events: mgr.GetEventRecorder("unbounded-controller"),
			only: func(name string) bool { return strings.Contains(name, prefix) }}
		return a.SetupWithManager(mgr)
	})
}

// lease is a test manager's leader election: none without a namespace;
// its lease named id (default LeaseName); kept at a stop (as a killed
// replica leaves it until it expires) with keep, else released.
type lease struct {
	namespace, id string
	keep          bool
}

// startManager runs a manager with cfg's credentials (leader election as
// l says), its controllers added by setup, until the test ends or what it
// returns is called.
func startManager(t *testing.T, cfg *rest.Config, l lease, setup func(ctrl.Manager) error) (stop func()) {
	t.Helper()
	s, err := Scheme()
	if err != nil {
		t.Fatal(err)
	}
	skip := true
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme: s, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		Controller:     config.Controller{SkipNameValidation: &skip},
		LeaderElection: l.namespace != "", LeaderElectionID: cmp.Or(l.id, LeaseName), LeaderElectionNamespace: l.namespace,
		LeaderElectionReleaseOnCancel: !l.keep,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := setup(mgr); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("manager: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// agentRequest creates, as cfg's user, a client request of the agent's
// signer named name for subject cn/o with usages.
func agentRequest(t testing.TB, kc kubernetes.Interface, name, cn string, usages []certificatesv1.KeyUsage) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: cn, Organization: []string{identity.AgentGroup}}}, key)
	if err != nil {
		t.Fatal(err)
	}
	csr := &certificatesv1.CertificateSigningRequest{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: certificatesv1.CertificateSigningRequestSpec{
		Request: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}), SignerName: identity.AgentSignerName, Usages: usages,
	}}
	if _, err := kc.CertificatesV1().CertificateSigningRequests().Create(context.Background(), csr, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create CSR %s: %v", name, err)
	}
}

// decision waits until the request has an approval or a denial.
func decision(t *testing.T, kc kubernetes.Interface, name string) certificatesv1.CertificateSigningRequestCondition {
	t.Helper()
	var cond certificatesv1.CertificateSigningRequestCondition
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		csr, err := kc.CertificatesV1().CertificateSigningRequests().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, c := range csr.Status.Conditions {
			if c.Type == certificatesv1.CertificateApproved || c.Type == certificatesv1.CertificateDenied {
				cond = c
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("CSR %s: no decision within 30s", name)
	}
	return cond
}

// counted is the approver's decisions metric for kind and decision.
func counted(t *testing.T, kind, decision string) float64 {
	t.Helper()
	m := &dto.Metric{}
	if err := csrDecisions.WithLabelValues(kind, decision).Write(m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

func TestApproverDecidesTheAgentsRequestsOnTheRealAPIServer(t *testing.T) {
	e := clustertest.Get(t)
	kc := e.Client(t)
	prefix := clustertest.UniqueName("csra")
	ctx := context.Background()
	machines := e.Machines(t)
	a, b, fenced := prefix+"-a", prefix+"-b", prefix+"-f"
	for _, m := range []*v1alpha3.Machine{
		{ObjectMeta: metav1.ObjectMeta{Name: a}}, {ObjectMeta: metav1.ObjectMeta{Name: b}},
		{ObjectMeta: metav1.ObjectMeta{Name: fenced}, Spec: v1alpha3.MachineSpec{Allocation: &v1alpha3.AllocationRef{Name: "alloc", Fenced: true}}},
	} {
		if _, err := machines.Create(ctx, m); err != nil {
			t.Fatalf("create Machine %s: %v", m.Name, err)
		}
		t.Cleanup(func() { e.DeleteMachine(m.Name) })
	}
	t.Cleanup(func() {
		l, _ := kc.CertificatesV1().CertificateSigningRequests().List(context.Background(), metav1.ListOptions{})
		for _, c := range l.Items {
			if strings.Contains(c.Name, prefix) {
				kc.CertificatesV1().CertificateSigningRequests().Delete(context.Background(), c.Name, metav1.DeleteOptions{})
			}
		}
	})
	// A client request of someone else, before the approver runs: never
	// touched.
	foreign := prefix + "-alice"
	{
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		der, _ := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "alice"}}, key)
		csr := &certificatesv1.CertificateSigningRequest{ObjectMeta: metav1.ObjectMeta{Name: foreign}, Spec: certificatesv1.CertificateSigningRequestSpec{
			Request: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}), SignerName: identity.AgentSignerName,
			Usages: []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth},
		}}
		if _, err := kc.CertificatesV1().CertificateSigningRequests().Create(ctx, csr, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	approvedBefore, deniedBefore := counted(t, csrapproval.KindAgentClient, "approve"), counted(t, csrapproval.KindAgentClient, "deny")
	startApprover(t, e, prefix)

	// The agent's own flow: machine a's daemon, by its bootstrap token,
	// gets its certificate with nobody approving by hand.
	token, _ := e.BootstrapToken(t, a)
	dir := t.TempDir()
	tf := filepath.Join(dir, "bootstrap-token")
	os.WriteFile(tf, []byte(token+"\n"), 0o600)
	creds := kube.Credentials{APIServer: e.Host(), CAFile: e.CAFile(), TokenFile: tf,
		Certs: kube.CertStore{Dir: filepath.Join(dir, "pki")}, Machine: a}
	boot, err := creds.BootstrapConfig()
	if err != nil {
		t.Fatal(err)
	}
	cm := kube.CertManager{Store: creds.Certs, Machine: a, Wait: 30 * time.Second, Log: quiet}
	pair, err := cm.EnsureConfig(ctx, boot)
	if err != nil {
		t.Fatalf("the daemon's certificate, approved by the controller: %v", err)
	}
	if pair.Cert.Subject.CommonName != identity.AgentUserName(a) {
		t.Errorf("issued subject %v", pair.Cert.Subject)
	}

	// Requests the rules refuse, each denied with its reason.
	tokenClient := kubernetes.NewForConfigOrDie(e.TokenConfig(token))
	agentRequest(t, tokenClient, prefix+"-a-asks-b", identity.AgentUserName(b), []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth})
	agentRequest(t, tokenClient, prefix+"-a-server", identity.AgentUserName(a), []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth, certificatesv1.UsageServerAuth})
	ftoken, _ := e.BootstrapToken(t, fenced)
	agentRequest(t, kubernetes.NewForConfigOrDie(e.TokenConfig(ftoken)), prefix+"-fenced", identity.AgentUserName(fenced), []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth})
	for name, says := range map[string]string{
		prefix + "-a-asks-b": "machine " + a + "'s own identity",
		prefix + "-a-server": `usage "server auth"`,
		prefix + "-fenced":   "is fenced",
	} {
		c := decision(t, kc, name)
		if c.Type != certificatesv1.CertificateDenied || c.Reason != csrapproval.ReasonDenied || !strings.Contains(c.Message, says) {
			t.Errorf("%s: %s %s %q; want Denied saying %q", name, c.Type, c.Reason, c.Message, says)
		}
		// The Event of the decision, about the request.
		err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
			evs, err := kc.EventsV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: "regarding.name=" + name})
			return err == nil && len(evs.Items) > 0 && evs.Items[0].Reason == csrapproval.ReasonDenied, nil
		})
		if err != nil {
			t.Errorf("%s: no %s Event", name, csrapproval.ReasonDenied)
		}
	}
	if got := counted(t, csrapproval.KindAgentClient, "approve") - approvedBefore; got != 1 {
		t.Errorf("approvals counted: %v, want 1", got)
	}
	if got := counted(t, csrapproval.KindAgentClient, "deny") - deniedBefore; got != 3 {
		t.Errorf("denials counted: %v, want 3", got)
	}
	// Decided once: the foreign request untouched, every decided one
	// with exactly one decision.
	l, err := kc.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range l.Items {
		if !strings.Contains(c.Name, prefix) {
			continue
		}
		n := 0
		for _, cond := range c.Status.Conditions {
			if cond.Type == certificatesv1.CertificateApproved || cond.Type == certificatesv1.CertificateDenied {
				n++
			}
		}
		switch {
		case c.Name == foreign && n != 0:
			t.Errorf("the foreign client request %s was decided: %v", c.Name, c.Status.Conditions)
		case c.Name != foreign && n != 1:
			t.Errorf("%s has %d decisions: %v", c.Name, n, c.Status.Conditions)
		}
	}
}

// The manifests' least privilege suffices: the approver, as the service
// account `unbounded manifests --controller-image` creates (its RBAC
// applied to the real API server), with leader election in its namespace,
// approves a machine's request.
func TestApproverWorksWithTheManifestsRBACAlone(t *testing.T) {
	e := clustertest.Get(t)
	kc := e.Client(t)
	ctx := context.Background()
	data, err := manifests.Controller("registry.example/unbounded-controller@sha256:" + strings.Repeat("0", 64))
	if err != nil {
		t.Fatal(err)
	}
	s, err := Scheme()
	if err != nil {
		t.Fatal(err)
	}
	admin, err := client.New(e.Admin, client.Options{Scheme: s})
	if err != nil {
		t.Fatal(err)
	}
	// Everything but the workload (no image to run here): namespace,
	// service account, RBAC.
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		doc, err := r.Read()
		if err != nil {
			break
		}
		obj, _, err := serializer.NewCodecFactory(s).UniversalDeserializer().Decode(doc, nil, nil)
		if err != nil {
			continue // comments only
		}
		co, ok := obj.(client.Object)
		if !ok {
			t.Fatalf("%T is not an object", obj)
		}
		switch co.GetObjectKind().GroupVersionKind().Kind {
		case "Deployment", "PodDisruptionBudget", "Service":
			continue
		}
		if err := admin.Create(ctx, co); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("create %s %s: %v", co.GetObjectKind().GroupVersionKind().Kind, co.GetName(), err)
		}
	}
	sa := rest.CopyConfig(e.Admin)
	sa.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:unbounded-system:unbounded-controller",
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:unbounded-system", "system:authenticated"}}

	prefix := clustertest.UniqueName("csrsa")
	m := prefix + "-a"
	if _, err := e.Machines(t).Create(ctx, &v1alpha3.Machine{ObjectMeta: metav1.ObjectMeta{Name: m}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.DeleteMachine(m) })
	startApproverAs(t, sa, prefix, "unbounded-system")
	token, _ := e.BootstrapToken(t, m)
	name := prefix + "-req"
	agentRequest(t, kubernetes.NewForConfigOrDie(e.TokenConfig(token)), name, identity.AgentUserName(m),
		[]certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth})
	t.Cleanup(func() {
		kc.CertificatesV1().CertificateSigningRequests().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	if c := decision(t, kc, name); c.Type != certificatesv1.CertificateApproved {
		t.Errorf("as the manifests' service account: %s %s %q; want Approved", c.Type, c.Reason, c.Message)
	}
	// It leads through its Lease.
	if _, err := kc.CoordinationV1().Leases("unbounded-system").Get(ctx, LeaseName, metav1.GetOptions{}); err != nil {
		t.Errorf("the Lease %s: %v", LeaseName, err)
	}
}
