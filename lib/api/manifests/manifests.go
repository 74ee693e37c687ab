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
	"slices"
	"strings"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"

	api "unbounded-cloud.io/agent/lib/api/v1alpha3"
)

//go:embed crds/*.yaml rbac/base.yaml
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

// ForMachineNode returns the RBAC of one machine whose Node is named node,
// as one multi-document YAML stream.
func ForMachineNode(machine, node string) ([]byte, error) {
	if err := api.ValidateMachineName(machine); err != nil {
		return nil, err
	}
	if errs := validation.IsDNS1123Subdomain(node); len(errs) > 0 {
		return nil, fmt.Errorf("machine %q: node name %q: %s", machine, node, strings.Join(errs, "; "))
	}
	objs := MachineObjects(machine, node)
	var out bytes.Buffer
	for _, o := range objs {
		b, err := yaml.Marshal(o)
		if err != nil {
			return nil, fmt.Errorf("machine %q: %w", machine, err)
		}
		appendDocument(&out, b)
	}
	return out.Bytes(), nil
}

// MachineObjects returns the per-machine RBAC objects (ClusterRoles, then
// ClusterRoleBindings) for callers that apply them with a client rather than
// as YAML. machine must be valid (api.ValidateMachineName).
func MachineObjects(machine, node string) []runtime.Object {
	meta := func(name string) metav1.ObjectMeta {
		return metav1.ObjectMeta{Name: name, Labels: map[string]string{
			PartOfLabel:      PartOfValue,
			api.MachineLabel: machine,
		}}
	}
	roleType := metav1.TypeMeta{APIVersion: rbacv1.SchemeGroupVersion.String(), Kind: "ClusterRole"}
	bindingType := metav1.TypeMeta{APIVersion: rbacv1.SchemeGroupVersion.String(), Kind: "ClusterRoleBinding"}
	roleRef := func(name string) rbacv1.RoleRef {
		return rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name}
	}
	certUser := rbacv1.Subject{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: api.AgentUserName(machine)}
	bootstrap := rbacv1.Subject{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: api.BootstrapGroup(machine)}

	machineRole := &rbacv1.ClusterRole{
		TypeMeta:   roleType,
		ObjectMeta: meta(MachineRoleName(machine)),
		Rules: []rbacv1.PolicyRule{
			// list and watch are authorized by resourceNames when the
			// request carries the field selector metadata.name=<machine>,
			// which is how the daemon watches its own Machine.
			{APIGroups: []string{api.GroupName}, Resources: []string{api.ResourceMachines}, ResourceNames: []string{machine}, Verbs: []string{"get", "list", "watch"}},
			// Status only: no update of the Machine itself, whose spec
			// holds the allocation binding and the fence flag.
			{APIGroups: []string{api.GroupName}, Resources: []string{api.ResourceMachines + "/status"}, ResourceNames: []string{machine}, Verbs: []string{"get", "update", "patch"}},
		},
	}
	nodeRole := &rbacv1.ClusterRole{
		TypeMeta:   roleType,
		ObjectMeta: meta(NodeRoleName(machine)),
		Rules: []rbacv1.PolicyRule{
			// get/list/watch to follow the Node (field selector
			// metadata.name), patch to cordon, delete before a repave.
			{APIGroups: []string{""}, Resources: []string{"nodes"}, ResourceNames: []string{node}, Verbs: []string{"get", "list", "watch", "patch", "delete"}},
		},
	}
	return []runtime.Object{
		machineRole,
		nodeRole,
		&rbacv1.ClusterRoleBinding{
			TypeMeta:   bindingType,
			ObjectMeta: meta(MachineRoleName(machine)),
			RoleRef:    roleRef(MachineRoleName(machine)),
			Subjects:   []rbacv1.Subject{bootstrap, certUser},
		},
		// The Node is the daemon's business; the bootstrap token never
		// touches it (the kubelet registers the Node with its own identity).
		&rbacv1.ClusterRoleBinding{
			TypeMeta:   bindingType,
			ObjectMeta: meta(NodeRoleName(machine)),
			RoleRef:    roleRef(NodeRoleName(machine)),
			Subjects:   []rbacv1.Subject{certUser},
		},
	}
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
