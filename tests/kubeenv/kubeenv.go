// Package kubeenv gives tests the shared Kubernetes test environment that
// tests/kube/with-env.sh starts: a real kube-apiserver with a real etcd,
// bootstrap-token auth, Node and RBAC authorization, a token cache of zero
// (a deleted bootstrap token stops authenticating at once), the
// kube-controller-manager controllers a joining node meets (CSR approving
// and signing, node lifecycle with a 20 s grace period, garbage collector,
// workloads, service accounts, bootstrap tokens; tests/kube/README.md) and
// kube-scheduler, with the project's CRDs and RBAC installed.
//
// All tests of a run share one API server and run in parallel: name objects
// with UniqueName, and never rely on a cluster-wide list being empty.
//
// Without the environment, Get skips the test with a line starting
// "kubeenv:", which tests/tiersum counts in the kubernetes tier; where the
// kube tier is required (UNBOUNDED_TEST_REQUIRED, see tests/tiers) it
// fails the test with that line instead.
package kubeenv

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/keyutil"

	"unbounded-cloud.io/agent/tests/tiers"
)

// The environment variables with-env.sh exports.
const (
	// EnvKubeconfig is the admin kubeconfig. Not KUBECONFIG: these tests
	// create cluster-wide objects and must never run against a cluster a
	// developer's shell points at.
	EnvKubeconfig = "UNBOUNDED_TEST_KUBECONFIG"
	// EnvDir holds kubeconfig, ca.crt, ca.key and admin-token.
	EnvDir = "UNBOUNDED_TEST_KUBEDIR"
	// EnvSkip is set, with the reason, when the environment could not be
	// built or started.
	EnvSkip = "UNBOUNDED_TEST_KUBE_SKIP"
)

// Env is the running test environment.
type Env struct {
	// Dir holds kubeconfig, ca.crt, ca.key and admin-token.
	Dir string
	// CAFile is the cluster CA: it signs the API server's serving
	// certificate, client certificates (--client-ca-file) and approved CSRs.
	CAFile string

	admin  *rest.Config
	client kubernetes.Interface
	dyn    dynamic.Interface
}

var (
	once    sync.Once
	shared  *Env
	loadErr error
)

// Get returns the environment, or skips the test with the reason there is
// none; when the kube tier is required (tests/tiers) it fails the test
// with that reason instead. A kubeconfig that is set but unusable fails the
// test: that is a broken environment, not a missing one.
func Get(t testing.TB) *Env {
	t.Helper()
	if reason := os.Getenv(EnvSkip); reason != "" {
		tiers.Skip(t, tiers.Kube, "kubeenv: no test API server: %s", reason)
	}
	path := os.Getenv(EnvKubeconfig)
	if path == "" {
		tiers.Skip(t, tiers.Kube, "kubeenv: no test API server: run under `make test` (tests/kube/with-env.sh)")
	}
	once.Do(func() { shared, loadErr = load(path) })
	if loadErr != nil {
		t.Fatalf("kubeenv: test API server from %s: %v", path, loadErr)
	}
	t.Logf("kubeenv: API server %s", shared.Host())
	return shared
}

func load(kubeconfig string) (*Env, error) {
	admin, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, err
	}
	// Tests of a run share the server and run in parallel: client-side
	// throttling would only make them slower and their timings noisier.
	admin.QPS, admin.Burst = -1, 0
	dir := os.Getenv(EnvDir)
	if dir == "" {
		dir = filepath.Dir(kubeconfig)
	}
	return loadDir(kubeconfig, dir)
}

// loadDir is load of an environment whose directory is dir.
func loadDir(kubeconfig, dir string) (*Env, error) {
	admin, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, err
	}
	admin.QPS, admin.Burst = -1, 0
	client, err := kubernetes.NewForConfig(admin)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(admin)
	if err != nil {
		return nil, err
	}
	return &Env{Dir: dir, CAFile: filepath.Join(dir, "ca.crt"), admin: admin, client: client, dyn: dyn}, nil
}

// RESTConfig is a copy of the admin (system:masters) configuration.
func (e *Env) RESTConfig() *rest.Config { return rest.CopyConfig(e.admin) }

// Client is an admin clientset.
func (e *Env) Client() kubernetes.Interface { return e.client }

// Dynamic is an admin dynamic client, for custom resources.
func (e *Env) Dynamic() dynamic.Interface { return e.dyn }

// Host is the API server's URL (https://127.0.0.1:PORT).
func (e *Env) Host() string { return e.admin.Host }

// CAPEM is the cluster CA certificate in PEM, as a kubeconfig or an agent's
// ca-file holds it.
func (e *Env) CAPEM(t testing.TB) []byte {
	t.Helper()
	b, err := os.ReadFile(e.CAFile)
	if err != nil {
		t.Fatalf("kubeenv: %v", err)
	}
	return b
}

// CACert is the cluster CA certificate.
func (e *Env) CACert(t testing.TB) *x509.Certificate {
	t.Helper()
	block, _ := pem.Decode(e.CAPEM(t))
	if block == nil {
		t.Fatalf("kubeenv: %s: no PEM block", e.CAFile)
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatalf("kubeenv: %s: %v", e.CAFile, err)
	}
	return c
}

// CAKey is the cluster CA's private key.
func (e *Env) CAKey(t testing.TB) crypto.Signer {
	t.Helper()
	path := filepath.Join(e.Dir, "ca.key")
	k, err := keyutil.PrivateKeyFromFile(path)
	if err != nil {
		t.Fatalf("kubeenv: %s: %v", path, err)
	}
	s, ok := k.(crypto.Signer)
	if !ok {
		t.Fatalf("kubeenv: %s: %T is not a signer", path, k)
	}
	return s
}

// TokenConfig is a configuration that authenticates with token alone
// (a bootstrap token, say), trusting the cluster CA.
func (e *Env) TokenConfig(token string) *rest.Config {
	return &rest.Config{
		Host:            e.admin.Host,
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAData: e.caData()},
		QPS:             -1,
	}
}

// CertConfig is a configuration that authenticates with a client
// certificate alone, trusting the cluster CA.
func (e *Env) CertConfig(certPEM, keyPEM []byte) *rest.Config {
	return &rest.Config{
		Host:            e.admin.Host,
		TLSClientConfig: rest.TLSClientConfig{CAData: e.caData(), CertData: certPEM, KeyData: keyPEM},
		QPS:             -1,
	}
}

func (e *Env) caData() []byte {
	if len(e.admin.CAData) > 0 {
		return e.admin.CAData
	}
	b, _ := os.ReadFile(e.CAFile)
	return b
}

var nonName = regexp.MustCompile(`[^a-z0-9]+`)

// UniqueName returns a DNS-1123 label for an object of this test: prefix,
// a few characters of the test's name (to find it in the cluster), and
// random hex (tests share the cluster and run in parallel, and -count=N
// runs a test again against the objects the last run left).
func UniqueName(t testing.TB, prefix string) string {
	b := make([]byte, 4)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	name := strings.Trim(nonName.ReplaceAllString(strings.ToLower(t.Name()), "-"), "-")
	sum := sha256.Sum256([]byte(t.Name()))
	hint := hex.EncodeToString(sum[:2])
	if len(name) > 20 {
		name = strings.Trim(name[len(name)-20:], "-")
	}
	out := strings.Trim(nonName.ReplaceAllString(strings.ToLower(prefix), "-"), "-")
	for _, part := range []string{name, hint, hex.EncodeToString(b)} {
		if part != "" {
			out += "-" + part
		}
	}
	out = strings.TrimLeft(out, "-")
	if len(out) > 63 {
		out = strings.TrimLeft(out[len(out)-63:], "-")
	}
	return out
}

// CreateBootstrapToken creates a bootstrap token Secret (kube-system,
// type bootstrap.kubernetes.io/token, usable for authentication, expiring
// in an hour) and waits until the API server accepts the token, so a test
// does not race the server's Secret informer. The token authenticates as
// system:bootstrap:<id> in system:bootstrappers plus extraGroups (each must
// start "system:bootstrappers:"). The Secret is deleted when the test ends.
// id is 6 and secret 16 characters of [a-z0-9] (see RandomTokenID).
func (e *Env) CreateBootstrapToken(t testing.TB, id, secret string, extraGroups ...string) string {
	t.Helper()
	ctx := context.Background()
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "bootstrap-token-" + id, Namespace: metav1.NamespaceSystem},
		Type:       corev1.SecretTypeBootstrapToken,
		StringData: map[string]string{
			"token-id":                       id,
			"token-secret":                   secret,
			"usage-bootstrap-authentication": "true",
			"expiration":                     time.Now().Add(time.Hour).UTC().Format(time.RFC3339),
		},
	}
	if len(extraGroups) > 0 {
		s.StringData["auth-extra-groups"] = strings.Join(extraGroups, ",")
	}
	if _, err := e.client.CoreV1().Secrets(metav1.NamespaceSystem).Create(ctx, s, metav1.CreateOptions{}); err != nil {
		t.Fatalf("kubeenv: create bootstrap token %s: %v", id, err)
	}
	t.Cleanup(func() { e.deleteTokenSecret(id) })
	token := id + "." + secret
	if err := e.waitToken(ctx, token, true); err != nil {
		t.Fatalf("kubeenv: bootstrap token %s: %v", id, err)
	}
	return token
}

// DeleteBootstrapToken deletes the token's Secret and waits until the API
// server rejects the token.
func (e *Env) DeleteBootstrapToken(t testing.TB, id, secret string) {
	t.Helper()
	if err := e.deleteTokenSecret(id); err != nil {
		t.Fatalf("kubeenv: delete bootstrap token %s: %v", id, err)
	}
	if err := e.waitToken(context.Background(), id+"."+secret, false); err != nil {
		t.Fatalf("kubeenv: bootstrap token %s: %v", id, err)
	}
}

func (e *Env) deleteTokenSecret(id string) error {
	err := e.client.CoreV1().Secrets(metav1.NamespaceSystem).Delete(context.Background(), "bootstrap-token-"+id, metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// TokenAuthenticated asks the API server (TokenReview, as admin) whether
// token authenticates, and as whom.
func (e *Env) TokenAuthenticated(ctx context.Context, token string) (bool, string, []string, error) {
	r, err := e.client.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: token}}, metav1.CreateOptions{})
	if err != nil {
		return false, "", nil, err
	}
	return r.Status.Authenticated, r.Status.User.Username, r.Status.User.Groups, nil
}

// The API server learns of bootstrap token Secrets through an informer: a
// few milliseconds after the write, but not at once.
func (e *Env) waitToken(ctx context.Context, token string, want bool) error {
	var got bool
	err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		ok, _, _, err := e.TokenAuthenticated(ctx, token)
		if err != nil {
			return false, err
		}
		got = ok
		return ok == want, nil
	})
	if err != nil {
		return fmt.Errorf("authenticated=%v, want %v: %w", got, want, err)
	}
	return nil
}

// RandomTokenID returns a fresh bootstrap token id and secret.
func RandomTokenID(t testing.TB) (id, secret string) {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, 22)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b[:6]), string(b[6:])
}

// MintClientCert returns a client certificate (and its key) signed by the
// cluster CA, valid for an hour, authenticating as cn in groups orgs: for
// identities that have no CSR flow of their own in a test (a kubelet's
// system:node:<name>, say).
func (e *Env) MintClientCert(t testing.TB, cn string, orgs ...string) (certPEM, keyPEM []byte) {
	t.Helper()
	now := time.Now()
	return e.MintClientCertValid(t, now.Add(-time.Minute), now.Add(time.Hour), cn, orgs...)
}

// MintClientCertValid is MintClientCert with a chosen validity period, for
// certificates that are expired or not yet valid.
func (e *Env) MintClientCertValid(t testing.TB, notBefore, notAfter time.Time, cn string, orgs ...string) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial.Add(serial, big.NewInt(1)),
		Subject:      pkix.Name{CommonName: cn, Organization: orgs},
		NotBefore:    notBefore,
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, e.CACert(t), key.Public(), e.CAKey(t))
	if err != nil {
		t.Fatalf("kubeenv: sign client certificate: %v", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
}

// ApproveCSR approves the CertificateSigningRequest as the cluster-side
// approver would; the environment's signer then issues the certificate.
func (e *Env) ApproveCSR(t testing.TB, name string) {
	t.Helper()
	ctx := context.Background()
	csrs := e.client.CertificatesV1().CertificateSigningRequests()
	err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		csr, err := csrs.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		csr.Status.Conditions = append(csr.Status.Conditions, certv1.CertificateSigningRequestCondition{
			Type:           certv1.CertificateApproved,
			Status:         corev1.ConditionTrue,
			Reason:         "KubeenvApproved",
			Message:        "approved by test " + t.Name(),
			LastUpdateTime: metav1.Now(),
		})
		_, err = csrs.UpdateApproval(ctx, name, csr, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) {
			return false, nil // the signer or the requester wrote meanwhile
		}
		return err == nil, err
	})
	if err != nil {
		t.Fatalf("kubeenv: approve CSR %s: %v", name, err)
	}
}

// WaitCSRCertificate waits until the CSR has its certificate and returns it.
func (e *Env) WaitCSRCertificate(t testing.TB, name string, timeout time.Duration) []byte {
	t.Helper()
	var cert []byte
	err := wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		csr, err := e.client.CertificatesV1().CertificateSigningRequests().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, c := range csr.Status.Conditions {
			if c.Type == certv1.CertificateFailed && c.Status == corev1.ConditionTrue {
				return false, fmt.Errorf("signer failed: %s: %s", c.Reason, c.Message)
			}
		}
		cert = csr.Status.Certificate
		return len(cert) > 0, nil
	})
	if err != nil {
		t.Fatalf("kubeenv: certificate of CSR %s: %v", name, err)
	}
	return cert
}

// kubeletsDir is where kube-testenv looks for NAME.sock, the way to node
// NAME's kubelet port (tests/kube/testenv.KubeletsDir).
const kubeletsDir = "kubelets"

// PublishKubelet makes the API server reach node's kubelet port (logs,
// exec, port-forward, metrics) through the unix socket sock, for a node in
// a network the API server cannot reach (a test host's own namespace),
// until the test ends. The API server dials kubelets by the Node's
// Hostname address through kube-testenv's "cluster" network proxy, which
// connects to the socket published under that name.
func (e *Env) PublishKubelet(t testing.TB, node, sock string) {
	t.Helper()
	link := filepath.Join(e.Dir, kubeletsDir, node+".sock")
	_ = os.Remove(link)
	if err := os.Symlink(sock, link); err != nil {
		t.Fatalf("kubeenv: publish the kubelet of %s: %v", node, err)
	}
	t.Cleanup(func() { os.Remove(link) })
}
