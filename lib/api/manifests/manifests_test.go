package manifests

import (
	"bufio"
	"bytes"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"unbounded-cloud.io/agent/lib/api/identity"
	api "unbounded-cloud.io/agent/lib/api/v1alpha3"
)

// decodeAll splits a YAML stream and decodes each document strictly into
// the typed object its apiVersion and kind name, so that a misspelt field
// is an error here rather than a field the API server silently drops.
func decodeAll(t *testing.T, stream []byte) []runtime.Object {
	t.Helper()
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{rbacv1.AddToScheme, admissionv1.AddToScheme, apiextv1.AddToScheme,
		appsv1.AddToScheme, corev1.AddToScheme, policyv1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(stream)))
	var objs []runtime.Object
	for i := 1; ; i++ {
		doc, err := r.Read()
		if err != nil {
			break
		}
		if len(bytes.TrimSpace(stripComments(doc))) == 0 {
			continue
		}
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &tm); err != nil {
			t.Fatalf("document %d: %v", i, err)
		}
		obj, err := scheme.New(tm.GroupVersionKind())
		if err != nil {
			t.Fatalf("document %d: %v", i, err)
		}
		if err := yaml.UnmarshalStrict(doc, obj); err != nil {
			t.Fatalf("document %d (%s): %v", i, tm.GroupVersionKind(), err)
		}
		objs = append(objs, obj)
	}
	return objs
}

func stripComments(doc []byte) []byte {
	var out [][]byte
	for _, l := range bytes.Split(doc, []byte("\n")) {
		if !bytes.HasPrefix(bytes.TrimSpace(l), []byte("#")) && !bytes.Equal(bytes.TrimSpace(l), []byte("---")) {
			out = append(out, l)
		}
	}
	return bytes.Join(out, []byte("\n"))
}

func kindName(o runtime.Object) string {
	m, err := metaOf(o)
	if err != nil {
		return fmt.Sprintf("%T", o)
	}
	return fmt.Sprintf("%T/%s", o, m.GetName())
}

func metaOf(o runtime.Object) (metav1.Object, error) {
	m, ok := o.(metav1.Object)
	if !ok {
		return nil, fmt.Errorf("%T has no metadata", o)
	}
	return m, nil
}

func TestAllDecodesIntoCRDsThenRBACAndPolicies(t *testing.T) {
	b, err := All()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, o := range decodeAll(t, b) {
		got = append(got, kindName(o))
	}
	want := []string{
		"*v1.CustomResourceDefinition/machineallocations.unbounded-cloud.io",
		"*v1.CustomResourceDefinition/machineoperations.unbounded-cloud.io",
		"*v1.CustomResourceDefinition/machinerollouts.unbounded-cloud.io",
		"*v1.CustomResourceDefinition/machines.unbounded-cloud.io",
		"*v1.ClusterRole/unbounded-agent:bootstrap",
		"*v1.ClusterRoleBinding/unbounded-agent:bootstrap",
		"*v1.ClusterRoleBinding/unbounded-agent:kubelet-bootstrap",
		"*v1.ClusterRoleBinding/unbounded-agent:node-autoapprove-bootstrap",
		"*v1.ClusterRoleBinding/unbounded-agent:node-autoapprove-certificate-rotation",
		"*v1.ClusterRole/unbounded-agent:daemon",
		"*v1.ClusterRoleBinding/unbounded-agent:daemon",
		"*v1.ClusterRole/unbounded-agent:events",
		"*v1.RoleBinding/unbounded-agent:events",
		"*v1.ValidatingAdmissionPolicy/unbounded-agent-machines.unbounded-cloud.io",
		"*v1.ValidatingAdmissionPolicyBinding/unbounded-agent-machines.unbounded-cloud.io",
		"*v1.ValidatingAdmissionPolicy/unbounded-agent-machineoperations.unbounded-cloud.io",
		"*v1.ValidatingAdmissionPolicyBinding/unbounded-agent-machineoperations.unbounded-cloud.io",
		"*v1.ValidatingAdmissionPolicy/unbounded-agent-nodes.unbounded-cloud.io",
		"*v1.ValidatingAdmissionPolicyBinding/unbounded-agent-nodes.unbounded-cloud.io",
		"*v1.ValidatingAdmissionPolicy/unbounded-agent-events.unbounded-cloud.io",
		"*v1.ValidatingAdmissionPolicyBinding/unbounded-agent-events.unbounded-cloud.io",
		"*v1.ValidatingAdmissionPolicy/machineoperation-label.unbounded-cloud.io",
		"*v1.ValidatingAdmissionPolicyBinding/machineoperation-label.unbounded-cloud.io",
	}
	if !slices.Equal(got, want) {
		t.Errorf("All() objects:\n got %q\nwant %q", got, want)
	}
}

func crdsByKind(t *testing.T) map[string]*apiextv1.CustomResourceDefinition {
	b, err := CRDs()
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]*apiextv1.CustomResourceDefinition{}
	for _, o := range decodeAll(t, b) {
		crd := o.(*apiextv1.CustomResourceDefinition)
		m[crd.Spec.Names.Kind] = crd
	}
	return m
}

func TestCRDsAreClusterScopedWithStatusAndPrinterColumns(t *testing.T) {
	wantColumns := map[string][]string{
		"Machine":           {"MODE", "SLOT", "PHASE", "AGENT", "NODE", "AGE"},
		"MachineOperation":  {"MACHINE", "OPERATION", "STATE", "REASON", "AGE"},
		"MachineAllocation": {"MACHINE", "CONSUMER", "FENCED", "AGE"},
		"MachineRollout":    {"OPERATION", "PHASE", "DONE", "FAILED", "TOTAL", "AGE"},
	}
	crds := crdsByKind(t)
	if len(crds) != len(wantColumns) {
		t.Fatalf("got CRDs %v, want %d", crds, len(wantColumns))
	}
	for kind, cols := range wantColumns {
		crd := crds[kind]
		if crd == nil {
			t.Errorf("no CRD for %s", kind)
			continue
		}
		if crd.Spec.Group != api.GroupName || crd.Spec.Scope != apiextv1.ClusterScoped {
			t.Errorf("%s: group %q scope %q", kind, crd.Spec.Group, crd.Spec.Scope)
		}
		if len(crd.Spec.Versions) != 1 || crd.Spec.Versions[0].Name != api.Version || !crd.Spec.Versions[0].Served || !crd.Spec.Versions[0].Storage {
			t.Errorf("%s: versions %+v", kind, crd.Spec.Versions)
			continue
		}
		v := crd.Spec.Versions[0]
		if v.Subresources == nil || v.Subresources.Status == nil {
			t.Errorf("%s: no status subresource", kind)
		}
		var names []string
		for _, c := range v.AdditionalPrinterColumns {
			names = append(names, c.Name)
		}
		if !slices.Equal(names, cols) {
			t.Errorf("%s printer columns %v, want %v", kind, names, cols)
		}
	}
	// `kubectl get` shows columns of priority 0 only: these are what
	// `kubectl get machines` and `kubectl get machineoperations` print
	// without -o wide.
	for kind, want := range map[string][]string{"Machine": {"MODE", "SLOT", "PHASE", "AGENT", "AGE"}, "MachineOperation": {"MACHINE", "OPERATION", "STATE", "AGE"}} {
		var shown []string
		for _, c := range crds[kind].Spec.Versions[0].AdditionalPrinterColumns {
			if c.Priority == 0 {
				shown = append(shown, c.Name)
			}
		}
		if !slices.Equal(shown, want) {
			t.Errorf("kubectl get %s shows %v, want %v", kind, shown, want)
		}
	}
}

func prop(t *testing.T, s apiextv1.JSONSchemaProps, path ...string) apiextv1.JSONSchemaProps {
	t.Helper()
	for _, p := range path {
		next, ok := s.Properties[p]
		if !ok {
			t.Fatalf("schema has no property %q (path %v)", p, path)
		}
		s = next
	}
	return s
}

func enumOf(s apiextv1.JSONSchemaProps) []string {
	var out []string
	for _, e := range s.Enum {
		out = append(out, strings.Trim(string(e.Raw), `"`))
	}
	return out
}

func TestCRDSchemasCarryEnumsAndRequiredFields(t *testing.T) {
	crds := crdsByKind(t)
	m := *crds["Machine"].Spec.Versions[0].Schema.OpenAPIV3Schema
	op := *crds["MachineOperation"].Spec.Versions[0].Schema.OpenAPIV3Schema
	for _, c := range []struct {
		name string
		got  []string
		want []string
	}{
		{"Machine spec.isolation.mode", enumOf(prop(t, m, "spec", "isolation", "mode")), []string{"nspawn", "container", "none"}},
		{"Machine spec.isolation.method", enumOf(prop(t, m, "spec", "isolation", "method")), []string{"InPlace", "Reprovision"}},
		{"Machine status.isolation.slot", enumOf(prop(t, m, "status", "isolation", "slot")), []string{"kube1", "kube2"}},
		// The phases the agent sets, and no other.
		{"Machine status.phase", enumOf(prop(t, m, "status", "phase")), []string{"Pending", "Bootstrapping", "Ready", "ChangingIsolation", "Refused", "Failed"}},
		{"Machine status.isolationChange.method", enumOf(prop(t, m, "status", "isolationChange", "method")), []string{"InPlace", "Reprovision"}},
		{"Machine status.isolationChange.state", enumOf(prop(t, m, "status", "isolationChange", "state")), []string{"InProgress", "Succeeded", "Failed"}},
		{"Machine status.bootstrap.state", enumOf(prop(t, m, "status", "bootstrap", "state")), []string{"Running", "Succeeded", "Failed"}},
		{"MachineOperation spec.operation", enumOf(prop(t, op, "spec", "operation")), []string{"Repave", "Restart", "Reboot", "AgentUpgrade"}},
		{"MachineOperation status.state", enumOf(prop(t, op, "status", "state")), []string{"Pending", "InProgress", "Complete", "Failed"}},
		{"MachineOperation spec required", prop(t, op, "spec").Required, []string{"machineRef", "operation"}},
		{"Machine spec.allocation required", prop(t, m, "spec", "allocation").Required, []string{"name"}},
	} {
		if !slices.Equal(c.got, c.want) {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
	if len(m.XValidations) != 1 || !strings.Contains(m.XValidations[0].Rule, "self.metadata.name") {
		t.Errorf("Machine: want one root rule on metadata.name, got %+v", m.XValidations)
	}
}

// rulesOf returns every rule of the ClusterRoles in objs.
func rulesOf(objs []runtime.Object) map[string][]rbacv1.PolicyRule {
	out := map[string][]rbacv1.PolicyRule{}
	for _, o := range objs {
		if r, ok := o.(*rbacv1.ClusterRole); ok {
			out[r.Name] = r.Rules
		}
	}
	return out
}

// TestRBACGrantsNoSecretsNoWildcardsAndNoSpecWrites guards the grants
// against privilege creep: no wildcard, nothing on Secrets or tokens, and
// no write to a Machine itself (its spec holds the fence) nor to an
// operation itself (the cluster's request).
func TestRBACGrantsNoSecretsNoWildcardsAndNoSpecWrites(t *testing.T) {
	b, err := All()
	if err != nil {
		t.Fatal(err)
	}
	for role, rules := range rulesOf(decodeAll(t, b)) {
		for _, r := range rules {
			if len(r.ResourceNames) > 0 {
				t.Errorf("%s: rule %+v names objects: the set must be the same for every machine", role, r)
			}
			for _, res := range r.Resources {
				switch {
				case res == "*" || slices.Contains(r.Verbs, "*") || slices.Contains(r.APIGroups, "*"):
					t.Errorf("%s: wildcard rule %+v", role, r)
				case res == "secrets" || res == "serviceaccounts/token" || res == "nodes/status" || res == "machineallocations":
					t.Errorf("%s grants %v on %s", role, r.Verbs, res)
				case (res == "machines" || res == "machineoperations") && slices.ContainsFunc(r.Verbs, isWriteOtherThanCreate):
					t.Errorf("%s grants %v on %s itself; agents write the status only", role, r.Verbs, res)
				case res == "machineoperations" && slices.Contains(r.Verbs, "create"):
					t.Errorf("%s lets agents create operations", role)
				}
			}
		}
	}
}

func isWriteOtherThanCreate(verb string) bool {
	return verb == "update" || verb == "patch" || verb == "delete" || verb == "deletecollection"
}

// TestEveryGrantedWriteIsNarrowedByAnAgentPolicy: RBAC cannot tell one
// machine's objects from another's, so every write it grants the agents
// must be matched by a policy that can. A grant added without its policy
// fails here. (What the policies decide is rbac_test.go's business.)
func TestEveryGrantedWriteIsNarrowedByAnAgentPolicy(t *testing.T) {
	b, err := All()
	if err != nil {
		t.Fatal(err)
	}
	objs := decodeAll(t, b)
	type key struct{ group, resource, op string }
	matched := map[key]bool{}
	for _, o := range objs {
		p, ok := o.(*admissionv1.ValidatingAdmissionPolicy)
		if !ok || !strings.HasPrefix(p.Name, "unbounded-agent-") {
			continue
		}
		if len(p.Spec.MatchConditions) != 1 || !strings.Contains(p.Spec.MatchConditions[0].Expression, "'"+identity.BootstrapAgentsGroup+"'") ||
			!strings.Contains(p.Spec.MatchConditions[0].Expression, "'"+identity.AgentGroup+"'") {
			t.Errorf("%s does not match both agent groups: %+v", p.Name, p.Spec.MatchConditions)
		}
		if p.Spec.FailurePolicy == nil || *p.Spec.FailurePolicy != admissionv1.Fail {
			t.Errorf("%s: failurePolicy %v, want Fail", p.Name, p.Spec.FailurePolicy)
		}
		for _, v := range p.Spec.Validations {
			if !strings.Contains(v.Message+v.MessageExpression, "'[") && !strings.HasPrefix(v.Message, "[") {
				t.Errorf("%s: validation %q has no [rule] name in its message", p.Name, v.Expression)
			}
		}
		for _, r := range p.Spec.MatchConstraints.ResourceRules {
			for _, g := range r.APIGroups {
				for _, res := range r.Resources {
					for _, op := range r.Operations {
						matched[key{g, res, string(op)}] = true
					}
				}
			}
		}
	}
	opOf := map[string]string{"create": "CREATE", "update": "UPDATE", "patch": "UPDATE", "delete": "DELETE"}
	for role, rules := range rulesOf(objs) {
		for _, r := range rules {
			for _, g := range r.APIGroups {
				for _, res := range r.Resources {
					for _, verb := range r.Verbs {
						op, write := opOf[verb]
						if !write || unnarrowed[res] {
							continue
						}
						if !matched[key{g, res, op}] {
							t.Errorf("%s grants %s on %s/%s, which no agent policy narrows (%s)", role, verb, g, res, op)
						}
					}
				}
			}
		}
	}
}

// unnarrowed are the writes no policy can narrow to the caller's own, and
// why: README's security section lists them.
var unnarrowed = map[string]bool{
	// A CSR names the subject it asks for inside the PEM request, which CEL
	// cannot parse; the approver checks it against spec.username/groups.
	"certificatesigningrequests": true,
	// A TokenReview authenticates with the token it reviews.
	"tokenreviews": true,
	// The eviction names a pod, not a node; PodDisruptionBudgets bound it.
	"pods/eviction": true,
}

// TestPoliciesUseTheIdentitiesOfPackageIdentity: the policies read the
// machine out of the caller's identity; a rename on either side must fail.
func TestPoliciesUseTheIdentitiesOfPackageIdentity(t *testing.T) {
	b, err := All()
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	for _, want := range []string{
		"'" + identity.AgentUserPrefix + "'",
		"'" + identity.BootstrapGroup("") + "'",
		"'" + identity.BootstrapAgentsGroup + "'",
		"'" + identity.AgentGroup + "'",
		"name: " + identity.AgentGroup + "\n",
		"name: " + identity.BootstrapAgentsGroup + "\n",
		"'" + api.MachineLabel + "'",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("manifests do not contain %q", want)
		}
	}
}

// The cluster side's manifests: only for an image pinned by its digest;
// a Deployment of two replicas of it, with restricted pod security (non-root,
// read-only root file system, every capability dropped, the runtime's
// seccomp profile), a PodDisruptionBudget, and RBAC that approves only the
// two signers' requests and reads no Secret.
func TestControllerManifestsPinTheImageAndGrantLeastPrivilege(t *testing.T) {
	for _, bad := range []string{"", "registry.example/c:v1", "registry.example/c@sha256:abc", "registry.example/c@sha256:" + strings.Repeat("0", 64) + "\nimage: evil"} {
		if _, err := Controller(bad); err == nil {
			t.Errorf("image %q accepted", bad)
		}
	}
	image := "registry.example/unbounded-controller:v1@sha256:" + strings.Repeat("a", 64)
	b, err := Controller(image)
	if err != nil {
		t.Fatal(err)
	}
	var dep *appsv1.Deployment
	var pdb *policyv1.PodDisruptionBudget
	kinds := map[string]int{}
	for _, o := range decodeAll(t, b) {
		kinds[o.GetObjectKind().GroupVersionKind().Kind]++
		switch o := o.(type) {
		case *appsv1.Deployment:
			dep = o
		case *policyv1.PodDisruptionBudget:
			pdb = o
		case *rbacv1.ClusterRole:
			for _, r := range o.Rules {
				if slices.Contains(r.Resources, "secrets") || slices.Contains(r.Verbs, "*") || slices.Contains(r.Resources, "*") {
					t.Errorf("ClusterRole %s: rule %v", o.Name, r)
				}
				if slices.Contains(r.Verbs, "approve") && !slices.Equal(r.ResourceNames, []string{"kubernetes.io/kube-apiserver-client", "kubernetes.io/kubelet-serving"}) {
					t.Errorf("approve on signers %v, want the two only", r.ResourceNames)
				}
			}
		}
	}
	for _, k := range []string{"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Deployment", "PodDisruptionBudget", "Service"} {
		if kinds[k] != 1 {
			t.Errorf("%d %s objects, want 1", kinds[k], k)
		}
	}
	if dep == nil || pdb == nil {
		t.FailNow()
	}
	if dep.Spec.Replicas == nil || *dep.Spec.Replicas != 2 {
		t.Errorf("replicas %v, want 2", dep.Spec.Replicas)
	}
	ps := dep.Spec.Template.Spec.SecurityContext
	if ps == nil || ps.RunAsNonRoot == nil || !*ps.RunAsNonRoot || ps.SeccompProfile == nil || ps.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod security context %+v", ps)
	}
	c := dep.Spec.Template.Spec.Containers[0]
	if c.Image != image {
		t.Errorf("image %q, want %q", c.Image, image)
	}
	cs := c.SecurityContext
	if cs == nil || cs.ReadOnlyRootFilesystem == nil || !*cs.ReadOnlyRootFilesystem || cs.AllowPrivilegeEscalation == nil || *cs.AllowPrivilegeEscalation ||
		cs.Capabilities == nil || !slices.Equal(cs.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Errorf("container security context %+v", cs)
	}
	spread := dep.Spec.Template.Spec.TopologySpreadConstraints
	if len(spread) != 1 || spread[0].TopologyKey != corev1.LabelHostname || spread[0].MaxSkew != 1 || spread[0].LabelSelector == nil ||
		!maps.Equal(spread[0].LabelSelector.MatchLabels, dep.Spec.Selector.MatchLabels) {
		t.Errorf("topology spread %+v, want the replicas spread over nodes (%s, max skew 1, the Deployment's pods)", spread, corev1.LabelHostname)
	}
	if pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.IntValue() != 1 {
		t.Errorf("PodDisruptionBudget minAvailable %v, want 1", pdb.Spec.MinAvailable)
	}
}
