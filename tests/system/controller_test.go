package system_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	"k8s.io/utils/ptr"

	"unbounded-cloud.io/agent/lib/csrapproval"
)

// The cluster side as the manifests ship it (lib/api/manifests/controller).
const (
	controllerNamespace  = "unbounded-system"
	controllerDeployment = "unbounded-controller"
)

// deployController runs unbounded-controller in host's cluster as an
// operator does: its image (make images) pushed to the registry the hosts
// pull from, and what `unbounded manifests --controller-image REF@DIGEST`
// prints (the CLI installed on host, run here) applied as `kubectl apply
// --server-side` applies it, unchanged. It returns the image reference.
func deployController(t *testing.T, host *firstBoot, img v1.Image) string {
	t.Helper()
	digest, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	ref := host.reg.Push(t, "unbounded/unbounded-controller:test", img) + "@" + digest.String()
	out, err := exec.Command(filepath.Join(host.m.Root(), "usr/bin/unbounded"), "manifests", "--controller-image", ref).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%w: %s", err, ee.Stderr)
		}
		t.Fatalf("unbounded manifests --controller-image %s: %v", ref, err)
	}
	env := host.env
	disc, err := discovery.NewDiscoveryClientForConfig(env.admin)
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disc))
	dyn := dynamic.NewForConfigOrDie(env.admin)
	ctx := context.Background()
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(out)))
	applied := 0
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		var obj unstructured.Unstructured
		if err := utilyaml.Unmarshal(doc, &obj.Object); err != nil {
			t.Fatalf("a document of the manifests: %v\n%s", err, doc)
		}
		if len(obj.Object) == 0 {
			continue // comments only
		}
		gvk := obj.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			t.Fatalf("%s %s of the manifests: %v", gvk.Kind, obj.GetName(), err)
		}
		// Applied as kubectl apply --server-side does: the manifests
		// the cluster has already (the CRDs, the agents' RBAC) stay.
		data, err := json.Marshal(obj.Object)
		if err != nil {
			t.Fatal(err)
		}
		ri := dyn.Resource(m.Resource).Namespace(obj.GetNamespace())
		if _, err := ri.Patch(ctx, obj.GetName(), types.ApplyPatchType, data, metav1.PatchOptions{FieldManager: "unbounded-system-test", Force: ptr.To(true)}); err != nil {
			t.Fatalf("apply %s %s: %v", gvk.Kind, obj.GetName(), err)
		}
		applied++
	}
	if applied == 0 {
		t.Fatalf("unbounded manifests --controller-image printed no object:\n%s", out)
	}
	t.Logf("unbounded-controller deployed from %s: %d objects applied", ref, applied)
	return ref
}

// waitControllerAvailable waits until n replicas of the controller are
// available, saying where its pods stand when they are not.
func waitControllerAvailable(t *testing.T, env *kubeEnv, n int32, within time.Duration) {
	t.Helper()
	defer func() {
		if t.Failed() {
			t.Logf("the controller's pods: %s", controllerPods(env))
		}
	}()
	waitUntil(t, within, fmt.Sprintf("%d replica(s) of the controller available", n), func(ctx context.Context) (bool, error) {
		d, err := env.kube.AppsV1().Deployments(controllerNamespace).Get(ctx, controllerDeployment, metav1.GetOptions{})
		return err == nil && d.Status.AvailableReplicas >= n, nil
	})
}

// controllerPods says where the controller's pods are and how they stand.
func controllerPods(env *kubeEnv) string {
	ctx := context.Background()
	pods, err := env.kube.CoreV1().Pods(controllerNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	if d, err := env.kube.AppsV1().Deployments(controllerNamespace).Get(ctx, controllerDeployment, metav1.GetOptions{}); err != nil {
		fmt.Fprintf(&b, "\n  Deployment: %v", err)
	} else {
		for _, c := range d.Status.Conditions {
			fmt.Fprintf(&b, "\n  Deployment %s=%s %s %s", c.Type, c.Status, c.Reason, c.Message)
		}
	}
	if rss, err := env.kube.AppsV1().ReplicaSets(controllerNamespace).List(ctx, metav1.ListOptions{}); err == nil {
		for _, rs := range rss.Items {
			for _, c := range rs.Status.Conditions {
				fmt.Fprintf(&b, "\n  ReplicaSet %s %s=%s %s %s", rs.Name, c.Type, c.Status, c.Reason, c.Message)
			}
		}
	}
	for _, p := range pods.Items {
		fmt.Fprintf(&b, "\n  pod %s on %q: %s", p.Name, p.Spec.NodeName, p.Status.Phase)
		for _, c := range p.Status.Conditions {
			if c.Status != corev1.ConditionTrue {
				fmt.Fprintf(&b, "; %s %s %s", c.Type, c.Reason, c.Message)
			}
		}
		for _, cs := range p.Status.ContainerStatuses {
			fmt.Fprintf(&b, "; restarts %d", cs.RestartCount)
			if w := cs.State.Waiting; w != nil {
				fmt.Fprintf(&b, ", waiting: %s %s", w.Reason, w.Message)
			}
			if w := cs.LastTerminationState.Terminated; w != nil {
				fmt.Fprintf(&b, ", last ended: %s (%d) %s", w.Reason, w.ExitCode, w.Message)
			}
		}
	}
	ev, err := env.kube.CoreV1().Events(controllerNamespace).List(ctx, metav1.ListOptions{})
	if err == nil {
		for _, e := range ev.Items {
			if e.Type != corev1.EventTypeNormal {
				fmt.Fprintf(&b, "\n  event %s/%s: %s %s", e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Reason, e.Message)
			}
		}
	}
	return b.String()
}

// wantApprovedByController asserts that the host's CSRs, its daemon's
// (kubernetes.io/kube-apiserver-client) and its kubelet's serving one,
// were approved, and by unbounded-controller (its reason), nothing else.
func wantApprovedByController(t *testing.T, f *firstBoot) {
	t.Helper()
	l, err := f.env.kube.CertificatesV1().CertificateSigningRequests().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, c := range l.Items {
		var kind string
		switch {
		case c.Spec.SignerName == certificatesv1.KubeAPIServerClientSignerName && strings.HasPrefix(c.Name, "unbounded-agent-"+f.name+"-"):
			kind = "the daemon's client certificate"
		case c.Spec.SignerName == certificatesv1.KubeletServingSignerName && c.Spec.Username == "system:node:"+f.name:
			kind = "the kubelet's serving certificate"
		default:
			continue
		}
		for _, cond := range c.Status.Conditions {
			switch {
			case cond.Type == certificatesv1.CertificateApproved && cond.Reason == csrapproval.ReasonApproved:
				seen[kind]++
				t.Logf("%s: CSR %s for %s approved by the controller: %s", f.name, c.Name, kind, cond.Message)
			default:
				t.Errorf("%s: CSR %s for %s: %s %s %q, want approved by unbounded-controller (reason %s) alone", f.name, c.Name, kind, cond.Type, cond.Reason, cond.Message, csrapproval.ReasonApproved)
			}
		}
	}
	for _, kind := range []string{"the daemon's client certificate", "the kubelet's serving certificate"} {
		if seen[kind] == 0 {
			t.Errorf("%s: no CSR for %s approved by the controller", f.name, kind)
		}
	}
}

// routeKubernetesService does for the host what kube-proxy does for the
// `kubernetes` Service on a node, which the test cluster has not (its
// API server listens on loopback, which each test host reaches on its
// own): connections of the host's pods to the Service's ClusterIP and
// port are sent to the API server (a DNAT rule in the host's network
// namespace, which the node shares, made by the node's own iptables), on
// the loopback address of the host, which route_localnet lets them reach
// (kube-proxy's --iptables-localhost-nodeports sets it alike). Pods then
// use in-cluster configuration as in any cluster: KUBERNETES_SERVICE_HOST
// and _PORT from their kubelet, the API server's certificate naming the
// ClusterIP.
func routeKubernetesService(t *testing.T, f *firstBoot) {
	t.Helper()
	ctx := context.Background()
	svc, err := f.env.kube.CoreV1().Services(metav1.NamespaceDefault).Get(ctx, "kubernetes", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(svc.Spec.Ports) == 0 {
		t.Fatalf("the kubernetes Service has no port: %+v", svc.Spec)
	}
	// Its endpoint: the API server's address (on loopback, which the API
	// server cannot write into Endpoints: their validation refuses
	// loopback addresses; the test cluster keeps none).
	api, err := url.Parse(f.env.admin.Host)
	if err != nil {
		t.Fatal(err)
	}
	to := api.Host
	rule := fmt.Sprintf("echo 1 >/proc/sys/net/ipv4/conf/all/route_localnet && iptables -w -t nat -A PREROUTING -d %s/32 -p tcp --dport %d -j DNAT --to-destination %s",
		svc.Spec.ClusterIP, svc.Spec.Ports[0].Port, to)
	if out, err := f.m.Run("unbounded", "exec", "--", "sh", "-c", rule); err != nil {
		t.Fatalf("%s: the kubernetes Service's route (%s): %v\n%s", f.name, rule, err, out)
	}
	t.Logf("%s: pods reach the kubernetes Service %s:%d at %s", f.name, svc.Spec.ClusterIP, svc.Spec.Ports[0].Port, to)
}
