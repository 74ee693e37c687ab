// Package clustertest gives the credentials, fence and reporter tests what
// they need from the real test API server started by tests/kube (its
// kubeconfig in UNBOUNDED_TEST_KUBECONFIG): an admin client, bootstrap
// tokens, client certificates signed by the cluster CA with any validity
// period, CSR approval as the cluster-side approver would do it, the
// per-machine RBAC, and a loopback proxy in front of the API server that
// can be slowed down or closed.
//
// Only tests import it. Without the environment, Get skips the test with a
// line starting "kubeenv:", which the tier summary counts.
package clustertest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"unbounded-cloud.io/agent/lib/api/manifests"
	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/kube"
)

// Env is the running test cluster.
type Env struct {
	// Admin authenticates as system:masters.
	Admin *rest.Config
	// Dir holds kubeconfig, ca.crt and ca.key.
	Dir string
}

// Get returns the environment, or skips the test when there is none.
func Get(t testing.TB) *Env {
	t.Helper()
	// Not KUBECONFIG: these tests create cluster-wide objects and must
	// never run against a cluster a developer's shell points at.
	path := os.Getenv("UNBOUNDED_TEST_KUBECONFIG")
	if path == "" {
		t.Skip("kubeenv: no Kubernetes test environment (UNBOUNDED_TEST_KUBECONFIG unset; run under tests/kube/with-env.sh)")
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatal(err)
	}
	cfg.QPS, cfg.Burst = -1, 0
	return &Env{Admin: cfg, Dir: filepath.Dir(path)}
}

// Client is an admin clientset.
func (e *Env) Client(t testing.TB) kubernetes.Interface {
	return kubernetes.NewForConfigOrDie(e.Admin)
}

// Machines is an admin Machines client.
func (e *Env) Machines(t testing.TB) *kube.Machines {
	m, err := kube.NewMachines(e.Admin)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// DeleteMachine deletes a Machine as the cluster side would (the agent's
// client has no Delete: the agent never deletes its Machine).
func (e *Env) DeleteMachine(name string) error {
	kc := kubernetes.NewForConfigOrDie(e.Admin)
	return kc.Discovery().RESTClient().Delete().
		AbsPath("/apis", v1alpha3.GroupName, v1alpha3.Version, v1alpha3.ResourceMachines, name).
		Do(context.Background()).Error()
}

// CAFile is the cluster CA (it signs the API server's serving certificate).
func (e *Env) CAFile() string { return filepath.Join(e.Dir, "ca.crt") }

// Host is the API server URL.
func (e *Env) Host() string { return e.Admin.Host }

// UniqueName returns prefix plus random hex: tests share one cluster.
func UniqueName(prefix string) string {
	b := make([]byte, 4)
	rand.Read(b)
	return prefix + "-" + hex.EncodeToString(b)
}

// BootstrapToken creates a bootstrap token Secret for machine, with the
// extra groups the provisioning side gives it, and returns the token and
// the Secret's name (delete it to revoke the token). The Secret is deleted
// at the end of the test.
func (e *Env) BootstrapToken(t testing.TB, machine string) (token, secret string) {
	t.Helper()
	id, sec := randomLower(6), randomLower(16)
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "bootstrap-token-" + id, Namespace: "kube-system"},
		Type:       corev1.SecretTypeBootstrapToken,
		StringData: map[string]string{
			"token-id": id, "token-secret": sec,
			"usage-bootstrap-authentication": "true",
			"auth-extra-groups":              v1alpha3.BootstrapExtraGroups(machine),
		},
	}
	kc := e.Client(t)
	if _, err := kc.CoreV1().Secrets("kube-system").Create(context.Background(), s, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		kc.CoreV1().Secrets("kube-system").Delete(context.Background(), s.Name, metav1.DeleteOptions{})
	})
	return id + "." + sec, s.Name
}

// RevokeToken deletes a bootstrap token Secret, as fencing an allocation
// does.
func (e *Env) RevokeToken(t testing.TB, secret string) {
	t.Helper()
	if err := e.Client(t).CoreV1().Secrets("kube-system").Delete(context.Background(), secret, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}

// GrantMachine creates the per-machine RBAC (`unbounded manifests
// --machine`), removed at the end of the test.
func (e *Env) GrantMachine(t testing.TB, machine string) {
	t.Helper()
	kc := e.Client(t)
	ctx := context.Background()
	for _, o := range manifests.MachineObjects(machine, machine) {
		var err error
		switch o := o.(type) {
		case *rbacv1.ClusterRole:
			_, err = kc.RbacV1().ClusterRoles().Create(ctx, o, metav1.CreateOptions{})
			t.Cleanup(func() { kc.RbacV1().ClusterRoles().Delete(ctx, o.Name, metav1.DeleteOptions{}) })
		case *rbacv1.ClusterRoleBinding:
			_, err = kc.RbacV1().ClusterRoleBindings().Create(ctx, o, metav1.CreateOptions{})
			t.Cleanup(func() { kc.RbacV1().ClusterRoleBindings().Delete(ctx, o.Name, metav1.DeleteOptions{}) })
		default:
			t.Fatalf("GrantMachine: unexpected object %T", o)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	// The authorizer learns about new bindings through an informer, a
	// moment later; wait until both identities may read the Machine.
	for _, id := range []authorizationv1.SubjectAccessReviewSpec{
		{User: "system:bootstrap:probe", Groups: []string{v1alpha3.BootstrapGroup(machine)}},
		{User: v1alpha3.AgentUserName(machine), Groups: []string{v1alpha3.AgentGroup}},
	} {
		id.ResourceAttributes = &authorizationv1.ResourceAttributes{Group: v1alpha3.GroupName,
			Resource: v1alpha3.ResourceMachines, Verb: "get", Name: machine}
		err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
			r, err := kc.AuthorizationV1().SubjectAccessReviews().Create(ctx,
				&authorizationv1.SubjectAccessReview{Spec: id}, metav1.CreateOptions{})
			return err == nil && r.Status.Allowed, nil
		})
		if err != nil {
			t.Fatalf("GrantMachine %s: RBAC not effective for %s within 10s", machine, id.User)
		}
	}
}

// MintClientCert signs a client certificate for cn/orgs with the cluster CA
// directly, valid from notBefore to notAfter: the way to get an expired or
// nearly expired certificate, which no signer issues on request.
func (e *Env) MintClientCert(t testing.TB, cn string, orgs []string, notBefore, notAfter time.Time) (certPEM, keyPEM []byte) {
	t.Helper()
	caPair, err := tls.LoadX509KeyPair(filepath.Join(e.Dir, "ca.crt"), filepath.Join(e.Dir, "ca.key"))
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: cn, Organization: orgs},
		NotBefore:    notBefore,
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caPair.Leaf, key.Public(), caPair.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	kd, _ := x509.MarshalECPrivateKey(key)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kd})
}

// ApproveCSR approves the named CSR as the cluster-side approver does; the
// signer in the test environment then issues the certificate.
func (e *Env) ApproveCSR(t testing.TB, name string) {
	t.Helper()
	ctx := context.Background()
	kc := e.Client(t)
	csr, err := kc.CertificatesV1().CertificateSigningRequests().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	csr.Status.Conditions = append(csr.Status.Conditions, certv1.CertificateSigningRequestCondition{
		Type: certv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: "TestApprover", Message: "approved by the test"})
	if _, err := kc.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, name, csr, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func randomLower(n int) string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, n)
	rand.Read(b)
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b)
}

// Proxy is a TCP proxy on loopback in front of the API server. TLS passes
// through untouched (the serving certificate names 127.0.0.1), so a client
// pointed at the proxy talks to the real server, and the test can make the
// server slow (SetDelay) or gone (Close).
type Proxy struct {
	URL string

	ln       net.Listener
	upstream string
	mu       sync.Mutex
	delay    time.Duration
	conns    map[net.Conn]bool
	closed   bool
}

// ProxyFront starts a proxy to the API server; it is closed at the end of
// the test.
func (e *Env) ProxyFront(t testing.TB) *Proxy {
	t.Helper()
	u, err := url.Parse(e.Host())
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{URL: "https://" + ln.Addr().String(), ln: ln, upstream: u.Host, conns: map[net.Conn]bool{}}
	go p.serve()
	t.Cleanup(p.Close)
	return p
}

// SetDelay makes every new connection wait d before it reaches the server
// (the TLS handshake, and so the first answer, comes d late).
func (p *Proxy) SetDelay(d time.Duration) {
	p.mu.Lock()
	p.delay = d
	p.mu.Unlock()
}

// Close stops listening and cuts every open connection: the API server is
// unreachable through the proxy from now on (connection refused).
func (p *Proxy) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	p.closed = true
	p.ln.Close()
	for c := range p.conns {
		c.Close()
	}
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		c.Close()
		return false
	}
	p.conns[c] = true
	return true
}

func (p *Proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			return
		}
		go func() {
			p.mu.Lock()
			d := p.delay
			p.mu.Unlock()
			time.Sleep(d)
			up, err := net.Dial("tcp", p.upstream)
			if err != nil || !p.track(up) {
				c.Close()
				return
			}
			go func() { io.Copy(up, c); up.Close() }()
			io.Copy(c, up)
			c.Close()
		}()
	}
}

// NewUID returns a random UUID, the form of a MachineAllocation's UID (and
// of [allocation] uid, which the config loader checks).
func NewUID() string { return string(uuid.NewUUID()) }
