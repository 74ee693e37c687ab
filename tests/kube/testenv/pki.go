package testenv

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// pki holds the credentials one environment is started with. All of them are
// generated fresh at every start: the environment is disposable, and a CA
// that lives only as long as the test run cannot leak into anything else.
type pki struct {
	caCert *x509.Certificate
	caKey  *ecdsa.PrivateKey
	// caCertPEM and caKeyPEM are what ca.crt and ca.key hold.
	caCertPEM, caKeyPEM []byte
	// serving is the API server's TLS certificate, signed by the CA so that
	// one ca.crt serves both as the client's trust root and as the
	// --client-ca-file (the same single-CA layout as a kubeadm cluster).
	servingCertPEM, servingKeyPEM []byte
	// saKeyPEM signs and verifies service account tokens.
	saKeyPEM []byte
	// adminToken authenticates as a member of system:masters through the
	// static token file.
	adminToken string
}

func newPKI(host string) (*pki, error) {
	p := &pki{}
	var err error
	if p.caKey, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
		return nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "unbounded-test-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, p.caKey.Public(), p.caKey)
	if err != nil {
		return nil, fmt.Errorf("self-sign CA: %w", err)
	}
	if p.caCert, err = x509.ParseCertificate(caDER); err != nil {
		return nil, err
	}
	p.caCertPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	if p.caKeyPEM, err = ecKeyPEM(p.caKey); err != nil {
		return nil, err
	}

	servingKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	servingTmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: "kube-apiserver"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
		// And the `kubernetes` Service's ClusterIP (the first address of
		// --service-cluster-ip-range), as a cluster's API server has it:
		// pods reach it there (a test's stand-in for kube-proxy).
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback, net.IPv4(10, 96, 0, 1)},
	}
	if ip := net.ParseIP(host); ip != nil && !ip.IsLoopback() {
		servingTmpl.IPAddresses = append(servingTmpl.IPAddresses, ip)
	}
	servingDER, err := x509.CreateCertificate(rand.Reader, servingTmpl, p.caCert, servingKey.Public(), p.caKey)
	if err != nil {
		return nil, fmt.Errorf("sign serving certificate: %w", err)
	}
	p.servingCertPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: servingDER})
	if p.servingKeyPEM, err = ecKeyPEM(servingKey); err != nil {
		return nil, err
	}

	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	if p.saKeyPEM, err = ecKeyPEM(saKey); err != nil {
		return nil, err
	}

	tok := make([]byte, 32)
	if _, err := rand.Read(tok); err != nil {
		return nil, err
	}
	p.adminToken = hex.EncodeToString(tok)
	return p, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return n.Add(n, big.NewInt(1))
}

func ecKeyPEM(k crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalECPrivateKey(k.(*ecdsa.PrivateKey))
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
}

// writeFileAtomic writes through a temporary file and a rename, so a reader
// (a test polling for the kubeconfig, say) never sees half a file.
func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
