package kubeenv

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"k8s.io/client-go/util/retry"
	"net"
	"testing"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// The test control plane approves a kubelet's serving CSR
// (kubernetes.io/kubelet-serving) as a cluster's approver does: only from
// the node itself, for the node's own names and addresses. Approved ones
// are signed by the cluster CA; the others are denied with the reason.
func TestKubeletServingCSRIsApprovedOnlyForTheNodesOwnAddresses(t *testing.T) {
	t.Parallel()
	env := Get(t)
	ctx := context.Background()
	c := env.Client()

	node := testNode(t, env, "node", nil)
	asNode := func(user string) kubernetes.Interface {
		certPEM, keyPEM := env.MintClientCert(t, user, "system:nodes")
		k, err := kubernetes.NewForConfig(env.CertConfig(certPEM, keyPEM))
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	theNode := asNode("system:node:" + node)
	otherNode := asNode("system:node:" + UniqueName(t, "other"))

	for _, tc := range []struct {
		name    string
		as      kubernetes.Interface
		dns     []string
		ips     []string
		approve bool
	}{
		{"own names", theNode, []string{node}, []string{"192.0.2.10"}, true},
		{"a foreign IP", theNode, []string{node}, []string{"192.0.2.99"}, false},
		{"a foreign name", theNode, []string{"kubernetes.default"}, []string{"192.0.2.10"}, false},
		{"another node asking", otherNode, []string{node}, []string{"192.0.2.10"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
			if err != nil {
				t.Fatal(err)
			}
			tmpl := &x509.CertificateRequest{Subject: pkix.Name{CommonName: "system:node:" + node, Organization: []string{"system:nodes"}}, DNSNames: tc.dns}
			for _, ip := range tc.ips {
				tmpl.IPAddresses = append(tmpl.IPAddresses, net.ParseIP(ip))
			}
			der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
			if err != nil {
				t.Fatal(err)
			}
			name := UniqueName(t, "serving")
			csr := &certv1.CertificateSigningRequest{
				ObjectMeta: metav1.ObjectMeta{Name: name},
				Spec: certv1.CertificateSigningRequestSpec{
					Request:    pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}),
					SignerName: certv1.KubeletServingSignerName,
					Usages:     []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageServerAuth},
				},
			}
			if _, err := tc.as.CertificatesV1().CertificateSigningRequests().Create(ctx, csr, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				c.CertificatesV1().CertificateSigningRequests().Delete(context.Background(), name, metav1.DeleteOptions{})
			})
			// Denials wait for the Node's addresses for up to 10 s first.
			var got *certv1.CertificateSigningRequest
			poll(t, 30*time.Second, "a decision on "+name, func(ctx context.Context) (bool, error) {
				got, err = c.CertificatesV1().CertificateSigningRequests().Get(ctx, name, metav1.GetOptions{})
				if err != nil {
					return false, nil
				}
				for _, cond := range got.Status.Conditions {
					if cond.Type == certv1.CertificateDenied {
						return true, nil
					}
				}
				return len(got.Status.Certificate) > 0, nil
			})
			signed := len(got.Status.Certificate) > 0
			if signed != tc.approve {
				t.Fatalf("signed %v, want %v; conditions %+v", signed, tc.approve, got.Status.Conditions)
			}
			if !signed {
				t.Logf("denied: %+v", got.Status.Conditions)
				return
			}
			b, _ := pem.Decode(got.Status.Certificate)
			cert, err := x509.ParseCertificate(b.Bytes)
			if err != nil {
				t.Fatal(err)
			}
			if err := cert.CheckSignatureFrom(env.CACert(t)); err != nil {
				t.Errorf("the serving certificate is not the cluster CA's: %v", err)
			}
		})
	}
}

// testNode creates a Node named after prefix (UniqueName), deleted when
// the test ends, with the Hostname address its name and the InternalIP
// 192.0.2.10, and edit applied to its status; it returns its name.
func testNode(t *testing.T, env *Env, prefix string, edit func(*corev1.Node)) string {
	t.Helper()
	ctx := context.Background()
	c := env.Client()
	node := UniqueName(t, prefix)
	if _, err := c.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.CoreV1().Nodes().Delete(context.Background(), node, metav1.DeleteOptions{}) })
	// The node lifecycle controller writes the new Node's status too
	// (taints, conditions): retry on its conflicts with the latest copy.
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := c.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		n.Status.Addresses = []corev1.NodeAddress{
			{Type: corev1.NodeHostName, Address: node},
			{Type: corev1.NodeInternalIP, Address: "192.0.2.10"},
		}
		if edit != nil {
			edit(n)
		}
		_, err = c.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return node
}
