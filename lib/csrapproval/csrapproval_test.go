package csrapproval

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"net"
	"strings"
	"testing"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"unbounded-cloud.io/agent/lib/api/identity"
	"unbounded-cloud.io/agent/lib/api/v1alpha3"
)

// request is a CSR of signer for tmpl, signed with a fresh key.
func request(t *testing.T, signer, user string, groups []string, usages []certificatesv1.KeyUsage, tmpl x509.CertificateRequest) *certificatesv1.CertificateSigningRequest {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &tmpl, key)
	if err != nil {
		t.Fatal(err)
	}
	return &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: "csr-1"},
		Spec: certificatesv1.CertificateSigningRequestSpec{
			Request: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}), SignerName: signer,
			Username: user, Groups: groups, Usages: usages,
		},
	}
}

func tokenGroups(machines ...string) []string {
	g := []string{"system:bootstrappers", identity.BootstrapAgentsGroup, "system:authenticated"}
	for _, m := range machines {
		g = append(g, identity.BootstrapGroup(m))
	}
	return g
}

func agentSubject(m string) x509.CertificateRequest {
	return x509.CertificateRequest{Subject: pkix.Name{CommonName: identity.AgentUserName(m), Organization: []string{identity.AgentGroup}}}
}

// ruleCase is a request (its requester, usages and contents) and the
// verdict the rules give it, with words its message must have.
type ruleCase struct {
	name   string
	user   string
	groups []string
	usages []certificatesv1.KeyUsage
	tmpl   x509.CertificateRequest
	want   Verdict
	says   string
}

var clientUsages = []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth}

// TestAgentClientRequests: a machine's daemon's client request is
// approved when its token (or its own certificate) asks for its own
// identity as a client, with its Machine there and not fenced; every other
// agent request is denied saying why; a client request that is no agent's
// is left to the cluster's other approvers.
func TestAgentClientRequests(t *testing.T) {
	fenced := &v1alpha3.Machine{ObjectMeta: metav1.ObjectMeta{Name: "m3"}, Spec: v1alpha3.MachineSpec{Allocation: &v1alpha3.AllocationRef{Name: "a3", Fenced: true}}}
	now := metav1.Now()
	deleting := &v1alpha3.Machine{ObjectMeta: metav1.ObjectMeta{Name: "m4", DeletionTimestamp: &now}}
	machines := map[string]*v1alpha3.Machine{
		"m1": {ObjectMeta: metav1.ObjectMeta{Name: "m1"}},
		"m2": {ObjectMeta: metav1.ObjectMeta{Name: "m2"}},
		"m3": fenced, "m4": deleting,
	}
	lookup := func(name string) (*v1alpha3.Machine, error) { return machines[name], nil }
	withDNS := agentSubject("m1")
	withDNS.DNSNames = []string{"m1.example"}
	otherOU := agentSubject("m1")
	otherOU.Subject.OrganizationalUnit = []string{"x"}
	for _, c := range []ruleCase{
		{"by its bootstrap token", "system:bootstrap:abcdef", tokenGroups("m1"), clientUsages, agentSubject("m1"), Approve, "bootstrap token"},
		{"renewal by its certificate", identity.AgentUserName("m1"), []string{identity.AgentGroup, "system:authenticated"}, clientUsages, agentSubject("m1"), Approve, "renewal"},
		{"machine A's token asks for B", "system:bootstrap:abcdef", tokenGroups("m1"), clientUsages, agentSubject("m2"), Deny, "machine m1's own identity"},
		{"A's certificate asks for B", identity.AgentUserName("m1"), []string{identity.AgentGroup}, clientUsages, agentSubject("m2"), Deny, "machine m1's own identity"},
		{"server auth besides", "system:bootstrap:abcdef", tokenGroups("m1"), append(clientUsages, certificatesv1.UsageServerAuth), agentSubject("m1"), Deny, `usage "server auth"`},
		{"no client auth", "system:bootstrap:abcdef", tokenGroups("m1"), []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature}, agentSubject("m1"), Deny, "lack"},
		{"names a DNS name", "system:bootstrap:abcdef", tokenGroups("m1"), clientUsages, withDNS, Deny, "DNS names"},
		{"another subject field", "system:bootstrap:abcdef", tokenGroups("m1"), clientUsages, otherOU, Deny, "want exactly"},
		{"fenced Machine", "system:bootstrap:abcdef", tokenGroups("m3"), clientUsages, agentSubject("m3"), Deny, "fenced"},
		{"Machine being deleted", "system:bootstrap:abcdef", tokenGroups("m4"), clientUsages, agentSubject("m4"), Deny, "being deleted"},
		{"no Machine", "system:bootstrap:abcdef", tokenGroups("m9"), clientUsages, agentSubject("m9"), Deny, "does not exist"},
		{"a token of two machines", "system:bootstrap:abcdef", tokenGroups("m1", "m2"), clientUsages, agentSubject("m1"), Deny, "no single machine"},
		{"someone else claims an agent", "alice", []string{"system:authenticated"}, clientUsages, agentSubject("m1"), Deny, "neither"},
		{"kubeadm's node token", "system:bootstrap:abcdef", []string{"system:bootstrappers", "system:bootstrappers:kubeadm:default-node-token"}, clientUsages, agentSubject("m1"), Deny, "neither"},
		{"not an agent's", "alice", []string{"system:authenticated"}, clientUsages, x509.CertificateRequest{Subject: pkix.Name{CommonName: "alice"}}, NotOurs, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			d, err := Decide(request(t, identity.AgentSignerName, c.user, c.groups, c.usages, c.tmpl), lookup, nil)
			if err != nil {
				t.Fatal(err)
			}
			if d.Verdict != c.want || !strings.Contains(d.Message, c.says) {
				t.Errorf("%s: %q; want %s saying %q", d.Verdict, d.Message, c.want, c.says)
			}
			if d.Verdict != NotOurs && d.Kind != KindAgentClient {
				t.Errorf("kind %q", d.Kind)
			}
		})
	}
}

// TestUnreadableRequestIsDeniedAndALookupThatFailsDecidesNothing.
func TestUnreadableRequestIsDeniedAndALookupThatFailsDecidesNothing(t *testing.T) {
	csr := request(t, identity.AgentSignerName, "system:bootstrap:abcdef", tokenGroups("m1"), clientUsages, agentSubject("m1"))
	failing := func(string) (*v1alpha3.Machine, error) { return nil, errors.New("connection refused") }
	if d, err := Decide(csr, failing, nil); err == nil {
		t.Errorf("a failed Machine lookup decided %s: %s", d.Verdict, d.Message)
	}
	csr.Spec.Request = []byte("not pem")
	if d, _ := Decide(csr, failing, nil); d.Verdict != Deny || !strings.Contains(d.Message, "not a PEM") {
		t.Errorf("unreadable agent request: %s %q", d.Verdict, d.Message)
	}
	other := request(t, "example.com/signer", "alice", nil, clientUsages, agentSubject("m1"))
	if d, _ := Decide(other, failing, nil); d.Verdict != NotOurs {
		t.Errorf("another signer's request: %s", d.Verdict)
	}
}

// TestKubeletServingRequests: the README's rules; a name the Node does
// not list (yet) waits.
func TestKubeletServingRequests(t *testing.T) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
		{Type: corev1.NodeHostName, Address: "n1"}, {Type: corev1.NodeInternalIP, Address: "10.0.0.5"},
	}}}
	lookup := func(name string) (*corev1.Node, error) {
		if name == "n1" {
			return node, nil
		}
		return nil, nil
	}
	serving := []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageKeyEncipherment, certificatesv1.UsageServerAuth}
	subj := func(n string, dns []string, ips ...string) x509.CertificateRequest {
		r := x509.CertificateRequest{Subject: pkix.Name{CommonName: "system:node:" + n, Organization: []string{"system:nodes"}}, DNSNames: dns}
		for _, ip := range ips {
			r.IPAddresses = append(r.IPAddresses, net.ParseIP(ip))
		}
		return r
	}
	nodes := []string{"system:nodes", "system:authenticated"}
	withEmail := subj("n1", []string{"n1"})
	withEmail.EmailAddresses = []string{"a@b.c"}
	for _, c := range []ruleCase{
		{"its own names", "system:node:n1", nodes, serving, subj("n1", []string{"n1"}, "10.0.0.5"), Approve, "own names"},
		{"not a node", "alice", []string{"system:authenticated"}, serving, subj("n1", []string{"n1"}), Deny, "not by a node"},
		{"another node's subject", "system:node:n1", nodes, serving, subj("n2", []string{"n1"}), Deny, "want CN"},
		{"client auth besides", "system:node:n1", nodes, append(serving, certificatesv1.UsageClientAuth), subj("n1", []string{"n1"}), Deny, `usage "client auth"`},
		{"an e-mail address", "system:node:n1", nodes, serving, withEmail, Deny, "e-mail"},
		{"no names", "system:node:n1", nodes, serving, subj("n1", nil), Deny, "no DNS name"},
		{"an address not the Node's", "system:node:n1", nodes, serving, subj("n1", []string{"n1"}, "10.0.0.6"), Wait, "10.0.0.6"},
		{"a name not the Node's", "system:node:n1", nodes, serving, subj("n1", []string{"evil.example"}), Wait, "evil.example"},
		{"no Node yet", "system:node:n2", nodes, serving, subj("n2", []string{"n2"}), Wait, "does not exist"},
	} {
		t.Run(c.name, func(t *testing.T) {
			d, err := Decide(request(t, certificatesv1.KubeletServingSignerName, c.user, c.groups, c.usages, c.tmpl), nil, lookup)
			if err != nil {
				t.Fatal(err)
			}
			if d.Verdict != c.want || !strings.Contains(d.Message, c.says) || d.Kind != KindKubeletServing {
				t.Errorf("%s %s: %q; want %s saying %q", d.Kind, d.Verdict, d.Message, c.want, c.says)
			}
		})
	}
}
