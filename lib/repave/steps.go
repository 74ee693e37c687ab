package repave

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"

	"unbounded-cloud.io/agent/lib/artifacts"
	"unbounded-cloud.io/agent/lib/config"
	"unbounded-cloud.io/agent/lib/exitcode"
	"unbounded-cloud.io/agent/lib/fence"
	"unbounded-cloud.io/agent/lib/kube"
	"unbounded-cloud.io/agent/lib/modes"
	"unbounded-cloud.io/agent/lib/modes/facts"
	"unbounded-cloud.io/agent/lib/owed"
	"unbounded-cloud.io/agent/lib/readiness"
	"unbounded-cloud.io/agent/lib/sdstatus"
	"unbounded-cloud.io/agent/lib/state"
	"unbounded-cloud.io/agent/lib/steps"
	"unbounded-cloud.io/agent/lib/version"
)

// steps runs every step not done yet (lib/steps).
func (r *Repave) steps(ctx context.Context, j *Journal, cfg *config.Config, m modes.Mode) error {
	var results []artifacts.Result
	var slot modes.Slot
	needSlot := func(ctx context.Context) error {
		if slot.Name != "" {
			return nil
		}
		if results == nil {
			var err error
			if results, err = r.fetch(ctx, cfg); err != nil {
				return err
			}
		}
		files := map[string]string{}
		for _, res := range results {
			files[res.Name] = res.File
		}
		a, err := modes.ArtifactsByName(files)
		if err != nil {
			return err
		}
		slot, err = modes.SlotFromConfig(cfg, j.To, a)
		return err
	}
	var cl Cluster
	cluster := func() (Cluster, error) {
		if cl != nil {
			return cl, nil
		}
		var err error
		cl, err = r.cluster(cfg, j.Options)
		return cl, err
	}
	return r.Runner(r.names().Operation, j).Run(ctx, []steps.Step{
		// Planned before the runner: journaling it is what makes every
		// later run resume this plan.
		{Name: StepPlan},
		{Name: StepArtifacts, Run: needSlot},
		{Name: StepBuild, Run: func(ctx context.Context) error {
			if j.From == j.To {
				return nil // in place: the mode builds beside the running stack itself
			}
			if err := needSlot(ctx); err != nil {
				return err
			}
			r.Status("step %s: building slot %s while slot %s serves", StepBuild, j.To, j.From)
			start := time.Now()
			if err := m.Prepare(ctx, slot); err != nil {
				return err
			}
			r.Logger().Info("new slot built while the old node serves", "slot", j.To, "took", time.Since(start).Round(time.Millisecond).String())
			return nil
		}},
		{Name: StepCordon, Status: "cordoning Node " + cfg.Machine, Run: func(ctx context.Context) error { return r.cordon(ctx, j, cfg, cluster) }},
		{Name: StepDrain, Run: func(ctx context.Context) error {
			// The fence's question does not depend on the drain: ask
			// it now, so that its answer is in when the old node has
			// stopped (see earlyFence).
			r.startEarlyFence(ctx)
			return r.drain(ctx, j, cfg, cluster)
		}},
		// The switch says what it does itself, once the artifacts of a
		// resumed run are fetched again.
		{Name: StepSwitch, Run: func(ctx context.Context) error {
			if err := needSlot(ctx); err != nil {
				return err
			}
			return r.switchOver(ctx, j, cfg, m, slot, cluster)
		}},
		{Name: StepRecord, Status: "recording the applied config of slot " + j.To, Run: func(context.Context) error { return r.record(j, cfg) }},
		{Name: StepRetire, Run: func(ctx context.Context) error {
			old := m
			if j.RunningMode() != j.Mode {
				var err error
				if old, err = r.mode(j.RunningMode()); err != nil {
					return err
				}
			}
			return r.retire(ctx, j, old)
		}},
	})
}

func (r *Repave) fetch(ctx context.Context, cfg *config.Config) ([]artifacts.Result, error) {
	r.Status("step %s: kubelet %s, containerd, runc, CNI plugins", StepArtifacts, cfg.Cluster.KubernetesVersion)
	if r.Fetch != nil {
		return r.Fetch(ctx, cfg)
	}
	return artifacts.FetchConfig(ctx, cfg, r.Paths, r.Logger())
}

func (r *Repave) cluster(cfg *config.Config, o Options) (Cluster, error) {
	if r.Cluster != nil {
		return r.Cluster(cfg, o)
	}
	creds := kube.CredentialsFor(cfg, r.Paths.PKIDir())
	// Only the daemon's certificate may cordon and delete the Node (the
	// admission policy of lib/api/manifests refuses a bootstrap token).
	rc, _, err := creds.CertConfig(r.Time())
	if err != nil {
		return nil, fmt.Errorf("the daemon's client certificate (%s), which cordons, drains and deletes the Node: %w", creds.Certs.Path(), err)
	}
	d, err := kube.NewDrainer(rc, cfg.Machine)
	if err != nil {
		return nil, err
	}
	d.Timeout, d.DeleteUnmanaged, d.Log = o.DrainTimeout, o.DeleteUnmanaged, r.Logger()
	return d, nil
}

// unreachable reports an error after which a forced repave goes on
// without the cluster: no answer, or no credential to ask with.
func unreachable(err error) bool {
	return kube.NoAnswer(err) || errors.Is(err, kube.ErrNoCertificate)
}

func (r *Repave) cordon(ctx context.Context, j *Journal, cfg *config.Config, cluster func() (Cluster, error)) error {
	c, err := cluster()
	if err == nil {
		var n *corev1.Node
		if n, err = c.GetNode(ctx); err == nil && n == nil {
			r.Logger().Info("the Node does not exist: nothing to cordon or drain", "node", cfg.Machine)
			return nil
		}
		if err == nil {
			// Journaled before the patch: a crash after it still
			// uncordons on failure.
			j.Cordoned = true
			if err = state.WriteJournal(r.Paths, r.names().Operation, j); err == nil {
				err = c.SetUnschedulable(ctx, true)
			}
			if err == nil {
				// This repave decides the Node's schedulability now:
				// an uncordon an earlier one owed would undo the
				// cordon under the drain.
				err = owed.Settle(r.Paths, owed.Uncordon)
			}
		}
	}
	// GetNode and SetUnschedulable try again for a minute
	// (kube.DefaultRetryFor) before they say the cluster cannot be asked.
	if err != nil && j.Force && unreachable(err) {
		r.Logger().Warn("the cluster cannot be asked; forced: repaving without cordon and drain", "error", err.Error())
		return nil
	}
	if err != nil && unreachable(err) {
		return fmt.Errorf("%w: cordon Node %s: %w (the repave did not touch the node; force repaves without the drain)", exitcode.ErrTemporary, cfg.Machine, err)
	}
	return err
}

func (r *Repave) drain(ctx context.Context, j *Journal, cfg *config.Config, cluster func() (Cluster, error)) error {
	if !j.Cordoned {
		return nil
	}
	if running, err := r.oldRuns(ctx, j); err == nil && !running {
		// A resumed repave after a reboot or a power cut: the old node
		// is not running, its pods are gone with it and its kubelet
		// cannot confirm an eviction. The Node's deletion (switch) lets
		// the cluster's garbage collector remove their objects, and
		// their controllers place them again.
		r.Logger().Warn("the old node is not running (a repave resumed after a reboot): nothing to drain gracefully", "slot", j.From)
		return nil
	}
	r.Status("step %s: evicting the pods of Node %s (at most %s)", StepDrain, cfg.Machine, j.DrainTimeout)
	c, err := cluster()
	if err == nil {
		err = c.Drain(ctx)
	}
	switch {
	case err == nil:
		return nil
	case errors.Is(err, kube.ErrUnmanagedPods):
		// Not passed by force: going on would stop the old node with
		// every pod still on it, the budgets unasked, and lose those
		// pods all the same.
		return fmt.Errorf("%w; the Node is uncordoned and the node left as it was (the parameter %s=true, or --delete-unmanaged, evicts such pods; force does not)", err, ParamDeleteUnmanaged)
	case j.Force:
		r.Logger().Warn("drain did not finish; forced: repaving anyway", "error", err.Error())
		return nil
	case errors.Is(err, kube.ErrDrainTimeout):
		return fmt.Errorf("%w; the Node is uncordoned and the node left as it was (force repaves anyway)", err)
	}
	return err
}

// oldRuns says whether every supervising unit of the old stack runs.
func (r *Repave) oldRuns(ctx context.Context, j *Journal) (bool, error) {
	sd, err := r.Manager(ctx)
	if err != nil {
		return false, err
	}
	defer sd.Close()
	for _, u := range facts.Supervising(j.RunningMode(), j.From) {
		st, err := sd.ActiveState(ctx, u)
		if err != nil {
			return false, err
		}
		if st != "active" {
			return false, nil
		}
	}
	return true, nil
}

// switchOver is Mode.Repave with the hooks.
func (r *Repave) switchOver(ctx context.Context, j *Journal, cfg *config.Config, m modes.Mode, s modes.Slot, cluster func() (Cluster, error)) error {
	r.Status("step %s: replacing the node stack of slot %s (mode %s) by slot %s (mode %s)", StepSwitch, j.From, j.RunningMode(), j.To, j.Mode)
	h := modes.RepaveHooks{
		Fence: func(ctx context.Context) error {
			// The old kubelet is stopped now: a Node deleted before
			// would have been registered again by it.
			if c, err := cluster(); err == nil {
				if err := c.DeleteNode(ctx); err != nil && !(j.Force && unreachable(err)) {
					return err
				}
				r.Logger().Info("Node deleted: the new kubelet registers it afresh under the same name", "node", cfg.Machine)
			} else if !(j.Force && unreachable(err)) {
				return err
			}
			r.Crash(r.names().Operation + "/after-node-deleted")
			if ok, err := r.earlyVerdict(ctx); ok {
				r.Logger().Info("allocation fence: using the check made during the drain", "allowed", err == nil)
				return err
			}
			r.Status("step %s: running the allocation fence for slot %s", StepSwitch, j.To)
			return r.fence(ctx)
		},
		Healthy: func(ctx context.Context, slot string) error {
			r.Status("step %s: waiting for slot %s to be healthy", StepSwitch, slot)
			if slot == j.From && j.RunningMode() != j.Mode {
				// A rollback of an isolation change: the old node
				// runs in the old mode.
				old, err := r.mode(j.RunningMode())
				if err != nil {
					return err
				}
				oc := *cfg
				oc.Mode = j.RunningMode()
				return r.healthy(ctx, &oc, slot, old)
			}
			return r.healthy(ctx, cfg, slot, m)
		},
		Crash: r.Crash,
	}
	start := time.Now()
	if j.RunningMode() != j.Mode {
		old, err := r.mode(j.RunningMode())
		if err != nil {
			return err
		}
		sd, err := r.Manager(ctx)
		if err != nil {
			return err
		}
		defer sd.Close()
		if err := modes.Change(ctx, r.Paths, sd, old, j.From, m, s, h); err != nil {
			return err
		}
		r.Logger().Info("node stack switched across modes", "from", j.From, "from_mode", j.RunningMode(), "to", j.To, "mode", j.Mode, "took", time.Since(start).Round(time.Millisecond).String())
		return nil
	}
	if err := m.Repave(ctx, j.From, s, h); err != nil {
		return err
	}
	r.Logger().Info("node stack switched", "from", j.From, "to", j.To, "took", time.Since(start).Round(time.Millisecond).String())
	return nil
}

// FenceFreshness bounds how old an allocation fence check may be when the
// new node starts on it (see earlyFence).
const FenceFreshness = 15 * time.Second

// earlyFence is the allocation fence check a repave starts as its drain
// begins, so that its answer (about a second: a unit start, a process, a
// TLS round trip to the API server) is not part of the node's downtime:
// the old node is stopped and the Node deleted, and the new node starts
// on this answer when the check began at most FenceFreshness before.
// Nothing starts without a check that allowed it, made by this run for
// this start; a refusal is a refusal whenever it came. A slower drain, a
// resumed run (the answer lives in memory only) and a rollback's start of
// the old node run the fence again at that point.
type earlyFence struct {
	started time.Time
	verdict chan error
}

func (r *Repave) startEarlyFence(ctx context.Context) {
	e := &earlyFence{started: time.Now(), verdict: make(chan error, 1)}
	r.early = e
	go func() { e.verdict <- r.fence(ctx) }()
}

// earlyVerdict returns the early check's answer (waiting for it if it is
// still on its way), and false when there is none or it began too long
// ago. It is used once.
func (r *Repave) earlyVerdict(ctx context.Context) (ok bool, verdict error) {
	e := r.early
	r.early = nil
	if e == nil || time.Since(e.started) > FenceFreshness {
		return false, nil
	}
	select {
	case err := <-e.verdict:
		return true, err
	case <-ctx.Done():
		return true, ctx.Err()
	}
}

// ReadyPoll is how often the wait for the new node looks at it: it is
// the node's downtime that is being waited out, so a Ready Node is seen
// within a quarter second all along (bootstrap's looks back off to 2 s;
// the cost: a loopback GET of the kubelet's healthz and one GET of the
// Node, four times a second, for the seconds of the downtime).
const ReadyPoll = readiness.QuickPoll

// CSINodeEarlyTriesOver is how long after the new node's start the
// kubelet's early CSINode tries are behind it: it tries at about 0.4, 0.8,
// 1.4, 4 and 20 s after its own start (lib/bootstrap's ready explains the
// race), starts about a second after its machine, and reports Ready
// within a second of a try that worked. The Node a repave deleted is
// registered again about 20 s after the kubelet starts, right at its last
// early try: when it still waits for its CSINode by now, the next try is
// two minutes away, and the node stack is restarted at once rather than
// after bootstrap's grace (the restarted kubelet finds its Node).
const CSINodeEarlyTriesOver = 24 * time.Second

func (r *Repave) fence(ctx context.Context) error {
	if r.Fence != nil {
		return r.Fence(ctx)
	}
	sd, err := r.Manager(ctx)
	if err != nil {
		return err
	}
	defer sd.Close()
	return fence.RunUnit(ctx, sd)
}

// healthy waits until the new node stack of slot is up (lib/readiness),
// its Node read live with its kubelet's certificate, with the one
// node-stack restart for the kubelet's CSINode at once after
// CSINodeEarlyTriesOver.
func (r *Repave) healthy(ctx context.Context, cfg *config.Config, slot string, m modes.Mode) error {
	if r.Healthy != nil {
		return r.Healthy(ctx, cfg, slot, m)
	}
	sd, err := r.Manager(ctx)
	if err != nil {
		return err
	}
	defer sd.Close()
	timeout := r.ReadyTimeout
	if timeout <= 0 {
		timeout = readiness.DefaultNewNodeTimeout
	}
	node := &kube.NodeReader{Name: cfg.Machine, Server: cfg.Cluster.APIServer, CAFile: cfg.Resolve(cfg.Cluster.CAFile),
		CertFile: modes.KubeletCertFile(m, slot), Root: m.NodeRoot(slot)}
	chk := &readiness.Check{Units: sd, Mode: cfg.Mode, Slot: slot, Name: cfg.Machine, Node: node.Read,
		LocalDNS: cfg.Node.LocalDNS, DNSReady: r.DNSReady}
	r.Status("step %s: waiting (at most %s) for the node units, kubelet healthz and Node %s Ready", StepSwitch, timeout, cfg.Machine)
	err = kube.NotUpExit(chk.Wait(ctx, readiness.Wait{Timeout: timeout, Poll: ReadyPoll, Log: r.Logger(),
		Status: func(line string) { sdstatus.Notify(r.Notify, fmt.Sprintf("STATUS=step %s: %s", StepSwitch, line)) },
		CSINode: &readiness.CSINode{AfterStart: CSINodeEarlyTriesOver,
			Restart: func(ctx context.Context) error { return m.Restart(ctx, slot) }},
	}))
	if err == nil {
		r.Logger().Info("node up", "node", cfg.Machine, "slot", slot)
	}
	return err
}

// record writes the new slot's applied config; an isolation change's
// journal then says that slot runs (the runner writes it with the step).
func (r *Repave) record(j *Journal, cfg *config.Config) error {
	a := &state.AppliedConfig{
		Slot: j.To, Mode: j.Mode, Machine: cfg.Machine,
		KubernetesVersion: cfg.Cluster.KubernetesVersion,
		AgentVersion:      version.Version,
		AppliedAt:         r.Time().UTC(),
		Config:            j.Config,
	}
	if err := state.WriteApplied(r.Paths, a); err != nil {
		return err
	}
	if j.RunningSlot != "" {
		j.RunningSlot = j.To
	}
	return nil
}

// supersededRemover is a mode that keeps what the old stack ran until
// the caller has recorded the new applied config (mode none: the old
// version directory, its rollback target until then).
type supersededRemover interface {
	RemoveSuperseded(ctx context.Context) error
}

// retire removes the old slot's record, then its files; in place, what
// the mode kept of the old stack.
func (r *Repave) retire(ctx context.Context, j *Journal, m modes.Mode) error {
	if j.From == j.To {
		if sr, ok := m.(supersededRemover); ok {
			r.Status("step %s: removing what the old node stack ran", StepRetire)
			if err := sr.RemoveSuperseded(ctx); err != nil {
				// The next repave (or the mode's lifecycle hooks)
				// removes it; the new node runs and is recorded.
				r.Logger().Warn("superseded files not removed yet", "error", err.Error())
			}
		}
		return nil
	}
	r.Status("step %s: removing slot %s (its record, then its files)", StepRetire, j.From)
	if err := state.RemoveApplied(r.Paths, j.From); err != nil {
		return err
	}
	return m.Destroy(ctx, j.From)
}
