// Package fence is the allocation launch check that unbounded-fence.service
// runs before every start of the node stack: may this host still run the
// node it was launched for? ARCHITECTURE section 7 has the rules and the
// unit file what brings a refused node back; Check.Run decides, and a
// *Refusal (exit 77) says which kind of "no" it was. It fails closed:
// nothing starts the node without a check that allowed it.
package fence

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"unbounded-cloud.io/agent/lib/api/identity"
	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/backoff"
	"unbounded-cloud.io/agent/lib/exitcode"
	"unbounded-cloud.io/agent/lib/kube"
)

// DefaultBudget is how long reads without an answer are retried when the
// configuration does not say ([fence] retry-budget).
const DefaultBudget = 2 * time.Minute

// Reasons of a refusal that the v1alpha3 package has no constant for,
// because the Machine cannot be told about them anyway (the host has no
// usable credential); they appear in the log and the exit message.
const (
	// ReasonCredentialsUnusable: the host cannot ask (CA or token file
	// missing or malformed).
	ReasonCredentialsUnusable = "CredentialsUnusable"
	// ReasonMachineNotFound: the Machine does not exist, so it cannot bind
	// this allocation.
	ReasonMachineNotFound = "MachineNotFound"
	// ReasonServerUntrusted: the API server's TLS certificate does not
	// verify against the configured CA file (wrong CA, wrong name). Not
	// "unreachable": something answered, and it is not a server this
	// host can trust.
	ReasonServerUntrusted = "APIServerUntrusted"
	// ReasonClockSkew: until the budget ran out, the API server's
	// certificate chain was not valid at this host's time ("not yet
	// valid" or "expired"): the host's clock is far off (or the server's
	// certificate expired). A refusal for lack of an answer: the clock is
	// usually set a little later (NTP), and the check is retried.
	ReasonClockSkew = "CertificateNotValidAtHostTime"
)

// ErrInterrupted is returned when the caller's context ends (SIGTERM)
// before the check decided. It matches exitcode.ErrTemporary (exit 75):
// not the cluster's "no", so nothing is recorded on the Machine, and the
// next start of the node checks anew; the node does not start on it.
var ErrInterrupted = errors.New("fence check interrupted before a decision")

// Refusal is a final "no". It matches exitcode.ErrRefused (exit 77).
type Refusal struct {
	// Reason is a CamelCase word, the condition's reason.
	Reason string
	// Message is for people; it never holds a secret.
	Message string
	// Err is the error behind the refusal, if any (for example
	// kube.ErrBootstrapTokenRejected).
	Err error
	// NoAnswer is set when the refusal is for lack of an answer within
	// the budget (unreachable, or TLS failing on this host's clock), not
	// a decision: it is worth asking again later. cmd/fence writes it to
	// the fence record, /run/unbounded/fence.json (lib/fence/record):
	// unbounded-health retries the node start after a refusal for lack of
	// an answer, while an explicit one holds the node down until the
	// Machine changes and the daemon starts the node target.
	NoAnswer bool
}

func (r *Refusal) Error() string {
	return "allocation launch refused: " + r.Reason + ": " + r.Message
}

// Is makes a refusal exitcode.ErrRefused.
func (r *Refusal) Is(target error) bool { return target == exitcode.ErrRefused }

// Unwrap gives the error behind the refusal.
func (r *Refusal) Unwrap() error { return r.Err }

// API is the fence's access to the cluster. Each call is made with the
// rest.Config of the credential chosen for that read.
type API interface {
	// GetMachine reads the Machine live.
	GetMachine(ctx context.Context, cfg *rest.Config, name string) (*v1alpha3.Machine, error)
	// ReviewToken sends a TokenReview of the token that cfg authenticates
	// with, authenticated by that same token.
	ReviewToken(ctx context.Context, cfg *rest.Config) (*authenticationv1.TokenReviewStatus, error)
	// MutateStatus is kube.Machines.MutateStatus with cfg's credential.
	MutateStatus(ctx context.Context, cfg *rest.Config, name string, mutate func(*v1alpha3.Machine) bool) error
}

// Check is one fence check. Its host-touching parts (clock, sleep, API) are
// fields whose zero value is the real thing; tests replace them.
type Check struct {
	// Machine is this host's Machine name.
	Machine string
	// AllocationUID is the configured allocation ([allocation] uid). Empty:
	// the host was not launched for an allocation; the check allows at once
	// without touching the network.
	AllocationUID string
	// Budget bounds the retries of reads without an answer; 0 means
	// DefaultBudget.
	Budget time.Duration
	// Credentials are the bootstrap token, the CA and the certificate store.
	Credentials kube.Credentials
	// ReportTimeout bounds the write of AllocationLaunchRefused after the
	// decision; 0 means 3 s. It is spent after the budget, so a refusal
	// returns at most Budget+ReportTimeout after the start.
	ReportTimeout time.Duration

	Now   func() time.Time
	Sleep func(ctx context.Context, d time.Duration) error
	API   API
	Log   *slog.Logger

	// via is what Via returns: set by Run when it returns.
	via Credential
}

// Via is the credential of the read that the last Run's outcome rests on:
// the read that allowed or refused, or, for a refusal for lack of an
// answer, the last read that got none. "" when no read decided: no
// allocation configured, or the check was interrupted. cmd/fence records
// it in fence.json: which identity the cluster judged is the first thing
// to know about a refusal (a rejected certificate, a revoked token).
func (c *Check) Via() Credential { return c.via }

func (c *Check) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}

func (c *Check) sleep(ctx context.Context, d time.Duration) error {
	if c.Sleep != nil {
		return c.Sleep(ctx, d)
	}
	return backoff.Sleep(ctx, d)
}

func (c *Check) api() API {
	if c.API != nil {
		return c.API
	}
	return restAPI{}
}

func (c *Check) log() *slog.Logger {
	if c.Log != nil {
		return c.Log
	}
	return slog.Default()
}

// Backoff between reads without an answer: doubling from firstBackoff,
// capped so that a cluster that comes back is noticed within a few seconds.
const (
	firstBackoff = 200 * time.Millisecond
	maxBackoff   = 5 * time.Second
	// maxReadTime bounds one read, so that one hanging connection does not
	// spend the whole budget.
	maxReadTime = 15 * time.Second
	// minLastRead is the least time worth giving a read at the end of
	// the budget (a loopback round trip is a few ms; a WAN one ~100 ms).
	minLastRead = 200 * time.Millisecond
)

// Credential names the credential a read used, in logs, in messages and
// in the fence record (lib/fence/record), where Check.Via puts it.
type Credential string

const (
	ViaCertificate Credential = "certificate"
	ViaToken       Credential = "bootstrap-token"
)

// outcome of one read: allowed, refused (final) or no answer (retry).
type outcome struct {
	via     Credential
	refusal *Refusal
	// noAnswer is set when the read got no decision; it is retried.
	noAnswer error
	// machine is the Machine as read and judged (by either credential).
	// An allow with machine nil came from the TokenReview alone: it has
	// not seen the allocation on the Machine and must not clear a refusal
	// recorded there.
	machine *v1alpha3.Machine
	// unconfirmed says why an allow did not see the Machine.
	unconfirmed string
}

// Run performs the check. It returns nil when the node may start, a
// *Refusal (exitcode.ErrRefused) otherwise; the only other error is
// ErrInterrupted, when ctx ends first: the node does not start on a check
// that did not finish. A clear "no" (fenced, deleting, another allocation,
// 401, 403, a server the CA does not verify) refuses at once; reads that
// get no answer are retried with backoff until Budget is spent, and then
// refuse too (Refusal.NoAnswer).
func (c *Check) Run(ctx context.Context) error {
	c.via = ""
	start := c.now()
	if c.AllocationUID == "" {
		c.log().Info("no allocation configured; node start allowed")
		return nil
	}
	budget := c.Budget
	if budget <= 0 {
		budget = DefaultBudget
	}
	deadline := start.Add(budget)
	var last outcome
	for attempt := 1; ; attempt++ {
		remaining := deadline.Sub(c.now())
		if remaining <= 0 {
			break
		}
		rctx, cancel := context.WithTimeout(ctx, min(remaining, maxReadTime))
		out := c.read(rctx)
		cancel()
		if ctx.Err() != nil {
			return c.interrupted(ctx, attempt)
		}
		last = out
		if out.noAnswer == nil {
			c.via = out.via
			if out.refusal != nil {
				c.log().Error("allocation launch refused", "machine", c.Machine, "allocation", c.AllocationUID,
					"via", out.via, "reason", out.refusal.Reason, "message", out.refusal.Message)
				if out.refusal.Reason != ReasonServerUntrusted {
					// Untrusted: the report would meet the same
					// certificate; the log line above is the record.
					c.reportRefusal(ctx, out.refusal)
				}
				return out.refusal
			}
			args := []any{"machine", c.Machine, "allocation", c.AllocationUID,
				"via", out.via, "took", c.now().Sub(start).Round(time.Millisecond)}
			if out.machine == nil {
				args = append(args, "unconfirmed", out.unconfirmed)
			}
			c.log().Info("allocation launch allowed", args...)
			c.reportAllowed(ctx, out)
			return nil
		}
		// The last wait is cut short so that one more read, of at least
		// minLastRead, still fits in the budget.
		wait := min(backoff.Doubling(firstBackoff, maxBackoff, attempt), deadline.Sub(c.now())-minLastRead)
		if wait < 0 {
			break
		}
		c.log().Warn("no answer from the cluster; retrying", "attempt", attempt, "via", out.via,
			"error", out.noAnswer.Error(), "retryIn", wait, "budgetLeft", deadline.Sub(c.now()).Round(time.Millisecond))
		if err := c.sleep(ctx, wait); err != nil {
			return c.interrupted(ctx, attempt)
		}
	}
	msg := fmt.Sprintf("no answer from the API server within the retry budget of %s", budget)
	if last.noAnswer != nil {
		msg += " (last: " + last.noAnswer.Error() + ")"
	}
	r := &Refusal{Reason: v1alpha3.ReasonClusterUnreachable, Message: msg, Err: last.noAnswer, NoAnswer: true}
	c.via = last.via
	if notValidNow(last.noAnswer) {
		// The report would fail on the same certificate; the log line
		// below is the record, as for an untrusted server.
		r.Reason = ReasonClockSkew
		r.Message = fmt.Sprintf("the API server's certificate was not valid at this host's time (%s) until the retry budget of %s ran out: is the clock far off? (last: %v)",
			c.now().UTC().Format(time.RFC3339), budget, last.noAnswer)
	}
	c.log().Error("allocation launch refused for lack of an answer; the node start is retried later", "machine", c.Machine, "allocation", c.AllocationUID,
		"reason", r.Reason, "message", r.Message)
	if r.Reason != ReasonClockSkew {
		c.reportRefusal(ctx, r)
	}
	return r
}

// interrupted is the end of a check cut short by ctx (SIGTERM from
// systemd: a stop, a shutdown, TimeoutStartSec): one line, no report on
// the Machine (the cluster said nothing), and an error that keeps the node
// down.
func (c *Check) interrupted(ctx context.Context, attempts int) error {
	cause := context.Cause(ctx)
	c.log().Warn("fence check interrupted before a decision; node start not allowed",
		"machine", c.Machine, "allocation", c.AllocationUID, "cause", cause.Error(), "reads", attempts)
	return fmt.Errorf("%w (%w): %w", ErrInterrupted, exitcode.ErrTemporary, cause)
}

// untrusted is the refusal for a TLS trust failure. A chain that is only
// outside its validity period at this host's time is no answer instead:
// the clock may be far off (set a little later by NTP, or by hand), and
// no Machine can say anything about that.
func (c *Check) untrusted(via Credential, err error) outcome {
	if notValidNow(err) {
		return outcome{via: via, noAnswer: err}
	}
	return outcome{via: via, refusal: &Refusal{Reason: ReasonServerUntrusted,
		Message: fmt.Sprintf("the API server %s presented a certificate that the cluster CA in %s does not verify (wrong CA file, or not the API server): %v",
			c.Credentials.APIServer, c.Credentials.CAFile, err), Err: err}}
}

// read is one read with one credential, chosen before it starts from the
// certificate store: the daemon's client certificate while one is stored
// and unexpired, else the bootstrap token. A read never switches credential
// halfway, so a certificate that expires during a call moves only the next
// read to the token: switching inside a read would let a rejected
// certificate be "rescued" by a token, or the reverse, and make the outcome
// depend on which of two answers came last.
func (c *Check) read(ctx context.Context) outcome {
	cfg, cert, err := c.Credentials.CertConfig(c.now())
	if err == nil {
		return c.readByCertificate(ctx, cfg, cert.NotAfter)
	}
	if errors.Is(err, kube.ErrForeignCertificate) {
		// Refused like a certificate the API server rejects: whatever
		// the Machine says, a host holding another machine's identity
		// (a cloned disk) must not start a node. The report goes with
		// the token, and the daemon requests this host's own
		// certificate, after which the check allows again.
		return outcome{via: ViaCertificate, refusal: &Refusal{Reason: v1alpha3.ReasonCertificateRejected, Message: err.Error(), Err: err}}
	}
	if !errors.Is(err, kube.ErrNoCertificate) {
		return outcome{via: ViaCertificate, refusal: &Refusal{Reason: ReasonCredentialsUnusable, Message: err.Error(), Err: err}}
	}
	return c.readByToken(ctx)
}

func (c *Check) readByCertificate(ctx context.Context, cfg *rest.Config, notAfter time.Time) outcome {
	m, err := c.api().GetMachine(ctx, cfg, c.Machine)
	out := outcome{via: ViaCertificate, machine: m}
	switch {
	case err == nil:
		out.refusal = c.judge(m)
		return out
	case kube.Untrusted(err):
		return c.untrusted(ViaCertificate, err)
	case kube.NoAnswer(err):
		out.noAnswer = err
	case (apierrors.IsUnauthorized(err) || apierrors.IsForbidden(err)) && !c.now().Before(notAfter):
		// The certificate expired while the request was on its way: the
		// answer is about a credential that is gone, not about this host.
		// The next read uses the bootstrap token.
		out.noAnswer = fmt.Errorf("client certificate expired during the read (%w); the next read uses the bootstrap token", err)
	case apierrors.IsUnauthorized(err):
		out.refusal = &Refusal{Reason: v1alpha3.ReasonCertificateRejected, Message: "the API server rejected the client certificate (401)", Err: err}
	case apierrors.IsForbidden(err):
		out.refusal = &Refusal{Reason: v1alpha3.ReasonForbidden, Message: "the API server forbids reading Machine " + c.Machine + " (403): " + err.Error(), Err: err}
	case apierrors.IsNotFound(err):
		out.refusal = &Refusal{Reason: ReasonMachineNotFound, Message: "Machine " + c.Machine + " does not exist, so it binds no allocation", Err: err}
	default:
		out.refusal = &Refusal{Reason: v1alpha3.ReasonForbidden, Message: "reading Machine " + c.Machine + ": " + err.Error(), Err: err}
	}
	out.machine = nil
	return out
}

// judge decides on a Machine, read with either credential.
func (c *Check) judge(m *v1alpha3.Machine) *Refusal {
	switch a := m.Spec.Allocation; {
	case m.DeletionTimestamp != nil:
		return &Refusal{Reason: v1alpha3.ReasonMachineDeleting,
			Message: "Machine " + m.Name + " is being deleted (since " + m.DeletionTimestamp.UTC().Format(time.RFC3339) + ")"}
	case a == nil:
		return &Refusal{Reason: v1alpha3.ReasonAllocationMismatch,
			Message: "Machine " + m.Name + " binds no allocation; this host was launched for allocation " + c.AllocationUID}
	case a.UID != c.AllocationUID:
		return &Refusal{Reason: v1alpha3.ReasonAllocationMismatch,
			Message: fmt.Sprintf("Machine %s binds allocation %s (uid %q); this host was launched for uid %q", m.Name, a.Name, a.UID, c.AllocationUID)}
	case a.Fenced:
		return &Refusal{Reason: v1alpha3.ReasonAllocationFenced,
			Message: fmt.Sprintf("allocation %s (uid %s) is fenced", a.Name, a.UID)}
	}
	return nil
}

func (c *Check) readByToken(ctx context.Context) outcome {
	out := outcome{via: ViaToken}
	cfg, err := c.Credentials.BootstrapConfig()
	if err != nil {
		out.refusal = &Refusal{Reason: ReasonCredentialsUnusable, Message: "no usable client certificate and no usable bootstrap token: " + err.Error(), Err: err}
		return out
	}
	st, err := c.api().ReviewToken(ctx, cfg)
	switch {
	case err == nil:
	case kube.Untrusted(err):
		return c.untrusted(ViaToken, err)
	case kube.NoAnswer(err):
		out.noAnswer = err
		return out
	case apierrors.IsUnauthorized(err):
		err = kube.TokenRejected(err)
		out.refusal = &Refusal{Reason: v1alpha3.ReasonBootstrapTokenRejected, Message: "the API server rejected the bootstrap token (401): revoked or expired", Err: err}
		return out
	case apierrors.IsForbidden(err):
		out.refusal = &Refusal{Reason: v1alpha3.ReasonForbidden, Message: "the bootstrap token may not create TokenReviews (403): " + err.Error(), Err: err}
		return out
	default:
		out.refusal = &Refusal{Reason: v1alpha3.ReasonForbidden, Message: "TokenReview: " + err.Error(), Err: err}
		return out
	}
	if !st.Authenticated {
		out.refusal = &Refusal{Reason: v1alpha3.ReasonBootstrapTokenRejected, Message: "TokenReview: the bootstrap token does not authenticate (revoked or expired)", Err: kube.ErrBootstrapTokenRejected}
		return out
	}
	// A token of another Machine authenticates too; the per-machine group
	// in its auth-extra-groups says whose it is.
	want := identity.BootstrapGroup(c.Machine)
	if !slices.Contains(st.User.Groups, want) {
		out.refusal = &Refusal{Reason: v1alpha3.ReasonAllocationMismatch,
			Message: fmt.Sprintf("the bootstrap token authenticates as %s without group %s: it was not issued for Machine %s", st.User.Username, want, c.Machine)}
		return out
	}
	return c.readMachineByToken(ctx, cfg)
}

// readMachineByToken reads the Machine with the bootstrap token once the
// TokenReview said the token is this Machine's, and judges it as the
// certificate path does, since every "no" counts whichever credential read
// it: a token that still authenticates says nothing about the fence flag,
// the deletion or the allocation binding, and RBAC (the agents' grant in
// lib/api/manifests) lets the token read them. Only a 403 (a cluster with
// older manifests, or a token issued without the agents' group) leaves the
// TokenReview alone to allow, unconfirmed.
func (c *Check) readMachineByToken(ctx context.Context, cfg *rest.Config) outcome {
	out := outcome{via: ViaToken}
	m, err := c.api().GetMachine(ctx, cfg, c.Machine)
	switch {
	case err == nil:
		out.machine = m
		out.refusal = c.judge(m)
	case kube.Untrusted(err):
		return c.untrusted(ViaToken, err)
	case kube.NoAnswer(err):
		out.noAnswer = err
	case apierrors.IsUnauthorized(err):
		// Revoked between the TokenReview and this read.
		out.refusal = &Refusal{Reason: v1alpha3.ReasonBootstrapTokenRejected, Message: "the API server rejected the bootstrap token (401): revoked or expired", Err: kube.TokenRejected(err)}
	case apierrors.IsForbidden(err):
		// RBAC without the read grant for the bootstrap group: the
		// TokenReview is all the token can tell. Allowed, unconfirmed.
		out.unconfirmed = "the bootstrap token may not read Machine " + c.Machine + " (403), so the allocation was not checked on it"
	case apierrors.IsNotFound(err):
		out.refusal = &Refusal{Reason: ReasonMachineNotFound, Message: "Machine " + c.Machine + " does not exist, so it binds no allocation", Err: err}
	default:
		out.refusal = &Refusal{Reason: v1alpha3.ReasonForbidden, Message: "reading Machine " + c.Machine + " with the bootstrap token: " + err.Error(), Err: err}
	}
	return out
}

// reportRefusal sets AllocationLaunchRefused=True (and phase Refused) on the
// Machine, best effort, with whichever credential works now: the
// certificate first, then, when the server rejects or forbids it, the
// bootstrap token. Writing a "no" with the other credential cannot start
// the node, and it is how the admin learns that the certificate is
// rejected. It is bounded by ReportTimeout: the decision is made, a slow
// cluster must not hold the unit longer.
func (c *Check) reportRefusal(ctx context.Context, r *Refusal) {
	c.mutate(ctx, true, func(m *v1alpha3.Machine) bool {
		changed := meta.SetStatusCondition(&m.Status.Conditions, metav1.Condition{
			Type:               v1alpha3.ConditionAllocationLaunchRefused,
			Status:             metav1.ConditionTrue,
			Reason:             r.Reason,
			Message:            truncate(r.Message, 1024),
			ObservedGeneration: m.Generation,
		})
		if m.Status.Phase != v1alpha3.MachineRefused {
			m.Status.Phase = v1alpha3.MachineRefused
			changed = true
		}
		return changed
	})
}

// reportAllowed clears AllocationLaunchRefused (False) when it is set, and
// only after an allow that read the Machine and found the allocation bound
// on it: a TokenReview alone does not clear a recorded refusal. The
// Machine was just read, so an allowed check that has nothing to clear
// costs no second request; the write judges the Machine it writes again,
// so one fenced in between keeps its refusal.
func (c *Check) reportAllowed(ctx context.Context, out outcome) {
	if out.machine == nil || !meta.IsStatusConditionTrue(out.machine.Status.Conditions, v1alpha3.ConditionAllocationLaunchRefused) {
		return
	}
	c.mutate(ctx, false, func(m *v1alpha3.Machine) bool {
		if !meta.IsStatusConditionTrue(m.Status.Conditions, v1alpha3.ConditionAllocationLaunchRefused) || c.judge(m) != nil {
			return false
		}
		meta.SetStatusCondition(&m.Status.Conditions, metav1.Condition{
			Type:               v1alpha3.ConditionAllocationLaunchRefused,
			Status:             metav1.ConditionFalse,
			Reason:             v1alpha3.ReasonAllowed,
			Message:            "the allocation fence allowed the node start",
			ObservedGeneration: m.Generation,
		})
		if m.Status.Phase == v1alpha3.MachineRefused {
			// The daemon reports Ready once the node is up.
			m.Status.Phase = v1alpha3.MachinePending
		}
		return true
	})
}

// mutate writes the Machine's status with the certificate while one is
// usable, else with the bootstrap token. With orToken, a certificate that
// the server rejects (401) or forbids (403) hands the write to the token.
func (c *Check) mutate(ctx context.Context, orToken bool, f func(*v1alpha3.Machine) bool) {
	timeout := c.ReportTimeout
	if timeout <= 0 {
		timeout = 3 * time.Second
	}
	// The budget's context may be spent already; the report gets its own
	// short one. Not cancelled with the caller's either: the refusal is
	// decided, and a SIGTERM now should not lose its record.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	var cfgs []*rest.Config
	cfg, _, certErr := c.Credentials.CertConfig(c.now())
	if certErr == nil {
		cfgs = append(cfgs, cfg)
	}
	if certErr != nil || orToken {
		if cfg, err := c.Credentials.BootstrapConfig(); err == nil {
			cfgs = append(cfgs, cfg)
		} else if certErr != nil {
			c.log().Warn("cannot report on the Machine: no usable credential", "error", err.Error())
			return
		}
	}
	for i, cfg := range cfgs {
		err := c.api().MutateStatus(ctx, cfg, c.Machine, f)
		if err == nil {
			return
		}
		if i+1 < len(cfgs) && (apierrors.IsUnauthorized(err) || apierrors.IsForbidden(err)) {
			c.log().Info("the client certificate may not report on the Machine; reporting with the bootstrap token", "machine", c.Machine, "error", err.Error())
			continue
		}
		c.log().Warn("cannot report "+v1alpha3.ConditionAllocationLaunchRefused+" on the Machine", "machine", c.Machine, "error", err.Error())
		return
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-3] + "..."
}

// restAPI is the real API: client-go against the API server.
type restAPI struct{}

func (restAPI) GetMachine(ctx context.Context, cfg *rest.Config, name string) (*v1alpha3.Machine, error) {
	ms, err := kube.NewMachines(cfg)
	if err != nil {
		return nil, err
	}
	return ms.Get(ctx, name)
}

func (restAPI) ReviewToken(ctx context.Context, cfg *rest.Config) (*authenticationv1.TokenReviewStatus, error) {
	return kube.ReviewOwnToken(ctx, cfg)
}

func (restAPI) MutateStatus(ctx context.Context, cfg *rest.Config, name string, mutate func(*v1alpha3.Machine) bool) error {
	ms, err := kube.NewMachines(cfg)
	if err != nil {
		return err
	}
	_, err = ms.MutateStatus(ctx, name, mutate)
	return err
}

// notValidNow reports whether err is a TLS verification failure only
// because a certificate of the chain is outside its validity period at
// this host's time (crypto/x509 says "expired" for both "not yet valid"
// and "expired"). With a trusted CA and the right name, that is what a
// host whose clock is far off sees.
func notValidNow(err error) bool {
	var invalid x509.CertificateInvalidError
	return err != nil && errors.As(err, &invalid) && invalid.Reason == x509.Expired
}
