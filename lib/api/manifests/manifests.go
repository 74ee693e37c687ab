// Package manifests holds what a cluster needs before an unbounded agent can
// talk to it: the CRDs of lib/api/v1alpha3 and least-privilege RBAC for the
// agent's two identities (bootstrap token, daemon certificate). `unbounded
// manifests` prints them, ready for `kubectl apply -f -`.
//
// The RBAC is in two parts, because RBAC can only narrow a grant to named
// objects when the names are known:
//
//   - All: the CRDs and the cluster-wide part, the same in every cluster
//     (rbac/base.yaml). It grants what cannot be limited by name (create,
//     list/watch by label) to the groups every agent carries, and ships a
//     ValidatingAdmissionPolicy that narrows those grants back to the
//     caller's own machine.
//   - ForMachine: one machine's part, rendered when a host is provisioned:
//     get/list/watch of its own Machine and writes to its own Machine's
//     status only (never its spec: an agent that could write its spec could
//     unfence itself), bound to its bootstrap group and its certificate user;
//     and its own Node (get/list/watch/patch/delete, for cordon and the
//     delete before a repave), bound to the certificate user only.
package manifests

import (
	"bytes"
	"embed"
	"fmt"
	"io/fs"
	"regexp"
	"slices"
	"text/template"

	"unbounded-cloud.io/agent/lib/api/identity"
)

// This package renders YAML only and imports no Kubernetes package: the
// operator CLI prints these manifests, and the API machinery would
// multiply its size (`make bench`, "binary sizes", shows bin/unbounded as it
// is). Callers that apply the objects with a client
// decode them with lib/api/manifests/objects.

//go:embed crds/*.yaml rbac/base.yaml rbac/machine.yaml.tmpl
var files embed.FS

// PartOfLabel is set on every object these manifests create, so that an
// operator can find (and remove) them all with one label selector.
const PartOfLabel = "app.kubernetes.io/part-of"

// PartOfValue is the value of PartOfLabel.
const PartOfValue = "unbounded-agent"

// Names of the per-machine RBAC objects.
func MachineRoleName(machine string) string { return "unbounded-agent:machine:" + machine }
func NodeRoleName(machine string) string    { return "unbounded-agent:node:" + machine }

// CRDs returns the CustomResourceDefinitions, one YAML document each, in a
// stable order.
func CRDs() ([]byte, error) {
	names, err := fs.Glob(files, "crds/*.yaml")
	if err != nil {
		return nil, err
	}
	slices.Sort(names)
	var out bytes.Buffer
	for _, n := range names {
		b, err := files.ReadFile(n)
		if err != nil {
			return nil, err
		}
		appendDocument(&out, b)
	}
	return out.Bytes(), nil
}

// All returns the CRDs followed by the cluster-wide RBAC and admission
// policies, as one multi-document YAML stream.
func All() ([]byte, error) {
	crds, err := CRDs()
	if err != nil {
		return nil, err
	}
	base, err := files.ReadFile("rbac/base.yaml")
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	out.Write(crds)
	appendDocument(&out, base)
	return out.Bytes(), nil
}

// ForMachine returns the RBAC of one machine whose Node has the machine's
// name. See ForMachineNode.
func ForMachine(machine string) ([]byte, error) { return ForMachineNode(machine, machine) }

var machineTemplate = template.Must(template.ParseFS(files, "rbac/machine.yaml.tmpl"))

// nodeNameRE is a DNS-1123 subdomain, the syntax of a Node name.
var nodeNameRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)

// ForMachineNode returns the RBAC of one machine whose Node is named node,
// as one multi-document YAML stream: a ClusterRole for its own Machine
// (read, and write its status), one for its own Node, and their bindings
// (rbac/machine.yaml.tmpl says why each grant is there). The names are
// validated first, so the template needs no quoting.
func ForMachineNode(machine, node string) ([]byte, error) {
	if err := identity.ValidateMachineName(machine); err != nil {
		return nil, err
	}
	if len(node) == 0 || len(node) > 253 || !nodeNameRE.MatchString(node) {
		return nil, fmt.Errorf("machine %q: node name %q: must be a DNS-1123 subdomain (lower-case letters, digits, '-' and '.', at most 253)", machine, node)
	}
	var out bytes.Buffer
	err := machineTemplate.Execute(&out, struct{ Machine, Node string }{machine, node})
	if err != nil {
		return nil, fmt.Errorf("machine %q: %w", machine, err)
	}
	return out.Bytes(), nil
}

// appendDocument writes doc as one or more YAML documents, each started by
// "---", whether or not doc already starts with one.
func appendDocument(out *bytes.Buffer, doc []byte) {
	doc = bytes.TrimSpace(doc)
	if !bytes.HasPrefix(doc, []byte("---")) {
		out.WriteString("---\n")
	}
	out.Write(doc)
	out.WriteString("\n")
}
