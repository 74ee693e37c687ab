package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
)

// The drain's client speaks core/v1 (Nodes, Pods, and policy/v1
// Evictions posted to a pod's eviction subresource) through a plain REST
// client: client-go's typed clientset
// registers every API group at start (binary size, see the daemon's
// cluster.go).
var (
	drainScheme         = runtime.NewScheme()
	drainCodecs         = serializer.NewCodecFactory(drainScheme)
	drainParameterCodec = runtime.NewParameterCodec(drainScheme)
)

func init() {
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, policyv1.AddToScheme} {
		if err := add(drainScheme); err != nil {
			panic(err)
		}
	}
}

// DefaultDrainTimeout bounds a drain: the evictions (a PodDisruptionBudget
// that forbids one is retried until then) and the wait for the evicted
// pods to be gone (their grace periods). kubectl drain has no bound by
// default; a repave that waits forever holds the host, so it has one.
const DefaultDrainTimeout = 5 * time.Minute

// ErrDrainTimeout is wrapped by a drain that did not finish within its
// timeout; the error names the pods that were left and why.
var ErrDrainTimeout = errors.New("drain did not finish within its timeout")

// Drainer cordons, drains and deletes one Node, as `kubectl drain` and
// `kubectl delete node` do, with the daemon's certificate (the cluster's
// RBAC and admission policies let an agent cordon and delete only its own
// Node, list pods and create evictions; lib/api/manifests).
type Drainer struct {
	// Node is the Node's name.
	Node string
	// Timeout bounds Drain; 0 is DefaultDrainTimeout.
	Timeout time.Duration
	// Poll is the period of the retries (a 429 from a PDB) and of the
	// wait for evicted pods; 0 is 2 s.
	Poll time.Duration
	Log  *slog.Logger

	core rest.Interface
}

// NewDrainer returns a Drainer for node with the credential of cfg.
func NewDrainer(cfg *rest.Config, node string) (*Drainer, error) {
	cc := rest.CopyConfig(cfg)
	cc.GroupVersion = &corev1.SchemeGroupVersion
	cc.APIPath = "/api"
	cc.NegotiatedSerializer = drainCodecs.WithoutConversion()
	cc.ContentType = runtime.ContentTypeJSON
	core, err := rest.RESTClientFor(cc)
	if err != nil {
		return nil, fmt.Errorf("core client: %w", err)
	}
	return &Drainer{Node: node, core: core}, nil
}

func (d *Drainer) log() *slog.Logger {
	if d.Log != nil {
		return d.Log
	}
	return slog.Default()
}

func (d *Drainer) poll() time.Duration {
	if d.Poll > 0 {
		return d.Poll
	}
	return 2 * time.Second
}

// GetNode reads the Node; a Node that does not exist is (nil, nil).
func (d *Drainer) GetNode(ctx context.Context) (*corev1.Node, error) {
	n := &corev1.Node{}
	err := d.core.Get().Resource("nodes").Name(d.Node).Do(ctx).Into(n)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("get node %s: %w", d.Node, err)
	}
	return n, nil
}

// SetUnschedulable cordons (true) or uncordons (false) the Node with a
// merge patch of spec.unschedulable only (the admission policy allows an
// agent no other change). A Node that does not exist is no error: there
// is nothing to cordon, and an uncordon after it was deleted is moot (the
// kubelet registers a new Node schedulable).
func (d *Drainer) SetUnschedulable(ctx context.Context, on bool) error {
	body := fmt.Sprintf(`{"spec":{"unschedulable":%t}}`, on)
	err := d.core.Patch(types.MergePatchType).Resource("nodes").Name(d.Node).Body([]byte(body)).Do(ctx).Error()
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		verb := "cordon"
		if !on {
			verb = "uncordon"
		}
		return fmt.Errorf("%s node %s: %w", verb, d.Node, err)
	}
	return nil
}

// DeleteNode deletes the Node; one that is gone already is no error.
func (d *Drainer) DeleteNode(ctx context.Context) error {
	err := d.core.Delete().Resource("nodes").Name(d.Node).Do(ctx).Error()
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete node %s: %w", d.Node, err)
	}
	return nil
}

// pods lists the pods bound to the Node.
func (d *Drainer) pods(ctx context.Context) ([]corev1.Pod, error) {
	out := &corev1.PodList{}
	opts := metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("spec.nodeName", d.Node).String()}
	err := d.core.Get().Resource("pods").VersionedParams(&opts, drainParameterCodec).Do(ctx).Into(out)
	if err != nil {
		return nil, fmt.Errorf("list pods on node %s: %w", d.Node, err)
	}
	return out.Items, nil
}

// Skipped says why kubectl drain leaves a pod in place ("" when it
// evicts it): a mirror pod (the kubelet's static pod: evicting it does
// nothing, the kubelet owns it), a DaemonSet's pod (its controller would
// put it back at once, and it tolerates the cordon), or a pod that has
// finished (nothing runs).
func Skipped(p *corev1.Pod) string {
	if _, ok := p.Annotations[corev1.MirrorPodAnnotationKey]; ok {
		return "mirror pod"
	}
	if c := metav1.GetControllerOf(p); c != nil && c.Kind == "DaemonSet" {
		return "DaemonSet pod"
	}
	if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		return "finished"
	}
	return ""
}

// evict asks the eviction API to evict p. A 429 is a PodDisruptionBudget
// that does not allow it now (retried by the caller), a 404 a pod gone
// already.
func (d *Drainer) evict(ctx context.Context, p *corev1.Pod) error {
	ev := &policyv1.Eviction{
		TypeMeta:   metav1.TypeMeta{APIVersion: "policy/v1", Kind: "Eviction"},
		ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace},
	}
	err := d.core.Post().Namespace(p.Namespace).Resource("pods").Name(p.Name).SubResource("eviction").Body(evictionBody(ev)).Do(ctx).Error()
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// Drain evicts every pod on the Node that kubectl drain would (see
// Skipped) through the eviction API, so that PodDisruptionBudgets hold: a
// refused eviction (429) is retried every Poll until the timeout. It then
// waits, within the same timeout, until the evicted pods are gone (the
// pod with the same name and a new UID is another pod). The Node should be
// cordoned first, so that nothing new is scheduled onto it. A drain that
// does not finish in time returns an error wrapping ErrDrainTimeout that
// names each pod left and the last answer for it.
func (d *Drainer) Drain(ctx context.Context) error {
	timeout := d.Timeout
	if timeout <= 0 {
		timeout = DefaultDrainTimeout
	}
	deadline := time.Now().Add(timeout)
	ctx, cancel := context.WithDeadline(ctx, deadline.Add(5*time.Second))
	defer cancel()
	evicted := map[types.UID]string{} // uid -> namespace/name
	last := map[string]string{}       // namespace/name -> why it is still there
	start := time.Now()
	for {
		pods, err := d.pods(ctx)
		if err != nil {
			return err
		}
		var left []string
		for i := range pods {
			p := &pods[i]
			key := p.Namespace + "/" + p.Name
			if why := Skipped(p); why != "" {
				continue
			}
			left = append(left, key)
			if _, ok := evicted[p.UID]; ok {
				last[key] = "evicted, waiting for it to end (grace period " + grace(p) + ")"
				continue
			}
			err := d.evict(ctx, p)
			switch {
			case err == nil:
				evicted[p.UID] = key
				last[key] = "evicted, waiting for it to end"
				d.log().Info("pod evicted", "pod", key, "node", d.Node)
			case apierrors.IsTooManyRequests(err):
				// A PodDisruptionBudget does not allow it now.
				last[key] = "eviction refused (429): " + err.Error()
			default:
				last[key] = "eviction failed: " + err.Error()
				if !apierrors.IsInternalError(err) && !apierrors.IsServerTimeout(err) && !apierrors.IsTimeout(err) && !NoAnswer(err) {
					return fmt.Errorf("drain node %s: evict %s: %w", d.Node, key, err)
				}
			}
		}
		if len(left) == 0 {
			d.log().Info("node drained", "node", d.Node, "evicted", len(evicted), "took", time.Since(start).Round(time.Millisecond).String())
			return nil
		}
		if time.Now().After(deadline) {
			slices.Sort(left)
			var b strings.Builder
			for _, k := range left {
				fmt.Fprintf(&b, "; %s: %s", k, last[k])
			}
			return fmt.Errorf("%w (%s) on node %s: %d pod(s) left%s", ErrDrainTimeout, timeout, d.Node, len(left), b.String())
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("drain node %s: %w", d.Node, ctx.Err())
		case <-time.After(d.poll()):
		}
	}
}

func grace(p *corev1.Pod) string {
	if s := p.Spec.TerminationGracePeriodSeconds; s != nil {
		return fmt.Sprintf("%ds", *s)
	}
	return "default"
}

func evictionBody(ev *policyv1.Eviction) []byte {
	data, _ := json.Marshal(ev) // a struct of strings: cannot fail
	return data
}
