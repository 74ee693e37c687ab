// Package kube holds the agent's cluster credentials and its small typed
// client for Machines (ARCHITECTURE section 7).
//
// An agent has two credentials over its life: the bootstrap token the host
// was launched with, and later a client certificate obtained through a
// CertificateSigningRequest (see cert.go). Credentials builds REST configs
// from both; callers decide which one a request uses, because the fence
// must never switch from one to the other within one read.
package kube

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"regexp"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/rest"

	"unbounded-cloud.io/agent/lib/api/identity"
	"unbounded-cloud.io/agent/lib/config"
	"unbounded-cloud.io/agent/lib/regfile"
	"unbounded-cloud.io/agent/lib/version"
)

// ErrBootstrapTokenRejected means the API server answered 401 to a request
// authenticated with the host's bootstrap token: the token was revoked
// (its Secret deleted, typically because the allocation was fenced) or has
// expired. The caller must stop before anything destructive happens: a host
// whose token is rejected must not tear down or replace its node stack on
// the strength of a credential the cluster no longer accepts. The fence
// turns it into a final refusal (exit 77).
var ErrBootstrapTokenRejected = errors.New("the API server rejected the bootstrap token (revoked or expired)")

// ErrNoCertificate means no usable client certificate is stored: none was
// ever issued, the file is unreadable, the certificate and key do not
// match, or it has expired. The caller uses the bootstrap token instead,
// or requests a new certificate.
var ErrNoCertificate = errors.New("no usable client certificate stored")

// ErrForeignCertificate means the stored client certificate names another
// machine than this host's (a disk cloned from another host, a golden
// image that kept the PKI directory). It wraps ErrNoCertificate: the host
// never speaks as that machine; it uses its bootstrap token and requests
// a certificate of its own.
var ErrForeignCertificate = errors.New("the stored client certificate is another machine's")

// Token is a bootstrap token. It formats as "[redacted]" in every fmt verb
// and in slog, so that a log line or an error that carries it by mistake
// does not leak it.
type Token string

// String redacts the token.
func (Token) String() string { return "[redacted]" }

// GoString redacts the token in %#v.
func (Token) GoString() string { return "[redacted]" }

// LogValue redacts the token in slog output.
func (Token) LogValue() slog.Value { return slog.StringValue("[redacted]") }

// tokenRE is the Kubernetes bootstrap token format, id.secret.
var tokenRE = regexp.MustCompile(`^[a-z0-9]{6}\.[a-z0-9]{16}$`)

// maxCredentialFileSize bounds the token, CA and certificate files read
// here (through lib/regfile: a regular file, opened without blocking, so
// that a FIFO or a device in their place is an error, not a hang). It is
// lib/config's limit for the token and CA files it checks, so that a file
// `unbounded config check` accepted is read here too.
const maxCredentialFileSize = 1 << 20

// ReadToken reads a bootstrap token file (one line, "abcdef.0123456789abcdef").
// The error names the file, never the content.
func ReadToken(file string) (Token, error) {
	b, err := regfile.Read(file, maxCredentialFileSize)
	if err != nil {
		return "", fmt.Errorf("bootstrap token: %w", err)
	}
	t := strings.TrimSpace(string(b))
	if !tokenRE.MatchString(t) {
		return "", fmt.Errorf("bootstrap token file %s: not a bootstrap token (want the format [a-z0-9]{6}.[a-z0-9]{16} on one line)", file)
	}
	return Token(t), nil
}

// Credentials locate everything the agent authenticates with. All paths are
// resolved already (under the host root, see lib/hostpaths).
type Credentials struct {
	// APIServer is the https:// URL of the API server.
	APIServer string
	// CAFile is the PEM bundle that signs the API server's certificate.
	CAFile string
	// TokenFile holds the bootstrap token (mode 0600).
	TokenFile string
	// Certs is where the client certificate is stored.
	Certs CertStore
	// Machine is this host's machine: a stored certificate for any other
	// identity is not used (ErrForeignCertificate).
	Machine string
	// Timeout bounds each request (rest.Config.Timeout); 0 means 30s.
	// Watches are not bounded by it.
	Timeout time.Duration
}

func (c Credentials) base() (*rest.Config, error) {
	if c.APIServer == "" {
		return nil, errors.New("no API server configured")
	}
	ca, err := regfile.Read(c.CAFile, maxCredentialFileSize)
	if err != nil {
		return nil, fmt.Errorf("cluster CA: %w", err)
	}
	if blk, _ := pem.Decode(ca); blk == nil {
		return nil, fmt.Errorf("cluster CA file %s: no PEM block", c.CAFile)
	}
	timeout := c.Timeout
	if timeout == 0 {
		timeout = 30 * time.Second
	}
	return &rest.Config{
		Host:            c.APIServer,
		TLSClientConfig: rest.TLSClientConfig{CAData: ca},
		UserAgent:       "unbounded-agent/" + version.Version,
		Timeout:         timeout,
		// The agent makes a handful of requests; client-side throttling
		// would only add latency to the fence.
		QPS:   50,
		Burst: 100,
	}, nil
}

// BootstrapConfig is a REST config authenticated with the bootstrap token.
// rest.Config redacts BearerToken in its String and GoString, so the config
// itself is safe to print.
func (c Credentials) BootstrapConfig() (*rest.Config, error) {
	cfg, err := c.base()
	if err != nil {
		return nil, err
	}
	tok, err := ReadToken(c.TokenFile)
	if err != nil {
		return nil, err
	}
	cfg.BearerToken = string(tok)
	return cfg, nil
}

// CertConfig is a REST config authenticated with the stored client
// certificate, and that certificate (for its expiry). It returns
// ErrNoCertificate when none is usable at now.
func (c Credentials) CertConfig(now time.Time) (*rest.Config, *x509.Certificate, error) {
	pair, err := c.Certs.Load()
	if err != nil {
		return nil, nil, err
	}
	if err := CheckIdentity(pair.Cert, c.Machine); err != nil {
		return nil, pair.Cert, err
	}
	if !now.Before(pair.Cert.NotAfter) {
		return nil, pair.Cert, fmt.Errorf("%w: expired at %s", ErrNoCertificate, pair.Cert.NotAfter.UTC().Format(time.RFC3339))
	}
	cfg, err := c.base()
	if err != nil {
		return nil, nil, err
	}
	cfg.CertData = pair.CertPEM
	cfg.KeyData = pair.KeyPEM
	return cfg, pair.Cert, nil
}

// CheckIdentity returns an error wrapping ErrForeignCertificate (and
// ErrNoCertificate) unless cert is machine's agent identity
// (CN=unbounded-agent:<machine>, what CertManager requests).
func CheckIdentity(cert *x509.Certificate, machine string) error {
	want := identity.AgentUserName(machine)
	if machine != "" && cert.Subject.CommonName == want {
		return nil
	}
	return fmt.Errorf("%w: %w: it names %q, this host is %q (want CN=%s); a disk or image copied from another host keeps its PKI directory",
		ErrNoCertificate, ErrForeignCertificate, cert.Subject.CommonName, machine, want)
}

// CredentialsFor are the credentials the configuration cfg names, with
// the client certificate stored in pkiDir (hostpaths.Paths.PKIDir).
func CredentialsFor(cfg *config.Config, pkiDir string) Credentials {
	return Credentials{
		APIServer: cfg.Cluster.APIServer,
		CAFile:    cfg.Resolve(cfg.Cluster.CAFile),
		TokenFile: cfg.Resolve(cfg.Cluster.BootstrapTokenFile),
		Certs:     CertStore{Dir: pkiDir},
		Machine:   cfg.Machine,
	}
}

// TokenRejected turns a 401 from a request made with the bootstrap token
// into ErrBootstrapTokenRejected (other errors pass unchanged). Only call it
// on errors of requests that used the token: a 401 for a certificate means
// something else.
func TokenRejected(err error) error {
	if err != nil && apierrors.IsUnauthorized(err) {
		return fmt.Errorf("%w: %w", ErrBootstrapTokenRejected, err)
	}
	return err
}

// Untrusted reports whether err is a TLS trust failure: the server's
// certificate does not verify against the cluster CA (signed by another
// authority, issued for another name, expired). It is not "no answer": a
// retry meets the same certificate, and the operator has to fix the CA
// file (or find out who is answering in the API server's place). NoAnswer
// is true for it too (it is not an API status); callers that tell the two
// apart ask Untrusted first.
func Untrusted(err error) bool {
	if err == nil {
		return false
	}
	var (
		verify   *tls.CertificateVerificationError
		unknown  x509.UnknownAuthorityError
		hostname x509.HostnameError
		invalid  x509.CertificateInvalidError
	)
	return errors.As(err, &verify) || errors.As(err, &unknown) || errors.As(err, &hostname) || errors.As(err, &invalid)
}

// NoAnswer reports whether err means the cluster gave no decision: the
// connection failed or timed out, or the server was overloaded or broken
// (5xx, 429). Such a read may be retried; any other answer (401, 403, 404,
// a decoded object) is the cluster's decision.
func NoAnswer(err error) bool {
	if err == nil {
		return false
	}
	var st apierrors.APIStatus
	if errors.As(err, &st) {
		code := int(st.Status().Code)
		switch {
		case code == http.StatusTooManyRequests, code >= 500:
			return true
		case apierrors.IsTimeout(err), apierrors.IsServerTimeout(err):
			return true
		case code == 0:
			// A Status without a code comes from a client-side failure
			// wrapped as a Status; treat it as no answer.
			return true
		default:
			return false
		}
	}
	// Everything that is not an API status is transport: refused, reset,
	// TLS handshake cut short, context deadline, DNS.
	return true
}
