package controller

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"unbounded-cloud.io/agent/lib/api/identity"
	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/csrapproval"
)

// csrDecisions counts the approver's decisions by kind and verdict
// (approve, deny), on the manager's metrics endpoint.
var csrDecisions = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "unbounded_csr_decisions_total",
	Help: "CertificateSigningRequests of the hosts decided by the controller, by kind (agent-client, kubelet-serving) and decision (approve, deny).",
}, []string{"kind", "decision"})

// CSRApprover decides the hosts' CertificateSigningRequests by the rules
// of lib/csrapproval: each request of the two signers it judges is
// approved or denied once, with the reason on the request's condition, an
// Event and a metric. A kubelet-serving request naming an address its Node
// does not list yet is looked at again until Patience has passed since it
// was created, then denied. Requests of other signers, and client
// requests that are no agent's, are never touched.
type CSRApprover struct {
	Client   client.Client
	Events   events.EventRecorder
	Patience time.Duration
	// now is the clock (tests).
	now func() time.Time
	// only, when set, limits the approver to the requests it names (the
	// kube tier's API server is shared with other tests).
	only func(name string) bool
}

// DefaultPatience is how long a kubelet-serving request may wait for its
// Node's addresses before it is denied.
const DefaultPatience = time.Minute

// SetupWithManager registers the approver with mgr.
func (a *CSRApprover) SetupWithManager(mgr ctrl.Manager) error {
	if a.Patience == 0 {
		a.Patience = DefaultPatience
	}
	if a.now == nil {
		a.now = time.Now
	}
	ours := predicate.NewPredicateFuncs(func(o client.Object) bool {
		csr, ok := o.(*certificatesv1.CertificateSigningRequest)
		return ok && judged(csr.Spec.SignerName) && !csrapproval.Decided(csr) && (a.only == nil || a.only(csr.Name))
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named("csr-approver").
		For(&certificatesv1.CertificateSigningRequest{}, builder.WithPredicates(ours, predicate.Funcs{
			DeleteFunc: func(event.DeleteEvent) bool { return false },
		})).
		WithOptions(controller.Options{MaxConcurrentReconciles: 1}).
		Complete(a)
}

// judged says whether requests of signer are the approver's to judge.
func judged(signer string) bool {
	return signer == identity.AgentSignerName || signer == certificatesv1.KubeletServingSignerName
}

// Reconcile decides one request.
func (a *CSRApprover) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	log := ctrl.LoggerFrom(ctx)
	csr := &certificatesv1.CertificateSigningRequest{}
	if err := a.Client.Get(ctx, req.NamespacedName, csr); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !judged(csr.Spec.SignerName) || csrapproval.Decided(csr) {
		return reconcile.Result{}, nil
	}
	d, err := csrapproval.Decide(csr, a.machine(ctx), a.node(ctx))
	if err != nil {
		// The cluster did not answer a lookup: nothing decided on a guess.
		return reconcile.Result{}, err
	}
	switch d.Verdict {
	case csrapproval.NotOurs:
		return reconcile.Result{}, nil
	case csrapproval.Wait:
		if age := a.now().Sub(csr.CreationTimestamp.Time); age < a.Patience {
			log.V(1).Info("certificate request not decidable yet", "csr", csr.Name, "why", d.Message)
			return reconcile.Result{RequeueAfter: min(2*time.Second, a.Patience-age)}, nil
		}
		d.Verdict, d.Message = csrapproval.Deny, fmt.Sprintf("%s, still %v after the request", d.Message, a.Patience)
	}
	cond := certificatesv1.CertificateSigningRequestCondition{
		Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue,
		Reason: csrapproval.ReasonApproved, Message: "unbounded-controller: " + d.Message,
		LastUpdateTime: metav1.NewTime(a.now()),
	}
	eventType, decision := corev1.EventTypeNormal, "approve"
	if d.Verdict == csrapproval.Deny {
		cond.Type, cond.Reason = certificatesv1.CertificateDenied, csrapproval.ReasonDenied
		eventType, decision = corev1.EventTypeWarning, "deny"
	}
	csr.Status.Conditions = append(csr.Status.Conditions, cond)
	if err := a.Client.SubResource("approval").Update(ctx, csr); err != nil {
		if apierrors.IsConflict(err) {
			// Changed meanwhile (decided by someone else, say): looked at
			// again from the cache.
			return reconcile.Result{RequeueAfter: time.Second}, nil
		}
		return reconcile.Result{}, err
	}
	csrDecisions.WithLabelValues(d.Kind, decision).Inc()
	log.Info("certificate request "+decision+"d", "csr", csr.Name, "kind", d.Kind, "requester", csr.Spec.Username, "why", d.Message)
	if a.Events != nil {
		a.Events.Eventf(csr, nil, eventType, cond.Reason, decision, "%s", cond.Message)
	}
	return reconcile.Result{}, nil
}

// machine reads Machines from the manager's cache.
func (a *CSRApprover) machine(ctx context.Context) csrapproval.MachineLookup {
	return func(name string) (*v1alpha3.Machine, error) {
		m := &v1alpha3.Machine{}
		err := a.Client.Get(ctx, types.NamespacedName{Name: name}, m)
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return m, err
	}
}

// node reads Nodes from the manager's cache.
func (a *CSRApprover) node(ctx context.Context) csrapproval.NodeLookup {
	return func(name string) (*corev1.Node, error) {
		n := &corev1.Node{}
		err := a.Client.Get(ctx, types.NamespacedName{Name: name}, n)
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return n, err
	}
}
