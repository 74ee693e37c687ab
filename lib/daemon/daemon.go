// Package daemon is unbounded-daemon, the agent's only long-running process
// (ARCHITECTURE sections 6 and 7): it watches its Machine, its Node and the
// MachineOperations labelled with its machine name, and does no host work
// itself: an operation becomes a request file and a started unit (resume
// says why it is never started twice), and the unit's outcome the
// operation's status and an Event on the Machine. followMachine says what
// it does without a Machine, watch.go why it holds plain watches.
package daemon

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"

	"unbounded-cloud.io/agent/lib/api/identity"
	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/kube"
	"unbounded-cloud.io/agent/lib/noderecord"
	"unbounded-cloud.io/agent/lib/report"
	"unbounded-cloud.io/agent/lib/state"
	"unbounded-cloud.io/agent/lib/upgrade"
	"unbounded-cloud.io/agent/lib/version"
)

// Options configure a daemon. The zero value runs on the real host with
// the credentials of /etc/unbounded/agent.toml.
type Options struct {
	// Paths resolves host paths (root "/" in production).
	Paths hostpaths.Paths
	// Host holds the steps that touch the host; the zero value is real.
	Host Host
	// Machine is the Machine's name; "" reads it from the active applied
	// config, else from the config file.
	Machine string
	// NodeName is the Node's name; "" is the Machine's name (the config
	// makes them the same, see lib/config's reference).
	NodeName string
	// REST is the cluster credential; nil builds it from the config file
	// (see credentials.go for which one).
	REST *rest.Config
	// PollInterval is how often a unit found running after a restart of
	// the daemon is looked at until it finishes; 0 means 1s. Only while
	// such a unit runs: at idle nothing polls.
	PollInterval time.Duration
	// NodeGoneGrace is how long a bootstrapped host's Node may be absent
	// from the daemon's first look before the daemon takes it for
	// vanished while it was down and repaves (a kubelet that starts
	// registers a missing Node itself); 0 means DefaultNodeGoneGrace.
	NodeGoneGrace time.Duration
	Log           *slog.Logger
}

// Run runs the daemon until ctx is cancelled (nil error) or it must stop.
// An installation owning the host is state.ErrOwned, at start or before a
// dispatch (exit 69: not a failure, and systemd does not restart it).
func Run(ctx context.Context, opts Options) error {
	log := opts.Log
	if log == nil {
		log = slog.Default()
	}
	if err := checkOwnership(opts.Paths); err != nil {
		// A Type=notify service that exits before READY=1 is a protocol
		// violation to systemd (result "protocol", unit failed) whatever
		// its exit status: say ready, then leave with 69, which the unit
		// lists as success. systemd reads the notification before it
		// reaps the process, so the order holds.
		_ = opts.Host.notify("READY=1\nSTATUS=deferred: an installation owns the host")
		return err
	}
	active, err := state.ReadActive(opts.Paths)
	if err != nil {
		return fmt.Errorf("read the active node's state: %w", err)
	}
	d := &daemon{
		opts:     opts,
		p:        opts.Paths,
		host:     opts.Host,
		log:      log,
		active:   active,
		machine:  opts.Machine,
		node:     opts.NodeName,
		poll:     cmp.Or(opts.PollInterval, time.Second),
		grace:    cmp.Or(opts.NodeGoneGrace, DefaultNodeGoneGrace),
		started:  opts.Host.now(),
		handled:  map[string]bool{},
		ops:      map[string]*v1alpha3.MachineOperation{},
		synced:   map[kind]bool{},
		resumed:  map[string]bool{},
		updates:  make(chan update),
		finished: make(chan result, 1), // one job at a time: its result never blocks
	}
	if d.machine == "" && active != nil {
		d.machine = active.Machine
	}
	cfg := opts.REST
	if cfg == nil || d.machine == "" {
		creds, err := loadCredentials(opts.Paths, d.host.now())
		if err != nil {
			return err
		}
		if d.machine == "" {
			d.machine = creds.machine
		}
		if cfg == nil {
			cfg = creds.rest
			d.renew = creds.renew
			d.useCredential(log, creds)
		}
	}
	if err := identity.ValidateMachineName(d.machine); err != nil {
		return fmt.Errorf("daemon: %w", err)
	}
	if d.node == "" {
		d.node = d.machine
	}
	d.log = log.With("machine", d.machine)
	if d.cluster, err = newCluster(cfg); err != nil {
		return err
	}
	if d.sd, err = d.host.systemd(ctx); err != nil {
		return err
	}
	defer d.sd.Close()
	// A record left by an earlier process (killed) is not this one's view.
	if err := noderecord.Remove(d.p); err != nil {
		log.Warn("cannot remove the Node record", "file", noderecord.File(d.p), "error", err)
	}
	defer d.forgetNode()
	for {
		err := d.serve(ctx, cfg)
		if !errors.Is(err, errCredentialsRenewed) {
			return err
		}
		creds, err := loadCredentials(opts.Paths, d.host.now())
		if err != nil {
			return err
		}
		cfg, d.renew = creds.rest, creds.renew
		if d.cluster, err = newCluster(cfg); err != nil {
			return err
		}
		d.useCredential(log, creds)
		_ = d.host.notify("STATUS=" + d.watching())
	}
}

// useCredential notes which credential the daemon speaks with. On the
// bootstrap token it says once, in the journal and in STATUS=, that its
// certificate is pending and why: until it has one it writes only what
// the token may (the agent version; the bootstrap writes the rest of
// its part), and the writes the token may not make are not tried (the
// cluster would refuse each), but made once the certificate is issued.
func (d *daemon) useCredential(log *slog.Logger, c *credentials) {
	d.tokenOnly = c.tokenOnly()
	if !d.tokenOnly {
		log.Info("cluster credential", "kind", c.kind)
		return
	}
	log.Warn("cluster credential: the bootstrap token, until this host's client certificate is issued; until then only the agent version is reported on the Machine (isolation, slot and Node name follow with the certificate)",
		"kind", c.kind, "certificate", c.pending)
}

// watching is the STATUS= of a daemon that follows its Machine.
func (d *daemon) watching() string {
	if d.tokenOnly {
		return "watching Machine " + d.machine + " (client certificate pending: reporting only the agent version)"
	}
	return "watching Machine " + d.machine
}

func checkOwnership(p hostpaths.Paths) error {
	// The older agent's node, not adopted yet: the older agent's daemon
	// may still run, and unbounded-lifecycle.service adopts it (or has
	// refused to, saying why): not this daemon's to act on.
	if err := state.CheckAdopted(p); err != nil {
		return err
	}
	own, err := state.ReadOwnership(p)
	if own == nil || (err == nil && own.Owner == state.OwnerUpgrade) {
		return nil
	}
	if err != nil {
		// An unreadable record still means "owned": fail closed.
		return fmt.Errorf("%w (record unreadable: %v)", state.ErrOwned, err)
	}
	return fmt.Errorf("%w (%s since %s)", state.ErrOwned, own.Owner, own.Since.Format(time.RFC3339))
}

type kind string

const (
	kindMachine kind = "machine"
	kindNode    kind = "node"
	kindOps     kind = "operations"
)

// update is what a watch goroutine hands to the loop: either a full list
// (sync) or one event.
type update struct {
	kind    kind
	sync    bool
	deleted bool
	objs    []any
	// gen is the following generation of a Node or operations watch; the
	// loop drops updates of a generation it has stopped.
	gen int
	// watchDown, watchUp: the watch failed, or works again without a new
	// list (no objects; node.go records it for the Node).
	watchDown, watchUp bool
}

// job is one unit of work for a dispatch goroutine.
type job struct {
	op  *v1alpha3.MachineOperation // nil for the repave of a vanished Node
	uid string
	typ v1alpha3.OperationType
	// resume: the op was InProgress when this daemon process found it, or
	// this job's request was written (set by dispatch).
	resume bool
	// wait names a unit that the daemon did not start and only waits for
	// (a node operation started by hand, see waitBusy).
	wait string
	// params are the request's parameters of a job without an operation
	// (the upgrade the Machine's spec.agent asks for).
	params map[string]string
}

type result struct {
	job *job
	uid string
	op  *v1alpha3.MachineOperation // final state, nil if unchanged
	err error                      // only ErrOwned stops the daemon
	// interrupted: the daemon's context ended mid-job; the job is neither
	// done nor to be left alone, and the next serve resumes it.
	interrupted bool
	// retry: the job failed before it reached a final state; it is picked
	// up again (as a resume when it got as far as InProgress).
	retry bool
	// state and message are the final state finish decided and why: a
	// job without an operation has no status to hold them, and an
	// isolation change's unit that left no outcome ends in them
	// (isolationEnded).
	state   v1alpha3.OperationState
	message string
}

type daemon struct {
	opts Options
	// tokenOnly: the credential is the bootstrap token (useCredential).
	tokenOnly bool
	// owedRunning: an owed write is being made (settleOwed).
	owedRunning atomic.Bool
	p           hostpaths.Paths
	host        Host
	log         *slog.Logger
	active      *state.AppliedConfig
	machine     string
	node        string
	poll        time.Duration
	grace       time.Duration // Options.NodeGoneGrace
	started     time.Time
	cluster     *cluster
	sd          Systemd
	renew       *renewal

	mu         sync.Mutex
	machineUID types.UID

	// Owned by the loop goroutine.
	nodeSeen   string // name of the Node once seen
	updates    chan update
	finished   chan result
	machineObj *v1alpha3.Machine
	ops        map[string]*v1alpha3.MachineOperation
	synced     map[kind]bool
	handled    map[string]bool // UIDs this process finished or must leave alone
	resumed    map[string]bool
	inflight   string
	// The job sources' own state (jobSources): the Node's loss
	// (nodeop.go) and the isolation change (isolation.go).
	loss        nodeLoss
	iso         isolationState
	statusRetry <-chan time.Time

	// Following the Node and the operations while the Machine lives.
	wg          *sync.WaitGroup // serve's, for the follow goroutines
	cfg         *rest.Config    // serve's credential, for the renewal
	renewed     chan struct{}   // closed (once) when a renewal stored a certificate
	renewedOnce *sync.Once
	followStop  context.CancelFunc // nil while not following
	followGen   int
	machineSeen bool   // a live Machine was seen by this process
	idleLogged  string // the idle state last logged, so it is logged once
	// idle is read by the watch goroutines: while no Machine lives, the
	// Machine watch's failures (RBAC removed with the Machine) are
	// expected and logged at debug level.
	idle atomic.Bool

	// The node's start once an explicit fence refusal no longer holds
	// (unfence.go).
	unfenceState unfenceState

	// The Node's Ready condition as recorded for health (node.go).
	nodeRec nodeRecord
}

func (d *daemon) machineUIDValue() types.UID {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.machineUID
}

func (d *daemon) serve(ctx context.Context, cfg *rest.Config) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	// The Node and the operations are followed, and the certificate
	// renewed, only while the Machine lives (followMachine starts and
	// stops them).
	renewed := make(chan struct{})
	d.wg, d.cfg, d.renewed, d.renewedOnce = &wg, cfg, renewed, &sync.Once{}
	defer d.unfollow()
	wg.Add(1)
	go func() { defer wg.Done(); d.watchLoop(ctx, kindMachine, d.listMachine, d.watchMachine) }()

	var tick <-chan time.Time
	if iv, err := d.host.watchdog(); err != nil {
		d.log.Warn("watchdog setting unreadable", "error", err)
	} else if iv > 0 {
		t := time.NewTicker(iv / 2)
		defer t.Stop()
		tick = t.C
	}
	// Ready once the host side is set up: a cluster that is unreachable
	// at boot must not make the start time out and the unit fail; the
	// watches keep retrying.
	if err := d.host.notify("READY=1\nSTATUS=" + d.watching()); err != nil {
		d.log.Warn("sd_notify READY failed", "error", err)
	}
	d.log.Info("daemon started", "version", version.Version, "node", d.node)

	var stopErr error
	for stopErr == nil {
		select {
		case <-ctx.Done():
			return nil
		case <-tick:
			_ = d.host.notify("WATCHDOG=1")
		case u := <-d.updates:
			d.apply(ctx, u)
		case r := <-d.finished:
			d.inflight = ""
			if r.op != nil {
				d.ops[r.op.Name] = r.op
			}
			if r.interrupted || r.retry {
				delete(d.resumed, r.uid)
				if r.job.op == nil && r.job.typ == v1alpha3.OperationRepave && r.job.wait == "" && d.loss.repave == nil && d.followStop != nil {
					d.loss.repave = r.job
				}
				if r.retry && r.job.typ == OperationIsolationChange && r.job.wait == "" {
					d.iso.resume = r.job
				}
				if r.interrupted {
					continue
				}
			} else {
				d.handled[r.uid] = true
			}
			// The unit may have changed the applied config (a repave
			// switches the slot): the Machine's status says so now.
			// (First: the outcome it leaves is reported with the
			// applied config's change.)
			if r.job.typ == OperationIsolationChange {
				d.isolationEnded(r)
			}
			d.refreshActive(ctx)
			// An upgrade's (lib/upgrade) or an isolation change's
			// outcome is on the host now (also of one started by hand
			// that the daemon waited for).
			if r.job.typ == v1alpha3.OperationAgentUpgrade || r.job.typ == OperationIsolationChange || r.job.wait == targets[OperationIsolationChange].unit {
				d.reportMachine(ctx)
			}
			if r.err != nil {
				stopErr = r.err
				continue
			}
		case <-d.loss.absent:
			d.loss.absent = nil
			d.nodeStillAbsent()
		case <-d.statusRetry:
			d.statusRetry = nil
			d.reportMachine(ctx)
		case <-renewed:
			d.log.Info("client certificate renewed; restarting with it")
			return errCredentialsRenewed
		}
		if err := d.step(ctx); err != nil {
			stopErr = err
		}
	}
	return stopErr
}

// apply takes one watch update into the loop's state.
func (d *daemon) apply(ctx context.Context, u update) {
	if u.kind != kindMachine && (d.followStop == nil || u.gen != d.followGen) {
		return // from a watch stopped since
	}
	if u.watchDown || u.watchUp {
		if u.kind == kindNode {
			d.nodeWatchLive(u.watchUp)
		}
		return
	}
	first := u.sync && !d.synced[u.kind]
	if first {
		d.synced[u.kind] = true
		d.log.Debug("initial list done", "kind", u.kind)
	}
	switch u.kind {
	case kindOps:
		if u.sync {
			d.ops = map[string]*v1alpha3.MachineOperation{}
		}
		for _, o := range u.objs {
			op := o.(*v1alpha3.MachineOperation)
			if u.deleted {
				delete(d.ops, op.Name)
				d.log.Debug("operation deleted from the cluster", "name", op.Name)
				continue
			}
			if cur, ok := d.ops[op.Name]; ok && cur.UID == op.UID && olderRV(op.ResourceVersion, cur.ResourceVersion) {
				continue // our own update raced ahead of the watch
			}
			d.ops[op.Name] = op
			d.log.Debug("operation seen", "name", op.Name, "state", op.Status.State, "sync", u.sync)
		}
		if u.sync {
			d.settleOwedStatuses()
		}
	case kindNode:
		var node *corev1.Node
		if len(u.objs) > 0 && !u.deleted {
			node = u.objs[0].(*corev1.Node)
		}
		d.observeNode(node)
		d.seeNode(node)
		if first && node == nil {
			d.armNodeAbsent()
		}
		if node != nil && (d.machineObj == nil || d.machineObj.Status.NodeName != node.Name ||
			(d.machineObj.Status.Phase == v1alpha3.MachinePending && nodeReady(node))) {
			d.reportMachine(ctx)
		}
		d.refreshActive(ctx)
		d.settleOwed(ctx, node)
	case kindMachine:
		var m *v1alpha3.Machine
		if len(u.objs) > 0 && !u.deleted {
			m = u.objs[0].(*v1alpha3.Machine)
		}
		d.machineObj = m
		if m != nil {
			d.mu.Lock()
			d.machineUID = m.UID
			d.mu.Unlock()
		}
		d.followMachine(ctx)
		d.reportMachine(ctx)
		d.unfence(ctx)
	}
}

// live reports whether the Machine exists and is not being deleted: the
// only state in which the daemon acts on the host and reports.
func (d *daemon) live() bool {
	return d.machineObj != nil && d.machineObj.DeletionTimestamp == nil
}

// followMachine starts or stops following the Node and the operations as
// the Machine comes and goes.
//
// A Machine that is deleted (or deleting) means the cluster side is
// retiring the host: the daemon stops acting on it at once (no operation
// is started or resumed; a unit already running finishes on its own, and
// its operation still gets its outcome), writes nothing more to the
// Machine, and does not recreate it: registering a Machine is bootstrap's
// job, and a daemon that recreated it would undo the decommissioning.
//
// The process does not exit. systemd would restart it (Restart=always),
// and a daemon that starts without a Machine has to wait anyway: bootstrap
// has not registered it yet, or it was deleted while the daemon was down.
// So "no Machine" is one idle state, whenever it begins: the unit stays
// active, its STATUS says why it is idle, the only cost is the one watch
// of the Machine (no requests beyond it), and if the Machine is registered
// again the daemon follows it without a restart. A fleet operator retiring
// a host deletes the Machine, then resets or discards the host; nothing on
// the host fights either step, fails, or pages.
func (d *daemon) followMachine(ctx context.Context) {
	if d.live() {
		d.idle.Store(false)
		if d.followStop != nil {
			return
		}
		// (Not idle before: the first list, or a restart of the watches
		// with a renewed certificate; nothing to say.)
		switch {
		case d.idleLogged != "" && d.machineSeen:
			d.log.Info("Machine registered again; following it", "uid", d.machineObj.UID)
		case d.idleLogged != "":
			d.log.Info("Machine registered; following it", "uid", d.machineObj.UID)
		}
		d.machineSeen, d.idleLogged = true, ""
		_ = d.host.notify("STATUS=" + d.watching())
		d.followGen++
		fctx, stop := context.WithCancel(context.WithValue(ctx, genKey{}, d.followGen))
		d.followStop = stop
		d.wg.Add(2)
		go func() { defer d.wg.Done(); d.watchLoop(fctx, kindNode, d.listNode, d.watchNode) }()
		go func() { defer d.wg.Done(); d.watchLoop(fctx, kindOps, d.listOps, d.watchOps) }()
		if d.renew != nil {
			// A host being retired mints itself no new credential.
			once, renewed, cfg := d.renewedOnce, d.renewed, d.cfg
			d.wg.Add(1)
			go func() {
				defer d.wg.Done()
				d.renew.run(fctx, d, cfg, func() { once.Do(func() { close(renewed) }) })
			}()
		}
		return
	}
	if !d.synced[kindMachine] {
		return // before the first list, "not seen" is not "absent"
	}
	d.idle.Store(true)
	d.unfollow()
	var why, status string
	switch {
	case d.machineObj != nil:
		why = "Machine is being deleted: this host is being retired; the daemon no longer acts on it or reports to it"
		status = "idle: Machine " + d.machine + " is being deleted (host retiring)"
	case d.machineSeen:
		why = "Machine was deleted: this host is being retired; the daemon no longer acts on it or reports to it, and does not recreate it"
		status = "idle: Machine " + d.machine + " deleted (host retiring)"
	default:
		why = "Machine does not exist: nothing is done on this host until bootstrap registers it"
		status = "idle: waiting for Machine " + d.machine + " to be registered"
	}
	if d.idleLogged == why {
		return
	}
	d.idleLogged = why
	d.log.Warn(why)
	_ = d.host.notify("STATUS=" + status)
}

// unfollow stops the Node and operations watches and forgets what they
// said, so that a Machine registered again starts from fresh lists.
func (d *daemon) unfollow() {
	if d.followStop == nil {
		return
	}
	d.followStop()
	d.followStop = nil
	d.forgetNode()
	d.synced[kindNode], d.synced[kindOps] = false, false
	d.ops = map[string]*v1alpha3.MachineOperation{}
	d.loss = nodeLoss{}
}

// olderRV reports whether a is an older resourceVersion than b. Resource
// versions are opaque in general; the API server's are etcd revisions
// (integers), and when either is not an integer nothing is considered older.
func olderRV(a, b string) bool {
	var x, y uint64
	if _, err := fmt.Sscan(a, &x); err != nil {
		return false
	}
	if _, err := fmt.Sscan(b, &y); err != nil {
		return false
	}
	return x < y
}

// observeNode tracks the Node: one that was Ready and is now gone means the
// node stack lost its registration (deleted by hand, or by a controller
// that found it dead), and the Machine is repaved. A Node deleted while a
// unit runs is not a loss: a repave deletes the Node itself before it
// builds the new one.
func (d *daemon) observeNode(node *corev1.Node) {
	if node != nil {
		if d.loss.absent != nil {
			d.loss.absent = nil
			d.log.Info("Node registered within the grace after the daemon's start; no repave", "node", node.Name)
		}
		d.nodeSeen = node.Name
		if nodeReady(node) {
			d.loss.readyUID = node.UID
		}
		return
	}
	if d.inflight != "" {
		if d.loss.readyUID != "" {
			d.log.Info("Node deleted while a unit runs; not a loss", "node", d.node, "running", d.inflight)
		}
		d.loss.readyUID = ""
		return
	}
	// A unit the daemon did not start (a repave by hand) may have
	// deleted it: step looks (waitBusy) before anything else.
	d.loss.gone = true
	if d.loss.readyUID == "" {
		return
	}
	uid := "node:" + string(d.loss.readyUID)
	d.loss.readyUID = ""
	if d.handled[uid] || (d.loss.repave != nil && d.loss.repave.uid == uid) {
		return
	}
	d.loss.repave = &job{uid: uid, typ: v1alpha3.OperationRepave}
}

func nodeReady(n *corev1.Node) bool { return kube.Readiness(n).Ready }

// step starts the next job when none runs, from the first of jobSources
// that has one. One at a time: operations on one host change the same
// node stack.
func (d *daemon) step(ctx context.Context) error {
	// The Machine first: a repave's request carries its spec as the
	// desired config.
	if d.inflight != "" || !d.live() || !d.synced[kindOps] || !d.synced[kindMachine] {
		return nil
	}
	var j *job
	for _, src := range jobSources {
		if j = src.next(d); j != nil {
			d.log.Debug("next job", "source", src.name, "uid", j.uid, "type", j.typ)
			break
		}
	}
	gone := d.loss.gone
	d.loss.gone = false
	if j == nil && !gone {
		return nil
	}
	// A node operation started by hand (a repave) runs: the daemon waits
	// for it as for its own job, before it starts one.
	if (j == nil || !j.resume) && d.waitBusy(ctx, j) {
		return nil
	}
	if j == nil {
		return nil
	}
	if j.op == nil && !j.resume && j.typ == v1alpha3.OperationRepave {
		d.log.Warn("Node was Ready and is gone: repaving", "node", d.node)
	}
	// An installation that took the host while the daemon ran wins: the
	// operation stays Pending, and the daemon stops as it would at start.
	if !j.resume {
		if err := checkOwnership(d.p); err != nil {
			return err
		}
		if own, err := state.ReadOwnership(d.p); err == nil && own != nil && own.Owner == state.OwnerUpgrade {
			// Pending until the upgrade's end, which restarts this
			// daemon or ends its job (finished: the loop steps again).
			d.log.Info("the agent's upgrade runs; the operation waits for its end", "uid", j.uid, "type", j.typ)
			return nil
		}
	}
	if j.typ == OperationIsolationChange && !j.resume {
		d.startIsolation(ctx, j)
	}
	d.inflight = j.uid
	var spec json.RawMessage
	if d.machineObj != nil {
		spec, _ = json.Marshal(d.machineObj.Spec)
	}
	// Counted in serve's wait group: serve (and Run) return only once the
	// job has ended (it ends when ctx does: "interrupted"), never while
	// it still writes a request under the host root.
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		r := d.run(ctx, j, spec)
		select {
		case d.finished <- r:
		case <-ctx.Done():
		}
	}()
	return nil
}

// A jobSource is one place the daemon's next job comes from, owning its
// own state: step asks the sources in the order of jobSources and starts
// the first job one has (one job at a time).
type jobSource struct {
	name string
	next func(d *daemon) *job
}

// jobSources, in the order step asks them: an operation an earlier
// process left InProgress (resumed), the repave of a vanished Node, an
// isolation change to resume (neither has an operation that would bring
// it back), the Pending operations oldest first, then what the
// Machine's spec asks for: the agent first (a change of mode runs on the
// agent the spec asks for, not the old one's, and an upgrade never waits
// behind a change that failed, which is not asked again at its
// generation), then the isolation mode.
var jobSources = []jobSource{
	{"operation in progress", (*daemon).inProgressOperation},
	{"vanished Node", func(d *daemon) *job { j := d.loss.repave; d.loss.repave = nil; return j }},
	{"isolation change to resume", func(d *daemon) *job { j := d.iso.resume; d.iso.resume = nil; return j }},
	{"pending operation", (*daemon).pendingOperation},
	{"spec.agent", (*daemon).agentUpgradeJob},
	{"spec.isolation", (*daemon).isolationJob},
}

// ownOperations are this Machine's operations in state, not finished by
// this process nor being deleted.
func (d *daemon) ownOperations(states ...v1alpha3.OperationState) []*v1alpha3.MachineOperation {
	var out []*v1alpha3.MachineOperation
	for _, op := range d.ops {
		if d.handled[string(op.UID)] || op.Spec.MachineRef.Name != d.machine || op.DeletionTimestamp != nil {
			continue
		}
		if slices.Contains(states, op.Status.State) {
			out = append(out, op)
		}
	}
	return out
}

// inProgressOperation resumes the oldest operation an earlier process
// left InProgress (once per process).
func (d *daemon) inProgressOperation() *job {
	ops := slices.DeleteFunc(d.ownOperations(v1alpha3.OperationInProgress), func(op *v1alpha3.MachineOperation) bool { return d.resumed[string(op.UID)] })
	if len(ops) == 0 {
		return nil
	}
	op := oldest(ops)
	d.resumed[string(op.UID)] = true
	return &job{op: op, uid: string(op.UID), typ: op.Spec.Operation, resume: true}
}

// pendingOperation is the oldest Pending operation.
func (d *daemon) pendingOperation() *job {
	ops := d.ownOperations("", v1alpha3.OperationPending)
	if len(ops) == 0 {
		return nil
	}
	op := oldest(ops)
	return &job{op: op, uid: string(op.UID), typ: op.Spec.Operation}
}

func oldest(ops []*v1alpha3.MachineOperation) *v1alpha3.MachineOperation {
	return slices.MinFunc(ops, func(a, b *v1alpha3.MachineOperation) int {
		if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
}

// reportMachine keeps the part of the Machine's status that the daemon
// owns (agent version, isolation mode and slot) current. It writes only
// when something differs, so that its own write, coming back through the
// watch, ends the exchange. It never creates the Machine (bootstrap
// registers it) and writes nothing to one that is being deleted.
func (d *daemon) reportMachine(ctx context.Context) {
	if !d.live() {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	want := d.machineObj.DeepCopy()
	want.Status.Agent = &v1alpha3.AgentStatus{Version: version.Version}
	if d.active != nil && (want.Status.Bootstrap == nil || want.Status.Bootstrap.State != v1alpha3.BootstrapSucceeded) {
		// A host with an applied record was bootstrapped (a record is
		// written only once its node is healthy), so the Machine is owed
		// the bootstrap's Succeeded: a power cut between the record and
		// its report, or an API server down then, lost it, and the next
		// boot only hands the node over. Either credential may write it.
		report.SetBootstrap(want, v1alpha3.BootstrapSucceeded, report.ReasonSucceeded, "node bootstrapped (reported by the daemon: the bootstrap's own report did not land)", d.host.now())
		d.log.Info("reporting the bootstrap's Succeeded, which the Machine lacks", "slot", d.active.Slot)
	}
	// With the bootstrap token only the agent version: the rest is not
	// the bootstrap's, and the token may not write it (useCredential).
	if d.active != nil && !d.tokenOnly {
		iso := &v1alpha3.IsolationStatus{Mode: v1alpha3.IsolationMode(d.active.Mode)}
		if d.active.Mode != string(v1alpha3.IsolationNone) {
			iso.Slot = v1alpha3.Slot(d.active.Slot)
		}
		want.Status.Isolation = iso
	}
	if d.nodeSeen != "" && !d.tokenOnly {
		want.Status.NodeName = d.nodeSeen
	}
	if !d.tokenOnly && d.active != nil && d.loss.readyUID != "" && want.Status.Phase == v1alpha3.MachinePending &&
		!meta.IsStatusConditionTrue(want.Status.Conditions, v1alpha3.ConditionAllocationLaunchRefused) {
		// The fence leaves a node it allowed after a refusal Pending (it
		// cannot tell when the node is up); the daemon sees the Node
		// Ready.
		want.Status.Phase = v1alpha3.MachineReady
	}
	var signals []func()
	if !d.tokenOnly {
		for _, s := range []func() func(){
			func() func() { return d.upgradeOutcome(ctx, want) },
			func() func() { return d.isolationReport(ctx, want) },
		} {
			if f := s(); f != nil {
				signals = append(signals, f)
			}
		}
	}
	reported := func() {
		for _, f := range signals {
			f()
		}
	}
	if equality.Semantic.DeepEqual(want.Status, d.machineObj.Status) {
		reported()
		return
	}
	updated, err := d.cluster.machines.UpdateStatus(ctx, want)
	switch {
	case err == nil:
		d.machineObj = updated
		reported()
	case apierrors.IsConflict(err), apierrors.IsNotFound(err):
		// The watch brings the newer object (or the deletion) and the
		// report runs again.
	default:
		d.log.Warn("cannot report the Machine status; retrying in 30s", "error", err)
		d.statusRetry = time.After(30 * time.Second)
	}
}

// upgradeOutcome puts the outcome of the agent's last self-upgrade into
// want's AgentUpgraded condition, from the signal the upgrade left
// (lib/upgrade: failed.json, or upgraded.json from a run that succeeded),
// and returns what to do once the status holds it (the signal removed,
// an Event), or nil. While an upgrade's journal exists the outcome is not
// known yet: the report is looked at again in 5 s (a local read; nothing
// is written until it changes).
func (d *daemon) upgradeOutcome(ctx context.Context, want *v1alpha3.Machine) func() {
	if upgrade.InProgress(d.p) {
		if d.statusRetry == nil {
			d.statusRetry = time.After(5 * time.Second)
		}
		return nil
	}
	cond := metav1.Condition{Type: v1alpha3.ConditionAgentUpgraded, ObservedGeneration: want.Generation}
	var file, evType, msg string
	if f, err := upgrade.ReadFailed(d.p); err != nil {
		d.log.Warn("the upgrade's failure signal is unreadable", "error", err)
		return nil
	} else if f != nil {
		cond.Status, cond.Reason = metav1.ConditionFalse, "UpgradeFailed"
		if f.RolledBack {
			cond.Reason = "RolledBack"
		}
		cond.Message = truncate(fmt.Sprintf("upgrade from %s to %s failed at step %s: %s", orUnknown(f.From), orUnknown(f.To), f.Step, f.Message), 1024)
		cond.LastTransitionTime = metav1.NewTime(f.At)
		file, evType = d.p.UpgradeFailed(), corev1.EventTypeWarning
	} else if u, err := upgrade.ReadUpgraded(d.p); err != nil {
		d.log.Warn("the upgrade's success signal is unreadable", "error", err)
		return nil
	} else if u != nil && upgrade.SameVersion(u.To, version.Version) {
		cond.Status, cond.Reason = metav1.ConditionTrue, "Upgraded"
		cond.Message = fmt.Sprintf("agent upgraded from %s to %s", u.From, u.To)
		cond.LastTransitionTime = metav1.NewTime(u.At)
		file, evType = upgrade.UpgradedFile(d.p), corev1.EventTypeNormal
	} else {
		return nil
	}
	msg = cond.Message
	meta.SetStatusCondition(&want.Status.Conditions, cond)
	return func() {
		if err := state.RemoveDurable(file); err != nil && !errors.Is(err, os.ErrNotExist) {
			d.log.Warn("the upgrade's signal was reported but not removed", "file", file, "error", err)
			return
		}
		d.log.Info("reported the agent upgrade's outcome", "status", cond.Status, "reason", cond.Reason, "message", msg)
		go d.recordEvent(context.WithoutCancel(ctx), evType, "AgentUpgrade"+cond.Reason, msg) // after reportMachine returned and cancelled its ctx
	}
}

// agentUpgradeJob is the upgrade the Machine's spec.agent asks for (a
// version other than this daemon's, with the package's URL and SHA-256),
// or nil. It is asked once per spec: not again while an upgrade runs or
// its outcome is still to be reported, nor after one for this generation
// of the Machine failed (AgentUpgraded=False observed at it: a rollback
// restarts the daemon, which must not try again until the spec changes).
func (d *daemon) agentUpgradeJob() *job {
	m := d.machineObj
	if m == nil || m.Spec.Agent == nil || d.tokenOnly {
		return nil
	}
	a := m.Spec.Agent
	if a.Version == "" || upgrade.SameVersion(a.Version, version.Version) {
		return nil
	}
	uid := "agent:" + a.Version + ":" + a.SHA256
	if d.handled[uid] {
		return nil
	}
	if a.URL == "" || a.SHA256 == "" {
		d.handled[uid] = true
		d.log.Warn("spec.agent asks for another version but names no package URL and SHA-256; this host upgrades only from both", "version", a.Version)
		return nil
	}
	if upgrade.InProgress(d.p) {
		return nil
	}
	if f, err := upgrade.ReadFailed(d.p); err != nil || f != nil {
		return nil // reported first (reportMachine), then judged
	}
	if c := meta.FindStatusCondition(m.Status.Conditions, v1alpha3.ConditionAgentUpgraded); c != nil &&
		c.Status == metav1.ConditionFalse && c.ObservedGeneration == m.Generation {
		return nil
	}
	d.log.Info("spec.agent asks for another version: upgrading", "from", version.Version, "to", a.Version)
	return &job{uid: uid, typ: v1alpha3.OperationAgentUpgrade, params: map[string]string{"version": a.Version, "url": a.URL, "sha256": a.SHA256}}
}
