// Package csrapproval holds the rules by which the cluster side
// (cmd/unbounded-controller) approves the two kinds of
// CertificateSigningRequest a host sends and kube-controller-manager signs
// but never approves: the daemon's client certificate
// (kubernetes.io/kube-apiserver-client, lib/kube) and the kubelet's
// serving certificate (kubernetes.io/kubelet-serving). A decision is a
// pure function of the request and what the cluster says of its machine
// or node (given as lookups), so that the controller, its tests and
// anything else that must judge a request judge it alike.
package csrapproval

import (
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"slices"
	"strings"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"

	"unbounded-cloud.io/agent/lib/api/identity"
	"unbounded-cloud.io/agent/lib/api/v1alpha3"
)

// Reasons of the CSR conditions the approver writes (and of its Events).
const (
	ReasonApproved = "UnboundedApproved"
	ReasonDenied   = "UnboundedDenied"
)

// Verdict is what a decision does with a request.
type Verdict int

const (
	// Approve: the request is what the rules allow.
	Approve Verdict = iota
	// Deny: it is not, and will never be.
	Deny
	// Wait: not yet decidable (a node's first serving request can come a
	// moment before the Node lists its addresses); look again later,
	// deny if it is still so past the approver's patience.
	Wait
	// NotOurs: not a request this approver judges (another signer, or a
	// client certificate that is no agent's); it is left alone.
	NotOurs
)

func (v Verdict) String() string {
	switch v {
	case Approve:
		return "approve"
	case Deny:
		return "deny"
	case Wait:
		return "wait"
	}
	return "not ours"
}

// Decision is a verdict and why, in words an operator reads in the CSR's
// condition and Event.
type Decision struct {
	Verdict Verdict
	// Kind is "agent-client" or "kubelet-serving" ("" when not ours).
	Kind    string
	Message string
}

// Kinds of request.
const (
	KindAgentClient    = "agent-client"
	KindKubeletServing = "kubelet-serving"
)

// MachineLookup returns the Machine of name, nil when there is none.
type MachineLookup func(name string) (*v1alpha3.Machine, error)

// NodeLookup returns the Node of name, nil when there is none.
type NodeLookup func(name string) (*corev1.Node, error)

// Decided says whether csr has an approval or a denial already: the
// approver decides once.
func Decided(csr *certificatesv1.CertificateSigningRequest) bool {
	for _, c := range csr.Status.Conditions {
		if c.Type == certificatesv1.CertificateApproved || c.Type == certificatesv1.CertificateDenied {
			return true
		}
	}
	return false
}

// Decide judges csr by its signer. A lookup that fails (the cluster does
// not answer) is an error: nothing is decided on a guess.
func Decide(csr *certificatesv1.CertificateSigningRequest, machine MachineLookup, node NodeLookup) (Decision, error) {
	switch csr.Spec.SignerName {
	case identity.AgentSignerName:
		return AgentClient(csr, machine)
	case certificatesv1.KubeletServingSignerName:
		return KubeletServing(csr, node)
	}
	return Decision{Verdict: NotOurs}, nil
}

// AgentClient judges a kube-apiserver-client request. It is an agent's
// when its requester is an unbounded bootstrap token or an agent's
// certificate, or its subject claims an agent's identity; any other
// client request is not ours (other components of the cluster have
// their own approvers). An agent's is approved only when the requester is
// machine M's bootstrap token (group BootstrapGroup(M)) or M's own
// certificate (a renewal), the subject is M's identity (CN AgentUserName(M),
// O AgentGroup, nothing else), the usages are a client's, and Machine M
// exists, is not being deleted and is not fenced.
func AgentClient(csr *certificatesv1.CertificateSigningRequest, machine MachineLookup) (Decision, error) {
	req, parseErr := parse(csr)
	claims := parseErr == nil && (strings.HasPrefix(req.Subject.CommonName, identity.AgentUserPrefix) || slices.Contains(req.Subject.Organization, identity.AgentGroup))
	m, byToken, byCert := requester(csr)
	if !byToken && !byCert && !claims {
		return Decision{Verdict: NotOurs}, nil
	}
	deny := func(format string, args ...any) (Decision, error) {
		return Decision{Verdict: Deny, Kind: KindAgentClient, Message: fmt.Sprintf(format, args...)}, nil
	}
	switch {
	case !byToken && !byCert:
		return deny("requested by %q (groups %v), which is neither a machine's unbounded bootstrap token nor an agent's certificate", csr.Spec.Username, csr.Spec.Groups)
	case m == "":
		return deny("requested by %q (groups %v): a bootstrap token of no single machine", csr.Spec.Username, csr.Spec.Groups)
	case parseErr != nil:
		return deny("%v", parseErr)
	}
	want := identity.AgentUserName(m)
	if req.Subject.CommonName != want || !slices.Equal(req.Subject.Organization, []string{identity.AgentGroup}) ||
		len(req.Subject.OrganizationalUnit) > 0 || len(req.Subject.Country) > 0 || len(req.Subject.Locality) > 0 ||
		len(req.Subject.Province) > 0 || len(req.Subject.StreetAddress) > 0 || len(req.Subject.PostalCode) > 0 || req.Subject.SerialNumber != "" {
		return deny("subject %q, want exactly CN=%s, O=%s (machine %s's own identity)", req.Subject.String(), want, identity.AgentGroup, m)
	}
	if len(req.DNSNames)+len(req.IPAddresses)+len(req.EmailAddresses)+len(req.URIs) > 0 {
		return deny("the request names DNS names, IP addresses, e-mail addresses or URIs: a client certificate has none")
	}
	if why := usages(csr.Spec.Usages, certificatesv1.UsageClientAuth); why != "" {
		return deny("%s", why)
	}
	mach, err := machine(m)
	if err != nil {
		return Decision{}, fmt.Errorf("machine %s: %w", m, err)
	}
	switch {
	case mach == nil:
		return deny("Machine %s does not exist", m)
	case mach.DeletionTimestamp != nil:
		return deny("Machine %s is being deleted", m)
	case mach.Spec.Allocation != nil && mach.Spec.Allocation.Fenced:
		return deny("Machine %s is fenced (allocation %s)", m, mach.Spec.Allocation.Name)
	}
	how := "its bootstrap token"
	if byCert {
		how = "its current certificate (renewal)"
	}
	return Decision{Verdict: Approve, Kind: KindAgentClient, Message: fmt.Sprintf("machine %s's agent, requested with %s", m, how)}, nil
}

// requester reads the machine of the request's requester: from the
// per-machine group of an unbounded bootstrap token (byToken; m is ""
// when the token carries no single machine's group), or from an agent's
// certificate's user (byCert).
func requester(csr *certificatesv1.CertificateSigningRequest) (m string, byToken, byCert bool) {
	if name, ok := identity.MachineOfAgentUser(csr.Spec.Username); ok && slices.Contains(csr.Spec.Groups, identity.AgentGroup) {
		return name, false, true
	}
	if !strings.HasPrefix(csr.Spec.Username, "system:bootstrap:") || !slices.Contains(csr.Spec.Groups, identity.BootstrapAgentsGroup) {
		return "", false, false
	}
	var machines []string
	for _, g := range csr.Spec.Groups {
		if name, ok := strings.CutPrefix(g, identity.BootstrapAgentsGroup+":"); ok && identity.ValidateMachineName(name) == nil {
			machines = append(machines, name)
		}
	}
	if len(machines) != 1 {
		return "", true, false
	}
	return machines[0], true, false
}

// KubeletServing judges a kubelet-serving request by the rules the
// README states: requested by system:node:N in group system:nodes, the
// subject CN=system:node:N, O=system:nodes, only a server's usages, no
// e-mail address or URI, and every DNS name and IP address one of Node N's
// addresses (Wait while the Node does not list one of them yet).
func KubeletServing(csr *certificatesv1.CertificateSigningRequest, node NodeLookup) (Decision, error) {
	deny := func(format string, args ...any) (Decision, error) {
		return Decision{Verdict: Deny, Kind: KindKubeletServing, Message: fmt.Sprintf(format, args...)}, nil
	}
	n, ok := strings.CutPrefix(csr.Spec.Username, "system:node:")
	if !ok || n == "" || !slices.Contains(csr.Spec.Groups, "system:nodes") {
		return deny("requested by %q (groups %v), not by a node", csr.Spec.Username, csr.Spec.Groups)
	}
	req, err := parse(csr)
	if err != nil {
		return deny("%v", err)
	}
	if req.Subject.CommonName != csr.Spec.Username || !slices.Equal(req.Subject.Organization, []string{"system:nodes"}) {
		return deny("subject CN %q O %v, want CN %q O [system:nodes]", req.Subject.CommonName, req.Subject.Organization, csr.Spec.Username)
	}
	if len(req.EmailAddresses) > 0 || len(req.URIs) > 0 {
		return deny("the request names e-mail addresses or URIs")
	}
	if len(req.DNSNames)+len(req.IPAddresses) == 0 {
		return deny("the request names no DNS name and no IP address")
	}
	if why := usages(csr.Spec.Usages, certificatesv1.UsageServerAuth); why != "" {
		return deny("%s", why)
	}
	obj, err := node(n)
	if err != nil {
		return Decision{}, fmt.Errorf("node %s: %w", n, err)
	}
	wait := func(format string, args ...any) (Decision, error) {
		return Decision{Verdict: Wait, Kind: KindKubeletServing, Message: fmt.Sprintf(format, args...)}, nil
	}
	if obj == nil {
		return wait("Node %s does not exist (yet)", n)
	}
	var names, ips []string
	for _, a := range obj.Status.Addresses {
		switch a.Type {
		case corev1.NodeHostName, corev1.NodeInternalDNS, corev1.NodeExternalDNS:
			names = append(names, a.Address)
		case corev1.NodeInternalIP, corev1.NodeExternalIP:
			if ip := net.ParseIP(a.Address); ip != nil {
				ips = append(ips, ip.String())
			}
		}
	}
	for _, d := range req.DNSNames {
		if !slices.Contains(names, d) {
			return wait("DNS name %q is not one of Node %s's names %v", d, n, names)
		}
	}
	for _, ip := range req.IPAddresses {
		if !slices.Contains(ips, ip.String()) {
			return wait("IP address %s is not one of Node %s's addresses %v", ip, n, ips)
		}
	}
	return Decision{Verdict: Approve, Kind: KindKubeletServing, Message: fmt.Sprintf("node %s's own names and addresses", n)}, nil
}

// usages says what is wrong with a request's usages ("" when nothing):
// they must include need and be among digital signature, key encipherment
// and need.
func usages(us []certificatesv1.KeyUsage, need certificatesv1.KeyUsage) string {
	if !slices.Contains(us, need) {
		return fmt.Sprintf("usages %v lack %q", us, need)
	}
	for _, u := range us {
		switch u {
		case certificatesv1.UsageDigitalSignature, certificatesv1.UsageKeyEncipherment, need:
		default:
			return fmt.Sprintf("usage %q is not allowed (only digital signature, key encipherment and %s)", u, need)
		}
	}
	return ""
}

// parse reads and checks the request's PEM and its signature.
func parse(csr *certificatesv1.CertificateSigningRequest) (*x509.CertificateRequest, error) {
	block, _ := pem.Decode(csr.Spec.Request)
	if block == nil || block.Type != "CERTIFICATE REQUEST" {
		return nil, fmt.Errorf("the request is not a PEM CERTIFICATE REQUEST")
	}
	req, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("the request does not parse: %v", err)
	}
	if err := req.CheckSignature(); err != nil {
		return nil, fmt.Errorf("the request's signature: %v", err)
	}
	return req, nil
}
