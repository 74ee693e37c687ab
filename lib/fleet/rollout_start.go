package fleet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
)

// ErrRolloutStopped: the MachineRollout a command follows stopped (its
// failureThreshold reached); the cluster left the rest untouched. The
// caller exits non-zero.
var ErrRolloutStopped = errors.New("rollout stopped")

// rollouts is the MachineRollouts' resource.
var rollouts = v1alpha3.SchemeGroupVersion.WithResource(v1alpha3.ResourceMachineRollouts)

// NewRollout is the MachineRollout that runs o in the cluster
// (unbounded-controller): named "<verb>-<id>" (o.ID, else the time), its
// hosts o's machines in their order or its selector's, at most
// o.MaxUnavailable at once. It validates o first. What only a workstation
// roll has (--resume, --ready-timeout) is refused here with what to do
// instead.
func NewRollout(o RollOptions, now time.Time) (*v1alpha3.MachineRollout, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if o.Resume {
		return nil, errors.New("--resume continues a roll of this workstation (--local); a MachineRollout goes on by itself, and a stopped one retries its failed hosts once its spec changes (kubectl edit umr NAME)")
	}
	if o.ReadyTimeout != 0 && o.ReadyTimeout != DefaultReadyTimeout {
		return nil, errors.New("--ready-timeout bounds a roll of this workstation (--local); a MachineRollout's host is done once its Node has been Ready for its readySeconds")
	}
	id := o.ID
	if id == "" {
		id = now.UTC().Format("20060102-150405")
	}
	budget := intstr.FromInt(o.MaxUnavailable)
	ro := &v1alpha3.MachineRollout{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha3.SchemeGroupVersion.String(), Kind: "MachineRollout"},
		ObjectMeta: metav1.ObjectMeta{Name: verbs[o.Operation] + "-" + id},
		Spec: v1alpha3.MachineRolloutSpec{Operation: o.Operation, Parameters: o.parameters(), MaxUnavailable: &budget,
			Machines: o.Machines},
	}
	if o.Selector != "" {
		sel, err := labelSelector(o.Selector)
		if err != nil {
			return nil, fmt.Errorf("-l %q: %w", o.Selector, err)
		}
		ro.Spec.Selector = sel
	}
	return ro, nil
}

// labelSelector is -l's selector (kubectl's syntax, labels.Parse) as a
// rollout's LabelSelector: k=v and k==v as matchLabels, k!=v as NotIn,
// in, notin, k and !k as they are. Gt and Lt have no LabelSelector form.
func labelSelector(s string) (*metav1.LabelSelector, error) {
	parsed, err := labels.Parse(s)
	if err != nil {
		return nil, err
	}
	reqs, _ := parsed.Requirements()
	sel := &metav1.LabelSelector{}
	for _, r := range reqs {
		var op metav1.LabelSelectorOperator
		switch r.Operator() {
		case selection.Equals, selection.DoubleEquals:
			if sel.MatchLabels == nil {
				sel.MatchLabels = map[string]string{}
			}
			v, _ := r.Values().PopAny()
			sel.MatchLabels[r.Key()] = v
			continue
		case selection.NotEquals, selection.NotIn:
			op = metav1.LabelSelectorOpNotIn
		case selection.In:
			op = metav1.LabelSelectorOpIn
		case selection.Exists:
			op = metav1.LabelSelectorOpExists
		case selection.DoesNotExist:
			op = metav1.LabelSelectorOpDoesNotExist
		default:
			return nil, fmt.Errorf("%s %s: a MachineRollout's selector has no such operator (roll from this workstation with --local)", r.Key(), r.Operator())
		}
		sel.MatchExpressions = append(sel.MatchExpressions, metav1.LabelSelectorRequirement{Key: r.Key(), Operator: op, Values: r.Values().List()})
	}
	return sel, nil
}

// CreateRollout creates ro (with dryRun, the API server only checks it:
// its schema and rules, nothing created) and says so on out.
func CreateRollout(ctx context.Context, dyn dynamic.Interface, ro *v1alpha3.MachineRollout, dryRun bool, out io.Writer) error {
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(ro)
	if err != nil {
		return err
	}
	opts := metav1.CreateOptions{}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	if _, err := dyn.Resource(rollouts).Create(ctx, &unstructured.Unstructured{Object: obj}, opts); err != nil {
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("create MachineRollout %s: %w (the cluster lacks the agent's manifests of this release: unbounded manifests | kubectl apply -f -; or roll from this workstation with --local)", ro.Name, err)
		}
		return fmt.Errorf("create MachineRollout %s: %w", ro.Name, err)
	}
	hosts := fmt.Sprintf("machines %v", ro.Spec.Machines)
	if ro.Spec.Selector != nil {
		hosts = "the Machines of -l " + metav1.FormatLabelSelector(ro.Spec.Selector)
	}
	if dryRun {
		fmt.Fprintf(out, "dry run: MachineRollout %s (%s of %s, %s at a time) would be created; the API server accepts it\n",
			ro.Name, ro.Spec.Operation, hosts, ro.Spec.MaxUnavailable.String())
		return nil
	}
	fmt.Fprintf(out, "MachineRollout %s created: %s of %s, %s at a time, run by unbounded-controller (it goes on without this command: kubectl unbounded get rollouts)\n",
		ro.Name, ro.Spec.Operation, hosts, ro.Spec.MaxUnavailable.String())
	return nil
}

// FollowRollout prints the rollout's progress (its phase, each host's
// state) as the cluster writes it, until it is Complete (nil), Stopped
// (ErrRolloutStopped), deleted, or ctx ends (nil: the rollout goes on
// without its follower). It reads by a watch, reopened when the API
// server ends it.
func FollowRollout(ctx context.Context, dyn dynamic.Interface, name string, out io.Writer) error {
	res := dyn.Resource(rollouts)
	var last *v1alpha3.MachineRollout
	report := func(u *unstructured.Unstructured) (done bool, err error) {
		var ro v1alpha3.MachineRollout
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &ro); err != nil {
			return false, fmt.Errorf("MachineRollout %s: %w", name, err)
		}
		printProgress(out, last, &ro)
		last = &ro
		switch ro.Status.Phase {
		case v1alpha3.RolloutComplete:
			return true, nil
		case v1alpha3.RolloutStopped:
			return true, fmt.Errorf("%w: MachineRollout %s: %s (a change of its spec retries the failed hosts)", ErrRolloutStopped, name, ro.Status.Message)
		}
		return false, nil
	}
	backoff := 500 * time.Millisecond
	for {
		u, err := res.Get(ctx, name, metav1.GetOptions{})
		switch {
		case ctx.Err() != nil:
			fmt.Fprintf(out, "no longer following MachineRollout %s; it goes on in the cluster\n", name)
			return nil
		case apierrors.IsNotFound(err):
			return fmt.Errorf("MachineRollout %s was deleted", name)
		case err != nil:
			// The API server did not answer: again, within the context.
			select {
			case <-ctx.Done():
			case <-time.After(backoff):
				backoff = min(2*backoff, 10*time.Second)
			}
			continue
		}
		backoff = 500 * time.Millisecond
		if done, err := report(u); done || err != nil {
			return err
		}
		w, err := res.Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String(),
			ResourceVersion: u.GetResourceVersion()})
		if err != nil {
			continue
		}
		done, err := followWatch(w, name, report)
		w.Stop()
		if done || err != nil {
			return err
		}
	}
}

// followWatch reports each change the watch delivers, until the rollout
// ends (done), is deleted (an error) or the watch closes (neither: the
// caller reads and watches again).
func followWatch(w watch.Interface, name string, report func(*unstructured.Unstructured) (bool, error)) (bool, error) {
	for ev := range w.ResultChan() {
		switch ev.Type {
		case watch.Deleted:
			return true, fmt.Errorf("MachineRollout %s was deleted", name)
		case watch.Added, watch.Modified:
			u, ok := ev.Object.(*unstructured.Unstructured)
			if !ok {
				continue
			}
			if done, err := report(u); done || err != nil {
				return done, err
			}
		case watch.Error:
			return false, nil
		}
	}
	return false, nil
}

// printProgress prints what changed from prev (nil: the first look) to ro:
// the phase and its message, each host's state.
func printProgress(out io.Writer, prev, ro *v1alpha3.MachineRollout) {
	if prev == nil || prev.Status.Phase != ro.Status.Phase || prev.Status.Message != ro.Status.Message {
		phase := string(ro.Status.Phase)
		if phase == "" {
			phase = "not started"
		}
		fmt.Fprintf(out, "%s: %s, %d/%d done, %d failed", ro.Name, phase, ro.Status.Done, ro.Status.Total, ro.Status.Failed)
		if ro.Status.Message != "" {
			fmt.Fprintf(out, ": %s", ro.Status.Message)
		}
		fmt.Fprintln(out)
	}
	was := map[string]v1alpha3.RolloutHost{}
	if prev != nil {
		for _, h := range prev.Status.Hosts {
			was[h.Name] = h
		}
	}
	for _, h := range ro.Status.Hosts {
		if p, ok := was[h.Name]; ok && p.State == h.State && p.Operation == h.Operation {
			continue
		}
		if h.State == v1alpha3.HostPending && was[h.Name].State == "" {
			continue // every host starts Pending: said once it moves
		}
		line := fmt.Sprintf("  %s: %s", h.Name, h.State)
		if h.Operation != "" {
			line += " (" + h.Operation + ")"
		}
		if h.Message != "" {
			line += ": " + h.Message
		}
		fmt.Fprintln(out, line)
	}
}
