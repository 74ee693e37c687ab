package kube

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// selfSigned returns a PEM certificate and key valid from notBefore to
// notAfter (for the store's own checks, no cluster involved).
func selfSigned(t *testing.T, cn string, notBefore, notAfter time.Time) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    notBefore,
		NotAfter:     notAfter,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	kd, _ := x509.MarshalECPrivateKey(key)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kd})
}

func TestCertStoreSavesKeyAndCertificateTogetherMode0600(t *testing.T) {
	s := CertStore{Dir: filepath.Join(t.TempDir(), "pki")}
	now := time.Now()
	c, k := selfSigned(t, "unbounded-agent:w1", now.Add(-time.Hour), now.Add(time.Hour))
	if err := s.Save(c, k); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(s.Path())
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want 0600: the file holds the private key", fi.Mode().Perm())
	}
	pair, err := s.Load()
	if err != nil {
		t.Fatal(err)
	}
	if pair.Cert.Subject.CommonName != "unbounded-agent:w1" {
		t.Errorf("loaded CN %q", pair.Cert.Subject.CommonName)
	}
	if string(pair.KeyPEM) != string(k) {
		t.Error("key did not round-trip")
	}
}

func TestCertStoreRefusesToSaveAMismatchedPair(t *testing.T) {
	s := CertStore{Dir: t.TempDir()}
	now := time.Now()
	c, _ := selfSigned(t, "a", now, now.Add(time.Hour))
	_, k := selfSigned(t, "b", now, now.Add(time.Hour))
	if err := s.Save(c, k); err == nil {
		t.Fatal("a certificate with another key's private key was stored")
	}
	if _, err := os.Stat(s.Path()); !os.IsNotExist(err) {
		t.Errorf("file written after a refused save: %v", err)
	}
}

func TestCertStoreLoadReportsNoCertificateForMissingCorruptAndMismatched(t *testing.T) {
	now := time.Now()
	c1, _ := selfSigned(t, "a", now, now.Add(time.Hour))
	_, k2 := selfSigned(t, "b", now, now.Add(time.Hour))
	for name, content := range map[string][]byte{
		"missing":    nil,
		"garbage":    []byte("not pem at all\n"),
		"only cert":  c1,
		"mismatched": append(append([]byte{}, c1...), k2...),
	} {
		t.Run(name, func(t *testing.T) {
			s := CertStore{Dir: t.TempDir()}
			if content != nil {
				os.WriteFile(s.Path(), content, 0o600)
			}
			_, err := s.Load()
			if !errors.Is(err, ErrNoCertificate) {
				t.Fatalf("Load: %v, want ErrNoCertificate", err)
			}
		})
	}
}

func TestRenewAtIsEightyPercentOfTheLifetime(t *testing.T) {
	nb := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	c := &x509.Certificate{NotBefore: nb, NotAfter: nb.Add(100 * time.Hour)}
	if got, want := RenewAt(c), nb.Add(80*time.Hour); !got.Equal(want) {
		t.Errorf("RenewAt = %v, want %v", got, want)
	}
}

func TestCertConfigRejectsAnExpiredCertificate(t *testing.T) {
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.crt")
	caPEM, _ := selfSigned(t, "ca", time.Now(), time.Now().Add(time.Hour))
	os.WriteFile(ca, caPEM, 0o644)
	s := CertStore{Dir: filepath.Join(dir, "pki")}
	now := time.Now()
	c, k := selfSigned(t, "unbounded-agent:w1", now.Add(-2*time.Hour), now.Add(-time.Minute))
	if err := s.Save(c, k); err != nil {
		t.Fatal(err)
	}
	cr := Credentials{APIServer: "https://127.0.0.1:1", CAFile: ca, Certs: s, Machine: "w1"}
	if _, _, err := cr.CertConfig(now); !errors.Is(err, ErrNoCertificate) {
		t.Fatalf("CertConfig with an expired certificate: %v, want ErrNoCertificate", err)
	}
	if cfg, _, err := cr.CertConfig(now.Add(-time.Hour)); err != nil || len(cfg.CertData) == 0 {
		t.Fatalf("CertConfig an hour earlier (certificate valid): %v", err)
	}
}

func TestTokenNeverPrints(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "token")
	const secret = "abcdef.0123456789abcdef"
	os.WriteFile(f, []byte(secret+"\n"), 0o600)
	tok, err := ReadToken(f)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{fmt.Sprint(tok), fmt.Sprintf("%v %s %#v", tok, tok, tok)} {
		if strings.Contains(s, "0123456789abcdef") {
			t.Errorf("token printed: %q", s)
		}
	}
	ca := filepath.Join(dir, "ca.crt")
	caPEM, _ := selfSigned(t, "ca", time.Now(), time.Now().Add(time.Hour))
	os.WriteFile(ca, caPEM, 0o644)
	cfg, err := Credentials{APIServer: "https://127.0.0.1:1", CAFile: ca, TokenFile: f}.BootstrapConfig()
	if err != nil {
		t.Fatal(err)
	}
	if s := fmt.Sprintf("%v %+v %#v", cfg, cfg, cfg); strings.Contains(s, "0123456789abcdef") {
		t.Errorf("rest.Config printed the token: %s", s)
	}
	os.WriteFile(f, []byte("not-a-token-but-a-secret\n"), 0o600)
	if _, err := ReadToken(f); err == nil || strings.Contains(err.Error(), "not-a-token-but-a-secret") {
		t.Errorf("malformed token: err %v (must fail without quoting the file)", err)
	}
}

// Another machine's certificate (a cloned disk) is never used, whatever
// its validity: CertConfig says so, as "no certificate" too, so that the
// callers fall back to the token.
func TestCertConfigRefusesAnotherMachinesCertificate(t *testing.T) {
	dir := t.TempDir()
	s := CertStore{Dir: filepath.Join(dir, "pki")}
	ca := filepath.Join(dir, "ca.crt")
	now := time.Now()
	c, k := selfSigned(t, "unbounded-agent:w1", now.Add(-time.Hour), now.Add(time.Hour))
	os.WriteFile(ca, c, 0o644)
	if err := s.Save(c, k); err != nil {
		t.Fatal(err)
	}
	for _, machine := range []string{"w2", ""} {
		cr := Credentials{APIServer: "https://127.0.0.1:1", CAFile: ca, Certs: s, Machine: machine}
		_, _, err := cr.CertConfig(now)
		if !errors.Is(err, ErrForeignCertificate) || !errors.Is(err, ErrNoCertificate) {
			t.Errorf("machine %q: CertConfig of w1's certificate: %v, want ErrForeignCertificate and ErrNoCertificate", machine, err)
		}
	}
	cr := Credentials{APIServer: "https://127.0.0.1:1", CAFile: ca, Certs: s, Machine: "w1"}
	if _, _, err := cr.CertConfig(now); err != nil {
		t.Errorf("w1's own certificate: %v", err)
	}
}
