package manifests

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"os"
	"strings"
	"testing"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// clusterEnv is what the RBAC tests need from the test cluster.
type clusterEnv interface {
	admin() *rest.Config
	uniqueName(t *testing.T, prefix string) string
	// bootstrapToken creates a bootstrap token for machine, with the
	// extra groups the provisioning side gives it, and returns a config
	// that authenticates with it, and the token.
	bootstrapToken(t *testing.T, machine string) (*rest.Config, string)
	clientCert(t *testing.T, cn string, orgs ...string) *rest.Config
}

type kubeconfigEnv struct{ cfg *rest.Config }

func getClusterEnv(t *testing.T) clusterEnv {
	t.Helper()
	// Not KUBECONFIG: these tests create and delete cluster-wide RBAC,
	// Nodes and Secrets, and must never run against whatever cluster a
	// developer's shell points at.
	path := os.Getenv("UNBOUNDED_TEST_KUBECONFIG")
	if path == "" {
		t.Skip("kubeenv: no Kubernetes test environment (UNBOUNDED_TEST_KUBECONFIG unset; run under tests/kube/with-env.sh)")
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kubeenv: using %s", path)
	return kubeconfigEnv{cfg: cfg}
}

func (e kubeconfigEnv) admin() *rest.Config { return rest.CopyConfig(e.cfg) }

func (e kubeconfigEnv) uniqueName(t *testing.T, prefix string) string {
	return prefix + "-" + randomHex(8)
}

// anonymous returns the admin config without its credentials.
func (e kubeconfigEnv) anonymous() *rest.Config {
	c := rest.AnonymousClientConfig(e.cfg)
	return c
}

func (e kubeconfigEnv) bootstrapToken(t *testing.T, machine string) (*rest.Config, string) {
	t.Helper()
	kc := kubernetes.NewForConfigOrDie(e.cfg)
	id, secret := randomHex(6), randomHex(16)
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "bootstrap-token-" + id, Namespace: "kube-system"},
		Type:       corev1.SecretTypeBootstrapToken,
		StringData: map[string]string{
			"token-id": id, "token-secret": secret,
			"usage-bootstrap-authentication": "true",
			"auth-extra-groups":              strings.Join([]string{"system:bootstrappers:unbounded", "system:bootstrappers:unbounded:" + machine}, ","),
		},
	}
	if _, err := kc.CoreV1().Secrets("kube-system").Create(context.Background(), s, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = kc.CoreV1().Secrets("kube-system").Delete(context.Background(), s.Name, metav1.DeleteOptions{})
	})
	c := e.anonymous()
	c.BearerToken = id + "." + secret
	return c, c.BearerToken
}

func (e kubeconfigEnv) clientCert(t *testing.T, cn string, orgs ...string) *rest.Config {
	t.Helper()
	ctx := context.Background()
	kc := kubernetes.NewForConfigOrDie(e.cfg)
	req, key, err := certRequest(cn, orgs...)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := kc.CertificatesV1().CertificateSigningRequests().Create(ctx, &certv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "rbac-test-"},
		Spec: certv1.CertificateSigningRequestSpec{Request: req, SignerName: "kubernetes.io/kube-apiserver-client",
			Usages: []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageClientAuth}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	csr.Status.Conditions = append(csr.Status.Conditions, certv1.CertificateSigningRequestCondition{
		Type: certv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: "Test", Message: "rbac test"})
	if _, err := kc.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, csr.Name, csr, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	var cert []byte
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		got, err := kc.CertificatesV1().CertificateSigningRequests().Get(ctx, csr.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		cert = got.Status.Certificate
		return len(cert) > 0, nil
	})
	if err != nil {
		t.Fatalf("CSR %s never signed: %v", csr.Name, err)
	}
	c := e.anonymous()
	c.CertData, c.KeyData = cert, key
	return c
}

// certRequest returns a PEM CSR and its PEM private key.
func certRequest(cn string, orgs ...string) (csrPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: cn, Organization: orgs}}, key)
	if err != nil {
		return nil, nil, err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), nil
}
