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
// answer (RBAC, then the admission policies) is the result. The cluster must
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

func newCaller(t *testing.T, name string, cfg *rest.Config) *caller {
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

func (c *caller) createEvent(ctx context.Context, namespace, machine string) error {
	_, err := c.kube.CoreV1().Events(namespace).Create(ctx, &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{GenerateName: machine + "."},
		InvolvedObject: corev1.ObjectReference{APIVersion: api.SchemeGroupVersion.String(), Kind: "Machine", Name: machine},
		Reason:         "Test", Message: "rbac test", Type: corev1.EventTypeNormal,
		Source: corev1.EventSource{Component: "unbounded-agent"},
	}, metav1.CreateOptions{})
	return err
}

func (c *caller) reviewToken(ctx context.Context, token string) error {
	_, err := c.kube.AuthenticationV1().TokenReviews().Create(ctx, &authnv1.TokenReview{Spec: authnv1.TokenReviewSpec{Token: token}}, metav1.CreateOptions{})
	return err
}

// expectation is one request and whether the server must allow it.
type expectation struct {
	what  string
	allow bool
	// policy: a refusal must come from the admission policy, not RBAC.
	policy bool
	do     func(ctx context.Context) error
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
		case !e.allow && err == nil:
			t.Errorf("%s: %s: want forbidden, was allowed", who, e.what)
		case !e.allow && !apierrors.IsForbidden(err):
			t.Errorf("%s: %s: want 403 Forbidden, got %v", who, e.what, err)
		case !e.allow && e.policy && !strings.Contains(err.Error(), "ValidatingAdmissionPolicy"):
			t.Errorf("%s: %s: want a refusal by the admission policy, got %v", who, e.what, err)
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

// fixture is two machines, A (the caller's) and B (another), each with its
// RBAC, B's Machine, Node and operation, and A's Node and operation.
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
		env.GrantMachine(t, m, m)
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

// common is what both identities of machine A may and may not do with
// Machines, Secrets, CSRs and Events.
func (f *fixture) common(c *caller) []expectation {
	return []expectation{
		{what: "create Machine B", allow: false, policy: true, do: func(ctx context.Context) error {
			// B exists, so RBAC's verdict is checked on a fresh name.
			return c.createMachine(ctx, &api.Machine{ObjectMeta: metav1.ObjectMeta{Name: f.b + "-x"}})
		}},
		{what: "create Machine A bound to an allocation", allow: false, policy: true, do: func(ctx context.Context) error {
			return c.createMachine(ctx, &api.Machine{ObjectMeta: metav1.ObjectMeta{Name: f.a}, Spec: api.MachineSpec{Allocation: &api.AllocationRef{Name: "x", UID: "1"}}})
		}},
		{what: "create Machine A", allow: true, do: func(ctx context.Context) error {
			err := c.createMachine(ctx, &api.Machine{ObjectMeta: metav1.ObjectMeta{Name: f.a}})
			if apierrors.IsAlreadyExists(err) {
				return nil // the other identity created it first
			}
			return err
		}},
		{what: "get Machine A", allow: true, do: func(ctx context.Context) error { _, err := c.getMachine(ctx, f.a); return err }},
		{what: "list Machine A by field selector", allow: true, do: func(ctx context.Context) error { return c.listMachines(ctx, "metadata.name="+f.a) }},
		{what: "watch Machine A by field selector", allow: true, do: func(ctx context.Context) error { return c.watchMachine(ctx, f.a) }},
		{what: "update Machine A's status", allow: true, do: func(ctx context.Context) error {
			return c.patchMachine(ctx, f.a, "status", `{"status":{"phase":"Ready","agent":{"version":"test"}}}`)
		}},
		{what: "update Machine A's spec (unfence)", allow: false, do: func(ctx context.Context) error {
			return c.patchMachine(ctx, f.a, "", `{"spec":{"allocation":{"name":"x","fenced":false}}}`)
		}},
		{what: "get Machine B", allow: false, do: func(ctx context.Context) error { _, err := c.getMachine(ctx, f.b); return err }},
		{what: "get Machine B's status", allow: false, do: func(ctx context.Context) error {
			return c.api.Get().Resource(api.ResourceMachines).Name(f.b).SubResource("status").Do(ctx).Error()
		}},
		{what: "list all Machines", allow: false, do: func(ctx context.Context) error { return c.listMachines(ctx, "") }},
		{what: "watch Machine B by field selector", allow: false, do: func(ctx context.Context) error { return c.watchMachine(ctx, f.b) }},
		{what: "update Machine B's status", allow: false, do: func(ctx context.Context) error {
			return c.patchMachine(ctx, f.b, "status", `{"status":{"phase":"Failed"}}`)
		}},
		{what: "list Secrets in all namespaces", allow: false, do: func(ctx context.Context) error {
			_, err := c.kube.CoreV1().Secrets("").List(ctx, metav1.ListOptions{})
			return err
		}},
		{what: "list Secrets in kube-system", allow: false, do: func(ctx context.Context) error {
			_, err := c.kube.CoreV1().Secrets("kube-system").List(ctx, metav1.ListOptions{})
			return err
		}},
		{what: "get a Secret in kube-system", allow: false, do: func(ctx context.Context) error {
			_, err := c.kube.CoreV1().Secrets("kube-system").Get(ctx, f.secret, metav1.GetOptions{})
			return err
		}},
		{what: "delete Machine A", allow: false, do: func(ctx context.Context) error {
			return c.api.Delete().Resource(api.ResourceMachines).Name(f.a).Do(ctx).Error()
		}},
		{what: "get MachineAllocations", allow: false, do: func(ctx context.Context) error {
			return c.api.Get().Resource(api.ResourceMachineAllocations).Do(ctx).Error()
		}},
		{what: "create a CSR", allow: true, do: func(ctx context.Context) error { return c.createCSR(ctx, f.a) }},
		{what: "create an Event in default", allow: true, do: func(ctx context.Context) error { return c.createEvent(ctx, "default", f.a) }},
		{what: "create an Event in kube-system", allow: false, do: func(ctx context.Context) error { return c.createEvent(ctx, "kube-system", f.a) }},
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
	waitAllowed(t, c, authzv1.ResourceAttributes{Group: api.GroupName, Resource: api.ResourceMachines, Verb: "get", Name: f.a})
	// The kubelet's TLS bootstrap with this token: kube-controller-manager's
	// approver approves a kubelet client CSR only when its requester may
	// create certificatesigningrequests/nodeclient (kubeadm's grant).
	waitAllowed(t, c, authzv1.ResourceAttributes{Group: "certificates.k8s.io", Resource: "certificatesigningrequests", Subresource: "nodeclient", Verb: "create"})

	exps := f.common(c)
	exps = append(exps,
		expectation{what: "TokenReview of its own token", allow: true, do: func(ctx context.Context) error { return c.reviewToken(ctx, token) }},
		// The daemon's business, on the certificate only.
		expectation{what: "list its MachineOperations", allow: false, do: func(ctx context.Context) error { return c.listOperations(ctx, f.a) }},
		expectation{what: "update its MachineOperation's status", allow: false, do: func(ctx context.Context) error { return c.updateOperationStatus(ctx, f.opA) }},
		expectation{what: "get Node A", allow: false, do: func(ctx context.Context) error {
			_, err := c.kube.CoreV1().Nodes().Get(ctx, f.a, metav1.GetOptions{})
			return err
		}},
		expectation{what: "list pods", allow: false, do: func(ctx context.Context) error {
			_, err := c.kube.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
			return err
		}},
	)
	check(t, c.name, exps)
}

func TestCertificateIdentityCanDoExactlyWhatIsGranted(t *testing.T) {
	env := kubeenv.Get(t)
	f := newFixture(t, env)
	// The subject lib/kube puts into the agent's CSR.
	c := newCaller(t, identity.AgentUserName(f.a), env.CertConfig(env.MintClientCert(t, identity.AgentUserName(f.a), identity.AgentGroup)))
	waitAllowed(t, c, authzv1.ResourceAttributes{Group: api.GroupName, Resource: api.ResourceMachines, Verb: "get", Name: f.a})
	waitAllowed(t, c, authzv1.ResourceAttributes{Resource: "nodes", Verb: "get", Name: f.a})

	exps := f.common(c)
	exps = append(exps,
		expectation{what: "TokenReview", allow: false, do: func(ctx context.Context) error { return c.reviewToken(ctx, "abcdef.0123456789abcdef") }},
		expectation{what: "list its MachineOperations by label", allow: true, do: func(ctx context.Context) error { return c.listOperations(ctx, f.a) }},
		expectation{what: "update its MachineOperation's status", allow: true, do: func(ctx context.Context) error { return c.updateOperationStatus(ctx, f.opA) }},
		expectation{what: "update B's MachineOperation's status", allow: false, policy: true, do: func(ctx context.Context) error { return c.updateOperationStatus(ctx, f.opB) }},
		expectation{what: "change its MachineOperation's spec", allow: false, do: func(ctx context.Context) error {
			return c.api.Patch(types.MergePatchType).Resource(api.ResourceMachineOperations).Name(f.opA).
				Body([]byte(`{"spec":{"operation":"Reboot"}}`)).Do(ctx).Error()
		}},
		expectation{what: "create a MachineOperation", allow: false, do: func(ctx context.Context) error {
			return c.api.Post().Resource(api.ResourceMachineOperations).Body(&api.MachineOperation{
				ObjectMeta: metav1.ObjectMeta{GenerateName: "x-", Labels: map[string]string{api.MachineLabel: f.b}},
				Spec:       api.MachineOperationSpec{MachineRef: api.MachineRef{Name: f.b}, Operation: api.OperationReboot},
			}).Do(ctx).Error()
		}},
		expectation{what: "get Node A", allow: true, do: func(ctx context.Context) error {
			_, err := c.kube.CoreV1().Nodes().Get(ctx, f.a, metav1.GetOptions{})
			return err
		}},
		expectation{what: "cordon Node A", allow: true, do: func(ctx context.Context) error {
			_, err := c.kube.CoreV1().Nodes().Patch(ctx, f.a, types.MergePatchType, []byte(`{"spec":{"unschedulable":true}}`), metav1.PatchOptions{})
			return err
		}},
		expectation{what: "watch Node A by field selector", allow: true, do: func(ctx context.Context) error {
			w, err := c.kube.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + f.a})
			if err == nil {
				w.Stop()
			}
			return err
		}},
		expectation{what: "get Node B", allow: false, do: func(ctx context.Context) error {
			_, err := c.kube.CoreV1().Nodes().Get(ctx, f.b, metav1.GetOptions{})
			return err
		}},
		expectation{what: "cordon Node B", allow: false, do: func(ctx context.Context) error {
			_, err := c.kube.CoreV1().Nodes().Patch(ctx, f.b, types.MergePatchType, []byte(`{"spec":{"unschedulable":true}}`), metav1.PatchOptions{})
			return err
		}},
		expectation{what: "list all Nodes", allow: false, do: func(ctx context.Context) error {
			_, err := c.kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
			return err
		}},
		expectation{what: "list pods on Node A (drain)", allow: true, do: func(ctx context.Context) error {
			_, err := c.kube.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + f.a})
			return err
		}},
		expectation{what: "delete a pod", allow: false, do: func(ctx context.Context) error {
			return c.kube.CoreV1().Pods("default").Delete(ctx, "anything", metav1.DeleteOptions{})
		}},
		expectation{what: "delete Node A (before a repave)", allow: true, do: func(ctx context.Context) error {
			return c.kube.CoreV1().Nodes().Delete(ctx, f.a, metav1.DeleteOptions{})
		}},
	)
	check(t, c.name, exps)
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
