package kubeenv

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/url"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	certv1 "k8s.io/api/certificates/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"unbounded-cloud.io/agent/tests/tiers"
)

func whoAmI(t *testing.T, cfg *rest.Config) (*authenticationv1.SelfSubjectReview, error) {
	t.Helper()
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c.AuthenticationV1().SelfSubjectReviews().Create(context.Background(), &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
}

func TestServerReportsTheStampedKubernetesVersion(t *testing.T) {
	t.Parallel()
	env := Get(t)
	v, err := env.Client().Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	if v.GitVersion != "v1.36.3" || v.Major != "1" || v.Minor != "36" {
		t.Errorf("server version = %s (major %q minor %q), want v1.36.3 (1, 36)", v.GitVersion, v.Major, v.Minor)
	}
}

func TestBootstrapTokenAuthenticatesAsBootstrapperUntilItsSecretIsDeleted(t *testing.T) {
	t.Parallel()
	env := Get(t)
	ctx := context.Background()
	id, secret := RandomTokenID(t)
	token := env.CreateBootstrapToken(t, id, secret, "system:bootstrappers:kubeenv-test")

	ok, user, groups, err := env.TokenAuthenticated(ctx, token)
	if err != nil {
		t.Fatal(err)
	}
	if !ok || user != "system:bootstrap:"+id {
		t.Fatalf("TokenReview: authenticated=%v user=%q, want true system:bootstrap:%s", ok, user, id)
	}
	for _, g := range []string{"system:bootstrappers", "system:bootstrappers:kubeenv-test"} {
		if !slices.Contains(groups, g) {
			t.Errorf("TokenReview groups %v lack %s", groups, g)
		}
	}
	// A real request with the token, not only the review.
	review, err := whoAmI(t, env.TokenConfig(token))
	if err != nil {
		t.Fatalf("request with the bootstrap token: %v", err)
	}
	if got := review.Status.UserInfo.Username; got != "system:bootstrap:"+id {
		t.Errorf("SelfSubjectReview user = %q, want system:bootstrap:%s", got, id)
	}

	// Delete the Secret directly (not through DeleteBootstrapToken, which
	// waits): the token must stop working well within the stock API
	// server's 10 s success cache, which this environment turns off.
	deleted := time.Now()
	if err := env.Client().CoreV1().Secrets(metav1.NamespaceSystem).Delete(ctx, "bootstrap-token-"+id, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	for {
		ok, _, _, err := env.TokenAuthenticated(ctx, token)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		if time.Since(deleted) > 2*time.Second {
			t.Fatalf("token still authenticates %v after its Secret was deleted", time.Since(deleted))
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("kubeenv: token rejected %v after its Secret was deleted", time.Since(deleted).Round(time.Millisecond))
	if _, err := whoAmI(t, env.TokenConfig(token)); !apierrors.IsUnauthorized(err) {
		t.Errorf("request with the deleted token: err = %v, want 401 Unauthorized", err)
	}
}

func TestDeleteBootstrapTokenReturnsOnceTheTokenIsRejected(t *testing.T) {
	t.Parallel()
	env := Get(t)
	id, secret := RandomTokenID(t)
	token := env.CreateBootstrapToken(t, id, secret)
	env.DeleteBootstrapToken(t, id, secret)
	if ok, _, _, err := env.TokenAuthenticated(context.Background(), token); err != nil || ok {
		t.Errorf("after DeleteBootstrapToken: authenticated=%v err=%v, want false", ok, err)
	}
}

func newCSR(t *testing.T, cn string, orgs ...string) (csrPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: cn, Organization: orgs}}, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
}

// signerChance is how long an unapproved CSR is left to a signer that
// might sign it anyway. The signer acts on the CSR's watch event, a
// loopback round trip; half a second leaves room for a loaded 2-core
// machine, and a wrongly signing signer would do it on every run, so a
// rare slow run cannot hide the bug for long.
const signerChance = 500 * time.Millisecond

func TestApprovedAPIServerClientCSRIsSignedAndItsCertificateAuthenticates(t *testing.T) {
	t.Parallel()
	env := Get(t)
	ctx := context.Background()
	name := UniqueName(t, "csr")
	cn := "kubeenv-test:" + name
	csrPEM, keyPEM := newCSR(t, cn, "kubeenv:testers")
	expiry := int32(3600)
	csrs := env.Client().CertificatesV1().CertificateSigningRequests()
	_, err := csrs.Create(ctx, &certv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: certv1.CertificateSigningRequestSpec{
			Request:           csrPEM,
			SignerName:        certv1.KubeAPIServerClientSignerName,
			ExpirationSeconds: &expiry,
			Usages:            []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageClientAuth},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { csrs.Delete(context.Background(), name, metav1.DeleteOptions{}) })

	// The signer must wait for approval: give it time to do wrong. Only a
	// quiet period can show that it did not sign.
	time.Sleep(signerChance)
	got, err := csrs.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Status.Certificate) > 0 {
		t.Fatal("CSR was signed before it was approved")
	}

	approved := time.Now()
	env.ApproveCSR(t, name)
	certPEM := env.WaitCSRCertificate(t, name, 10*time.Second)
	t.Logf("kubeenv: certificate issued %v after approval", time.Since(approved).Round(time.Millisecond))

	block, _ := pem.Decode(certPEM)
	if block == nil {
		t.Fatalf("certificate is not PEM: %q", certPEM)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if err := cert.CheckSignatureFrom(env.CACert(t)); err != nil {
		t.Errorf("certificate not signed by the cluster CA: %v", err)
	}
	if life := time.Until(cert.NotAfter); life > time.Hour+time.Minute || life < 50*time.Minute {
		t.Errorf("certificate valid for %v more, want about the requested hour", life)
	}

	review, err := whoAmI(t, env.CertConfig(certPEM, keyPEM))
	if err != nil {
		t.Fatalf("request with the issued certificate: %v", err)
	}
	if u := review.Status.UserInfo; u.Username != cn || !slices.Contains(u.Groups, "kubeenv:testers") || !slices.Contains(u.Groups, "system:authenticated") {
		t.Errorf("SelfSubjectReview = %q %v, want %q in kubeenv:testers and system:authenticated", u.Username, u.Groups, cn)
	}
}

func TestMintedClientCertificateAuthenticatesAndAnExpiredOneDoesNot(t *testing.T) {
	t.Parallel()
	env := Get(t)
	certPEM, keyPEM := env.MintClientCert(t, "system:node:kubeenv-node", "system:nodes")
	review, err := whoAmI(t, env.CertConfig(certPEM, keyPEM))
	if err != nil {
		t.Fatal(err)
	}
	if u := review.Status.UserInfo; u.Username != "system:node:kubeenv-node" || !slices.Contains(u.Groups, "system:nodes") {
		t.Errorf("SelfSubjectReview = %q %v, want system:node:kubeenv-node in system:nodes", u.Username, u.Groups)
	}

	now := time.Now()
	certPEM, keyPEM = env.MintClientCertValid(t, now.Add(-2*time.Hour), now.Add(-time.Hour), "kubeenv-expired")
	if _, err := whoAmI(t, env.CertConfig(certPEM, keyPEM)); !apierrors.IsUnauthorized(err) {
		t.Errorf("request with an expired certificate: err = %v, want 401 Unauthorized", err)
	}
}

func TestNoCredentialsIsAnonymousAndForbidden(t *testing.T) {
	t.Parallel()
	env := Get(t)
	cfg := env.TokenConfig("")
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.CoreV1().Secrets(metav1.NamespaceSystem).List(context.Background(), metav1.ListOptions{})
	if !apierrors.IsForbidden(err) {
		t.Errorf("anonymous list of kube-system Secrets: err = %v, want 403 Forbidden (RBAC)", err)
	}
}

func TestProxyPassesRequestsThroughUntilClosed(t *testing.T) {
	t.Parallel()
	env := Get(t)
	p := env.ProxyFront(t)
	cfg := p.Config(env.RESTConfig())
	cfg.Timeout = 5 * time.Second
	if _, err := whoAmI(t, cfg); err != nil {
		t.Fatalf("through the open proxy: %v", err)
	}
	p.Close()
	_, err := whoAmI(t, cfg)
	if err == nil {
		t.Fatal("request succeeded through the closed proxy")
	}
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		t.Fatalf("through the closed proxy: got an answer from the server (%v), want no connection", err)
	}
	// The open connection was cut (the request above may have failed on
	// it); a new one is refused.
	u, _ := url.Parse(p.Host())
	if c, err := net.DialTimeout("tcp", u.Host, time.Second); err == nil {
		c.Close()
		t.Error("the closed proxy still accepts connections")
	} else if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("dial the closed proxy: %v, want connection refused", err)
	}
	if _, err := whoAmI(t, cfg); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("second request through the closed proxy: err = %v, want connection refused", err)
	}
}

func TestProxyDelayHoldsEveryRequest(t *testing.T) {
	t.Parallel()
	env := Get(t)
	p := env.ProxyFront(t)
	cfg := p.Config(env.RESTConfig())
	if _, err := whoAmI(t, cfg); err != nil { // open a connection first
		t.Fatal(err)
	}
	const d = 300 * time.Millisecond
	p.SetDelay(d)
	start := time.Now()
	if _, err := whoAmI(t, cfg); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < d {
		t.Errorf("request on an open connection took %v with a %v delay", took, d)
	}

	short := p.Config(env.RESTConfig())
	short.Timeout = d / 3
	_, err := whoAmI(t, short)
	var uerr *url.Error
	if !errors.As(err, &uerr) || !uerr.Timeout() {
		t.Errorf("request with a %v timeout behind a %v delay: err = %v, want a timeout", short.Timeout, d, err)
	}

	p.SetDelay(0)
	start = time.Now()
	if _, err := whoAmI(t, cfg); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took >= d {
		t.Errorf("request took %v after the delay was removed", took)
	}
}

func TestUniqueNameIsAFreshDNSLabel(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for _, prefix := range []string{"machine", "Op_With.Odd/Chars", strings.Repeat("x", 70), ""} {
		for range 3 {
			n := UniqueName(t, prefix)
			if errs := validation.IsDNS1123Label(n); len(errs) > 0 {
				t.Errorf("UniqueName(%q) = %q: %v", prefix, n, errs)
			}
			if seen[n] {
				t.Errorf("UniqueName(%q) repeated %q", prefix, n)
			}
			seen[n] = true
		}
	}
}

func TestGetSkipsWithTheReasonWhenTheEnvironmentIsMissing(t *testing.T) {
	for _, tc := range []struct {
		name, kubeconfig, skip, required, want string
		fatal                                  bool
	}{
		{"unset", "", "", "", "run under `make test`", false},
		{"could not start", "/nonexistent/kubeconfig", "cannot build kube-testenv: boom", "system", "cannot build kube-testenv: boom", false},
		{"required", "", "cannot build kube-testenv: boom", "system,kube", "the kube tier is required", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(EnvKubeconfig, tc.kubeconfig)
			t.Setenv(EnvSkip, tc.skip)
			t.Setenv(tiers.EnvRequired, tc.required)
			t.Setenv(tiers.EnvKubeRequired, "")
			rec := &skipRecorder{TB: t}
			done := make(chan struct{})
			go func() {
				defer close(done)
				Get(rec)
			}()
			<-done
			if rec.skipped == tc.fatal || rec.fatal != tc.fatal || !strings.Contains(rec.msg, "kubeenv: ") || !strings.Contains(rec.msg, tc.want) {
				t.Errorf("Get: skipped=%v fatal=%v msg=%q, want fatal=%v with \"kubeenv: \" and %q", rec.skipped, rec.fatal, rec.msg, tc.fatal, tc.want)
			}
		})
	}
}

// skipRecorder records a skip or a fatal instead of ending the test; both
// end the calling goroutine as the testing package's do.
type skipRecorder struct {
	testing.TB
	skipped, fatal bool
	msg            string
}

func (r *skipRecorder) Skip(args ...any) {
	r.skipped, r.msg = true, strings.TrimSpace(fmt.Sprintln(args...))
	runtime.Goexit()
}

func (r *skipRecorder) Skipf(format string, args ...any) {
	r.skipped, r.msg = true, fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func (r *skipRecorder) Fatalf(format string, args ...any) {
	r.fatal, r.msg = true, fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func (r *skipRecorder) Helper() {}
