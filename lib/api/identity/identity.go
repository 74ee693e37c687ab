// Package identity names the identities an unbounded agent uses towards the
// API server. It has no Kubernetes dependency, so that the small binaries
// (the operator CLI printing RBAC manifests) can use it without linking the
// API machinery.
package identity

import (
	"fmt"
	"regexp"
	"strings"
)

// The identities an agent uses towards the API server. The credentials code
// (lib/kube) puts them into bootstrap token Secrets and CSRs; the RBAC
// manifests (lib/api/manifests) bind roles to them. Both read them from here.
//
// An agent has two identities over its life:
//
//   - its bootstrap token, which authenticates as user system:bootstrap:<id>
//     in group system:bootstrappers, plus the groups listed in the token
//     Secret's auth-extra-groups: BootstrapAgentsGroup (what every agent may
//     do) and BootstrapGroup(machine) (what this one machine may do);
//   - its client certificate, from a CSR for the kubernetes.io/kube-apiserver-client
//     signer, with CommonName AgentUserName(machine) and Organization
//     AgentGroup.
//
// The bootstrap token's user name carries only the token id, which is not the
// machine name; that is why the machine is named by a per-machine group, from
// which the admission policies of lib/api/manifests read it.
const (
	// AgentGroup is the Organization of every agent's client certificate;
	// cluster-wide agent rights are bound to it.
	AgentGroup = "unbounded-cloud.io:agents"

	// AgentUserPrefix prefixes the machine name in an agent certificate's
	// CommonName.
	AgentUserPrefix = "unbounded-agent:"

	// BootstrapAgentsGroup is carried by every unbounded bootstrap token (via
	// auth-extra-groups). Cluster-wide bootstrap rights are bound to it rather
	// than to system:bootstrappers, so that the cluster's other bootstrap
	// tokens (kubeadm's node tokens) gain nothing from installing this agent.
	BootstrapAgentsGroup = "system:bootstrappers:unbounded"

	// AgentSignerName is the CSR signer of the agent's client certificate.
	AgentSignerName = "kubernetes.io/kube-apiserver-client"
)

// AgentUserName is the user name (certificate CommonName) of the agent on
// machine.
func AgentUserName(machine string) string { return AgentUserPrefix + machine }

// MachineOfAgentUser returns the machine name in an agent's user name, and
// false when user is not an agent's.
func MachineOfAgentUser(user string) (string, bool) {
	m, ok := strings.CutPrefix(user, AgentUserPrefix)
	if !ok || ValidateMachineName(m) != nil {
		return "", false
	}
	return m, true
}

// BootstrapGroup is the group, carried by the bootstrap token of machine,
// that tells the admission policies which machine the token belongs to.
func BootstrapGroup(machine string) string { return BootstrapAgentsGroup + ":" + machine }

// BootstrapExtraGroups is the value of the auth-extra-groups key of the
// bootstrap token Secret for machine (groups are comma-separated there).
func BootstrapExtraGroups(machine string) string {
	return BootstrapAgentsGroup + "," + BootstrapGroup(machine)
}

var machineNameRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// ValidateMachineName reports whether name can name a Machine. The name is
// embedded in the bootstrap group, whose syntax (enforced by the API server's
// bootstrap token authenticator: system:bootstrappers:[a-z0-9:-]) allows no
// dot, so a Machine name is an RFC 1123 label rather than a DNS subdomain.
// The CRD enforces the same rule.
func ValidateMachineName(name string) error {
	if len(name) == 0 || len(name) > 63 || !machineNameRE.MatchString(name) {
		return fmt.Errorf("machine name %q: must be 1-63 lower-case letters, digits or '-', starting and ending with a letter or digit (RFC 1123 label)", name)
	}
	return nil
}
