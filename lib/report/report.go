// Package report is the bootstrap status reporter: it tells the cluster how
// the first bootstrap of this host goes (Running, Succeeded, Failed with a
// reason) in the Machine's status.bootstrap, status.phase and the
// Bootstrapped condition, and creates the Machine when it does not exist.
//
// It is best effort by design. A bootstrap must be able to finish on a
// host whose cluster has not installed the CRDs or RBAC yet, or cannot be
// reached at the moment: the node joining is what matters, the status is a
// courtesy. So every problem is logged as one clear line saying what is
// missing and how to fix it, and the bootstrap goes on. The one exception
// is a rejected bootstrap token (kube.ErrBootstrapTokenRejected): the host
// has no business preparing a node for a cluster that refuses it, and the
// caller stops before it changes anything.
package report

import (
	"context"
	"errors"
	"log/slog"
	"regexp"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"unbounded-cloud.io/agent/lib/api/identity"
	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/kube"
	"unbounded-cloud.io/agent/lib/version"
)

// Reasons of the Bootstrapped condition besides a failure's own reason.
const (
	ReasonRunning   = "Running"
	ReasonSucceeded = "Succeeded"
	// ReasonFailed replaces a failure reason that is not a valid condition
	// reason (CamelCase word).
	ReasonFailed = "BootstrapFailed"
)

// Reporter reports the bootstrap's progress on the Machine.
type Reporter struct {
	// Machine is this host's Machine name.
	Machine string
	// Mode is written into the spec of a Machine the reporter creates.
	Mode v1alpha3.IsolationMode
	// Credentials: the client certificate while one is usable, else the
	// bootstrap token (the usual case during a first bootstrap).
	Credentials kube.Credentials
	// Timeout bounds one report; 0 means 10 s. An unreachable cluster
	// must not hold the bootstrap up.
	Timeout time.Duration
	Now     func() time.Time
	Log     *slog.Logger
}

// Running reports that the bootstrap has started.
func (r *Reporter) Running(ctx context.Context) error {
	return r.report(ctx, v1alpha3.BootstrapRunning, ReasonRunning, "bootstrap running")
}

// Succeeded reports that the node is up and its applied config recorded.
func (r *Reporter) Succeeded(ctx context.Context) error {
	return r.report(ctx, v1alpha3.BootstrapSucceeded, ReasonSucceeded, "node bootstrapped")
}

// Failed reports a failed bootstrap; reason is a CamelCase word (for example
// ArtifactDownloadFailed), message says what happened.
func (r *Reporter) Failed(ctx context.Context, reason, message string) error {
	if !reasonRE.MatchString(reason) {
		message = reason + ": " + message
		reason = ReasonFailed
	}
	return r.report(ctx, v1alpha3.BootstrapFailed, reason, message)
}

// reasonRE is metav1.Condition's reason syntax, enforced by the API server.
var reasonRE = regexp.MustCompile(`^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$`)

func (r *Reporter) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

func (r *Reporter) log() *slog.Logger {
	if r.Log != nil {
		return r.Log
	}
	return slog.Default()
}

func (r *Reporter) report(ctx context.Context, st v1alpha3.BootstrapState, reason, message string) error {
	timeout := r.Timeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	usingToken := false
	cfg, _, err := r.Credentials.CertConfig(r.now())
	if err != nil {
		usingToken = true
		if cfg, err = r.Credentials.BootstrapConfig(); err != nil {
			r.log().Warn("bootstrap status not reported: no usable credential", "state", st, "error", err.Error())
			return nil
		}
	}
	ms, err := kube.NewMachines(cfg)
	if err != nil {
		r.log().Warn("bootstrap status not reported", "state", st, "error", err.Error())
		return nil
	}
	mutate := func(m *v1alpha3.Machine) bool {
		SetBootstrap(m, st, reason, message, r.now())
		return true
	}
	_, err = ms.MutateStatus(ctx, r.Machine, mutate)
	if isMissingObject(err, r.Machine) {
		m := &v1alpha3.Machine{}
		m.Name = r.Machine
		m.Spec.Isolation.Mode = r.Mode
		if _, err = ms.Create(ctx, m); err == nil || apierrors.IsAlreadyExists(err) {
			r.log().Info("Machine created", "machine", r.Machine)
			_, err = ms.MutateStatus(ctx, r.Machine, mutate)
		}
	}
	if err == nil {
		r.log().Info("bootstrap status reported", "machine", r.Machine, "state", st, "reason", reason)
		return nil
	}
	return r.explain(err, st, usingToken)
}

// SetBootstrap sets the bootstrap's part of m's status (what a bootstrap
// token may write): the bootstrap state, the phase, the Bootstrapped
// condition and the agent version. The daemon uses it too, to make a
// Succeeded report the bootstrap owed (the node was recorded, the report
// did not land).
func SetBootstrap(m *v1alpha3.Machine, st v1alpha3.BootstrapState, reason, message string, at time.Time) {
	now := metav1.NewTime(at)
	m.Status.Bootstrap = &v1alpha3.BootstrapStatus{State: st, Message: truncate(message, 4096), Time: &now}
	cond := metav1.Condition{Type: v1alpha3.ConditionBootstrapped, Status: metav1.ConditionFalse,
		Reason: reason, Message: truncate(message, 4096), ObservedGeneration: m.Generation}
	switch st {
	case v1alpha3.BootstrapRunning:
		m.Status.Phase = v1alpha3.MachineBootstrapping
	case v1alpha3.BootstrapSucceeded:
		m.Status.Phase = v1alpha3.MachineReady
		cond.Status = metav1.ConditionTrue
	case v1alpha3.BootstrapFailed:
		m.Status.Phase = v1alpha3.MachineFailed
		m.Status.Bootstrap.Reason = reason
	}
	if meta.IsStatusConditionTrue(m.Status.Conditions, v1alpha3.ConditionAllocationLaunchRefused) {
		// A refusal recorded by the fence is cleared only by a fence
		// check that read the allocation on this Machine; the
		// bootstrap's progress must not paint over it.
		m.Status.Phase = v1alpha3.MachineRefused
	}
	meta.SetStatusCondition(&m.Status.Conditions, cond)
	m.Status.Agent = &v1alpha3.AgentStatus{Version: version.Version}
}

// explain turns a failed report into one log line that says what is
// missing, and nil, except for a rejected bootstrap token.
func (r *Reporter) explain(err error, st v1alpha3.BootstrapState, usingToken bool) error {
	l := r.log().With("machine", r.Machine, "state", st, "error", err.Error())
	switch {
	case usingToken && apierrors.IsUnauthorized(err):
		l.Error("the cluster rejected the bootstrap token; stopping before the host is changed")
		return kube.TokenRejected(err)
	case apierrors.IsNotFound(err):
		l.Warn("bootstrap status not reported: the cluster has no Machine API (install the CRDs: unbounded manifests | kubectl apply -f -); bootstrap goes on")
	case apierrors.IsForbidden(err):
		l.Warn("bootstrap status not reported: RBAC does not allow it (apply unbounded manifests, and issue the bootstrap token with auth-extra-groups " + identity.BootstrapExtraGroups(r.Machine) + "); bootstrap goes on")
	case kube.NoAnswer(err) || errors.Is(err, context.DeadlineExceeded):
		l.Warn("bootstrap status not reported: the cluster did not answer; bootstrap goes on")
	default:
		l.Warn("bootstrap status not reported; bootstrap goes on")
	}
	return nil
}

// isMissingObject tells "this Machine does not exist" (404 naming it) from
// "there is no Machine API" (a 404 for the resource type itself, when the
// CRD is not installed), which a create would not fix.
func isMissingObject(err error, name string) bool {
	var se *apierrors.StatusError
	if !errors.As(err, &se) || !apierrors.IsNotFound(err) {
		return false
	}
	d := se.ErrStatus.Details
	return d != nil && d.Name == name
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-3] + "..."
}
