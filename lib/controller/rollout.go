package controller

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/rollout"
)

// Rollouts runs MachineRollouts (lib/rollout decides, this carries the
// decision out): it creates the hosts' MachineOperations, follows them
// and the hosts' Nodes and Machines, and writes the rollout's status.
// One rollout at a time (MaxConcurrentReconciles 1), and before it starts
// a host it reads the host's operations from the API server itself, not
// from the cache: two rollouts over one host never give it two
// operations at once, nor does a restarted controller.
type Rollouts struct {
	Client client.Client
	// Live reads around the cache (the host's other operations, an
	// operation the cache has not seen yet).
	Live   client.Reader
	Events events.EventRecorder
	now    func() time.Time
	// only, for tests: the rollouts this controller acts on.
	only func(name string) bool
}

var rolloutHosts = prometheus.NewGaugeVec(prometheus.GaugeOpts{
	Name: "unbounded_rollout_hosts",
	Help: "Hosts of each MachineRollout by state (Pending, InProgress, Verifying, Done, Failed).",
}, []string{"rollout", "state"})

func init() {
	metrics.Registry.MustRegister(rolloutHosts, rolloutOperations)
}

var rolloutOperations = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "unbounded_rollout_operations_created_total",
	Help: "MachineOperations the rollouts created, by operation type.",
}, []string{"operation"})

// SetupWithManager registers the controller: rollouts, their operations
// (by label), and the Nodes and Machines of the hosts they roll.
func (r *Rollouts) SetupWithManager(mgr ctrl.Manager) error {
	if r.now == nil {
		r.now = time.Now
	}
	ours := predicate.NewPredicateFuncs(func(o client.Object) bool { return r.only == nil || r.only(o.GetName()) })
	byLabel := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		name := o.GetLabels()[v1alpha3.RolloutLabel]
		if name == "" || (r.only != nil && !r.only(name)) {
			return nil
		}
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: name}}}
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named("machine-rollouts").
		For(&v1alpha3.MachineRollout{}, builder.WithPredicates(ours, predicate.GenerationChangedPredicate{})).
		Watches(&v1alpha3.MachineOperation{}, byLabel).
		Watches(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(r.rolloutsOfHost)).
		Watches(&v1alpha3.Machine{}, handler.EnqueueRequestsFromMapFunc(r.rolloutsOfHost)).
		WithOptions(controller.Options{MaxConcurrentReconciles: 1}).
		Complete(r)
}

// rolloutsOfHost: the unfinished rollouts whose hosts include o's name.
func (r *Rollouts) rolloutsOfHost(ctx context.Context, o client.Object) []reconcile.Request {
	var l v1alpha3.MachineRolloutList
	if err := r.Client.List(ctx, &l); err != nil {
		return nil
	}
	var reqs []reconcile.Request
	for _, ro := range l.Items {
		if ro.Status.Phase == v1alpha3.RolloutComplete || (r.only != nil && !r.only(ro.Name)) {
			continue
		}
		if slices.ContainsFunc(ro.Status.Hosts, func(h v1alpha3.RolloutHost) bool { return h.Name == o.GetName() }) {
			reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Name: ro.Name}})
		}
	}
	return reqs
}

// Reconcile takes one rollout one step.
func (r *Rollouts) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	log := ctrl.LoggerFrom(ctx)
	ro := &v1alpha3.MachineRollout{}
	if err := r.Client.Get(ctx, req.NamespacedName, ro); err != nil {
		if apierrors.IsNotFound(err) {
			rolloutHosts.DeletePartialMatch(prometheus.Labels{"rollout": req.Name})
		}
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if ro.DeletionTimestamp != nil {
		return reconcile.Result{}, nil
	}
	names, err := r.hostNames(ctx, ro)
	var invalid errInvalidSpec
	if err != nil && !errors.As(err, &invalid) {
		return reconcile.Result{}, err
	}
	var hosts []rollout.Host
	if err == nil {
		if hosts, err = r.observe(ctx, ro, names); err != nil {
			return reconcile.Result{}, err
		}
	}
	now := r.now()
	var d rollout.Decision
	if err == nil {
		d, err = r.decide(ctx, ro, hosts, now)
	}
	if err != nil {
		msg := "invalid spec: " + err.Error()
		if ro.Status.Message != msg { // once per change, not at every wake-up
			r.Events.Eventf(ro, nil, corev1.EventTypeWarning, "InvalidSpec", "Decide", "%s", msg)
		}
		return reconcile.Result{}, r.writeStatus(ctx, ro, func(st *v1alpha3.MachineRolloutStatus) {
			st.Message, st.ObservedGeneration = msg, ro.Generation
		})
	}
	for _, name := range d.Start {
		i := slices.IndexFunc(d.Hosts, func(h v1alpha3.RolloutHost) bool { return h.Name == name })
		if err := r.start(ctx, ro, d.Hosts[i]); err != nil {
			return reconcile.Result{}, err
		}
		log.Info("operation created", "rollout", ro.Name, "machine", name, "operation", d.Hosts[i].Operation)
	}
	before := ro.Status.Phase
	if err := r.writeStatus(ctx, ro, func(st *v1alpha3.MachineRolloutStatus) {
		st.ObservedGeneration = ro.Generation
		st.Phase, st.Message, st.Hosts = d.Phase, d.Message, d.Hosts
		st.Total, st.Done, st.Unavailable, st.Failed = int32(len(d.Hosts)), d.Done, d.Unavailable, d.Failed
		st.NextActionTime = nil
		if !d.Next.IsZero() {
			st.NextActionTime = &metav1.Time{Time: d.Next.Truncate(time.Second).Add(time.Second)}
		}
		setCondition(st, "Complete", d.Phase == v1alpha3.RolloutComplete, string(d.Phase), d.Message, ro.Generation)
		setCondition(st, "Stopped", d.Phase == v1alpha3.RolloutStopped, string(d.Phase), d.Message, ro.Generation)
	}); err != nil {
		return reconcile.Result{}, err
	}
	r.metrics(ro.Name, d.Hosts)
	if d.Phase != before {
		switch d.Phase {
		case v1alpha3.RolloutStopped:
			r.Events.Eventf(ro, nil, corev1.EventTypeWarning, "RolloutStopped", "Roll", "%s", d.Message)
		case v1alpha3.RolloutComplete:
			r.Events.Eventf(ro, nil, corev1.EventTypeNormal, "RolloutComplete", "Roll", "%s", d.Message)
		}
	}
	if !d.Next.IsZero() {
		return reconcile.Result{RequeueAfter: max(d.Next.Sub(now)+time.Second, time.Second)}, nil
	}
	return reconcile.Result{}, nil
}

// decide is rollout.Decide, with a live read of the other operations of
// each host it would start: a host with one unfinished is marked busy and
// the rollout decided again (the next host in line may go instead). Only
// the hosts about to start cost a request.
func (r *Rollouts) decide(ctx context.Context, ro *v1alpha3.MachineRollout, hosts []rollout.Host, now time.Time) (rollout.Decision, error) {
	checked := map[string]bool{}
	for {
		d, err := rollout.Decide(ro, hosts, now)
		if err != nil {
			return d, err
		}
		again := false
		for _, name := range d.Start {
			if checked[name] {
				continue
			}
			checked[name] = true
			busy, err := r.busy(ctx, name)
			if err != nil {
				return d, err
			}
			if busy != "" {
				i := slices.IndexFunc(hosts, func(h rollout.Host) bool { return h.Name == name })
				hosts[i].Busy, again = busy, true
			}
		}
		if !again {
			return d, nil
		}
	}
}

// errInvalidSpec marks what makes a spec one the rollout cannot act on
// (said in its status, an Event once per change; nothing starts).
type errInvalidSpec struct{ error }

// hostNames are the rollout's hosts: those its status records once it
// has acted, else the Machines it names (in its order: each must exist,
// else errInvalidSpec) or its selector picks now (in name order).
func (r *Rollouts) hostNames(ctx context.Context, ro *v1alpha3.MachineRollout) ([]string, error) {
	if ro.Status.Phase != "" {
		var names []string
		for _, h := range ro.Status.Hosts {
			names = append(names, h.Name)
		}
		return names, nil
	}
	if len(ro.Spec.Machines) > 0 {
		// Read live, once (before the rollout first acts): a Machine
		// created just before the rollout may not be in the cache yet,
		// and "no such Machine" would stop the rollout until its spec
		// changes.
		var reader client.Reader = r.Client
		if r.Live != nil {
			reader = r.Live
		}
		var missing []string
		for _, name := range ro.Spec.Machines {
			m := &v1alpha3.Machine{}
			if err := reader.Get(ctx, client.ObjectKey{Name: name}, m); apierrors.IsNotFound(err) || err == nil && m.DeletionTimestamp != nil {
				missing = append(missing, name)
			} else if err != nil {
				return nil, err
			}
		}
		if len(missing) > 0 {
			return nil, errInvalidSpec{fmt.Errorf("spec.machines: no Machine %s", strings.Join(missing, ", "))}
		}
		return slices.Clone(ro.Spec.Machines), nil
	}
	if ro.Spec.Selector == nil {
		return nil, errInvalidSpec{errors.New("neither spec.selector nor spec.machines names a host")}
	}
	sel, err := metav1.LabelSelectorAsSelector(ro.Spec.Selector)
	if err != nil {
		return nil, errInvalidSpec{fmt.Errorf("spec.selector: %w", err)}
	}
	var l v1alpha3.MachineList
	if err := r.Client.List(ctx, &l, client.MatchingLabelsSelector{Selector: sel}); err != nil {
		return nil, err
	}
	var names []string
	for _, m := range l.Items {
		if m.DeletionTimestamp == nil {
			names = append(names, m.Name)
		}
	}
	slices.Sort(names)
	return names, nil
}

// observe reads each host's latest operation of the rollout, its Node and
// its Machine.
func (r *Rollouts) observe(ctx context.Context, ro *v1alpha3.MachineRollout, names []string) ([]rollout.Host, error) {
	var ops v1alpha3.MachineOperationList
	if err := r.Client.List(ctx, &ops, client.MatchingLabels{v1alpha3.RolloutLabel: ro.Name}); err != nil {
		return nil, err
	}
	byName := map[string]*v1alpha3.MachineOperation{}
	for i := range ops.Items {
		byName[ops.Items[i].Name] = &ops.Items[i]
	}
	prev := map[string]v1alpha3.RolloutHost{}
	for _, h := range ro.Status.Hosts {
		prev[h.Name] = h
	}
	var hosts []rollout.Host
	for _, name := range names {
		h := rollout.Host{Name: name}
		// The highest attempt there is: the recorded one, or a later one
		// created before a status write that was lost.
		for a := max(prev[name].Attempt, 1); ; a++ {
			op := byName[rollout.OperationName(ro.Name, name, a)]
			if op == nil && a == prev[name].Attempt {
				// Recorded but not in the cache (yet, or any more): ask.
				live := &v1alpha3.MachineOperation{}
				if err := r.Live.Get(ctx, types.NamespacedName{Name: rollout.OperationName(ro.Name, name, a)}, live); err == nil {
					op = live
				} else if !apierrors.IsNotFound(err) {
					return nil, err
				}
			}
			if op == nil {
				break
			}
			h.Op, h.Attempt = op, a
		}
		node := &corev1.Node{}
		if err := r.Client.Get(ctx, types.NamespacedName{Name: name}, node); err == nil {
			h.Node = node
		} else if !apierrors.IsNotFound(err) {
			return nil, err
		}
		m := &v1alpha3.Machine{}
		if err := r.Client.Get(ctx, types.NamespacedName{Name: name}, m); err == nil {
			h.Machine = m
		} else if !apierrors.IsNotFound(err) {
			return nil, err
		}
		hosts = append(hosts, h)
	}
	return hosts, nil
}

// busy names an unfinished operation of the host, read from the API
// server (any rollout's or an operator's), or "".
func (r *Rollouts) busy(ctx context.Context, machine string) (string, error) {
	var l v1alpha3.MachineOperationList
	if err := r.Live.List(ctx, &l, client.MatchingLabels{v1alpha3.MachineLabel: machine}); err != nil {
		return "", err
	}
	for _, op := range l.Items {
		if !op.Status.State.Finished() && op.DeletionTimestamp == nil {
			return op.Name, nil
		}
	}
	return "", nil
}

// start creates the host's operation (an existing one of that name is
// this attempt's, created before a lost status write).
func (r *Rollouts) start(ctx context.Context, ro *v1alpha3.MachineRollout, h v1alpha3.RolloutHost) error {
	op := &v1alpha3.MachineOperation{
		ObjectMeta: metav1.ObjectMeta{Name: h.Operation, Labels: map[string]string{
			v1alpha3.MachineLabel:   h.Name,
			v1alpha3.RolloutLabel:   ro.Name,
			rollout.GenerationLabel: strconv.FormatInt(h.Generation, 10),
		}},
		Spec: v1alpha3.MachineOperationSpec{MachineRef: v1alpha3.MachineRef{Name: h.Name}, Operation: ro.Spec.Operation, Parameters: ro.Spec.Parameters},
	}
	if err := r.Client.Create(ctx, op); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return nil
		}
		return fmt.Errorf("create operation %s: %w", h.Operation, err)
	}
	rolloutOperations.WithLabelValues(string(ro.Spec.Operation)).Inc()
	r.Events.Eventf(ro, op, corev1.EventTypeNormal, "OperationCreated", "Roll", "%s %s on %s (attempt %d)", op.Name, ro.Spec.Operation, h.Name, h.Attempt)
	return nil
}

// writeStatus applies change to the rollout's status and writes it when
// it changed.
func (r *Rollouts) writeStatus(ctx context.Context, ro *v1alpha3.MachineRollout, change func(*v1alpha3.MachineRolloutStatus)) error {
	st := ro.Status.DeepCopy()
	change(st)
	if equality.Semantic.DeepEqual(*st, ro.Status) {
		return nil
	}
	ro.Status = *st
	return r.Client.Status().Update(ctx, ro)
}

func setCondition(st *v1alpha3.MachineRolloutStatus, t string, on bool, reason, msg string, gen int64) {
	s := metav1.ConditionFalse
	if on {
		s = metav1.ConditionTrue
	}
	for i, c := range st.Conditions {
		if c.Type == t {
			if c.Status != s {
				st.Conditions[i].LastTransitionTime = metav1.Now()
			}
			st.Conditions[i].Status, st.Conditions[i].Reason, st.Conditions[i].Message, st.Conditions[i].ObservedGeneration = s, reason, msg, gen
			return
		}
	}
	st.Conditions = append(st.Conditions, metav1.Condition{Type: t, Status: s, Reason: reason, Message: msg, ObservedGeneration: gen, LastTransitionTime: metav1.Now()})
}

func (r *Rollouts) metrics(name string, hosts []v1alpha3.RolloutHost) {
	n := map[v1alpha3.HostState]int{}
	for _, h := range hosts {
		n[h.State]++
	}
	for _, s := range []v1alpha3.HostState{v1alpha3.HostPending, v1alpha3.HostInProgress, v1alpha3.HostVerifying, v1alpha3.HostDone, v1alpha3.HostFailed} {
		rolloutHosts.WithLabelValues(name, string(s)).Set(float64(n[s]))
	}
}
