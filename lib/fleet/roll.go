package fleet

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/url"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"unbounded-cloud.io/agent/lib/api/identity"
	"unbounded-cloud.io/agent/lib/api/v1alpha3"
)

// RollLabel marks the MachineOperations of one roll (kubectl unbounded
// repave|restart|reboot|upgrade); its value is the roll's id. The roll
// keeps no state on the workstation: --resume finds by this label what an
// earlier run of the same roll did, so a roll resumes from any
// workstation, and `kubectl get umo -l unbounded-cloud.io/roll=ID` shows it.
const RollLabel = v1alpha3.GroupName + "/roll"

// DefaultReadyTimeout bounds the wait for a host's Node to be Ready again
// after its operation completed: past it the roll stops at that host, as
// at a failed operation, rather than hang on a node that never returns.
const DefaultReadyTimeout = 10 * time.Minute

var (
	// ErrRollFailed: a host's operation failed, or its Node did not come
	// back; the roll started nothing after it. The caller exits non-zero;
	// the error names the host and the output says how to resume.
	ErrRollFailed = errors.New("roll stopped")
	// ErrInterrupted: the roll's context ended (SIGINT, SIGTERM); no new
	// operation was started and the running ones were left to finish. The
	// caller exits non-zero.
	ErrInterrupted = errors.New("roll interrupted")
)

// RollAPI is what a roll needs of the agent's API group; *kube.Machines is
// the real one.
type RollAPI interface {
	List(ctx context.Context) (*v1alpha3.MachineList, error)
	ListOperations(ctx context.Context, selector string) (*v1alpha3.MachineOperationList, error)
	WatchOperations(ctx context.Context, selector, resourceVersion string) (watch.Interface, error)
	CreateOperation(ctx context.Context, op *v1alpha3.MachineOperation) (*v1alpha3.MachineOperation, error)
}

// RollOptions say what a roll does, to which machines, how wide.
type RollOptions struct {
	Operation v1alpha3.OperationType
	// Machines, in the order given, or Selector (a label selector on
	// Machines, taken in name order): one of the two.
	Machines []string
	Selector string
	// MaxUnavailable hosts at most have an operation in flight (or a Node
	// not Ready again after it) at any time.
	MaxUnavailable int
	// Version, URL and SHA256 are an AgentUpgrade's parameters, as the
	// host's upgrade reads them (README "Agent upgrade").
	Version, URL, SHA256 string
	// ID names the roll (RollLabel); "" makes a new one. Resume continues
	// the roll ID: hosts whose operation of this kind completed in it are
	// skipped, one still running is waited for, a failed one is retried.
	ID     string
	Resume bool
	// DryRun prints the plan and creates nothing.
	DryRun bool
	// ReadyTimeout: 0 is DefaultReadyTimeout.
	ReadyTimeout time.Duration
	Out          io.Writer
	// Requests, when set, reads the number of API requests made so far
	// (RequestCounter.Count), for the summary.
	Requests func() int64
	// Now is the clock of the elapsed times; nil is time.Now.
	Now func() time.Time
}

// verbs are the command's names of the operations a roll can run.
var verbs = map[v1alpha3.OperationType]string{
	v1alpha3.OperationRepave:       "repave",
	v1alpha3.OperationRestart:      "restart",
	v1alpha3.OperationReboot:       "reboot",
	v1alpha3.OperationAgentUpgrade: "upgrade",
}

// Validate refuses bad input before any request is made (Roll calls it
// first; a command calls it before it reads the kubeconfig).
func (o *RollOptions) Validate() error {
	if _, ok := verbs[o.Operation]; !ok {
		return fmt.Errorf("operation %q: one of Repave, Restart, Reboot, AgentUpgrade", o.Operation)
	}
	if o.MaxUnavailable < 1 {
		return fmt.Errorf("--max-unavailable %d: at least 1", o.MaxUnavailable)
	}
	switch {
	case len(o.Machines) == 0 && o.Selector == "":
		return errors.New("name the machines (MACHINE...) or select them (-l SELECTOR)")
	case len(o.Machines) > 0 && o.Selector != "":
		return errors.New("name the machines or select them with -l, not both")
	}
	for _, m := range o.Machines {
		if err := identity.ValidateMachineName(m); err != nil {
			return err
		}
	}
	if o.Selector != "" {
		if _, err := labels.Parse(o.Selector); err != nil {
			return fmt.Errorf("-l %q: %w", o.Selector, err)
		}
	}
	if o.Resume && o.ID == "" {
		return errors.New("--resume continues a roll: name it with --roll ID (the id the interrupted run printed)")
	}
	if o.ID != "" {
		if errs := validation.IsDNS1123Label(o.ID); len(errs) > 0 {
			return fmt.Errorf("--roll %q: %s", o.ID, strings.Join(errs, "; "))
		}
	}
	if o.ReadyTimeout < 0 {
		return fmt.Errorf("--ready-timeout %s: not negative", o.ReadyTimeout)
	}
	if o.Operation == v1alpha3.OperationAgentUpgrade {
		return o.validateUpgrade()
	}
	if o.Version != "" || o.URL != "" || o.SHA256 != "" {
		return errors.New("--version, --url and --sha256 are the upgrade's")
	}
	return nil
}

// validateUpgrade checks what the host's upgrade would refuse only once
// it ran (lib/upgrade's plan): every parameter there, a SHA-256 of 64 hex
// digits, a URL it fetches (https, or a file on the host) and that can go
// into an operation every agent reads (no userinfo).
func (o *RollOptions) validateUpgrade() error {
	var missing []string
	for _, p := range []struct{ flag, v string }{{"--version", o.Version}, {"--url", o.URL}, {"--sha256", o.SHA256}} {
		if p.v == "" {
			missing = append(missing, p.flag)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("upgrade needs %s", strings.Join(missing, ", "))
	}
	if b, err := hex.DecodeString(o.SHA256); err != nil || len(b) != 32 {
		return fmt.Errorf("--sha256 %q: the package's SHA-256, 64 hex digits", o.SHA256)
	}
	u, err := url.Parse(o.URL)
	if err != nil || (u.Scheme != "https" && u.Scheme != "file") || (u.Scheme == "https" && u.Host == "") {
		return fmt.Errorf("--url %q: an https:// URL or a file:/// path on the host", o.URL)
	}
	if u.User != nil {
		return fmt.Errorf("--url: no user or password in the URL: every agent reads every operation")
	}
	return nil
}

// parameters are the operation's spec.parameters.
func (o *RollOptions) parameters() map[string]string {
	if o.Operation != v1alpha3.OperationAgentUpgrade {
		return nil
	}
	return map[string]string{"version": o.Version, "url": o.URL, "sha256": strings.ToLower(o.SHA256)}
}

// hostPlan is one host of the roll and what the roll does there.
type hostPlan struct {
	machine string
	// done: its operation of this kind completed in this roll already.
	done bool
	// adopt: its operation of this kind in this roll, not finished (an
	// earlier run was interrupted); the roll waits for it instead of
	// creating another.
	adopt *v1alpha3.MachineOperation
	// opName is the operation the roll creates (or adopts).
	opName string
}

// plan is the hosts in order, with those already done.
type plan struct {
	hosts []hostPlan
}

func (p *plan) todo() []hostPlan {
	var out []hostPlan
	for _, h := range p.hosts {
		if !h.done {
			out = append(out, h)
		}
	}
	return out
}

// Roll runs o.Operation across the machines, at most o.MaxUnavailable at
// once, and stops at the first host that fails. It returns nil when every
// host is done, an error wrapping ErrRollFailed or ErrInterrupted when it
// stopped, or another error for bad input or an API server that could
// not be asked (then nothing was created).
func Roll(ctx context.Context, api RollAPI, core kubernetes.Interface, o RollOptions) error {
	if err := o.Validate(); err != nil {
		return err
	}
	if o.ReadyTimeout == 0 {
		o.ReadyTimeout = DefaultReadyTimeout
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Out == nil {
		o.Out = io.Discard
	}
	if o.ID == "" {
		o.ID = verbs[o.Operation] + "-" + o.Now().UTC().Format("20060102-150405")
	}
	hosts, err := selectMachines(ctx, api, &o)
	if err != nil {
		return err
	}
	p, err := makePlan(ctx, api, &o, hosts)
	if err != nil {
		return err
	}
	r := &roller{api: api, core: core, o: &o, plan: p, began: o.Now()}
	r.printPlan()
	if o.DryRun {
		r.printf("dry run: nothing created\n")
		return nil
	}
	return r.run(ctx)
}

// selectMachines returns the machines of the roll, in order: as named
// (each must exist), or the selector's in name order (at least one).
func selectMachines(ctx context.Context, api RollAPI, o *RollOptions) ([]string, error) {
	ml, err := api.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("list the Machines: %w", err)
	}
	if o.Selector != "" {
		sel, _ := labels.Parse(o.Selector) // validated
		var out []string
		for _, m := range ml.Items {
			if sel.Matches(labels.Set(m.Labels)) {
				out = append(out, m.Name)
			}
		}
		if len(out) == 0 {
			return nil, fmt.Errorf("no Machine matches -l %q", o.Selector)
		}
		sort.Strings(out)
		return out, nil
	}
	have := map[string]bool{}
	for _, m := range ml.Items {
		have[m.Name] = true
	}
	var out, unknown []string
	for _, n := range o.Machines {
		switch {
		case !have[n]:
			unknown = append(unknown, n)
		case !slices.Contains(out, n):
			out = append(out, n)
		}
	}
	if len(unknown) > 0 {
		return nil, fmt.Errorf("no such Machine: %s", strings.Join(unknown, ", "))
	}
	return out, nil
}

// makePlan reads what the roll o.ID already did (its operations, by
// RollLabel) and decides each host's part. Completed wins over anything
// else a host has in the roll, a running one is adopted, and a failed one
// is retried under a new name (an operation's spec is immutable and its
// final state is never dispatched again).
func makePlan(ctx context.Context, api RollAPI, o *RollOptions, machines []string) (*plan, error) {
	ops, err := api.ListOperations(ctx, labels.Set{RollLabel: o.ID}.String())
	if err != nil {
		return nil, fmt.Errorf("list the operations of roll %s: %w", o.ID, err)
	}
	if len(ops.Items) > 0 && !o.Resume {
		return nil, fmt.Errorf("roll %s already has %d operation(s): add --resume to continue it, or leave out --roll for a new roll", o.ID, len(ops.Items))
	}
	byMachine := map[string][]*v1alpha3.MachineOperation{}
	for i := range ops.Items {
		op := &ops.Items[i]
		if op.Spec.Operation != o.Operation {
			return nil, fmt.Errorf("roll %s is a roll of %s (operation %s), not of %s", o.ID, op.Spec.Operation, op.Name, o.Operation)
		}
		byMachine[op.Spec.MachineRef.Name] = append(byMachine[op.Spec.MachineRef.Name], op)
	}
	p := &plan{}
	for _, m := range machines {
		h := hostPlan{machine: m, opName: m + "-" + o.ID}
		had := byMachine[m]
		for _, op := range had {
			switch {
			case op.Status.State == v1alpha3.OperationComplete:
				h.done = true
			case !op.Status.State.Finished() && h.adopt == nil:
				h.adopt = op
			}
		}
		switch {
		case h.adopt != nil:
			h.opName = h.adopt.Name
		case len(had) > 0:
			h.opName = fmt.Sprintf("%s-%d", h.opName, len(had)+1)
		}
		p.hosts = append(p.hosts, h)
	}
	return p, nil
}

// roller runs one plan.
type roller struct {
	api   RollAPI
	core  kubernetes.Interface
	o     *RollOptions
	plan  *plan
	began time.Time

	mu sync.Mutex // serializes the output of the host goroutines
}

func (r *roller) printf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	fmt.Fprintf(r.o.Out, format, args...)
}

// printPlan says what the roll will do. A roll is a sliding window, not
// batches: the next host starts as soon as one is done. The batches shown
// are the window's turns were every host equally fast.
func (r *roller) printPlan() {
	todo := r.plan.todo()
	r.printf("roll %s: %s of %d machine(s), at most %d at a time\n", r.o.ID, r.o.Operation, len(todo), r.o.MaxUnavailable)
	for i := 0; i < len(todo); i += r.o.MaxUnavailable {
		var names []string
		for _, h := range todo[i:min(len(todo), i+r.o.MaxUnavailable)] {
			n := h.machine
			if h.adopt != nil {
				n += " (its operation " + h.adopt.Name + " runs: waited for)"
			}
			names = append(names, n)
		}
		r.printf("  batch %d: %s\n", i/r.o.MaxUnavailable+1, strings.Join(names, ", "))
	}
	var done []string
	for _, h := range r.plan.hosts {
		if h.done {
			done = append(done, h.machine)
		}
	}
	if len(done) > 0 {
		r.printf("  skipped (%s completed in this roll): %s\n", r.o.Operation, strings.Join(done, ", "))
	}
}

// run starts the hosts in order, at most MaxUnavailable at once, and
// collects them. After a failure, or once ctx ends, it starts no more;
// after a failure it still waits for the hosts in flight (their
// operations run anyway, and the summary should say how they ended).
func (r *roller) run(ctx context.Context) error {
	todo := r.plan.todo()
	finished := make(chan hostResult)
	running := map[string]hostPlan{}
	var results []hostResult
	var failure *hostResult
	interrupted := false
	cancelled := ctx.Done()
	next := 0
	for {
		for failure == nil && !interrupted && ctx.Err() == nil && next < len(todo) && len(running) < r.o.MaxUnavailable {
			h := todo[next]
			next++
			hr, res := r.startHost(ctx, h, next, len(todo))
			if res != nil {
				results = append(results, *res)
				interrupted = interrupted || res.outcome == outcomeInterrupted
				if res.outcome == outcomeFailed {
					failure = res
				}
				continue
			}
			running[h.machine] = h
			go func() { finished <- hr.wait() }()
		}
		if len(running) == 0 {
			break
		}
		select {
		case res := <-finished:
			delete(running, res.machine)
			results = append(results, res)
			if res.outcome == outcomeInterrupted {
				interrupted = true
			}
			if res.outcome == outcomeFailed && failure == nil {
				failure = &res
				if len(running) > 0 {
					r.printf("%s failed: not starting any other host; waiting for the %d still running\n", res.machine, len(running))
				}
			}
		case <-cancelled:
			cancelled = nil // once: the hosts return as interrupted
			interrupted = true
		}
	}
	if ctx.Err() != nil && next < len(todo) {
		interrupted = true
	}
	return r.finish(results, len(todo)-next, failure, interrupted)
}

// finish prints the summary and how to resume, and returns the roll's
// error.
func (r *roller) finish(results []hostResult, notStarted int, failure *hostResult, interrupted bool) error {
	count := map[outcome]int{}
	var still []string
	for _, res := range results {
		count[res.outcome]++
		if res.outcome == outcomeInterrupted && res.created {
			still = append(still, fmt.Sprintf("%s (operation %s, %s)", res.machine, res.opName, res.state))
		}
	}
	elapsed := r.o.Now().Sub(r.began).Round(time.Second)
	skipped := len(r.plan.hosts) - len(r.plan.todo())
	if interrupted {
		r.printf("interrupted: no new operation started\n")
		if len(still) > 0 {
			r.printf("still running (not deleted): %s\n", strings.Join(still, "; "))
		}
	}
	r.printf("roll %s: %d done, %d failed, %d skipped (done earlier), %d not started, %d interrupted, in %s; %s\n",
		r.o.ID, count[outcomeDone], count[outcomeFailed], skipped, notStarted, count[outcomeInterrupted], elapsed, r.requests(len(results), elapsed))
	switch {
	case failure != nil:
		r.printf("to resume after fixing %s: %s\n", failure.machine, r.resumeCommand())
		return fmt.Errorf("%w at %s: %s", ErrRollFailed, failure.machine, failure.why)
	case interrupted:
		r.printf("to resume: %s\n", r.resumeCommand())
		return fmt.Errorf("%w: %d host(s) not done (%d not started)", ErrInterrupted, notStarted+count[outcomeInterrupted], notStarted)
	}
	return nil
}

// requests is the summary's count of API requests, and their rate per
// host per minute: what a roll costs the API server beside the daemons'
// own watches.
func (r *roller) requests(hosts int, elapsed time.Duration) string {
	if r.o.Requests == nil {
		return "requests: not counted"
	}
	n := r.o.Requests()
	if hosts == 0 || elapsed < time.Second {
		return fmt.Sprintf("requests: %d", n)
	}
	return fmt.Sprintf("requests: %d (%.1f per host per minute)", n, float64(n)/float64(hosts)/elapsed.Minutes())
}

// resumeCommand is the command line that continues this roll.
func (r *roller) resumeCommand() string {
	args := []string{"kubectl unbounded", verbs[r.o.Operation], "--roll", r.o.ID, "--resume"}
	if r.o.MaxUnavailable != 1 {
		args = append(args, fmt.Sprintf("--max-unavailable %d", r.o.MaxUnavailable))
	}
	if r.o.Operation == v1alpha3.OperationAgentUpgrade {
		args = append(args, "--version", shellQuote(r.o.Version), "--url", shellQuote(r.o.URL), "--sha256", r.o.SHA256)
	}
	if r.o.Selector != "" {
		args = append(args, "-l", shellQuote(r.o.Selector))
	} else {
		args = append(args, r.o.Machines...)
	}
	return strings.Join(args, " ")
}

func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:/=~+") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
