package testenv

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
)

// The API server's path to kubelets (kubectl logs, exec, port-forward,
// metrics): as in a kubeadm cluster, the API server authenticates to each
// kubelet with a client certificate of the cluster CA
// (--kubelet-client-certificate, CN kube-apiserver-kubelet-client, bound to
// system:kubelet-api-admin) and verifies the kubelet's serving certificate
// against the cluster CA (--kubelet-certificate-authority). Kubelets get
// that certificate through a kubernetes.io/kubelet-serving CSR, which
// kube-controller-manager signs but never approves: approveKubeletServing
// approves it as a cluster's approver would.
//
// Test nodes live in network namespaces of their own, several with the
// same address (192.0.2.10), which the API server's network cannot reach.
// So the API server dials kubelets by the Node's Hostname address first,
// through an HTTP CONNECT proxy on a unix socket (its egress selector's
// "cluster" network): for "NAME:PORT" the proxy connects to the unix
// socket KubeletsDir/NAME.sock when a test has published one there (a
// socket that leads into that node's namespace), and otherwise to the
// Node's InternalIP (kubelets in this host's own network), or to the
// address as given.

// KubeletsDir is the directory under the environment's directory where
// tests publish a unix socket per node: NAME.sock reaches node NAME's
// kubelet port.
const KubeletsDir = "kubelets"

// kubeletClientUser is the API server's identity towards kubelets.
const kubeletClientUser = "kube-apiserver-kubelet-client"

// kubeletClientCert signs the API server's client certificate for kubelets.
func (p *pki) kubeletClientCert() (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: kubeletClientUser},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.caCert, key.Public(), p.caKey)
	if err != nil {
		return nil, nil, fmt.Errorf("sign kubelet client certificate: %w", err)
	}
	keyPEM, err = ecKeyPEM(key)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), keyPEM, err
}

// egressConfig is the API server's EgressSelectorConfiguration: the
// "cluster" network (kubelets, and pods and services it proxies to) goes
// through the CONNECT proxy on sock.
func egressConfig(sock string) []byte {
	return fmt.Appendf(nil, `apiVersion: apiserver.k8s.io/v1beta1
kind: EgressSelectorConfiguration
egressSelections:
- name: cluster
  connection:
    proxyProtocol: HTTPConnect
    transport:
      uds:
        udsName: %s
`, sock)
}

// kubeletProxy is the CONNECT proxy of the "cluster" network.
type kubeletProxy struct {
	dir    string // where NAME.sock files are published
	client kubernetes.Interface
	log    *slog.Logger
}

// serve accepts connections on ln until it is closed.
func (k *kubeletProxy) serve(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go k.handle(c)
	}
}

func (k *kubeletProxy) handle(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	req, err := http.ReadRequest(br)
	if err != nil {
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	if req.Method != http.MethodConnect {
		fmt.Fprintf(c, "HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")
		return
	}
	target := req.Host
	up, err := k.dial(target)
	if err != nil {
		k.log.Warn("cluster network: cannot connect", "target", target, "err", err)
		fmt.Fprintf(c, "HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain\r\n\r\n%v\n", err)
		return
	}
	defer up.Close()
	if _, err := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	done := make(chan struct{}, 2)
	go func() {
		// What the client sent after its request (nothing, normally).
		if n := br.Buffered(); n > 0 {
			b, _ := br.Peek(n)
			_, _ = up.Write(b)
		}
		_, _ = io.Copy(up, c)
		if cw, ok := up.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		}
		done <- struct{}{}
	}()
	go func() {
		_, _ = io.Copy(c, up)
		if cw, ok := c.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		}
		done <- struct{}{}
	}()
	<-done
	<-done
}

// dial connects to target ("HOST:PORT"): a published node socket, the
// Node's InternalIP, or the address itself.
func (k *kubeletProxy) dial(target string) (net.Conn, error) {
	host, port, err := net.SplitHostPort(target)
	if err != nil {
		return nil, err
	}
	if net.ParseIP(host) == nil && !strings.ContainsAny(host, "/") {
		// The published name is a symlink to the socket: dial the socket's
		// own (short) path, not one under a possibly long directory.
		if sock, err := filepath.EvalSymlinks(filepath.Join(k.dir, host+".sock")); err == nil {
			return net.DialTimeout("unix", sock, 10*time.Second)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if n, err := k.client.CoreV1().Nodes().Get(ctx, host, metav1.GetOptions{}); err == nil {
			for _, a := range n.Status.Addresses {
				if a.Type == corev1.NodeInternalIP {
					return net.DialTimeout("tcp", net.JoinHostPort(a.Address, port), 10*time.Second)
				}
			}
		}
	}
	return net.DialTimeout("tcp", target, 10*time.Second)
}

// bindKubeletClient lets the API server's kubelet client identity use every
// kubelet API (kubeadm binds its apiserver-kubelet-client the same way).
func bindKubeletClient(ctx context.Context, client kubernetes.Interface) error {
	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "kube-testenv:apiserver-kubelet-client"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:kubelet-api-admin"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: kubeletClientUser}},
	}
	_, err := client.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		err = nil
	}
	return err
}

// approveKubeletServing approves kubernetes.io/kubelet-serving CSRs until
// ctx is done, as a cluster's approver does: the requester is the node
// (user system:node:NAME in group system:nodes), the subject is that node
// (CN system:node:NAME, O system:nodes), the usages are a server's, and
// every name in the request is one of Node NAME's addresses. Anything else
// is denied, with the reason.
func approveKubeletServing(ctx context.Context, client kubernetes.Interface, log *slog.Logger) {
	sel := fields.OneTermEqualSelector("spec.signerName", certificatesv1.KubeletServingSignerName).String()
	for ctx.Err() == nil {
		w, err := client.CertificatesV1().CertificateSigningRequests().Watch(ctx, metav1.ListOptions{FieldSelector: sel})
		if err != nil {
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
			continue
		}
		for ev := range w.ResultChan() {
			if ev.Type != watch.Added && ev.Type != watch.Modified {
				continue
			}
			csr, ok := ev.Object.(*certificatesv1.CertificateSigningRequest)
			if !ok || decided(csr) {
				continue
			}
			// The Node's addresses may lag its kubelet's first CSR by a
			// moment; a request whose names are not (yet) the Node's is
			// looked at again for a while before it is denied.
			go decideKubeletServing(ctx, client, log, csr)
		}
		w.Stop()
	}
}

func decided(csr *certificatesv1.CertificateSigningRequest) bool {
	for _, c := range csr.Status.Conditions {
		if c.Type == certificatesv1.CertificateApproved || c.Type == certificatesv1.CertificateDenied {
			return true
		}
	}
	return false
}

func decideKubeletServing(ctx context.Context, client kubernetes.Interface, log *slog.Logger, csr *certificatesv1.CertificateSigningRequest) {
	var why string
	for try := 0; try < 20; try++ {
		if why = checkKubeletServing(ctx, client, csr); why == "" {
			break
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(500 * time.Millisecond):
		}
	}
	cond := certificatesv1.CertificateSigningRequestCondition{
		Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue,
		Reason: "KubeTestenvApprove", Message: "kube-testenv: the requesting node's own names and addresses",
	}
	if why != "" {
		cond.Type, cond.Reason, cond.Message = certificatesv1.CertificateDenied, "KubeTestenvDeny", "kube-testenv: "+why
		log.Warn("kubelet serving CSR denied", "csr", csr.Name, "why", why)
	}
	cur, err := client.CertificatesV1().CertificateSigningRequests().Get(ctx, csr.Name, metav1.GetOptions{})
	if err != nil || decided(cur) {
		return
	}
	cur.Status.Conditions = append(cur.Status.Conditions, cond)
	if _, err := client.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, cur.Name, cur, metav1.UpdateOptions{}); err != nil {
		log.Warn("kubelet serving CSR: approval not recorded", "csr", csr.Name, "err", err)
	}
}

// checkKubeletServing says why csr must not be approved, or "".
func checkKubeletServing(ctx context.Context, client kubernetes.Interface, csr *certificatesv1.CertificateSigningRequest) string {
	node, ok := strings.CutPrefix(csr.Spec.Username, "system:node:")
	if !ok || node == "" || !slices.Contains(csr.Spec.Groups, "system:nodes") {
		return fmt.Sprintf("requested by %q (groups %v), not by a node", csr.Spec.Username, csr.Spec.Groups)
	}
	block, _ := pem.Decode(csr.Spec.Request)
	if block == nil || block.Type != "CERTIFICATE REQUEST" {
		return "the request is not a PEM CERTIFICATE REQUEST"
	}
	req, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return fmt.Sprintf("the request does not parse: %v", err)
	}
	if err := req.CheckSignature(); err != nil {
		return fmt.Sprintf("the request's signature: %v", err)
	}
	if req.Subject.CommonName != csr.Spec.Username || !slices.Equal(req.Subject.Organization, []string{"system:nodes"}) {
		return fmt.Sprintf("subject CN %q O %v, want CN %q O [system:nodes]", req.Subject.CommonName, req.Subject.Organization, csr.Spec.Username)
	}
	if len(req.EmailAddresses) > 0 || len(req.URIs) > 0 {
		return "the request names e-mail addresses or URIs"
	}
	if len(req.DNSNames)+len(req.IPAddresses) == 0 {
		return "the request names no DNS name and no IP address"
	}
	for _, u := range csr.Spec.Usages {
		switch u {
		case certificatesv1.UsageDigitalSignature, certificatesv1.UsageKeyEncipherment, certificatesv1.UsageServerAuth:
		default:
			return fmt.Sprintf("usage %q is not a server's", u)
		}
	}
	n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return fmt.Sprintf("Node %s: %v", node, err)
	}
	var names, ips []string
	for _, a := range n.Status.Addresses {
		switch a.Type {
		case corev1.NodeHostName, corev1.NodeInternalDNS, corev1.NodeExternalDNS:
			names = append(names, a.Address)
		case corev1.NodeInternalIP, corev1.NodeExternalIP:
			ips = append(ips, net.ParseIP(a.Address).String())
		}
	}
	for _, d := range req.DNSNames {
		if !slices.Contains(names, d) {
			return fmt.Sprintf("DNS name %q is not one of Node %s's names %v", d, node, names)
		}
	}
	for _, ip := range req.IPAddresses {
		if !slices.Contains(ips, ip.String()) {
			return fmt.Sprintf("IP address %s is not one of Node %s's addresses %v", ip, node, ips)
		}
	}
	return ""
}
