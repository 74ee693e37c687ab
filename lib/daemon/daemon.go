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
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"

	"unbounded-cloud.io/agent/lib/api/identity"
	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/kube"
	"unbounded-cloud.io/agent/lib/noderecord"
	"unbounded-cloud.io/agent/lib/state"
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
	// MetricsAddress is where the host's metrics are served ([daemon]
	// metrics-address, IP:PORT); "" serves none.
	MetricsAddress string
	Log            *slog.Logger
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
	if opts.MetricsAddress != "" {
		mctx, stopMetrics := context.WithCancel(ctx)
		var served sync.WaitGroup
		served.Go(func() {
			d.serveMetrics(mctx, opts.MetricsAddress, func(a string) (net.Listener, error) { return net.Listen("tcp", a) })
		})
		// Before the service manager's connection closes: a scrape reads
		// the node stack's units through it.
		defer served.Wait()
		defer stopMetrics()
	}
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
	metrics     opMetrics // the operations finished, for the host's metrics
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
		d.firstLook()
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
		d.firstLook()
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
