package repave

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/config"
	"unbounded-cloud.io/agent/lib/exitcode"
	"unbounded-cloud.io/agent/lib/kube"
	"unbounded-cloud.io/agent/lib/modes"
	"unbounded-cloud.io/agent/lib/request"
	"unbounded-cloud.io/agent/lib/state"
)

// plan returns the journal to run (resumed, or new), the desired config
// and the mode; a nil journal means nothing to do.
func (r *Repave) plan(ctx context.Context) (*Journal, *config.Config, modes.Mode, error) {
	k, n := r.kind(), r.names()
	var j Journal
	found, err := state.ReadJournal(r.Paths, n.Operation, &j)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("%s journal: %w", n.Operation, err)
	}
	if found {
		cfg, err := r.journalConfig(&j)
		if err != nil {
			return nil, nil, nil, err
		}
		m, err := r.mode(j.Mode)
		if err != nil {
			return nil, nil, nil, err
		}
		r.Status("resuming the %s of slot %s (mode %s) into %s (mode %s) from step %q", n.Operation, j.From, j.RunningMode(), j.To, j.Mode, j.Step)
		return &j, cfg, m, nil
	}
	active, err := state.ReadActive(r.Paths)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("applied state: %w", err)
	}
	if active == nil {
		return nil, nil, nil, fmt.Errorf("this host has no applied config: it was never bootstrapped, so there is no node to repave (unbounded-bootstrap.service builds the first one)")
	}
	r.Status("step %s: reading the desired config", StepPlan)
	cfg, req, err := r.desired()
	if err != nil {
		return nil, nil, nil, err
	}
	opts, err := r.options(req)
	if err != nil {
		return nil, nil, nil, err
	}
	if nothing, err := k.Decide(active, cfg); err != nil {
		return nil, nil, nil, err
	} else if nothing {
		return nil, nil, nil, r.taken(req)
	}
	if cfg.Machine != active.Machine && active.Machine != "" {
		return nil, nil, nil, fmt.Errorf("%w: the desired config names machine %q, the node runs as %q: a repave keeps the Node's name (reset and bootstrap the host to rename it)",
			exitcode.ErrConfigInvalid, cfg.Machine, active.Machine)
	}
	// node.ip and devices.allow against this host: said before the drain.
	if err := modes.CheckHost(cfg); err != nil {
		return nil, nil, nil, err
	}
	want, err := effective(cfg)
	if err != nil {
		return nil, nil, nil, err
	}
	if same, err := sameConfig(want, active.Config); err != nil {
		return nil, nil, nil, err
	} else if same && !opts.Force {
		r.Status("the desired config is the one slot %s runs: nothing to do", active.Slot)
		return nil, nil, nil, r.taken(req)
	}
	m, err := r.mode(cfg.Mode)
	if err != nil {
		return nil, nil, nil, err
	}
	j = Journal{
		From: active.Slot, To: modes.TargetSlot(m, active.Slot), Mode: active.Mode,
		Config: want, Options: opts, StartedAt: r.Time().UTC(),
	}
	if req != nil {
		j.Request = req.UID
	}
	if err := k.Plan(ctx, &j, active, cfg, req); err != nil {
		return nil, nil, nil, err
	}
	// A switch's journal (modes.Switch) belongs to the plan whose run
	// left it: a new plan never goes on with it.
	if err := state.RemoveJournal(r.Paths, modes.SwitchJournal(n.Operation)); err != nil {
		return nil, nil, nil, err
	}
	r.Logger().Info("repave planned", "from", j.From, "to", j.To, "mode", j.Mode,
		"kubernetes_version", cfg.Cluster.KubernetesVersion, "force", opts.Force, "delete_unmanaged", opts.DeleteUnmanaged, "drain_timeout", opts.DrainTimeout.String())
	return &j, cfg, m, nil
}

// taken marks the daemon's request req (nil: none) carried out: the
// run found nothing to do for it.
func (r *Repave) taken(req *request.Request) error {
	if req == nil {
		return nil
	}
	return request.MarkTaken(r.Paths, r.names().Concern, req.UID)
}

// desired is the config to apply: the config on disk, with the Machine's
// spec from the daemon's request laid over it when there is a request.
func (r *Repave) desired() (*config.Config, *request.Request, error) {
	cfg, err := config.Load(r.Paths)
	if err != nil {
		return nil, nil, err
	}
	req, err := request.Read(r.Paths, r.names().Concern)
	switch {
	case err == nil:
	case errors.Is(err, os.ErrNotExist):
		return cfg, nil, nil
	default:
		return nil, nil, fmt.Errorf("the daemon's request: %w", err)
	}
	// A request an earlier run carried out to its end is not the input
	// of a later start by hand (request.Taken). One cut before its end
	// is: its journal, once written, is what a resumed run follows.
	if request.Taken(r.Paths, r.names().Concern, req.UID) {
		r.Logger().Info("the daemon's request was carried out by an earlier run; the desired config is the config on disk",
			"request", r.Paths.Request(r.names().Concern), "uid", req.UID)
		return cfg, nil, nil
	}
	if len(req.Desired) > 0 {
		var spec v1alpha3.MachineSpec
		if err := json.Unmarshal(req.Desired, &spec); err != nil {
			return nil, nil, fmt.Errorf("the daemon's request %s: desired: %w", r.Paths.Request(r.names().Concern), err)
		}
		overlay(cfg, &spec)
	}
	r.Logger().Info("desired config: the config on disk with the Machine's spec from the daemon's request",
		"request", r.Paths.Request(r.names().Concern), "operation", req.Operation, "uid", req.UID)
	return cfg, req, nil
}

// overlay lays the Machine's spec over the config: what the cluster says
// wins for the fields it has (Kubernetes version, node labels and
// taints, isolation mode); an unset field keeps the config's value.
func overlay(cfg *config.Config, spec *v1alpha3.MachineSpec) {
	if v := strings.TrimPrefix(spec.Kubernetes.Version, "v"); v != "" {
		cfg.Cluster.KubernetesVersion = v
	}
	if len(spec.Kubernetes.NodeLabels) > 0 {
		cfg.Node.Labels = spec.Kubernetes.NodeLabels
	}
	if len(spec.Kubernetes.Taints) > 0 {
		var ts []string
		for _, t := range spec.Kubernetes.Taints {
			s := t.Key
			if t.Value != "" {
				s += "=" + t.Value
			}
			ts = append(ts, s+":"+string(t.Effect))
		}
		cfg.Node.Taints = ts
	}
	if m := string(spec.Isolation.Mode); m != "" {
		cfg.Mode = m
	}
}

// VanishedNode reports whether req is the daemon's repave of a Machine
// whose Node vanished (no operation; lib/request's UID "node:...").
func VanishedNode(req *request.Request) bool {
	return req != nil && req.Operation == "" && strings.HasPrefix(req.UID, "node:")
}

// options are the run's options: the request's parameters win over the
// flags (a "true" one adds to them).
func (r *Repave) options(req *request.Request) (Options, error) {
	force, deleteUnmanaged, timeout := r.Force, r.DeleteUnmanaged, r.DrainTimeout
	if VanishedNode(req) {
		// The config did not change, the Node did: the new node registers
		// it afresh, so unchanged is no reason to stop here.
		r.Logger().Warn("this repave is for the vanished Node: the daemon found the Machine's Node gone; repaving although the config is unchanged",
			"node", req.Machine, "uid", req.UID)
		force = true
	}
	if req != nil {
		if v, ok := req.Parameters[ParamForce]; ok {
			b, err := strconv.ParseBool(v)
			if err != nil {
				return Options{}, fmt.Errorf("the daemon's request: parameter %s=%q: want true or false", ParamForce, v)
			}
			force = force || b
		}
		if v, ok := req.Parameters[ParamDeleteUnmanaged]; ok {
			b, err := strconv.ParseBool(v)
			if err != nil {
				return Options{}, fmt.Errorf("the daemon's request: parameter %s=%q: want true or false", ParamDeleteUnmanaged, v)
			}
			deleteUnmanaged = deleteUnmanaged || b
		}
		if v, ok := req.Parameters[ParamDrainTimeout]; ok {
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 {
				return Options{}, fmt.Errorf("the daemon's request: parameter %s=%q: want a positive duration such as 90s or 10m", ParamDrainTimeout, v)
			}
			timeout = d
		}
	}
	if timeout <= 0 {
		timeout = kube.DefaultDrainTimeout
	}
	return Options{Force: force, DeleteUnmanaged: deleteUnmanaged, DrainTimeout: timeout}, nil
}

// effective is the config as an applied record stores it (the JSON
// bootstrap records), without the list of files it was read from.
func effective(cfg *config.Config) (json.RawMessage, error) {
	c := *cfg
	c.Files = nil
	return json.Marshal(&c)
}

// sameConfig compares two effective configs by meaning (decoded and
// encoded again, so that field order and the file list do not count).
func sameConfig(want, applied json.RawMessage) (bool, error) {
	norm := func(raw json.RawMessage) ([]byte, error) {
		var c config.Config
		if err := json.Unmarshal(raw, &c); err != nil {
			return nil, err
		}
		c.Files = nil
		return json.Marshal(&c)
	}
	a, err := norm(want)
	if err != nil {
		return false, err
	}
	if len(applied) == 0 {
		return false, nil
	}
	b, err := norm(applied)
	if err != nil {
		// An applied config this build cannot read is not "the same".
		return false, nil
	}
	return bytes.Equal(a, b), nil
}

// journalConfig is the journaled desired config, bound to this host's
// root (config.LoadEffective).
func (r *Repave) journalConfig(j *Journal) (*config.Config, error) {
	cfg, err := config.LoadEffective(r.Paths, j.Config)
	if errors.Is(err, config.ErrRecorded) {
		return nil, fmt.Errorf("%w: %s journal: config: %v", state.ErrCorrupt, r.names().Operation, err)
	}
	if err != nil {
		return nil, fmt.Errorf("resuming the %s: %w", r.names().Operation, err)
	}
	return cfg, nil
}
