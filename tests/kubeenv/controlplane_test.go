package kubeenv

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	certv1 "k8s.io/api/certificates/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// The control plane's controllers and scheduler are tested here against
// Nodes whose kubelet is this test: it registers the Node, reports it
// Ready and renews its Lease as a kubelet does, and stops doing so to play
// a kubelet that stopped. A real kubelet is tested in tests/kube's node
// stack; these tests need none and run in the kubernetes tier.

// nodeGrace is kube-testenv's --node-monitor-grace-period default.
const nodeGrace = 20 * time.Second

func poll(t *testing.T, timeout time.Duration, what string, cond func(ctx context.Context) (bool, error)) {
	t.Helper()
	start := time.Now()
	if err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, timeout, true, cond); err != nil {
		t.Fatalf("%s: not within %v: %v", what, timeout, err)
	}
	t.Logf("%s after %v", what, time.Since(start).Round(time.Millisecond))
}

// namespace creates a namespace for the test, waits until the service
// account controller has given it its default ServiceAccount (pods cannot
// be created before), and deletes it when the test ends.
func namespace(t *testing.T, env *Env) string {
	t.Helper()
	ctx := context.Background()
	ns := UniqueName(t, "ns")
	if _, err := env.Client().CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { env.Client().CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })
	poll(t, 30*time.Second, "ServiceAccount default in "+ns, func(ctx context.Context) (bool, error) {
		_, err := env.Client().CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	})
	return ns
}

// fakeKubelet registers a Node and keeps it alive the way a kubelet does
// (Ready condition, Lease renewed every second) until stop.
type fakeKubelet struct {
	name string
	stop func()
}

func startFakeKubelet(t *testing.T, c kubernetes.Interface) *fakeKubelet {
	t.Helper()
	ctx := context.Background()
	name := UniqueName(t, "node")
	now := metav1.Now()
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("4"),
		corev1.ResourceMemory: resource.MustParse("8Gi"),
		corev1.ResourcePods:   resource.MustParse("110"),
	}
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{corev1.LabelHostname: name}},
		Status: corev1.NodeStatus{
			Capacity:    capacity,
			Allocatable: capacity,
			Conditions: []corev1.NodeCondition{{
				Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
				LastHeartbeatTime: now, LastTransitionTime: now,
			}},
		},
	}
	if _, err := c.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: corev1.NamespaceNodeLease},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity: ptr.To(name), LeaseDurationSeconds: ptr.To[int32](40),
			RenewTime: &metav1.MicroTime{Time: time.Now()},
		},
	}
	if _, err := c.CoordinationV1().Leases(corev1.NamespaceNodeLease).Create(ctx, lease, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.CoordinationV1().Leases(corev1.NamespaceNodeLease).Delete(context.Background(), name, metav1.DeleteOptions{})
	})

	renewCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-renewCtx.Done():
				return
			case <-tick.C:
			}
			l, err := c.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(renewCtx, name, metav1.GetOptions{})
			if err != nil {
				continue
			}
			l.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
			c.CoordinationV1().Leases(corev1.NamespaceNodeLease).Update(renewCtx, l, metav1.UpdateOptions{})
		}
	})
	fk := &fakeKubelet{name: name, stop: func() { cancel(); wg.Wait() }}
	t.Cleanup(fk.stop)
	return fk
}

func TestSchedulerPlacesADeploymentsPodsAndPDBGetsStatus(t *testing.T) {
	t.Parallel()
	env := Get(t)
	ctx := context.Background()
	c := env.Client()
	ns := namespace(t, env)
	node := startFakeKubelet(t, c)

	labels := map[string]string{"app": "web"}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](2),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					// Other tests' Nodes share the cluster: this one's only.
					NodeSelector: map[string]string{corev1.LabelHostname: node.name},
					Containers:   []corev1.Container{{Name: "c", Image: "registry.invalid/never-pulled:1"}},
				},
			},
		},
	}
	if _, err := c.AppsV1().Deployments(ns).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns},
		Spec: policyv1.PodDisruptionBudgetSpec{
			MinAvailable: ptr.To(intstr.FromInt32(1)),
			Selector:     &metav1.LabelSelector{MatchLabels: labels},
		},
	}
	if _, err := c.PolicyV1().PodDisruptionBudgets(ns).Create(ctx, pdb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// deployment controller -> ReplicaSet -> replicaset controller -> Pods
	// -> scheduler -> bound to the Node.
	poll(t, 30*time.Second, "2 pods of the Deployment bound to "+node.name, func(ctx context.Context) (bool, error) {
		pods, err := c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
		if err != nil {
			return false, err
		}
		bound := 0
		for _, p := range pods.Items {
			if p.Spec.NodeName == node.name {
				bound++
			}
		}
		return bound == 2 && len(pods.Items) == 2, nil
	})

	// disruption controller: it counts the pods; none is Ready (no real
	// kubelet runs them), so none may be disrupted.
	poll(t, 30*time.Second, "PDB status", func(ctx context.Context) (bool, error) {
		got, err := c.PolicyV1().PodDisruptionBudgets(ns).Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		s := got.Status
		return s.ObservedGeneration == got.Generation && s.ExpectedPods == 2 && s.DesiredHealthy == 1 && s.CurrentHealthy == 0 && s.DisruptionsAllowed == 0, nil
	})

	// garbage collector: deleting the Deployment takes its ReplicaSet and
	// pods (pods bound to a Node are only marked: their kubelet finishes
	// the deletion, and this one has none).
	rss, err := c.AppsV1().ReplicaSets(ns).List(ctx, metav1.ListOptions{})
	if err != nil || len(rss.Items) != 1 {
		t.Fatalf("ReplicaSets of the Deployment: %v, %v; want one", rss, err)
	}
	if err := c.AppsV1().Deployments(ns).Delete(ctx, "web", metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)}); err != nil {
		t.Fatal(err)
	}
	poll(t, 30*time.Second, "ReplicaSet and pods collected", func(ctx context.Context) (bool, error) {
		if _, err := c.AppsV1().ReplicaSets(ns).Get(ctx, rss.Items[0].Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return false, nil
		}
		pods, err := c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for _, p := range pods.Items {
			if p.DeletionTimestamp == nil {
				return false, nil
			}
		}
		return true, nil
	})
}

func TestNodeGoesNotReadyWhenItsKubeletStops(t *testing.T) {
	t.Parallel()
	env := Get(t)
	c := env.Client()
	node := startFakeKubelet(t, c)

	ready := func(ctx context.Context) (corev1.ConditionStatus, bool, error) {
		n, err := c.CoreV1().Nodes().Get(ctx, node.name, metav1.GetOptions{})
		if err != nil {
			return "", false, err
		}
		unreachable := false
		for _, taint := range n.Spec.Taints {
			unreachable = unreachable || taint.Key == corev1.TaintNodeUnreachable
		}
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				return cond.Status, unreachable, nil
			}
		}
		return "", unreachable, nil
	}
	// While the Lease is renewed the Node stays Ready past the grace period.
	time.Sleep(nodeGrace + 3*time.Second)
	if s, tainted, err := ready(context.Background()); err != nil || s != corev1.ConditionTrue || tainted {
		t.Fatalf("Node %s with a live kubelet: Ready=%q unreachable-taint=%v (%v), want True and untainted", node.name, s, tainted, err)
	}

	node.stop()
	stopped := time.Now()
	poll(t, nodeGrace+30*time.Second, "Node Ready=Unknown and tainted unreachable", func(ctx context.Context) (bool, error) {
		s, tainted, err := ready(ctx)
		return s == corev1.ConditionUnknown && tainted, err
	})
	if d := time.Since(stopped); d < nodeGrace-2*time.Second {
		t.Errorf("Node marked NotReady %v after its kubelet stopped, before the %v grace period", d, nodeGrace)
	}
}

func TestKubeletClientCSRIsAutoApprovedOnlyWithNodeclientRBAC(t *testing.T) {
	t.Parallel()
	env := Get(t)
	ctx := context.Background()
	c := env.Client()

	// The requester is a client certificate user of a group of its own,
	// not a bootstrap token: the project's manifests may grant nodeclient
	// to bootstrap token groups, and this test decides who has it.
	submit := func(t *testing.T, grantNodeclient bool) string {
		user := UniqueName(t, "kubeenv-requester")
		certPEM, keyPEM := env.MintClientCert(t, user, "kubeenv:requesters")
		roles := []string{"system:node-bootstrapper"}
		if grantNodeclient {
			roles = append(roles, "system:certificates.k8s.io:certificatesigningrequests:nodeclient")
		}
		for _, role := range roles {
			b := &rbacv1.ClusterRoleBinding{
				ObjectMeta: metav1.ObjectMeta{Name: UniqueName(t, "crb")},
				RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
				Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}},
			}
			if _, err := c.RbacV1().ClusterRoleBindings().Create(ctx, b, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.RbacV1().ClusterRoleBindings().Delete(context.Background(), b.Name, metav1.DeleteOptions{}) })
		}
		asRequester, err := kubernetes.NewForConfig(env.CertConfig(certPEM, keyPEM))
		if err != nil {
			t.Fatal(err)
		}
		nodeName := UniqueName(t, "node")
		csrPEM, _ := newCSR(t, "system:node:"+nodeName, "system:nodes")
		name := UniqueName(t, "csr")
		csr := &certv1.CertificateSigningRequest{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: certv1.CertificateSigningRequestSpec{
				Request:    csrPEM,
				SignerName: certv1.KubeAPIServerClientKubeletSignerName,
				Usages:     []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageClientAuth},
			},
		}
		// RBAC learns of the bindings through an informer.
		poll(t, 10*time.Second, "CSR created as "+user, func(ctx context.Context) (bool, error) {
			_, err := asRequester.CertificatesV1().CertificateSigningRequests().Create(ctx, csr, metav1.CreateOptions{})
			return err == nil, nil
		})
		t.Cleanup(func() {
			c.CertificatesV1().CertificateSigningRequests().Delete(context.Background(), name, metav1.DeleteOptions{})
		})
		return name
	}

	t.Run("granted", func(t *testing.T) {
		t.Parallel()
		name := submit(t, true)
		cert := env.WaitCSRCertificate(t, name, 30*time.Second)
		got, err := c.CertificatesV1().CertificateSigningRequests().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		approved := ""
		for _, cond := range got.Status.Conditions {
			if cond.Type == certv1.CertificateApproved && cond.Status == corev1.ConditionTrue {
				approved = cond.Reason
			}
		}
		if approved != "AutoApproved" {
			t.Errorf("CSR %s conditions %+v, want Approved by the controller (reason AutoApproved)", name, got.Status.Conditions)
		}
		if len(cert) == 0 {
			t.Error("no certificate")
		}
	})
	t.Run("not granted", func(t *testing.T) {
		t.Parallel()
		name := submit(t, false)
		// Give the approver time to do wrong: it answers a granted CSR
		// within a second here (see "granted").
		time.Sleep(3 * time.Second)
		got, err := c.CertificatesV1().CertificateSigningRequests().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(got.Status.Conditions) != 0 || len(got.Status.Certificate) != 0 {
			t.Errorf("CSR %s of a requester without nodeclient RBAC: conditions %+v, certificate %d bytes; want it left pending", name, got.Status.Conditions, len(got.Status.Certificate))
		}
	})
}

func TestBootstrapTokenControllersSignClusterInfoAndDeleteExpiredTokens(t *testing.T) {
	t.Parallel()
	env := Get(t)
	ctx := context.Background()
	c := env.Client()

	id, secret := RandomTokenID(t)
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "bootstrap-token-" + id, Namespace: metav1.NamespaceSystem},
		Type:       corev1.SecretTypeBootstrapToken,
		StringData: map[string]string{
			"token-id": id, "token-secret": secret,
			"usage-bootstrap-signing": "true",
			"expiration":              time.Now().Add(5 * time.Second).UTC().Format(time.RFC3339),
		},
	}
	if _, err := c.CoreV1().Secrets(metav1.NamespaceSystem).Create(ctx, s, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { env.deleteTokenSecret(id) })

	key := "jws-kubeconfig-" + id
	poll(t, 10*time.Second, "kube-public/cluster-info signed for the token", func(ctx context.Context) (bool, error) {
		cm, err := c.CoreV1().ConfigMaps(metav1.NamespacePublic).Get(ctx, "cluster-info", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return cm.Data[key] != "", nil
	})
	poll(t, 20*time.Second, "expired token Secret deleted", func(ctx context.Context) (bool, error) {
		_, err := c.CoreV1().Secrets(metav1.NamespaceSystem).Get(ctx, s.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	poll(t, 10*time.Second, "its signature removed from cluster-info", func(ctx context.Context) (bool, error) {
		cm, err := c.CoreV1().ConfigMaps(metav1.NamespacePublic).Get(ctx, "cluster-info", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		_, still := cm.Data[key]
		return !still, nil
	})
}

func TestNewNamespaceGetsItsServiceAccountRootCAAndIsDeletedWithItsContent(t *testing.T) {
	t.Parallel()
	env := Get(t)
	ctx := context.Background()
	c := env.Client()
	ns := namespace(t, env)
	poll(t, 30*time.Second, "kube-root-ca.crt in "+ns, func(ctx context.Context) (bool, error) {
		cm, err := c.CoreV1().ConfigMaps(ns).Get(ctx, "kube-root-ca.crt", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		return cm.Data["ca.crt"] == string(env.CAPEM(t)), nil
	})
	// The token controller fills a legacy service account token Secret.
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "legacy", Namespace: ns, Annotations: map[string]string{corev1.ServiceAccountNameKey: "default"}},
		Type:       corev1.SecretTypeServiceAccountToken,
	}
	if _, err := c.CoreV1().Secrets(ns).Create(ctx, sec, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var token string
	poll(t, 30*time.Second, "token in the legacy Secret", func(ctx context.Context) (bool, error) {
		got, err := c.CoreV1().Secrets(ns).Get(ctx, "legacy", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		token = string(got.Data[corev1.ServiceAccountTokenKey])
		return token != "", nil
	})
	// The API server checks a legacy token against its informers' view of
	// the Secret and the ServiceAccount, which can lag the write that
	// filled the token (CI saw "false" once right after the fill).
	want := fmt.Sprintf("system:serviceaccount:%s:default", ns)
	var ok bool
	var user string
	var err error
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		ok, user, _, err = env.TokenAuthenticated(ctx, token)
		if (err == nil && ok && user == want) || time.Now().After(deadline) {
			break
		}
	}
	if err != nil || !ok || user != want {
		t.Errorf("the controller's token authenticates: %v as %q (%v), want %s", ok, user, err, want)
	}

	// namespace controller: deleting the namespace empties and removes it.
	if err := c.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	poll(t, 60*time.Second, "namespace "+ns+" gone", func(ctx context.Context) (bool, error) {
		_, err := c.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
}
