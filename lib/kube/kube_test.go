package kube_test

// Credentials and the Machines client against the real API server of
// tests/kube, with its real CSR signer; the test approves CSRs as the
// cluster-side controller would.

import (
	"context"
	"crypto/x509"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"unbounded-cloud.io/agent/lib/api/identity"
	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/kube"
	"unbounded-cloud.io/agent/lib/kube/clustertest"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

type agentHost struct {
	env       *clustertest.Env
	machine   string
	tokenName string
	creds     kube.Credentials
}

func newAgentHost(t *testing.T) *agentHost {
	t.Helper()
	env := clustertest.Get(t)
	h := &agentHost{env: env, machine: clustertest.UniqueName("cred")}
	token, secret := env.BootstrapToken(t, h.machine)
	h.tokenName = secret
	dir := t.TempDir()
	tf := filepath.Join(dir, "bootstrap-token")
	os.WriteFile(tf, []byte(token+"\n"), 0o600)
	h.creds = kube.Credentials{APIServer: env.Host(), CAFile: env.CAFile(), TokenFile: tf,
		Certs: kube.CertStore{Dir: filepath.Join(dir, "var/lib/unbounded/pki")}, Machine: h.machine}
	return h
}

func (h *agentHost) bootstrapConfig(t *testing.T) *rest.Config {
	t.Helper()
	cfg, err := h.creds.BootstrapConfig()
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func (h *agentHost) bootstrapClient(t *testing.T) kubernetes.Interface {
	return kubernetes.NewForConfigOrDie(h.bootstrapConfig(t))
}

// approveNext approves, as the cluster-side approver, the next CSR of the
// machine that is not approved yet, and returns its name.
func (h *agentHost) approveNext(t *testing.T, seen map[string]bool) string {
	t.Helper()
	kc := h.env.Client(t)
	prefix := "unbounded-agent-" + h.machine + "-"
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		l, err := kc.CertificatesV1().CertificateSigningRequests().List(context.Background(), metav1.ListOptions{})
		if err != nil {
			t.Error(err)
			return ""
		}
		for _, c := range l.Items {
			if strings.HasPrefix(c.Name, prefix) && !seen[c.Name] {
				if c.Spec.SignerName != identity.AgentSignerName {
					t.Errorf("CSR %s signer %q", c.Name, c.Spec.SignerName)
				}
				if c.Spec.Username == "" || !strings.HasPrefix(c.Spec.Username, "system:bootstrap:") && c.Spec.Username != identity.AgentUserName(h.machine) {
					t.Errorf("CSR %s requested by %q", c.Name, c.Spec.Username)
				}
				seen[c.Name] = true
				h.env.ApproveCSR(t, c.Name)
				t.Cleanup(func() {
					kc.CertificatesV1().CertificateSigningRequests().Delete(context.Background(), c.Name, metav1.DeleteOptions{})
				})
				return c.Name
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Error("no CSR of the machine appeared within 20s")
	return ""
}

// ensureApproved runs ensure (CertManager.EnsureConfig or Ensure) while the
// test approves the CSR it sends.
func (h *agentHost) ensureApproved(t *testing.T, ensure func(context.Context) (*kube.CertPair, error), seen map[string]bool) (*kube.CertPair, string) {
	t.Helper()
	type res struct {
		p   *kube.CertPair
		err error
	}
	done := make(chan res, 1)
	go func() {
		p, err := ensure(context.Background())
		done <- res{p, err}
	}()
	name := h.approveNext(t, seen)
	r := <-done
	if r.err != nil {
		t.Fatalf("Ensure: %v", r.err)
	}
	return r.p, name
}

func TestCSRFlowIssuesAClientCertificateStoredWith0600(t *testing.T) {
	h := newAgentHost(t)
	m := kube.CertManager{Store: h.creds.Certs, Machine: h.machine, Wait: 30 * time.Second, Log: quiet}
	pair, csrName := h.ensureApproved(t, func(ctx context.Context) (*kube.CertPair, error) {
		return m.EnsureConfig(ctx, h.bootstrapConfig(t))
	}, map[string]bool{})
	if csrName == "" {
		t.FailNow()
	}
	if pair.Cert.Subject.CommonName != identity.AgentUserName(h.machine) ||
		len(pair.Cert.Subject.Organization) != 1 || pair.Cert.Subject.Organization[0] != identity.AgentGroup {
		t.Errorf("subject %v", pair.Cert.Subject)
	}
	ca, _ := os.ReadFile(h.env.CAFile())
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	if _, err := pair.Cert.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("issued certificate does not verify against the cluster CA for client auth: %v", err)
	}
	fi, err := os.Stat(h.creds.Certs.Path())
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("%s mode %v, want 0600", h.creds.Certs.Path(), fi.Mode().Perm())
	}
	// The API server authenticates the stored certificate as the agent.
	cfg, _, err := h.creds.CertConfig(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	ms, _ := kube.NewMachines(cfg)
	if _, err := ms.Get(context.Background(), h.machine); !apierrors.IsNotFound(err) {
		t.Errorf("Get own (absent) Machine with the certificate: %v, want NotFound (authenticated and authorized)", err)
	}
	// A second Ensure with a fresh certificate sends no new CSR.
	again, err := m.EnsureConfig(context.Background(), h.bootstrapConfig(t))
	if err != nil || again.Cert.SerialNumber.Cmp(pair.Cert.SerialNumber) != 0 {
		t.Errorf("Ensure with a fresh certificate: %v, serial changed: %v", err, again != nil && again.Cert.SerialNumber.Cmp(pair.Cert.SerialNumber) != 0)
	}
}

func TestCSRRenewsPastEightyPercentOfTheLifetimeWithTheCurrentCertificate(t *testing.T) {
	h := newAgentHost(t)
	seen := map[string]bool{}
	clock := time.Now()
	m := kube.CertManager{Store: h.creds.Certs, Machine: h.machine, Wait: 30 * time.Second, Log: quiet,
		Duration: time.Hour, Now: func() time.Time { return clock }}
	first, _ := h.ensureApproved(t, func(ctx context.Context) (*kube.CertPair, error) {
		return m.EnsureConfig(ctx, h.bootstrapConfig(t))
	}, seen)
	if life := first.Cert.NotAfter.Sub(first.Cert.NotBefore); life > 2*time.Hour {
		t.Errorf("lifetime %s, asked for 1h", life)
	}

	// At 70 % nothing happens.
	clock = first.Cert.NotBefore.Add(first.Cert.NotAfter.Sub(first.Cert.NotBefore) * 7 / 10)
	same, err := m.EnsureConfig(context.Background(), h.bootstrapConfig(t))
	if err != nil || same.Cert.SerialNumber.Cmp(first.Cert.SerialNumber) != 0 {
		t.Fatalf("Ensure at 70%%: %v (renewed too early?)", err)
	}

	// Past 80 % the certificate is renewed, with the current certificate
	// as the credential (the bootstrap token may be revoked by now).
	h.env.RevokeToken(t, h.tokenName)
	clock = kube.RenewAt(first.Cert).Add(time.Second)
	cfg, _, err := h.creds.CertConfig(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	renewed, _ := h.ensureApproved(t, func(ctx context.Context) (*kube.CertPair, error) {
		return m.EnsureConfig(ctx, cfg)
	}, seen)
	if renewed.Cert.SerialNumber.Cmp(first.Cert.SerialNumber) == 0 {
		t.Fatal("not renewed")
	}
	if string(renewed.KeyPEM) == string(first.KeyPEM) {
		t.Error("renewal kept the old key; each CSR has a new key")
	}
	stored, err := h.creds.Certs.Load()
	if err != nil || stored.Cert.SerialNumber.Cmp(renewed.Cert.SerialNumber) != 0 {
		t.Errorf("stored certificate is not the renewed one: %v", err)
	}
}

func TestCSRReplacesAnUnreadableStoredCertificate(t *testing.T) {
	h := newAgentHost(t)
	os.MkdirAll(h.creds.Certs.Dir, 0o700)
	os.WriteFile(h.creds.Certs.Path(), []byte("-----BEGIN CERTIFICATE-----\ngarbage\n"), 0o600)
	m := kube.CertManager{Store: h.creds.Certs, Machine: h.machine, Wait: 30 * time.Second, Log: quiet}
	pair, _ := h.ensureApproved(t, func(ctx context.Context) (*kube.CertPair, error) {
		return m.EnsureConfig(ctx, h.bootstrapConfig(t))
	}, map[string]bool{})
	if _, err := h.creds.Certs.Load(); err != nil || pair == nil {
		t.Fatalf("after a new CSR the store is still unusable: %v", err)
	}
}

// A disk cloned from another host holds that machine's valid
// certificate: the manager never keeps it, it requests this host's own.
func TestCSRReplacesAnotherMachinesStoredCertificate(t *testing.T) {
	h := newAgentHost(t)
	c, k := clustertest.Get(t).MintClientCert(t, "unbounded-agent:some-other-machine", nil, time.Now().Add(-time.Minute), time.Now().Add(time.Hour))
	if err := h.creds.Certs.Save(c, k); err != nil {
		t.Fatal(err)
	}
	if _, _, err := h.creds.CertConfig(time.Now()); !errors.Is(err, kube.ErrForeignCertificate) {
		t.Fatalf("CertConfig of the other machine's certificate: %v, want ErrForeignCertificate", err)
	}
	m := kube.CertManager{Store: h.creds.Certs, Machine: h.machine, Wait: 30 * time.Second, Log: quiet}
	pair, _ := h.ensureApproved(t, func(ctx context.Context) (*kube.CertPair, error) {
		return m.EnsureConfig(ctx, h.bootstrapConfig(t))
	}, map[string]bool{})
	if want := "unbounded-agent:" + h.machine; pair == nil || pair.Cert.Subject.CommonName != want {
		t.Fatalf("after Ensure: %v, want a certificate for %s", pair, want)
	}
	if _, _, err := h.creds.CertConfig(time.Now()); err != nil {
		t.Errorf("the stored certificate after Ensure: %v", err)
	}
}

func TestCSRNotApprovedInTimeFailsWithoutStoringAnything(t *testing.T) {
	h := newAgentHost(t)
	m := kube.CertManager{Store: h.creds.Certs, Machine: h.machine, Wait: 1500 * time.Millisecond, Log: quiet}
	start := time.Now()
	_, err := m.EnsureConfig(context.Background(), h.bootstrapConfig(t))
	if err == nil || !strings.Contains(err.Error(), "not approved and issued within") {
		t.Fatalf("Ensure without approval: %v", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("took %s with a 1.5s wait", took)
	}
	if _, err := os.Stat(h.creds.Certs.Path()); !os.IsNotExist(err) {
		t.Errorf("something was stored: %v", err)
	}
}

func TestBootstrapTokenRejectedAfterTheSecretIsDeleted(t *testing.T) {
	h := newAgentHost(t)
	kc := h.bootstrapClient(t)
	h.env.RevokeToken(t, h.tokenName)
	_, err := kc.CertificatesV1().CertificateSigningRequests().List(context.Background(), metav1.ListOptions{})
	if err = kube.TokenRejected(err); !errors.Is(err, kube.ErrBootstrapTokenRejected) {
		t.Fatalf("request with a deleted token: %v, want ErrBootstrapTokenRejected", err)
	}
	if kube.NoAnswer(err) {
		t.Error("a 401 counted as no answer: it is the cluster's decision")
	}
}

func TestMachinesClientGetCreateUpdateStatusAndWatchOwnMachine(t *testing.T) {
	env := clustertest.Get(t)
	ms := env.Machines(t)
	ctx := context.Background()
	name := clustertest.UniqueName("mc")
	other := clustertest.UniqueName("mc-other")
	t.Cleanup(func() { env.DeleteMachine(name); env.DeleteMachine(other) })

	w, err := ms.Watch(ctx, name, "")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	m := &v1alpha3.Machine{}
	m.Name = name
	m.Status.Phase = v1alpha3.MachineReady
	created, err := ms.Create(ctx, m)
	if err != nil {
		t.Fatal(err)
	}
	if created.Status.Phase != "" {
		t.Errorf("status kept on create: %q (the status subresource drops it)", created.Status.Phase)
	}
	o := &v1alpha3.Machine{}
	o.Name = other
	if _, err := ms.Create(ctx, o); err != nil {
		t.Fatal(err)
	}
	created.Status.Phase = v1alpha3.MachineBootstrapping
	updated, err := ms.UpdateStatus(ctx, created)
	if err != nil {
		t.Fatal(err)
	}
	if updated.Status.Phase != v1alpha3.MachineBootstrapping || updated.Generation != created.Generation {
		t.Errorf("UpdateStatus: phase %q generation %d->%d", updated.Status.Phase, created.Generation, updated.Generation)
	}
	created.Status.Phase = v1alpha3.MachineFailed // stale resourceVersion
	if _, err := ms.UpdateStatus(ctx, created); !apierrors.IsConflict(err) {
		t.Errorf("stale UpdateStatus: %v, want a conflict", err)
	}

	var events []string
	timeout := time.After(10 * time.Second)
	for len(events) < 2 {
		select {
		case ev := <-w.ResultChan():
			got, ok := ev.Object.(*v1alpha3.Machine)
			if !ok {
				t.Fatalf("watch event %s with %T", ev.Type, ev.Object)
			}
			if ev.Type == watch.Bookmark {
				continue
			}
			if got.Name != name {
				t.Errorf("watch of %s saw %s", name, got.Name)
			}
			events = append(events, string(ev.Type)+":"+string(got.Status.Phase))
		case <-timeout:
			t.Fatalf("watch events so far %v", events)
		}
	}
	if events[0] != "ADDED:" || events[1] != "MODIFIED:Bootstrapping" {
		t.Errorf("watch events %v", events)
	}
}
