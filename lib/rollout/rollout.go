// Package rollout decides a MachineRollout's next step from what the
// cluster shows (its hosts' operations, Nodes and Machines) and the time:
// which hosts are done, failed or unavailable, which may start now within
// the budgets and the maintenance window, and when to look again. It
// reads and writes nothing: lib/controller feeds it and carries its
// decision out, so that every rule here is tested without an API server.
package rollout

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/kube"
)

// Host is one selected host as the cluster shows it.
type Host struct {
	// Name is the Machine's (and its Node's).
	Name string
	// Op is the host's latest operation of this rollout (the highest
	// attempt found), nil if none.
	Op *v1alpha3.MachineOperation
	// Attempt is Op's attempt (0 without one).
	Attempt int32
	// Node and Machine, nil when missing.
	Node    *corev1.Node
	Machine *v1alpha3.Machine
	// Busy names another unfinished operation of the host's (any
	// rollout's or an operator's): the host waits for it. Filled only for
	// the hosts a first Decide would start.
	Busy string
}

// Decision is what the rollout does now.
type Decision struct {
	// Hosts is the status' hosts, by name.
	Hosts []v1alpha3.RolloutHost
	// Start names the hosts whose operation to create now (their entry in
	// Hosts says the attempt and operation name).
	Start                     []string
	Phase                     v1alpha3.RolloutPhase
	Message                   string
	Done, Unavailable, Failed int32
	// Next is when to look again without being woken (zero: no such
	// time).
	Next time.Time
}

// OperationName is the name of a host's attempt-th operation of rollout:
// MACHINE-ROLLOUT, then MACHINE-ROLLOUT-2 ...; one name per attempt, so
// that creating it twice (a controller restarted between the create and
// its status write) creates one operation. A name over the API's 253
// characters keeps a hash of the rest.
func OperationName(rollout, machine string, attempt int32) string {
	n := machine + "-" + rollout
	if attempt > 1 {
		n += "-" + strconv.Itoa(int(attempt))
	}
	if len(n) > 253 {
		sum := sha256.Sum256([]byte(n))
		n = strings.TrimRight(n[:253-17], "-.") + "-" + hex.EncodeToString(sum[:8])
	}
	return n
}

// Budget is n resolved against total: a count, or a percentage rounded
// down, and at least one.
func Budget(n *intstr.IntOrString, total int) (int, error) {
	if n == nil {
		return 1, nil
	}
	v, err := intstr.GetScaledValueFromIntOrPercent(n, total, false)
	if err != nil {
		return 0, err
	}
	if v < 0 {
		return 0, fmt.Errorf("%s is negative", n.String())
	}
	return max(v, 1), nil
}

// Decide judges every host and says which start now. prev is the status'
// hosts (what the rollout recorded), hosts what the cluster shows now, in
// the rollout's order (its spec.machines, else its selector's Machines by
// name), which is the order they start in.
func Decide(r *v1alpha3.MachineRollout, hosts []Host, now time.Time) (Decision, error) {
	var d Decision
	prev := map[string]v1alpha3.RolloutHost{}
	for _, h := range r.Status.Hosts {
		prev[h.Name] = h
	}
	readyFor := time.Duration(r.Spec.ReadySeconds) * time.Second
	threshold := int32(max(r.Spec.FailureThreshold, 1))
	maxU, err := Budget(r.Spec.MaxUnavailable, len(hosts))
	if err != nil {
		return d, fmt.Errorf("spec.maxUnavailable: %w", err)
	}

	var next []time.Time
	for _, h := range hosts {
		st, nx := judge(r, h, prev[h.Name], now, readyFor)
		if !nx.IsZero() {
			next = append(next, nx)
		}
		d.Hosts = append(d.Hosts, st)
	}

	// Budgets: overall and per topology domain.
	domain := func(i int) string {
		if r.Spec.Topology == nil || hosts[i].Node == nil {
			return ""
		}
		return hosts[i].Node.Labels[r.Spec.Topology.Key]
	}
	size, down := map[string]int{}, map[string]int{}
	unavailable := 0
	for i, st := range d.Hosts {
		size[domain(i)]++
		switch {
		case st.State.Unavailable():
			unavailable++
			down[domain(i)]++
		case st.State == v1alpha3.HostDone:
			d.Done++
		case st.State == v1alpha3.HostFailed:
			d.Failed++
		}
	}
	topoLimit := func(dom string) (int, error) {
		if r.Spec.Topology == nil {
			return len(hosts), nil
		}
		return Budget(&r.Spec.Topology.MaxUnavailable, size[dom])
	}

	open, opens, err := Open(r.Spec.Window, now)
	if err != nil {
		return d, fmt.Errorf("spec.window: %w", err)
	}
	pending := 0
	for _, st := range d.Hosts {
		if st.State == v1alpha3.HostPending {
			pending++
		}
	}
	switch {
	case d.Failed >= threshold:
		d.Phase = v1alpha3.RolloutStopped
		d.Message = fmt.Sprintf("stopped: %d host(s) failed (failureThreshold %d); %d not started are left untouched; change the spec to retry the failed", d.Failed, threshold, pending)
	case len(hosts) == 0:
		d.Phase = v1alpha3.RolloutComplete
		d.Message = "no Machine matched the selector when the rollout began: nothing to do"
	case pending == 0 && unavailable == 0:
		d.Phase = v1alpha3.RolloutComplete
		d.Message = fmt.Sprintf("%d host(s) done", d.Done)
	case r.Spec.Paused:
		d.Phase, d.Message = v1alpha3.RolloutPaused, "paused: no new operation starts"
	case !open && pending > 0:
		d.Phase = v1alpha3.RolloutOutsideWindow
		d.Message = "outside the maintenance window: the next host starts at " + opens.Format(time.RFC3339)
		next = append(next, opens)
	default:
		d.Phase = v1alpha3.RolloutProgressing
		for i := range d.Hosts {
			st := &d.Hosts[i]
			if st.State != v1alpha3.HostPending {
				continue
			}
			if unavailable >= maxU {
				st.Message = fmt.Sprintf("waiting: %d host(s) unavailable, maxUnavailable %d", unavailable, maxU)
				continue
			}
			dom := domain(i)
			lim, err := topoLimit(dom)
			if err != nil {
				return d, fmt.Errorf("spec.topology.maxUnavailable: %w", err)
			}
			if down[dom] >= lim {
				st.Message = fmt.Sprintf("waiting: %d host(s) unavailable in %s=%q, its limit %d", down[dom], r.Spec.Topology.Key, dom, lim)
				continue
			}
			if hosts[i].Busy != "" {
				st.Message = "waiting: operation " + hosts[i].Busy + " of this host has not finished"
				continue
			}
			st.Attempt++
			st.Generation = r.Generation
			st.Operation = OperationName(r.Name, st.Name, st.Attempt)
			st.State, st.Message = v1alpha3.HostInProgress, "operation "+st.Operation+" created"
			d.Start = append(d.Start, st.Name)
			unavailable++
			down[dom]++
		}
		if d.Message == "" {
			d.Message = fmt.Sprintf("%d done, %d unavailable, %d failed, %d waiting", d.Done, unavailable, d.Failed, pending-len(d.Start))
		}
	}
	d.Unavailable = int32(unavailable)
	if len(next) > 0 {
		d.Next = slices.MinFunc(next, func(a, b time.Time) int { return a.Compare(b) })
	}
	return d, nil
}

// judge is one host's state, and when its state may change by time alone.
func judge(r *v1alpha3.MachineRollout, h Host, prev v1alpha3.RolloutHost, now time.Time, readyFor time.Duration) (v1alpha3.RolloutHost, time.Time) {
	st := v1alpha3.RolloutHost{Name: h.Name, State: v1alpha3.HostPending, Attempt: h.Attempt, Generation: prev.Generation}
	if h.Op != nil {
		st.Operation = h.Op.Name
	}
	if prev.Attempt > h.Attempt && h.Op == nil && prev.State.Unavailable() {
		// Recorded as started, its operation is gone.
		st.Attempt, st.Operation = prev.Attempt, prev.Operation
		st.State, st.Message = v1alpha3.HostFailed, "operation "+prev.Operation+" was deleted before it finished"
		return retry(r, st), time.Time{}
	}
	if prev.State == v1alpha3.HostDone && prev.Attempt == h.Attempt {
		return prev, time.Time{} // done stays done
	}
	if h.Op == nil {
		return st, time.Time{}
	}
	op := h.Op
	if g, err := strconv.ParseInt(op.Labels[GenerationLabel], 10, 64); err == nil {
		st.Generation = g
	}
	s := op.Status
	switch s.State {
	case v1alpha3.OperationFailed:
		st.State = v1alpha3.HostFailed
		st.Message = fmt.Sprintf("%s failed (%s): %s", op.Name, cmp.Or(s.Reason, "<none>"), kube.Truncate(strings.Join(strings.Fields(s.Message), " "), 300))
		return retry(r, st), time.Time{}
	case v1alpha3.OperationComplete:
	default:
		st.State = v1alpha3.HostInProgress
		st.Message = fmt.Sprintf("%s %s", op.Name, cmp.Or(string(s.State), "Pending (the host's daemon has not picked it up)"))
		return st, time.Time{}
	}
	st.State = v1alpha3.HostVerifying
	if why := recoveryFailed(h.Machine, op); why != "" {
		st.State, st.Message = v1alpha3.HostFailed, why
		return retry(r, st), time.Time{}
	}
	ok, why := kube.ReadyAfter(op, h.Node)
	if !ok {
		st.Message = "health gate: " + why
		return st, time.Time{}
	}
	since := kube.Readiness(h.Node).Transition
	if s.CompletionTime != nil && s.CompletionTime.After(since) {
		since = s.CompletionTime.Time
	}
	if left := since.Add(readyFor).Sub(now); left > 0 {
		st.Message = fmt.Sprintf("health gate: Node Ready since %s, %s to go", since.UTC().Format(time.RFC3339), left.Round(time.Second))
		return st, since.Add(readyFor)
	}
	st.State, st.Message = v1alpha3.HostDone, ""
	return st, time.Time{}
}

// retry turns a host that failed at an older generation of the rollout
// back into a pending one: the changed spec is tried on it.
func retry(r *v1alpha3.MachineRollout, st v1alpha3.RolloutHost) v1alpha3.RolloutHost {
	if st.State == v1alpha3.HostFailed && st.Generation < r.Generation {
		st.State, st.Message = v1alpha3.HostPending, "retried: the spec changed since "+st.Message
	}
	return st
}

// GenerationLabel labels an operation with the rollout generation it was
// created for (so that a restarted controller knows it without its status).
const GenerationLabel = v1alpha3.GroupName + "/rollout-generation"

// recoveryFailed: the Machine's Recovered condition turned False after
// the operation started (a unit failed and recovery could not repair it
// or held back): the health gate fails.
func recoveryFailed(m *v1alpha3.Machine, op *v1alpha3.MachineOperation) string {
	if m == nil || op.Status.StartTime == nil {
		return ""
	}
	c := metaFind(m.Status.Conditions, v1alpha3.ConditionRecovered)
	if c == nil || c.Status != metav1.ConditionFalse || c.LastTransitionTime.Before(op.Status.StartTime) {
		return ""
	}
	return fmt.Sprintf("health gate: recovery reported %s since %s: %s", c.Reason, op.Name, kube.Truncate(c.Message, 300))
}

func metaFind(cs []metav1.Condition, t string) *metav1.Condition {
	for i := range cs {
		if cs[i].Type == t {
			return &cs[i]
		}
	}
	return nil
}
