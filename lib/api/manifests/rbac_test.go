package manifests_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"unbounded-cloud.io/agent/lib/api/identity"
	"unbounded-cloud.io/agent/lib/api/manifests"
	api "unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/tests/kubeenv"
)

// These tests ask the real API server (tests/kube) what the manifests
// allow: each identity performs each request for real, and the server's
// answer (RBAC, then the admission policies) is the result. Each refusal
// must say why: the policy rule's [name], or the resource RBAC grants none
// of. The cluster must
// have had All() applied at start (UNBOUNDED_TEST_MANIFESTS).

var (
	apiScheme = runtime.NewScheme()
	apiCodecs = serializer.NewCodecFactory(apiScheme)
)

func init() {
	if err := api.AddToScheme(apiScheme); err != nil {
		panic(err)
	}
}

// caller is one identity's view of the cluster.
type caller struct {
	name string
	api  rest.Interface // unbounded-cloud.io/v1alpha3
	kube kubernetes.Interface
}

func newCaller(t testing.TB, name string, cfg *rest.Config) *caller {
	t.Helper()
	c := rest.CopyConfig(cfg)
	c.GroupVersion = &api.SchemeGroupVersion
	c.APIPath = "/apis"
	c.NegotiatedSerializer = apiCodecs.WithoutConversion()
	c.ContentType = runtime.ContentTypeJSON
	rc, err := rest.RESTClientFor(c)
	if err != nil {
		t.Fatal(err)
	}
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &caller{name: name, api: rc, kube: kc}
}

func (c *caller) createMachine(ctx context.Context, m *api.Machine) error {
	return c.api.Post().Resource(api.ResourceMachines).Body(m).Do(ctx).Error()
}

func (c *caller) getMachine(ctx context.Context, name string) (*api.Machine, error) {
	m := &api.Machine{}
	err := c.api.Get().Resource(api.ResourceMachines).Name(name).Do(ctx).Into(m)
	return m, err
}

func (c *caller) listMachines(ctx context.Context, fieldSelector string) error {
	return c.api.Get().Resource(api.ResourceMachines).
		VersionedParams(&metav1.ListOptions{FieldSelector: fieldSelector}, metav1.ParameterCodec).
		Do(ctx).Error()
}

// watchMachine opens a watch on one Machine the way the daemon does (field
// selector metadata.name) and closes it again.
func (c *caller) watchMachine(ctx context.Context, name string) error {
	w, err := c.api.Get().Resource(api.ResourceMachines).
		VersionedParams(&metav1.ListOptions{FieldSelector: "metadata.name=" + name, Watch: true}, metav1.ParameterCodec).
		Watch(ctx)
	if err == nil {
		w.Stop()
	}
	return err
}

func (c *caller) patchMachine(ctx context.Context, name, subresource, patch string) error {
	r := c.api.Patch(types.MergePatchType).Resource(api.ResourceMachines).Name(name)
	if subresource != "" {
		r = r.SubResource(subresource)
	}
	return r.Body([]byte(patch)).Do(ctx).Error()
}

func (c *caller) updateOperationStatus(ctx context.Context, name string) error {
	op := &api.MachineOperation{}
	if err := c.api.Get().Resource(api.ResourceMachineOperations).Name(name).Do(ctx).Into(op); err != nil {
		return err
	}
	op.Status.State = api.OperationInProgress
	return c.api.Put().Resource(api.ResourceMachineOperations).Name(name).SubResource("status").Body(op).Do(ctx).Error()
}

func (c *caller) listOperations(ctx context.Context, machine string) error {
	return c.api.Get().Resource(api.ResourceMachineOperations).
		VersionedParams(&metav1.ListOptions{LabelSelector: api.MachineLabel + "=" + machine}, metav1.ParameterCodec).
		Do(ctx).Error()
}

func (c *caller) createCSR(ctx context.Context, machine string) error {
	csr, err := newCSR(machine)
	if err != nil {
		return err
	}
	_, err = c.kube.CertificatesV1().CertificateSigningRequests().Create(ctx, csr, metav1.CreateOptions{})
	return err
}

func (c *caller) createEvent(ctx context.Context, namespace, kind, name string) error {
	_, err := c.kube.CoreV1().Events(namespace).Create(ctx, &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{GenerateName: name + "."},
		InvolvedObject: corev1.ObjectReference{Kind: kind, Name: name},
		Reason:         "Test", Message: "rbac test", Type: corev1.EventTypeNormal,
		Source: corev1.EventSource{Component: "unbounded-agent"},
	}, metav1.CreateOptions{})
	return err
}

func (c *caller) reviewToken(ctx context.Context, token string) error {
	_, err := c.kube.AuthenticationV1().TokenReviews().Create(ctx, &authnv1.TokenReview{Spec: authnv1.TokenReviewSpec{Token: token}}, metav1.CreateOptions{})
	return err
}

// expectation is one request and whether the server must allow it. A
// refusal must name why: rule is the [name] an admission policy's message
// starts with; rbac is the resource RBAC's message names ("cannot <verb>
// resource <rbac>"), for what no grant covers at all.
type expectation struct {
	what  string
	allow bool
	rule  string
	rbac  string
	do    func(ctx context.Context) error
}

func allow(what string, do func(ctx context.Context) error) expectation {
	return expectation{what: what, allow: true, do: do}
}

func refusedBy(rule, what string, do func(ctx context.Context) error) expectation {
	return expectation{what: what, rule: rule, do: do}
}

func refusedByRBAC(resource, what string, do func(ctx context.Context) error) expectation {
	return expectation{what: what, rbac: resource, do: do}
}

func check(t *testing.T, who string, exps []expectation) {
	t.Helper()
	for _, e := range exps {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		err := e.do(ctx)
		cancel()
		switch {
		case e.allow && err != nil:
			t.Errorf("%s: %s: want allowed, got %v", who, e.what, err)
		case e.allow:
		case err == nil:
			t.Errorf("%s: %s: want forbidden, was allowed", who, e.what)
		case !apierrors.IsForbidden(err):
			t.Errorf("%s: %s: want 403 Forbidden, got %v", who, e.what, err)
		case e.rule != "" && (!strings.Contains(err.Error(), "ValidatingAdmissionPolicy") || !strings.Contains(err.Error(), "["+e.rule+"]")):
			t.Errorf("%s: %s: want a refusal by policy rule [%s], got %v", who, e.what, e.rule, err)
		case e.rbac != "" && (strings.Contains(err.Error(), "ValidatingAdmissionPolicy") || !strings.Contains(err.Error(), `resource "`+e.rbac+`"`)):
			t.Errorf("%s: %s: want RBAC's refusal naming resource %q, got %v", who, e.what, e.rbac, err)
		}
	}
}

// waitAllowed polls a SelfSubjectAccessReview until the RBAC grants just
// created reach the authorizer's cache.
func waitAllowed(t *testing.T, c *caller, attrs authzv1.ResourceAttributes) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 15*time.Second, true, func(ctx context.Context) (bool, error) {
		r, err := c.kube.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authzv1.SelfSubjectAccessReview{
			Spec: authzv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &attrs},
		}, metav1.CreateOptions{})
		if err != nil {
			return false, err
		}
		return r.Status.Allowed, nil
	})
	if err != nil {
		t.Fatalf("%s: grant %+v never took effect: %v", c.name, attrs, err)
	}
}

// fixture is two machines, A (the caller's) and B (another): both Nodes and
// operations, B's Machine, and a Secret no agent may read. A's Machine is
// created by the caller (or by admin, for the over-granted tests).
type fixture struct {
	a, b   string
	admin  *caller
	opA    string
	opB    string
	secret string // name of a Secret in kube-system the agent must not read
}

func newFixture(t *testing.T, env *kubeenv.Env) *fixture {
	t.Helper()
	ctx := context.Background()
	f := &fixture{a: kubeenv.UniqueName(t, "a"), b: kubeenv.UniqueName(t, "b")}
	f.admin = newCaller(t, "admin", env.RESTConfig())
	requireCurrentBase(t, f.admin.kube)
	for _, m := range []string{f.a, f.b} {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: m}}
		if _, err := f.admin.kube.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = f.admin.kube.CoreV1().Nodes().Delete(context.Background(), m, metav1.DeleteOptions{}) })
		op := &api.MachineOperation{
			ObjectMeta: metav1.ObjectMeta{GenerateName: m + "-", Labels: map[string]string{api.MachineLabel: m}},
			Spec:       api.MachineOperationSpec{MachineRef: api.MachineRef{Name: m}, Operation: api.OperationRestart},
		}
		if err := f.admin.api.Post().Resource(api.ResourceMachineOperations).Body(op).Do(ctx).Into(op); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = f.admin.api.Delete().Resource(api.ResourceMachineOperations).Name(op.Name).Do(context.Background()).Error()
		})
		if m == f.a {
			f.opA = op.Name
		} else {
			f.opB = op.Name
		}
	}
	if err := f.admin.createMachine(ctx, &api.Machine{ObjectMeta: metav1.ObjectMeta{Name: f.b}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = f.admin.api.Delete().Resource(api.ResourceMachines).Name(f.b).Do(context.Background()).Error()
		_ = f.admin.api.Delete().Resource(api.ResourceMachines).Name(f.a).Do(context.Background()).Error()
	})
	s, err := f.admin.kube.CoreV1().Secrets("kube-system").Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "unbounded-rbac-test-"},
		StringData: map[string]string{"k": "v"},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	f.secret = s.Name
	t.Cleanup(func() {
		_ = f.admin.kube.CoreV1().Secrets("kube-system").Delete(context.Background(), s.Name, metav1.DeleteOptions{})
	})
	return f
}

func (f *fixture) createMachineA(t *testing.T) {
	t.Helper()
	if err := f.admin.createMachine(context.Background(), &api.Machine{ObjectMeta: metav1.ObjectMeta{Name: f.a}}); err != nil {
		t.Fatal(err)
	}
}

func machine(name string, mutate func(*api.Machine)) *api.Machine {
	m := &api.Machine{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: api.MachineSpec{Isolation: api.IsolationSpec{Mode: api.IsolationNspawn}}}
	if mutate != nil {
		mutate(m)
	}
	return m
}

func (c *caller) patchNode(ctx context.Context, name, subresource, patch string) error {
	var sub []string
	if subresource != "" {
		sub = []string{subresource}
	}
	_, err := c.kube.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}, sub...)
	return err
}

func (c *caller) patchOperation(ctx context.Context, name, subresource, patch string) error {
	r := c.api.Patch(types.MergePatchType).Resource(api.ResourceMachineOperations).Name(name)
	if subresource != "" {
		r = r.SubResource(subresource)
	}
	return r.Body([]byte(patch)).Do(ctx).Error()
}

// common is what both identities of machine A may and may not do with
// Machines, Secrets, CSRs and Events.
func (f *fixture) common(c *caller) []expectation {
	return []expectation{
		// Registration: its own Machine, unbound, nothing but the mode.
		refusedBy("own-machine", "create Machine B", func(ctx context.Context) error {
			return c.createMachine(ctx, machine(f.b+"-x", nil))
		}),
		refusedBy("machine-create-spec", "create Machine A bound to an allocation", func(ctx context.Context) error {
			return c.createMachine(ctx, machine(f.a, func(m *api.Machine) { m.Spec.Allocation = &api.AllocationRef{Name: "x", UID: "1"} }))
		}),
		refusedBy("machine-create-spec", "create Machine A naming another host's bootstrap token Secret", func(ctx context.Context) error {
			return c.createMachine(ctx, machine(f.a, func(m *api.Machine) {
				m.Spec.Kubernetes.BootstrapTokenRef = &api.SecretRef{Namespace: "kube-system", Name: "bootstrap-token-abcdef"}
			}))
		}),
		refusedBy("machine-create-spec", "create Machine A with an agent build", func(ctx context.Context) error {
			return c.createMachine(ctx, machine(f.a, func(m *api.Machine) {
				m.Spec.Agent = &api.AgentSpec{Version: "6.6.6", URL: "https://evil.example/a.deb"}
			}))
		}),
		refusedBy("machine-create-metadata", "create Machine A with labels", func(ctx context.Context) error {
			return c.createMachine(ctx, machine(f.a, func(m *api.Machine) { m.Labels = map[string]string{"team": "x"} }))
		}),
		allow("create Machine A", func(ctx context.Context) error { return c.createMachine(ctx, machine(f.a, nil)) }),
		// Reads are not narrowed (README, security): every agent reads every Machine.
		allow("get Machine A", func(ctx context.Context) error { _, err := c.getMachine(ctx, f.a); return err }),
		allow("list Machine A by field selector", func(ctx context.Context) error { return c.listMachines(ctx, "metadata.name="+f.a) }),
		allow("watch Machine A by field selector", func(ctx context.Context) error { return c.watchMachine(ctx, f.a) }),
		allow("get Machine B", func(ctx context.Context) error { _, err := c.getMachine(ctx, f.b); return err }),
		allow("list all Machines", func(ctx context.Context) error { return c.listMachines(ctx, "") }),
		// Writes: its own Machine's status, nothing else.
		refusedByRBAC("machines", "patch Machine A's spec (unfence)", func(ctx context.Context) error {
			return c.patchMachine(ctx, f.a, "", `{"spec":{"allocation":{"name":"x","fenced":false}}}`)
		}),
		refusedByRBAC("machines", "label Machine A", func(ctx context.Context) error {
			return c.patchMachine(ctx, f.a, "", `{"metadata":{"labels":{"team":"x"}}}`)
		}),
		refusedBy("own-machine", "update Machine B's status", func(ctx context.Context) error {
			return c.patchMachine(ctx, f.b, "status", `{"status":{"phase":"Failed"}}`)
		}),
		refusedByRBAC("machines", "delete Machine A", func(ctx context.Context) error {
			return c.api.Delete().Resource(api.ResourceMachines).Name(f.a).Do(ctx).Error()
		}),
		refusedByRBAC("secrets", "list Secrets in all namespaces", func(ctx context.Context) error {
			_, err := c.kube.CoreV1().Secrets("").List(ctx, metav1.ListOptions{})
			return err
		}),
		refusedByRBAC("secrets", "get a Secret in kube-system", func(ctx context.Context) error {
			_, err := c.kube.CoreV1().Secrets("kube-system").Get(ctx, f.secret, metav1.GetOptions{})
			return err
		}),
		refusedByRBAC("machineallocations", "list MachineAllocations", func(ctx context.Context) error {
			return c.api.Get().Resource(api.ResourceMachineAllocations).Do(ctx).Error()
		}),
		allow("create a CSR", func(ctx context.Context) error { return c.createCSR(ctx, f.a) }),
		allow("record an Event about Machine A", func(ctx context.Context) error { return c.createEvent(ctx, "default", "Machine", f.a) }),
		refusedBy("own-events", "record an Event about Machine B", func(ctx context.Context) error {
			return c.createEvent(ctx, "default", "Machine", f.b)
		}),
		refusedBy("own-events", "record an Event about a Secret named A", func(ctx context.Context) error {
			return c.createEvent(ctx, "default", "Secret", f.a)
		}),
		refusedByRBAC("events", "record an Event in kube-system", func(ctx context.Context) error {
			return c.createEvent(ctx, "kube-system", "Machine", f.a)
		}),
	}
}

func TestBootstrapIdentityCanDoExactlyWhatIsGranted(t *testing.T) {
	env := kubeenv.Get(t)
	f := newFixture(t, env)
	// The groups the provisioning side puts into the token Secret's
	// auth-extra-groups (identity.BootstrapExtraGroups).
	id, secret := kubeenv.RandomTokenID(t)
	token := env.CreateBootstrapToken(t, id, secret, strings.Split(identity.BootstrapExtraGroups(f.a), ",")...)
	c := newCaller(t, "bootstrap token of "+f.a, env.TokenConfig(token))
	// The kubelet's TLS bootstrap with this token: kube-controller-manager's
	// approver approves a kubelet client CSR only when its requester may
	// create certificatesigningrequests/nodeclient (kubeadm's grant).
	waitAllowed(t, c, authzv1.ResourceAttributes{Group: "certificates.k8s.io", Resource: "certificatesigningrequests", Subresource: "nodeclient", Verb: "create"})

	exps := f.common(c)
	exps = append(exps,
		allow("TokenReview of its own token", func(ctx context.Context) error { return c.reviewToken(ctx, token) }),
		// The bootstrap report (lib/report) and the fence's refusal (lib/fence).
		allow("report the bootstrap on Machine A", func(ctx context.Context) error {
			return c.patchMachine(ctx, f.a, "status", `{"status":{"phase":"Bootstrapping","agent":{"version":"test"},"bootstrap":{"state":"Running"},`+
				`"conditions":[{"type":"Bootstrapped","status":"False","reason":"Running","message":"m","lastTransitionTime":"2026-01-01T00:00:00Z"}]}}`)
		}),
		allow("record AllocationLaunchRefused on Machine A", func(ctx context.Context) error {
			return c.api.Patch(types.JSONPatchType).Resource(api.ResourceMachines).Name(f.a).SubResource("status").Body([]byte(
				`[{"op":"add","path":"/status/conditions/-","value":{"type":"AllocationLaunchRefused","status":"True","reason":"AllocationFenced","message":"m","lastTransitionTime":"2026-01-01T00:00:00Z"}}]`)).
				Do(ctx).Error()
		}),
		// The daemon's share of the status is not the token's to write.
		refusedBy("bootstrap-status", "report Machine A's isolation", func(ctx context.Context) error {
			return c.patchMachine(ctx, f.a, "status", `{"status":{"isolation":{"mode":"none"}}}`)
		}),
		refusedBy("bootstrap-status", "report Machine A's Node", func(ctx context.Context) error {
			return c.patchMachine(ctx, f.a, "status", `{"status":{"nodeName":"`+f.b+`"}}`)
		}),
		refusedBy("bootstrap-status", "set Machine A's IsolationChanged condition", func(ctx context.Context) error {
			return c.api.Patch(types.JSONPatchType).Resource(api.ResourceMachines).Name(f.a).SubResource("status").Body([]byte(
				`[{"op":"add","path":"/status/conditions/-","value":{"type":"IsolationChanged","status":"True","reason":"Succeeded","message":"m","lastTransitionTime":"2026-01-01T00:00:00Z"}}]`)).
				Do(ctx).Error()
		}),
		// The daemon's business, on the certificate only.
		refusedByRBAC("machineoperations", "list its MachineOperations", func(ctx context.Context) error { return c.listOperations(ctx, f.a) }),
		refusedByRBAC("machineoperations/status", "update its MachineOperation's status", func(ctx context.Context) error {
			return c.patchOperation(ctx, f.opA, "status", `{"status":{"state":"InProgress"}}`)
		}),
		refusedByRBAC("nodes", "get Node A", func(ctx context.Context) error {
			_, err := c.kube.CoreV1().Nodes().Get(ctx, f.a, metav1.GetOptions{})
			return err
		}),
		refusedByRBAC("nodes", "cordon Node A", func(ctx context.Context) error {
			return c.patchNode(ctx, f.a, "", `{"spec":{"unschedulable":true}}`)
		}),
		refusedByRBAC("pods", "list pods", func(ctx context.Context) error {
			_, err := c.kube.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
			return err
		}),
	)
	check(t, c.name, exps)
}

func TestCertificateIdentityCanDoExactlyWhatIsGranted(t *testing.T) {
	env := kubeenv.Get(t)
	f := newFixture(t, env)
	// The subject lib/kube puts into the agent's CSR.
	c := newCaller(t, identity.AgentUserName(f.a), env.CertConfig(env.MintClientCert(t, identity.AgentUserName(f.a), identity.AgentGroup)))

	exps := f.common(c)
	exps = append(exps,
		// The daemon reports everything about its Machine.
		allow("report Machine A's isolation, Node and conditions", func(ctx context.Context) error {
			return c.patchMachine(ctx, f.a, "status", `{"status":{"phase":"Ready","isolation":{"mode":"nspawn","slot":"kube1"},"nodeName":"`+f.a+`",`+
				`"conditions":[{"type":"IsolationChanged","status":"True","reason":"Succeeded","message":"m","lastTransitionTime":"2026-01-01T00:00:00Z"}]}}`)
		}),
		refusedByRBAC("tokenreviews", "TokenReview", func(ctx context.Context) error { return c.reviewToken(ctx, "abcdef.0123456789abcdef") }),
		allow("list its MachineOperations by label", func(ctx context.Context) error { return c.listOperations(ctx, f.a) }),
		allow("update its MachineOperation's status", func(ctx context.Context) error { return c.updateOperationStatus(ctx, f.opA) }),
		refusedBy("own-operation", "update B's MachineOperation's status", func(ctx context.Context) error { return c.updateOperationStatus(ctx, f.opB) }),
		refusedByRBAC("machineoperations", "change its MachineOperation's spec", func(ctx context.Context) error {
			return c.patchOperation(ctx, f.opA, "", `{"spec":{"operation":"Reboot"}}`)
		}),
		refusedByRBAC("machineoperations", "relabel its MachineOperation", func(ctx context.Context) error {
			return c.patchOperation(ctx, f.opA, "", `{"metadata":{"labels":{"`+api.MachineLabel+`":"`+f.b+`"}}}`)
		}),
		refusedByRBAC("machineoperations", "create a MachineOperation", func(ctx context.Context) error {
			return c.api.Post().Resource(api.ResourceMachineOperations).Body(&api.MachineOperation{
				ObjectMeta: metav1.ObjectMeta{GenerateName: "x-", Labels: map[string]string{api.MachineLabel: f.b}},
				Spec:       api.MachineOperationSpec{MachineRef: api.MachineRef{Name: f.b}, Operation: api.OperationReboot},
			}).Do(ctx).Error()
		}),
		allow("get Node A", func(ctx context.Context) error {
			_, err := c.kube.CoreV1().Nodes().Get(ctx, f.a, metav1.GetOptions{})
			return err
		}),
		allow("get Node B", func(ctx context.Context) error {
			_, err := c.kube.CoreV1().Nodes().Get(ctx, f.b, metav1.GetOptions{})
			return err
		}),
		allow("cordon Node A", func(ctx context.Context) error { return c.patchNode(ctx, f.a, "", `{"spec":{"unschedulable":true}}`) }),
		allow("watch Node A by field selector", func(ctx context.Context) error {
			w, err := c.kube.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + f.a})
			if err == nil {
				w.Stop()
			}
			return err
		}),
		refusedBy("own-node", "cordon Node B", func(ctx context.Context) error { return c.patchNode(ctx, f.b, "", `{"spec":{"unschedulable":true}}`) }),
		refusedBy("node-cordon-only", "label Node A for trusted workloads", func(ctx context.Context) error {
			return c.patchNode(ctx, f.a, "", `{"metadata":{"labels":{"node-restriction.kubernetes.io/trusted":"yes"}}}`)
		}),
		refusedBy("node-cordon-only", "remove a taint from Node A", func(ctx context.Context) error {
			return c.patchNode(ctx, f.a, "", `{"spec":{"taints":[{"key":"x","effect":"NoSchedule"}]}}`)
		}),
		refusedByRBAC("nodes/status", "write Node A's status", func(ctx context.Context) error {
			return c.patchNode(ctx, f.a, "status", `{"status":{"phase":"Running"}}`)
		}),
		refusedBy("own-node", "delete Node B", func(ctx context.Context) error {
			return c.kube.CoreV1().Nodes().Delete(ctx, f.b, metav1.DeleteOptions{})
		}),
		allow("list pods on Node A (drain)", func(ctx context.Context) error {
			_, err := c.kube.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + f.a})
			return err
		}),
		allow("watch pods on Node A (drain)", func(ctx context.Context) error {
			w, err := c.kube.CoreV1().Pods("").Watch(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + f.a})
			if err == nil {
				w.Stop()
			}
			return err
		}),
		refusedByRBAC("pods", "delete a pod", func(ctx context.Context) error {
			return c.kube.CoreV1().Pods("default").Delete(ctx, "anything", metav1.DeleteOptions{})
		}),
		allow("delete Node A (before a repave)", func(ctx context.Context) error {
			return c.kube.CoreV1().Nodes().Delete(ctx, f.a, metav1.DeleteOptions{})
		}),
	)
	check(t, c.name, exps)
}

// overGrant gives user and group every write RBAC can give on the objects
// the policies guard, as an operator might by mistake, and waits until the
// authorizer honours it: the policies must hold without RBAC's help.
func overGrant(t *testing.T, env *kubeenv.Env, user, group string) {
	t.Helper()
	ctx := context.Background()
	rb := env.Client().RbacV1()
	name := kubeenv.UniqueName(t, "rbac-test-overgrant")
	writes := []string{"create", "update", "patch", "delete"}
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{api.GroupName}, Resources: []string{"machines", "machines/status", "machineoperations", "machineoperations/status"}, Verbs: writes},
		{APIGroups: []string{""}, Resources: []string{"nodes", "nodes/status"}, Verbs: writes},
		{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: writes},
	}}
	if _, err := rb.ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rb.ClusterRoles().Delete(context.Background(), name, metav1.DeleteOptions{}) })
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: user},
			{APIGroup: rbacv1.GroupName, Kind: "Group", Name: group}}}
	if _, err := rb.ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rb.ClusterRoleBindings().Delete(context.Background(), name, metav1.DeleteOptions{}) })
}

// TestPoliciesHoldWhenRBACGrantsTheAgentsMore: every write the agent
// policies forbid is refused by the named rule even for an agent that RBAC
// lets write anything on Machines, operations, Nodes and Events.
func TestPoliciesHoldWhenRBACGrantsTheAgentsMore(t *testing.T) {
	env := kubeenv.Get(t)
	f := newFixture(t, env)
	f.createMachineA(t)
	ctx := context.Background()
	overGrant(t, env, identity.AgentUserName(f.a), identity.BootstrapGroup(f.a))
	cert := newCaller(t, identity.AgentUserName(f.a), env.CertConfig(env.MintClientCert(t, identity.AgentUserName(f.a), identity.AgentGroup)))
	id, secret := kubeenv.RandomTokenID(t)
	tok := newCaller(t, "bootstrap token of "+f.a, env.TokenConfig(env.CreateBootstrapToken(t, id, secret, strings.Split(identity.BootstrapExtraGroups(f.a), ",")...)))
	waitAllowed(t, cert, authzv1.ResourceAttributes{Group: api.GroupName, Resource: api.ResourceMachines, Verb: "delete", Name: f.a})
	waitAllowed(t, tok, authzv1.ResourceAttributes{Resource: "nodes", Verb: "patch", Name: f.a})
	_ = ctx

	opPatch := `{"metadata":{"annotations":{"x":"y"}}}`
	check(t, cert.name, []expectation{
		refusedBy("machine-spec", "unfence Machine A", func(ctx context.Context) error {
			return cert.patchMachine(ctx, f.a, "", `{"spec":{"allocation":{"name":"x","fenced":false}}}`)
		}),
		refusedBy("machine-spec", "label Machine A", func(ctx context.Context) error {
			return cert.patchMachine(ctx, f.a, "", `{"metadata":{"labels":{"team":"x"}}}`)
		}),
		refusedBy("own-machine", "unfence Machine B", func(ctx context.Context) error {
			return cert.patchMachine(ctx, f.b, "", `{"spec":{"allocation":{"name":"x","fenced":false}}}`)
		}),
		refusedBy("machine-delete", "delete Machine A", func(ctx context.Context) error {
			return cert.api.Delete().Resource(api.ResourceMachines).Name(f.a).Do(ctx).Error()
		}),
		refusedBy("own-machine", "delete Machine B", func(ctx context.Context) error {
			return cert.api.Delete().Resource(api.ResourceMachines).Name(f.b).Do(ctx).Error()
		}),
		refusedBy("operation-status-only", "annotate its MachineOperation", func(ctx context.Context) error {
			return cert.patchOperation(ctx, f.opA, "", opPatch)
		}),
		refusedBy("operation-status-only", "delete its MachineOperation", func(ctx context.Context) error {
			return cert.api.Delete().Resource(api.ResourceMachineOperations).Name(f.opA).Do(ctx).Error()
		}),
		refusedBy("operation-status-only", "create a MachineOperation for itself", func(ctx context.Context) error {
			return cert.api.Post().Resource(api.ResourceMachineOperations).Body(&api.MachineOperation{
				ObjectMeta: metav1.ObjectMeta{GenerateName: "x-", Labels: map[string]string{api.MachineLabel: f.a}},
				Spec:       api.MachineOperationSpec{MachineRef: api.MachineRef{Name: f.a}, Operation: api.OperationReboot},
			}).Do(ctx).Error()
		}),
		refusedBy("node-register", "create a Node", func(ctx context.Context) error {
			_, err := cert.kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: f.a + "-x"}}, metav1.CreateOptions{})
			if err != nil && strings.Contains(err.Error(), "[own-node]") {
				// Both rules refuse another name; ask again under its own.
				_, err = cert.kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: f.a}}, metav1.CreateOptions{})
			}
			return err
		}),
		refusedBy("node-register", "write Node A's status", func(ctx context.Context) error {
			return cert.patchNode(ctx, f.a, "status", `{"status":{"phase":"Running"}}`)
		}),
		refusedBy("node-cordon-only", "annotate Node A", func(ctx context.Context) error {
			return cert.patchNode(ctx, f.a, "", `{"metadata":{"annotations":{"x":"y"}}}`)
		}),
		refusedBy("own-events", "delete an Event about Machine A", func(ctx context.Context) error {
			ev, err := cert.kube.CoreV1().Events("default").Create(ctx, &corev1.Event{
				ObjectMeta:     metav1.ObjectMeta{GenerateName: f.a + "."},
				InvolvedObject: corev1.ObjectReference{Kind: "Machine", Name: f.a},
				Reason:         "Test", Message: "rbac test", Type: corev1.EventTypeNormal,
			}, metav1.CreateOptions{})
			if err != nil {
				return fmt.Errorf("creating it: %w", err)
			}
			return cert.kube.CoreV1().Events("default").Delete(ctx, ev.Name, metav1.DeleteOptions{})
		}),
	})
	check(t, tok.name, []expectation{
		refusedBy("node-certificate-only", "cordon Node A with the bootstrap token", func(ctx context.Context) error {
			return tok.patchNode(ctx, f.a, "", `{"spec":{"unschedulable":true}}`)
		}),
		refusedBy("operation-certificate-only", "report its MachineOperation with the bootstrap token", func(ctx context.Context) error {
			return tok.patchOperation(ctx, f.opA, "status", `{"status":{"state":"InProgress"}}`)
		}),
		refusedBy("machine-spec", "unfence Machine A with the bootstrap token", func(ctx context.Context) error {
			return tok.patchMachine(ctx, f.a, "", `{"spec":{"allocation":{"name":"x","fenced":false}}}`)
		}),
	})
	// The label that decides ownership cannot move, even by a status write
	// that carries it: the server keeps the old labels (status strategy),
	// so the operation stays A's.
	if err := cert.api.Put().Resource(api.ResourceMachineOperations).Name(f.opA).SubResource("status").
		Body(relabelled(t, f.admin, f.opA, f.b)).Do(ctx).Error(); err != nil {
		t.Fatalf("status write carrying a new label: %v", err)
	}
	op := &api.MachineOperation{}
	if err := f.admin.api.Get().Resource(api.ResourceMachineOperations).Name(f.opA).Do(ctx).Into(op); err != nil {
		t.Fatal(err)
	}
	if op.Labels[api.MachineLabel] != f.a {
		t.Errorf("a status write moved operation %s to %q", f.opA, op.Labels[api.MachineLabel])
	}
}

func relabelled(t *testing.T, admin *caller, name, machine string) *api.MachineOperation {
	t.Helper()
	op := &api.MachineOperation{}
	if err := admin.api.Get().Resource(api.ResourceMachineOperations).Name(name).Do(context.Background()).Into(op); err != nil {
		t.Fatal(err)
	}
	op.Labels[api.MachineLabel] = machine
	op.Status.State = api.OperationInProgress
	return op
}

// newCSR makes a CSR for the agent certificate of machine, as lib/kube
// does, with a fresh key.
func newCSR(machine string) (*certv1.CertificateSigningRequest, error) {
	pemReq, _, err := certRequest(identity.AgentUserName(machine), identity.AgentGroup)
	if err != nil {
		return nil, err
	}
	return &certv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "unbounded-rbac-test-"},
		Spec: certv1.CertificateSigningRequestSpec{
			Request:    pemReq,
			SignerName: identity.AgentSignerName,
			Usages:     []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageClientAuth},
		},
	}, nil
}

// certRequest returns a PEM CSR and its PEM private key.
func certRequest(cn string, orgs ...string) (csrPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: cn, Organization: orgs}}, key)
	if err != nil {
		return nil, nil, err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), nil
}

// requireCurrentBase fails the test when the cluster-wide objects installed
// in the test cluster differ from what All() renders now: the environment
// was started from stale manifests, and its verdicts would be about them.
func requireCurrentBase(t *testing.T, admin kubernetes.Interface) {
	t.Helper()
	stream, err := manifests.All()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(stream)))
	for {
		doc, err := r.Read()
		if err != nil {
			break
		}
		var tm struct {
			metav1.TypeMeta   `json:",inline"`
			metav1.ObjectMeta `json:"metadata"`
		}
		if err := yaml.Unmarshal(doc, &tm); err != nil || tm.Kind == "" {
			continue
		}
		var want, got any
		switch tm.Kind {
		case "ClusterRole":
			var o rbacv1.ClusterRole
			mustUnmarshal(t, doc, &o)
			c, err := admin.RbacV1().ClusterRoles().Get(ctx, o.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatalf("test cluster lacks ClusterRole %s of All(): %v", o.Name, err)
			}
			want, got = o.Rules, c.Rules
		case "ClusterRoleBinding":
			var o rbacv1.ClusterRoleBinding
			mustUnmarshal(t, doc, &o)
			c, err := admin.RbacV1().ClusterRoleBindings().Get(ctx, o.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatalf("test cluster lacks ClusterRoleBinding %s of All(): %v", o.Name, err)
			}
			want, got = o.Subjects, c.Subjects
		case "RoleBinding":
			var o rbacv1.RoleBinding
			mustUnmarshal(t, doc, &o)
			c, err := admin.RbacV1().RoleBindings(o.Namespace).Get(ctx, o.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatalf("test cluster lacks RoleBinding %s/%s of All(): %v", o.Namespace, o.Name, err)
			}
			want, got = o.Subjects, c.Subjects
		case "ValidatingAdmissionPolicy":
			var o admissionv1.ValidatingAdmissionPolicy
			mustUnmarshal(t, doc, &o)
			c, err := admin.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(ctx, o.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatalf("test cluster lacks ValidatingAdmissionPolicy %s of All(): %v", o.Name, err)
			}
			want, got = o.Spec.Validations, c.Spec.Validations
		default:
			continue
		}
		if !equality.Semantic.DeepEqual(want, got) {
			t.Fatalf("test cluster's %s %s differs from All(): restart the environment with current manifests (UNBOUNDED_TEST_MANIFESTS)\nAll(): %+v\ncluster: %+v", tm.Kind, tm.Name, want, got)
		}
	}
}

func mustUnmarshal(t *testing.T, doc []byte, into any) {
	t.Helper()
	if err := yaml.UnmarshalStrict(doc, into); err != nil {
		t.Fatal(err)
	}
}
