package kube

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"

	"unbounded-cloud.io/agent/lib/api/identity"
	"unbounded-cloud.io/agent/lib/regfile"
	"unbounded-cloud.io/agent/lib/state"
)

// CertFileName is the file under the PKI directory that holds the daemon's
// client certificate and its private key together. One file, written
// atomically, so that a power cut can never leave a new key beside an old
// certificate (kubelet's kubelet-client-current.pem does the same).
const CertFileName = "agent-client.pem"

// CertStore is where the client certificate lives: Dir is the PKI
// directory (hostpaths.Paths.PKIDir()).
type CertStore struct {
	Dir string
}

// Path is the certificate-and-key file.
func (s CertStore) Path() string { return filepath.Join(s.Dir, CertFileName) }

// CertPair is a stored certificate with its key.
type CertPair struct {
	Cert    *x509.Certificate
	CertPEM []byte
	KeyPEM  []byte
}

// Load reads the stored certificate and key. Any problem (missing,
// unreadable, not PEM, certificate and key that do not belong together) is
// ErrNoCertificate with the detail; expiry is the caller's business.
func (s CertStore) Load() (*CertPair, error) {
	data, err := regfile.Read(s.Path(), maxCredentialFileSize)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoCertificate, err)
	}
	var certPEM, keyPEM bytes.Buffer
	for rest := data; ; {
		var blk *pem.Block
		blk, rest = pem.Decode(rest)
		if blk == nil {
			break
		}
		switch blk.Type {
		case "CERTIFICATE":
			pem.Encode(&certPEM, blk)
		case "EC PRIVATE KEY", "PRIVATE KEY":
			pem.Encode(&keyPEM, blk)
		}
	}
	// X509KeyPair checks that the key belongs to the certificate.
	pair, err := tls.X509KeyPair(certPEM.Bytes(), keyPEM.Bytes())
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrNoCertificate, s.Path(), err)
	}
	return &CertPair{Cert: pair.Leaf, CertPEM: certPEM.Bytes(), KeyPEM: keyPEM.Bytes()}, nil
}

// Save stores a certificate and its key, atomically, mode 0600 (the key is
// a secret).
func (s CertStore) Save(certPEM, keyPEM []byte) error {
	if _, err := tls.X509KeyPair(certPEM, keyPEM); err != nil {
		return fmt.Errorf("refusing to store a certificate that does not match its key: %w", err)
	}
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		return err
	}
	data := append(append([]byte{}, certPEM...), keyPEM...)
	return state.WriteFileAtomic(s.Path(), data, 0o600)
}

// RenewAt is the point of a certificate's life after which it is renewed:
// 80 % of the way from NotBefore to NotAfter, the same rule as the kubelet's
// (which picks a jittered point between 70 and 90 %). Renewing early leaves
// the other 20 % for a cluster whose approver is slow or down.
func RenewAt(c *x509.Certificate) time.Time {
	life := c.NotAfter.Sub(c.NotBefore)
	return c.NotBefore.Add(life * 8 / 10)
}

// CertManager obtains and renews the agent's client certificate.
type CertManager struct {
	Store CertStore
	// Machine is the Machine name; the certificate's CommonName is
	// identity.AgentUserName(Machine), its Organization identity.AgentGroup.
	Machine string
	// Wait bounds the wait for approval and issuance; 0 means 15 minutes.
	Wait time.Duration
	// Duration is the lifetime asked for (spec.expirationSeconds); 0 leaves
	// it to the signer.
	Duration time.Duration
	// Now is the time source; nil means time.Now.
	Now func() time.Time
	// Rand is the key generator's randomness; nil means crypto/rand.
	Rand io.Reader
	Log  *slog.Logger
}

func (m CertManager) now() time.Time {
	if m.Now != nil {
		return m.Now()
	}
	return time.Now()
}

// EnsureConfig returns a usable certificate: the stored one while it is
// before its renewal point, else a new one requested with the credential
// of cfg (the bootstrap token's, or the current certificate's while it is
// still valid). A stored certificate that is expired, unreadable or does
// not match its key is replaced by a new CSR.
//
// It talks to the API server through a REST client over this package's
// own small scheme, not a clientset: a clientset registers every built-in
// API type (client-go/kubernetes/scheme), which would double the size of
// the executable (`make bench`, "binary sizes", shows it as it is).
func (m CertManager) EnsureConfig(ctx context.Context, cfg *rest.Config) (*CertPair, error) {
	rc, err := groupClient(cfg, certificatesv1.SchemeGroupVersion)
	if err != nil {
		return nil, err
	}
	return m.ensure(ctx, rc)
}

func (m CertManager) ensure(ctx context.Context, rc rest.Interface) (*CertPair, error) {
	pair, err := m.Store.Load()
	if err == nil {
		// Another machine's certificate (a cloned disk) is never kept:
		// this host requests its own.
		err = CheckIdentity(pair.Cert, m.Machine)
	}
	switch {
	case err != nil:
		m.log().Info("requesting a client certificate", "reason", err.Error())
	case !m.now().Before(pair.Cert.NotAfter):
		m.log().Info("requesting a client certificate", "reason", "stored certificate expired", "notAfter", pair.Cert.NotAfter)
	case !m.now().Before(RenewAt(pair.Cert)):
		m.log().Info("renewing the client certificate", "renewAt", RenewAt(pair.Cert), "notAfter", pair.Cert.NotAfter)
	default:
		return pair, nil
	}
	return m.request(ctx, rc)
}

func (m CertManager) log() *slog.Logger {
	if m.Log != nil {
		return m.Log
	}
	return slog.Default()
}

// request generates a new ECDSA P-256 key on the host, sends a CSR for the
// kubernetes.io/kube-apiserver-client signer, waits (with a watch) until the
// cluster approves it and the signer issues the certificate, and stores
// both. The key never leaves the host; it reaches the disk only together
// with its certificate.
func (m CertManager) request(ctx context.Context, rc rest.Interface) (*CertPair, error) {
	if err := identity.ValidateMachineName(m.Machine); err != nil {
		return nil, err
	}
	rnd := m.Rand
	if rnd == nil {
		rnd = rand.Reader
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rnd)
	if err != nil {
		return nil, fmt.Errorf("generate key: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
	csrDER, err := x509.CreateCertificateRequest(rnd, &x509.CertificateRequest{Subject: pkix.Name{
		CommonName:   identity.AgentUserName(m.Machine),
		Organization: []string{identity.AgentGroup},
	}}, key)
	if err != nil {
		return nil, fmt.Errorf("make CSR: %w", err)
	}
	csrPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: csrDER})
	// The name is derived from the public key: a retry with the same key
	// finds its own CSR instead of piling up new ones.
	pub, _ := x509.MarshalPKIXPublicKey(key.Public())
	sum := sha256.Sum256(pub)
	name := "unbounded-agent-" + m.Machine + "-" + hex.EncodeToString(sum[:6])
	wait := m.Wait
	if wait == 0 {
		wait = 15 * time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	obj := &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: certificatesv1.CertificateSigningRequestSpec{
			Request:    csrPEM,
			SignerName: identity.AgentSignerName,
			Usages:     []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth},
		},
	}
	if m.Duration > 0 {
		secs := expirationSeconds(m.Duration)
		obj.Spec.ExpirationSeconds = &secs
	}
	created, err := createCSR(ctx, rc, obj)
	if err != nil {
		return nil, fmt.Errorf("create CSR %s: %w", name, err)
	}
	m.log().Info("CSR created; waiting for approval and issuance", "csr", name, "wait", wait)
	certPEM, err := waitForCertificate(ctx, rc, created)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("CSR %s: not approved and issued within %s: %w", name, wait, err)
		}
		return nil, fmt.Errorf("CSR %s: %w", name, err)
	}
	issued, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("CSR %s: issued certificate does not match the key: %w", name, err)
	}
	if cn := issued.Leaf.Subject.CommonName; cn != identity.AgentUserName(m.Machine) {
		return nil, fmt.Errorf("CSR %s: issued certificate is for %q, not %q", name, cn, identity.AgentUserName(m.Machine))
	}
	if err := m.Store.Save(certPEM, keyPEM); err != nil {
		return nil, fmt.Errorf("store certificate: %w", err)
	}
	pair := &CertPair{Cert: issued.Leaf, CertPEM: certPEM, KeyPEM: keyPEM}
	m.log().Info("client certificate stored", "csr", name, "notAfter", pair.Cert.NotAfter, "renewAt", RenewAt(pair.Cert))
	return pair, nil
}

const csrResource = "certificatesigningrequests"

// createCSR creates obj, or finds the CSR of an earlier try with the same
// name and the same request (same key: the name derives from it).
func createCSR(ctx context.Context, rc rest.Interface, obj *certificatesv1.CertificateSigningRequest) (*certificatesv1.CertificateSigningRequest, error) {
	out := &certificatesv1.CertificateSigningRequest{}
	err := rc.Post().Resource(csrResource).Body(obj).Do(ctx).Into(out)
	if !apierrors.IsAlreadyExists(err) {
		return out, err
	}
	if err := rc.Get().Resource(csrResource).Name(obj.Name).Do(ctx).Into(out); err != nil {
		return nil, err
	}
	if !bytes.Equal(out.Spec.Request, obj.Spec.Request) {
		return nil, fmt.Errorf("a different CSR named %s exists", obj.Name)
	}
	return out, nil
}

// waitForCertificate watches the CSR (field selector on its name) until it
// is approved and carries a certificate, is denied or failed, or ctx ends.
// A watch that closes is resumed after a fresh read.
func waitForCertificate(ctx context.Context, rc rest.Interface, cur *certificatesv1.CertificateSigningRequest) ([]byte, error) {
	uid := cur.UID
	for {
		if cert, err := issuedCertificate(cur); cert != nil || err != nil {
			return cert, err
		}
		opts := metav1.ListOptions{
			FieldSelector:   fields.OneTermEqualSelector("metadata.name", cur.Name).String(),
			ResourceVersion: cur.ResourceVersion,
			Watch:           true,
		}
		w, err := rc.Get().Resource(csrResource).VersionedParams(&opts, parameterCodec).Watch(ctx)
		if err == nil {
			for ev := range w.ResultChan() {
				got, ok := ev.Object.(*certificatesv1.CertificateSigningRequest)
				if !ok {
					break // an error event (for example a too old resourceVersion): read again
				}
				if ev.Type == watch.Deleted {
					w.Stop()
					return nil, errors.New("the CSR was deleted before a certificate was issued")
				}
				cur = got
				if cert, err := issuedCertificate(cur); cert != nil || err != nil {
					w.Stop()
					return cert, err
				}
			}
			w.Stop()
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Second):
		}
		fresh := &certificatesv1.CertificateSigningRequest{}
		if err := rc.Get().Resource(csrResource).Name(cur.Name).Do(ctx).Into(fresh); err != nil {
			if apierrors.IsNotFound(err) {
				return nil, errors.New("the CSR was deleted before a certificate was issued")
			}
			continue
		}
		if fresh.UID != uid {
			return nil, errors.New("the CSR was replaced by another one of the same name")
		}
		cur = fresh
	}
}

// issuedCertificate is the certificate of an approved and signed CSR, an
// error for a denied or failed one, and nothing while it waits.
func issuedCertificate(c *certificatesv1.CertificateSigningRequest) ([]byte, error) {
	approved := false
	for _, cond := range c.Status.Conditions {
		switch cond.Type {
		case certificatesv1.CertificateDenied:
			return nil, fmt.Errorf("denied: %s: %s", cond.Reason, cond.Message)
		case certificatesv1.CertificateFailed:
			return nil, fmt.Errorf("signing failed: %s: %s", cond.Reason, cond.Message)
		case certificatesv1.CertificateApproved:
			approved = true
		}
	}
	if approved && len(c.Status.Certificate) > 0 {
		return c.Status.Certificate, nil
	}
	return nil, nil
}

// expirationSeconds is d in whole seconds for spec.expirationSeconds, an
// int32: a lifetime beyond math.MaxInt32 seconds (about 68 years) asks for
// the longest the field can carry instead of wrapping around to a negative
// or short one. The signer caps the lifetime anyway; what it must never see
// is a request shorter than the operator configured.
func expirationSeconds(d time.Duration) int32 {
	if s := d / time.Second; s < math.MaxInt32 {
		return int32(s)
	}
	return math.MaxInt32
}
