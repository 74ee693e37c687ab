package kube_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"unbounded-cloud.io/agent/lib/kube"
	"unbounded-cloud.io/agent/lib/kube/clustertest"
)

// Untrusted tells a server whose certificate the CA file does not verify
// (the real API server, with another CA configured) from one that does not
// answer (a closed loopback port) and from one that answers (the right
// CA): only the first is a trust failure.
func TestUntrustedIsTheWrongCANotAClosedPortOrAnAnswer(t *testing.T) {
	env := clustertest.Get(t)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "not-the-cluster-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	wrongCA := filepath.Join(t.TempDir(), "wrong-ca.crt")
	if err := os.WriteFile(wrongCA, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "https://" + ln.Addr().String()
	ln.Close()

	for _, tc := range []struct {
		name, server, ca string
		untrusted        bool
	}{
		{"wrong CA", env.Host(), wrongCA, true},
		{"closed port", closed, env.CAFile(), false},
		{"right CA", env.Host(), env.CAFile(), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			creds := kube.Credentials{APIServer: tc.server, CAFile: tc.ca, Timeout: 5 * time.Second,
				Certs: kube.CertStore{Dir: t.TempDir()}, Machine: "untrusted-probe"}
			c, k := env.MintClientCert(t, "unbounded-agent:untrusted-probe", nil, time.Now().Add(-time.Minute), time.Now().Add(time.Hour))
			if err := creds.Certs.Save(c, k); err != nil {
				t.Fatal(err)
			}
			cfg, _, err := creds.CertConfig(time.Now())
			if err != nil {
				t.Fatal(err)
			}
			ms, err := kube.NewMachines(cfg)
			if err != nil {
				t.Fatal(err)
			}
			_, err = ms.Get(context.Background(), "untrusted-probe")
			if err == nil {
				t.Fatal("the read succeeded; want an error of some kind")
			}
			if got := kube.Untrusted(err); got != tc.untrusted {
				t.Errorf("Untrusted(%v) = %v, want %v", err, got, tc.untrusted)
			}
		})
	}
}
