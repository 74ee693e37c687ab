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
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"

	"unbounded-cloud.io/agent/lib/backoff"
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

// DefaultDrainSettle is how long the Node must stay empty of the pods a
// drain evicts before the drain ends. A controller that binds its pods to
// the Node itself (a StatefulSet-like one whose replacement keeps the
// name and spec.nodeName) creates the replacement of an evicted pod a
// moment after it is gone: a drain that ended at the first empty look
// would leave that pod to the repave, which stops the node under it. The
// drain watches the Node's pods through the window; a newcomer is evicted
// like the others, and the window starts again once it is gone. It is
// part of the drain's timeout.
const DefaultDrainSettle = 5 * time.Second

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
	// from a PDB) or of one that got no answer; 0 is 2 s. The wait for
	// the pods to be gone needs none: it watches them.
	Poll time.Duration
	// Settle is how long the Node must have stayed empty of pods to
	// evict before Drain ends; 0 is DefaultDrainSettle. It is at most
	// half the timeout, so that a short timeout leaves the evictions
	// room and an empty Node can be drained within it.
	Settle time.Duration
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

// settle is the settle window of a drain bounded by timeout.
func (d *Drainer) settle(timeout time.Duration) time.Duration {
	s := DefaultDrainSettle
	if d.Settle > 0 {
		s = d.Settle
	}
	return min(s, timeout/2)
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

// podSelector selects the pods bound to the Node.
func (d *Drainer) podSelector() string {
	return fields.OneTermEqualSelector("spec.nodeName", d.Node).String()
}

// pods lists the pods bound to the Node.
func (d *Drainer) pods(ctx context.Context) (*corev1.PodList, error) {
	out := &corev1.PodList{}
	opts := metav1.ListOptions{FieldSelector: d.podSelector()}
	err := d.core.Get().Resource("pods").VersionedParams(&opts, drainParameterCodec).Do(ctx).Into(out)
	if err != nil {
		return nil, fmt.Errorf("list pods on node %s: %w", d.Node, err)
	}
	return out, nil
}

// watchPods watches the pods bound to the Node from resourceVersion rv.
func (d *Drainer) watchPods(ctx context.Context, rv string) (watch.Interface, error) {
	opts := metav1.ListOptions{FieldSelector: d.podSelector(), ResourceVersion: rv, AllowWatchBookmarks: true, Watch: true}
	w, err := d.core.Get().Resource("pods").VersionedParams(&opts, drainParameterCodec).Watch(ctx)
	if apierrors.IsForbidden(err) {
		// The daemon's ClusterRole of an older `unbounded manifests`
		// lets it list pods, not watch them.
		return nil, fmt.Errorf("watch pods on node %s (the cluster's RBAC must be that of this agent's `unbounded manifests`): %w", d.Node, err)
	}
	if err != nil {
		return nil, fmt.Errorf("watch pods on node %s: %w", d.Node, err)
	}
	return w, nil
}

// Expired says whether err is the API server's answer that a watch's or
// list's resourceVersion is too old (410 Gone, or the Expired reason): the
// caller lists again.
func Expired(err error) bool {
	return apierrors.IsGone(err) || apierrors.IsResourceExpired(err)
}

// nodePods is the drain's view of the pods bound to the Node: a list,
// then a watch from the list's resourceVersion (field selector
// spec.nodeName) that keeps it current. A watch that ends is resumed
// from the last resourceVersion seen; one whose resourceVersion expired
// is replaced by a list again. Not a client-go informer: its reflector
// retries every failed list forever (a 403 must end the drain at once,
// and no answer end it at its timeout, through Retry), and its package is
// not linked into the agent (ARCHITECTURE's size budget; the daemon's
// watches are plain ones alike).
type nodePods struct {
	d    *Drainer
	pods map[types.UID]*corev1.Pod
	rv   string
	w    watch.Interface
	// quiet counts the watches in a row that ended without an event:
	// the next one waits a growing delay (a watch the server or a proxy
	// ends at once must not spin).
	quiet int
	heard bool // the current watch has delivered an event
}

func (v *nodePods) stop() {
	if v.w != nil {
		v.w.Stop()
		v.w = nil
	}
}

// events is the watch's channel (ensure starts the watch first).
func (v *nodePods) events() <-chan watch.Event { return v.w.ResultChan() }

// ensure lists the pods (when there is no resourceVersion to resume
// from) and starts the watch; each request that gets no answer is tried
// again until deadline (Retry).
func (v *nodePods) ensure(ctx context.Context, deadline time.Time) error {
	for v.w == nil {
		if v.quiet > 0 {
			wait := min(backoff.Doubling(retryBackoff.Duration, retryBackoff.Cap, v.quiet), time.Until(deadline))
			if err := backoff.Sleep(ctx, max(wait, 0)); err != nil {
				return err
			}
		}
		if v.rv == "" {
			var list *corev1.PodList
			err := v.d.retry(ctx, deadline, "list pods", NoAnswer, func(ctx context.Context) (err error) {
				list, err = v.d.pods(ctx)
				return err
			})
			if err != nil {
				return err
			}
			v.pods = make(map[types.UID]*corev1.Pod, len(list.Items))
			for i := range list.Items {
				p := &list.Items[i]
				v.pods[p.UID] = p
			}
			v.rv = list.ResourceVersion
		}
		var w watch.Interface
		err := v.d.retry(ctx, deadline, "watch pods", NoAnswer, func(ctx context.Context) (err error) {
			w, err = v.d.watchPods(ctx, v.rv)
			return err
		})
		switch {
		case Expired(err):
			v.rv = ""
		case err != nil:
			return err
		default:
			v.w, v.heard = w, false
		}
	}
	return nil
}

// apply applies one event of the watch (ok false: its channel closed).
func (v *nodePods) apply(ev watch.Event, ok bool) {
	if !ok || ev.Type == watch.Error {
		if !v.heard {
			v.quiet++
		}
		v.stop()
		if ok && Expired(apierrors.FromObject(ev.Object)) {
			v.rv = ""
		} else if ok {
			v.d.log().Info("the watch of the pods ended with an error; resuming it", "node", v.d.Node, "error", apierrors.FromObject(ev.Object).Error())
		}
		return
	}
	v.heard, v.quiet = true, 0
	p, isPod := ev.Object.(*corev1.Pod)
	if !isPod {
		return
	}
	v.rv = p.ResourceVersion
	switch ev.Type {
	case watch.Added, watch.Modified:
		v.pods[p.UID] = p
	case watch.Deleted:
		delete(v.pods, p.UID)
	}
}

// sorted is the pods in the view by namespace and name.
func (v *nodePods) sorted() []*corev1.Pod {
	out := make([]*corev1.Pod, 0, len(v.pods))
	for _, p := range v.pods {
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b *corev1.Pod) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	return out
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
// refused eviction (429) is retried every Poll until the timeout. It
// watches the Node's pods (a list, then a watch with the field selector
// spec.nodeName) and ends only once the Node has stayed empty of pods to
// evict for the settle window (Settle): the evicted and the terminating
// pods are gone, and no newcomer came meanwhile. A newcomer, such as the
// replacement a controller creates under the same name bound to this
// Node, is evicted like the others (the pod with the same name and a new
// UID is another pod), and the window starts again once it is gone. All
// of it within the timeout: a pod that keeps coming back makes the drain
// time out.
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
// ErrDrainTimeout that names each pod left and the last answer for it,
// and the pods that came back after their eviction.
func (d *Drainer) Drain(ctx context.Context) error {
	r := &drainRun{d: d, timeout: d.Timeout, start: time.Now(),
		evicted: map[types.UID]string{}, waited: map[types.UID]bool{}, askAgain: map[types.UID]time.Time{},
		evictions: map[string]int{}, last: map[string]string{}}
	if r.timeout <= 0 {
		r.timeout = DefaultDrainTimeout
	}
	r.settle = d.settle(r.timeout)
	deadline := r.start.Add(r.timeout)
	parent := ctx
	// The requests begun before the deadline have room to end.
	ctx, cancel := context.WithDeadline(ctx, deadline.Add(5*time.Second))
	defer cancel()
	view := &nodePods{d: d}
	defer view.stop()
	for {
		err := view.ensure(ctx, deadline)
		switch {
		case err == nil:
		case parent.Err() != nil:
			return fmt.Errorf("drain node %s: %w", d.Node, parent.Err())
		case NoAnswer(err), ctx.Err() != nil:
			return r.timedOut(err) // no answer until the deadline
		default:
			return fmt.Errorf("drain node %s: %w", d.Node, err)
		}
		toEvict, err := r.sort(view)
		if err != nil {
			return err
		}
		if err := r.evict(ctx, deadline, toEvict); err != nil {
			return err
		}
		now := time.Now()
		switch {
		case len(r.left) > 0:
			r.emptySince = time.Time{}
		case r.emptySince.IsZero():
			r.emptySince = now
			d.log().Info("no pod to evict left on the node: watching that it stays so", "node", d.Node, "settle", r.settle.String())
		}
		if !r.emptySince.IsZero() && now.Sub(r.emptySince) >= r.settle {
			d.log().Info("node drained", "node", d.Node, "evicted", len(r.evicted), "waited_for_terminating", len(r.waited),
				"settle", r.settle.String(), "took", time.Since(r.start).Round(time.Millisecond).String())
			return nil
		}
		if !now.Before(deadline) {
			return r.timedOut(nil)
		}
		// Woken by the next event of the watch, the end of the
		// settle window, the next eviction to ask again, or the
		// deadline.
		timer := time.NewTimer(time.Until(r.wake(deadline, view)))
		select {
		case ev, ok := <-view.events():
			view.apply(ev, ok)
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			if parent.Err() != nil {
				return fmt.Errorf("drain node %s: %w", d.Node, parent.Err())
			}
			return r.timedOut(nil)
		}
		timer.Stop()
	}
}

// drainRun is one Drain's account of the Node's pods.
type drainRun struct {
	d               *Drainer
	timeout, settle time.Duration
	start           time.Time
	evicted         map[types.UID]string    // uid -> namespace/name
	waited          map[types.UID]bool      // terminating when found: not evicted
	askAgain        map[types.UID]time.Time // eviction refused or unanswered: when to ask again
	evictions       map[string]int          // namespace/name -> evictions (more than one: it came back)
	last            map[string]string       // namespace/name -> why it is still there
	left            []string                // the pods to evict or wait for, at the last look
	emptySince      time.Time               // since when no pod to evict is left; zero while there is one
}

// sort goes through the Node's pods as the view has them: the evicted and
// the terminating ones are waited for, the others returned to evict. A
// pod without a controller refuses the drain (ErrUnmanagedPods) unless
// DeleteUnmanaged.
func (r *drainRun) sort(view *nodePods) ([]*corev1.Pod, error) {
	d := r.d
	r.left = r.left[:0]
	var toEvict []*corev1.Pod
	var unmanaged []string
	for _, p := range view.sorted() {
		key := p.Namespace + "/" + p.Name
		if why := Skipped(p); why != "" {
			continue
		}
		if _, ok := r.evicted[p.UID]; ok {
			r.left = append(r.left, key)
			r.last[key] = "evicted, waiting for it to end (" + deletionGrace(p) + ")"
			continue
		}
		if p.DeletionTimestamp != nil {
			// An eviction would only ask for the deletion that runs
			// already; its grace is the one that counts.
			r.left = append(r.left, key)
			r.last[key] = "terminating, not evicted again: waiting for it to end (" + deletionGrace(p) + ")"
			if !r.waited[p.UID] {
				r.waited[p.UID] = true
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
		done := "nothing was evicted"
		if len(r.evicted) > 0 {
			done = fmt.Sprintf("nothing more was evicted (%d pod(s) were, before these appeared)", len(r.evicted))
		}
		return nil, fmt.Errorf("drain node %s: %w: %s (no ownerReference with controller=true: nothing would create them again); %s",
			d.Node, ErrUnmanagedPods, strings.Join(unmanaged, ", "), done)
	}
	return toEvict, nil
}

// evict asks for the eviction of each pod of toEvict whose time to ask
// has come; a refusal (429) or no answer is asked again after Poll.
func (r *drainRun) evict(ctx context.Context, deadline time.Time, toEvict []*corev1.Pod) error {
	d := r.d
	for _, p := range toEvict {
		key := p.Namespace + "/" + p.Name
		r.left = append(r.left, key)
		if t, ok := r.askAgain[p.UID]; ok && time.Now().Before(t) {
			continue
		}
		err := d.retry(ctx, deadline, "evict pod "+key, evictionRetriable, func(ctx context.Context) error { return d.evict(ctx, p) })
		switch {
		case err == nil:
			r.evicted[p.UID] = key
			delete(r.askAgain, p.UID)
			r.evictions[key]++
			r.last[key] = "evicted, waiting for it to end"
			if n := r.evictions[key]; n > 1 {
				d.log().Info("pod came back after its eviction (another pod of the same name): evicted it too", "pod", key, "node", d.Node, "evictions", n)
			} else {
				d.log().Info("pod evicted", "pod", key, "node", d.Node)
			}
		case apierrors.IsTooManyRequests(err):
			// A PodDisruptionBudget does not allow it now.
			r.askAgain[p.UID] = time.Now().Add(d.poll())
			r.last[key] = "eviction refused (429): " + err.Error()
		case NoAnswer(err):
			r.askAgain[p.UID] = time.Now().Add(d.poll())
			r.last[key] = "eviction failed: " + err.Error() // retried until the deadline
		default:
			return fmt.Errorf("drain node %s: evict %s: %w", d.Node, key, err)
		}
	}
	return nil
}

// wake is when the drain looks again without an event of the watch: the
// end of the settle window, the next eviction to ask again, or the
// deadline, whichever comes first. An eviction to ask again of a pod that
// has gone is forgotten.
func (r *drainRun) wake(deadline time.Time, view *nodePods) time.Time {
	wake := deadline
	if end := r.emptySince.Add(r.settle); !r.emptySince.IsZero() && end.Before(wake) {
		wake = end
	}
	for uid, t := range r.askAgain {
		if _, there := view.pods[uid]; !there {
			delete(r.askAgain, uid)
		} else if t.Before(wake) {
			wake = t
		}
	}
	return wake
}

// timedOut is the drain's error at its deadline: each pod left and the
// last answer for it, the pods that came back after their eviction, and,
// for a node that was empty, for how long.
func (r *drainRun) timedOut(cause error) error {
	d := r.d
	slices.Sort(r.left)
	var b strings.Builder
	for _, k := range r.left {
		fmt.Fprintf(&b, "; %s: %s", k, r.last[k])
		if n := r.evictions[k]; n > 1 {
			fmt.Fprintf(&b, " (evicted %d times: it came back)", n)
		}
	}
	var back []string
	for k, n := range r.evictions {
		if n > 1 && !slices.Contains(r.left, k) {
			back = append(back, fmt.Sprintf("%s (evicted %d times)", k, n))
		}
	}
	if len(back) > 0 {
		slices.Sort(back)
		fmt.Fprintf(&b, "; came back after their eviction: %s", strings.Join(back, ", "))
	}
	if len(r.left) == 0 && !r.emptySince.IsZero() {
		fmt.Fprintf(&b, "; the node was empty for the last %s only, not the %s it must stay empty",
			time.Since(r.emptySince).Round(time.Millisecond), r.settle)
	}
	if cause != nil {
		return fmt.Errorf("%w (%s) on node %s: %w; %d pod(s) left at the last answer%s", ErrDrainTimeout, r.timeout, d.Node, cause, len(r.left), b.String())
	}
	return fmt.Errorf("%w (%s) on node %s: %d pod(s) left%s", ErrDrainTimeout, r.timeout, d.Node, len(r.left), b.String())
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
