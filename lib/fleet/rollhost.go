package fleet

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/watch"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/kube"
)

// outcome is how one host of a roll ended.
type outcome int

const (
	outcomeDone        outcome = iota + 1 // operation Complete, Node Ready again
	outcomeFailed                         // operation Failed, deleted, or its Node not back in time
	outcomeInterrupted                    // the roll's context ended first
)

type hostResult struct {
	machine, opName string
	outcome         outcome
	// created: the host has an operation in this roll (created now, or
	// adopted from an earlier run).
	created bool
	// state is the host's last state as the progress line said it.
	state string
	// why a host failed: the operation's reason and message, or what its
	// Node did.
	why string
}

// hostEvent is one event of a host's watches, or a watch that could not
// be re-opened (it is tried again).
type hostEvent struct {
	node bool
	ev   watch.Event
	err  error
}

// hostRun is what the roll knows of one host while it runs.
type hostRun struct {
	r      *roller
	h      hostPlan
	tag    string
	began  time.Time
	ctx    context.Context
	cancel context.CancelFunc // stops the host's watches
	events chan hostEvent
	res    hostResult
	op     *v1alpha3.MachineOperation // last seen; nil before the first
	gone   bool                       // the operation was deleted
	node   *corev1.Node               // last seen; nil while absent
	last   string                     // the last progress line's state
}

// startHost starts the host's part: opens its watches and creates its
// operation (or adopts the one an earlier run left running). It runs in
// the roll's loop, one host after the other, so that operations are
// created in the roll's order. It returns the host to wait for, or its
// result when it did not start.
func (r *roller) startHost(ctx context.Context, h hostPlan, nth, total int) (*hostRun, *hostResult) {
	ctx, cancel := context.WithCancel(ctx)
	hr := &hostRun{r: r, h: h, tag: fmt.Sprintf("[%d/%d] %s", nth, total, h.machine), began: r.o.Now(),
		ctx: ctx, cancel: cancel, events: make(chan hostEvent)}
	hr.res = hostResult{machine: h.machine, opName: h.opName, created: h.adopt != nil}
	notStarted := func(err error) (*hostRun, *hostResult) {
		cancel()
		if ctx.Err() != nil {
			hr.res.outcome, hr.res.state = outcomeInterrupted, "not started"
			return nil, &hr.res
		}
		hr.res.outcome, hr.res.why = outcomeFailed, err.Error()
		hr.progress("not started: " + err.Error())
		return nil, &hr.res
	}
	if err := r.watchHost(ctx, h.machine, hr.events); err != nil {
		return notStarted(err)
	}
	if h.adopt != nil {
		hr.progress("waiting for its operation " + h.opName + " from an earlier run")
		return hr, nil
	}
	if _, err := r.api.CreateOperation(ctx, r.newOperation(h)); err != nil {
		return notStarted(fmt.Errorf("create the operation %s: %w", h.opName, err))
	}
	hr.res.created = true
	hr.progress("created operation " + h.opName)
	return hr, nil
}

// newOperation is the host's operation: labelled with its machine (the
// daemon watches by it, and an admission policy holds it equal to
// machineRef) and with the roll.
func (r *roller) newOperation(h hostPlan) *v1alpha3.MachineOperation {
	return &v1alpha3.MachineOperation{
		TypeMeta: metav1.TypeMeta{APIVersion: v1alpha3.SchemeGroupVersion.String(), Kind: "MachineOperation"},
		ObjectMeta: metav1.ObjectMeta{Name: h.opName, Labels: map[string]string{
			v1alpha3.MachineLabel: h.machine,
			RollLabel:             r.o.ID,
		}},
		Spec: v1alpha3.MachineOperationSpec{
			MachineRef: v1alpha3.MachineRef{Name: h.machine},
			Operation:  r.o.Operation,
			Parameters: r.o.parameters(),
		},
	}
}

// watchHost opens the host's two watches, its operations in this roll and
// its Node, before the operation is created: each begins with the current
// objects (resourceVersion ""), so nothing before or after the creation is
// missed, and the roll sends no request while it waits.
func (r *roller) watchHost(ctx context.Context, machine string, out chan<- hostEvent) error {
	opSel := labels.Set{v1alpha3.MachineLabel: machine, RollLabel: r.o.ID}.String()
	ops := func(ctx context.Context) (watch.Interface, error) { return r.api.WatchOperations(ctx, opSel, "") }
	nodes := func(ctx context.Context) (watch.Interface, error) {
		return r.core.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{
			FieldSelector: fields.OneTermEqualSelector("metadata.name", machine).String(), AllowWatchBookmarks: true})
	}
	ow, err := ops(ctx)
	if err != nil {
		return fmt.Errorf("watch the operations of %s: %w", machine, err)
	}
	nw, err := nodes(ctx)
	if err != nil {
		ow.Stop()
		return fmt.Errorf("watch the Node %s: %w", machine, err)
	}
	go follow(ctx, ow, ops, false, out)
	go follow(ctx, nw, nodes, true, out)
	return nil
}

// follow hands w's events to the host's loop until ctx ends. When the API
// server ends the watch (every watch ends after its --min-request-timeout;
// a roll can outlive it) or sends an error (410 Gone), it opens it again
// a second later, from the current objects: the loop takes them like any
// change.
func follow(ctx context.Context, w watch.Interface, open func(context.Context) (watch.Interface, error), node bool, out chan<- hostEvent) {
	for {
		ended := pass(ctx, w, node, out)
		w.Stop()
		if !ended {
			return
		}
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
			var err error
			if w, err = open(ctx); err == nil {
				break
			}
			if !send(ctx, out, hostEvent{node: node, err: err}) {
				return
			}
		}
	}
}

// pass forwards w's events until the watch ends (true) or ctx does
// (false).
func pass(ctx context.Context, w watch.Interface, node bool, out chan<- hostEvent) bool {
	for {
		select {
		case <-ctx.Done():
			return false
		case ev, ok := <-w.ResultChan():
			switch {
			case !ok || ev.Type == watch.Error:
				return true
			case ev.Type == watch.Bookmark:
			case !send(ctx, out, hostEvent{node: node, ev: ev}):
				return false
			}
		}
	}
}

func send(ctx context.Context, out chan<- hostEvent, e hostEvent) bool {
	select {
	case out <- e:
		return true
	case <-ctx.Done():
		return false
	}
}

// wait follows the host until its operation is final and, when
// Complete, its Node Ready again (within ReadyTimeout), or the roll's
// context ends.
func (hr *hostRun) wait() hostResult {
	defer hr.cancel()
	ctx, events, res := hr.ctx, hr.events, hr.res
	var readyTimeout <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			res.outcome, res.state = outcomeInterrupted, hr.last
			return res
		case <-readyTimeout:
			res.outcome = outcomeFailed
			res.why = fmt.Sprintf("%s %s, but its Node is not Ready again after %s (%s)", hr.h.opName, v1alpha3.OperationComplete, hr.r.o.ReadyTimeout, hr.nodeState())
			hr.progress("failed: " + res.why)
			return res
		case e := <-events:
			if e.err != nil {
				hr.progress(fmt.Sprintf("%s (watch cut, reopening: %v)", hr.last, e.err))
				continue
			}
			hr.take(e)
			o, why := hr.judge()
			switch o {
			case outcomeDone:
				res.outcome = o
				hr.progress(fmt.Sprintf("done: %s, Node Ready", v1alpha3.OperationComplete))
				return res
			case outcomeFailed:
				res.outcome, res.why = o, why
				hr.progress("failed: " + why)
				return res
			}
			if hr.op != nil && hr.op.Status.State == v1alpha3.OperationComplete && readyTimeout == nil {
				readyTimeout = time.After(hr.r.o.ReadyTimeout)
			}
			hr.progress(why)
		}
	}
}

// take records an event of the host's operation or Node (a watch on a
// server that ignores the selector may bring others: they are not ours).
func (hr *hostRun) take(e hostEvent) {
	deleted := e.ev.Type == watch.Deleted
	switch o := e.ev.Object.(type) {
	case *corev1.Node:
		if !e.node || o.Name != hr.h.machine {
			return
		}
		hr.node = o
		if deleted {
			hr.node = nil
		}
	case *v1alpha3.MachineOperation:
		if e.node || o.Name != hr.h.opName {
			return
		}
		hr.op, hr.gone = o, deleted
	}
}

// judge says whether the host is done or failed, and else its state for
// the progress line.
func (hr *hostRun) judge() (outcome, string) {
	op := hr.op
	switch {
	case hr.gone:
		return outcomeFailed, fmt.Sprintf("operation %s was deleted before it finished", hr.h.opName)
	case op == nil:
		return 0, "" // the Node's watch answered first
	}
	st := op.Status
	switch st.State {
	case v1alpha3.OperationFailed:
		return outcomeFailed, fmt.Sprintf("%s %s %s (%s): %s", op.Name, op.Spec.Operation, st.State, orNone(st.Reason), kube.Truncate(oneLine(st.Message), 400))
	case v1alpha3.OperationComplete:
		if ok, why := kube.ReadyAfter(op, hr.node); !ok {
			return 0, fmt.Sprintf("%s (%s); waiting for the Node: %s", st.State, orNone(st.Reason), why)
		}
		return outcomeDone, ""
	case "":
		return 0, string(v1alpha3.OperationPending) + " (the host's daemon has not picked it up)"
	}
	s := string(st.State)
	if st.Reason != "" || st.Message != "" {
		s += fmt.Sprintf(" (%s: %s)", orNone(st.Reason), kube.Truncate(oneLine(st.Message), 200))
	}
	return 0, s
}

// nodeState is the Node's Ready as the timeout's message says it.
func (hr *hostRun) nodeState() string {
	if hr.op == nil {
		return "no operation seen"
	}
	_, why := kube.ReadyAfter(hr.op, hr.node)
	return why
}

// progress prints the host's line when its state changed: plain lines,
// one per change, whether or not the output is a terminal (a roll's log
// reads the same in a CI job).
func (hr *hostRun) progress(state string) {
	if state == "" || state == hr.last {
		return
	}
	hr.last = state
	hr.r.printf("%s +%s: %s\n", hr.tag, hr.r.o.Now().Sub(hr.began).Round(time.Second), state)
}

func orNone(s string) string {
	if s == "" {
		return "<none>"
	}
	return s
}
