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
// that forbids one is retried until then), the wait for the evicted and
// the terminating pods to be gone (their deletions' grace periods), and
// the retries of requests that got no answer. kubectl drain has no bound
// by default; a repave that waits forever holds the host, so it has one.
const DefaultDrainTimeout = 5 * time.Minute

// DefaultRetryFor bounds the retries of one GetNode, SetUnschedulable or
// DeleteNode whose context has no sooner deadline: long enough to ride
// out a restart of the API server (a control plane upgrade), short enough
// that a repave that cannot ask the cluster says so (exit 75), or, forced,
// goes on, within a minute.
const DefaultRetryFor = time.Minute

// ErrDrainTimeout is wrapped by a drain that did not finish within its
// timeout; the error names the pods that were left and why.
var ErrDrainTimeout = errors.New("drain did not finish within its timeout")

// ErrUnmanagedPods is wrapped by a drain that found pods without a
// controller (no ownerReference with controller=true) and was not told to
// evict them (Drainer.DeleteUnmanaged): nothing creates such a pod again,
// so evicting it loses it for good. kubectl drain refuses them alike
// unless --force. The drain stops before it evicts anything more, and the
// error names each pod; the caller fails and says which setting lets them
// go.
var ErrUnmanagedPods = errors.New("pods without a controller, which an eviction loses for good")

// Drainer cordons, drains and deletes one Node, as `kubectl drain` and
// `kubectl delete node` do, with the daemon's certificate (the cluster's
// RBAC and admission policies let an agent cordon and delete only its own
// Node, list pods and create evictions; lib/api/manifests). Every request
// that gets no answer is tried again (retryBackoff), within Timeout in
// Drain, within RetryFor (or the context's deadline) in the other calls.
type Drainer struct {
	// Node is the Node's name.
	Node string
	// Timeout bounds Drain; 0 is DefaultDrainTimeout.
	Timeout time.Duration
	// Poll is the period of the retries of a refused eviction (a 429
	// from a PDB) and of the wait for the pods to be gone; 0 is 2 s.
	Poll time.Duration
	// DeleteUnmanaged evicts the pods without a controller too, instead
	// of refusing the drain (ErrUnmanagedPods).
	DeleteUnmanaged bool
	// RetryFor bounds the retries of GetNode, SetUnschedulable and
	// DeleteNode (a sooner deadline of their context wins); 0 is
	// DefaultRetryFor.
	RetryFor time.Duration
	Log      *slog.Logger

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

// retryUntil is the bound of the retries of a call outside Drain.
func (d *Drainer) retryUntil() time.Time {
	if d.RetryFor > 0 {
		return time.Now().Add(d.RetryFor)
	}
	return time.Now().Add(DefaultRetryFor)
}

// retry is Retry with the Drainer's log and Node.
func (d *Drainer) retry(ctx context.Context, until time.Time, what string, retriable func(error) bool, call func(context.Context) error) error {
	return Retry(ctx, until, d.log().With("node", d.Node), what, retriable, call)
}

// GetNode reads the Node; a Node that does not exist is (nil, nil).
func (d *Drainer) GetNode(ctx context.Context) (*corev1.Node, error) {
	var n *corev1.Node
	err := d.retry(ctx, d.retryUntil(), "get node", NoAnswer, func(ctx context.Context) error {
		got := &corev1.Node{}
		err := d.core.Get().Resource("nodes").Name(d.Node).Do(ctx).Into(got)
		if apierrors.IsNotFound(err) {
			n = nil
			return nil
		}
		n = got
		return err
	})
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
	verb := "cordon"
	if !on {
		verb = "uncordon"
	}
	body := fmt.Sprintf(`{"spec":{"unschedulable":%t}}`, on)
	err := d.retry(ctx, d.retryUntil(), verb+" node", NoAnswer, func(ctx context.Context) error {
		err := d.core.Patch(types.MergePatchType).Resource("nodes").Name(d.Node).Body([]byte(body)).Do(ctx).Error()
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("%s node %s: %w", verb, d.Node, err)
	}
	return nil
}

// DeleteNode deletes the Node; one that is gone already is no error (also
// when a try whose answer was lost deleted it).
func (d *Drainer) DeleteNode(ctx context.Context) error {
	err := d.retry(ctx, d.retryUntil(), "delete node", NoAnswer, func(ctx context.Context) error {
		err := d.core.Delete().Resource("nodes").Name(d.Node).Do(ctx).Error()
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	})
	if err != nil {
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

// evictionRetriable: an eviction that got no answer is tried again at
// once (retryBackoff), but a 429 is a PodDisruptionBudget's "not now",
// which Drain asks again every Poll.
func evictionRetriable(err error) bool {
	return NoAnswer(err) && !apierrors.IsTooManyRequests(err)
}

// Drain evicts every pod on the Node that kubectl drain would (see
// Skipped) through the eviction API, so that PodDisruptionBudgets hold: a
// refused eviction (429) is retried every Poll until the timeout. It then
// waits, within the same timeout, until the evicted pods are gone (the
// pod with the same name and a new UID is another pod).
//
// Unlike kubectl drain's defaults: a pod without a controller refuses the
// drain (ErrUnmanagedPods) before anything more is evicted, unless
// DeleteUnmanaged; a pod with local storage (emptyDir) is evicted, since a
// repave deletes the Node and rebuilds its slot, so that storage goes
// whether the pod is evicted or killed, and an eviction at least holds
// the budgets and the grace period. A pod already terminating
// (deletionTimestamp set, by whoever) is not evicted again: its deletion
// runs, and it is waited for like an evicted one.
//
// Every request that gets no answer is tried again within the timeout.
// The Node should be cordoned first, so that nothing new is scheduled
// onto it. A drain that does not finish in time returns an error wrapping
// ErrDrainTimeout that names each pod left and the last answer for it.
func (d *Drainer) Drain(ctx context.Context) error {
	timeout := d.Timeout
	if timeout <= 0 {
		timeout = DefaultDrainTimeout
	}
	deadline := time.Now().Add(timeout)
	parent := ctx
	// The requests of a pass begun before the deadline have room to end.
	ctx, cancel := context.WithDeadline(ctx, deadline.Add(5*time.Second))
	defer cancel()
	evicted := map[types.UID]string{} // uid -> namespace/name
	waited := map[types.UID]bool{}    // terminating when found: not evicted
	last := map[string]string{}       // namespace/name -> why it is still there
	var left []string
	timedOut := func(cause error) error {
		slices.Sort(left)
		var b strings.Builder
		for _, k := range left {
			fmt.Fprintf(&b, "; %s: %s", k, last[k])
		}
		if cause != nil {
			return fmt.Errorf("%w (%s) on node %s: %w; %d pod(s) left at the last answer%s", ErrDrainTimeout, timeout, d.Node, cause, len(left), b.String())
		}
		return fmt.Errorf("%w (%s) on node %s: %d pod(s) left%s", ErrDrainTimeout, timeout, d.Node, len(left), b.String())
	}
	start := time.Now()
	for {
		var pods []corev1.Pod
		err := d.retry(ctx, deadline, "list pods", NoAnswer, func(ctx context.Context) (err error) {
			pods, err = d.pods(ctx)
			return err
		})
		switch {
		case err == nil:
		case parent.Err() != nil:
			return fmt.Errorf("drain node %s: %w", d.Node, parent.Err())
		case NoAnswer(err):
			return timedOut(err) // no answer until the deadline
		default:
			return fmt.Errorf("drain node %s: %w", d.Node, err)
		}
		left = left[:0]
		var toEvict []*corev1.Pod
		var unmanaged []string
		for i := range pods {
			p := &pods[i]
			key := p.Namespace + "/" + p.Name
			if why := Skipped(p); why != "" {
				continue
			}
			if _, ok := evicted[p.UID]; ok {
				left = append(left, key)
				last[key] = "evicted, waiting for it to end (" + deletionGrace(p) + ")"
				continue
			}
			if p.DeletionTimestamp != nil {
				// An eviction would only ask for the deletion that
				// runs already; its grace is the one that counts.
				left = append(left, key)
				last[key] = "terminating, not evicted again: waiting for it to end (" + deletionGrace(p) + ")"
				if !waited[p.UID] {
					waited[p.UID] = true
					d.log().Info("pod terminating already: waiting for it, not evicting it", "pod", key, "node", d.Node, "grace", deletionGrace(p))
				}
				continue
			}
			if metav1.GetControllerOf(p) == nil && !d.DeleteUnmanaged {
				unmanaged = append(unmanaged, key)
			}
			toEvict = append(toEvict, p)
		}
		if len(unmanaged) > 0 {
			slices.Sort(unmanaged)
			done := "nothing was evicted"
			if len(evicted) > 0 {
				done = fmt.Sprintf("nothing more was evicted (%d pod(s) were, before these appeared)", len(evicted))
			}
			return fmt.Errorf("drain node %s: %w: %s (no ownerReference with controller=true: nothing would create them again); %s",
				d.Node, ErrUnmanagedPods, strings.Join(unmanaged, ", "), done)
		}
		for _, p := range toEvict {
			key := p.Namespace + "/" + p.Name
			left = append(left, key)
			err := d.retry(ctx, deadline, "evict pod "+key, evictionRetriable, func(ctx context.Context) error { return d.evict(ctx, p) })
			switch {
			case err == nil:
				evicted[p.UID] = key
				last[key] = "evicted, waiting for it to end"
				d.log().Info("pod evicted", "pod", key, "node", d.Node)
			case apierrors.IsTooManyRequests(err):
				// A PodDisruptionBudget does not allow it now.
				last[key] = "eviction refused (429): " + err.Error()
			case NoAnswer(err):
				last[key] = "eviction failed: " + err.Error() // retried until the deadline
			default:
				return fmt.Errorf("drain node %s: evict %s: %w", d.Node, key, err)
			}
		}
		if len(left) == 0 {
			d.log().Info("node drained", "node", d.Node, "evicted", len(evicted), "waited_for_terminating", len(waited),
				"took", time.Since(start).Round(time.Millisecond).String())
			return nil
		}
		if time.Now().After(deadline) {
			return timedOut(nil)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("drain node %s: %w", d.Node, ctx.Err())
		case <-time.After(d.poll()):
		}
	}
}

// deletionGrace describes the deletion under way of p: its grace period
// (metadata.deletionGracePeriodSeconds, which the deleter chose; the
// spec's terminationGracePeriodSeconds is only its default) and when it
// ends (metadata.deletionTimestamp).
func deletionGrace(p *corev1.Pod) string {
	s := "deletion grace period "
	if g := p.DeletionGracePeriodSeconds; g != nil {
		s += fmt.Sprintf("%ds", *g)
	} else {
		s += "unknown"
	}
	if t := p.DeletionTimestamp; t != nil {
		s += ", ending " + t.UTC().Format(time.RFC3339)
	}
	return s
}

func evictionBody(ev *policyv1.Eviction) []byte {
	data, _ := json.Marshal(ev) // a struct of strings: cannot fail
	return data
}
