// Package repave replaces the node stack of a bootstrapped host from the
// desired config (unbounded-repave.service, ARCHITECTURE sections 2 and 6):
// blue/green into the other slot in mode nspawn, in place in mode none.
// What is the mode's (build, stop, switch, roll back) is Mode.Repave of
// lib/modes; this package does everything around it and stays
// mode-agnostic.
//
// Steps, in order, run by lib/steps: each one journaled in
// /var/lib/unbounded/journal/repave.json once done (atomic, SHA-256
// sidecar) and followed by a crash point "repave/after-<step>"
// (lib/crashpoint):
//
//	lock       the ownership lock, owner "repave", naming
//	           unbounded-repave.service (see Lock below for why)
//	plan       the desired config (the daemon's request file when there
//	           is one: the config on disk with the Machine's spec laid
//	           over it; else the config on disk) against the active
//	           applied config: unchanged is nothing to do (exit 0) unless
//	           forced; a mode change is refused (an isolation change, exit
//	           1); else the plan (from, to, the desired config) is
//	           journaled and every later run resumes it unchanged
//	artifacts  kubelet, containerd, runc, CNI plugins of the desired
//	           config, verified (lib/artifacts; a cache hit costs nothing)
//	build      blue/green only: the mode prepares the other slot while
//	           the old node still serves
//	cordon     the Node is cordoned (when the cluster is reachable and the
//	           Node exists)
//	drain      its pods are evicted through the eviction API (lib/kube
//	           Drainer: PodDisruptionBudgets honoured, DaemonSet and mirror
//	           pods left, pods without a controller refused unless
//	           deleteUnmanaged), bounded by the drain timeout; on timeout
//	           the Node is uncordoned and the repave fails, unless forced.
//	           unbounded-fence.service is started beside it (earlyFence)
//	switch     Mode.Repave: the old stack stopped, its networking cleaned,
//	           then the Fence hook (the Node deleted now that its kubelet
//	           is gone, so that it is not registered again by the old
//	           kubelet, then the fence's answer), the new stack
//	           started, the Healthy hook (units, kubelet healthz, Node
//	           registered afresh and Ready); a failure rolls back inside
//	           the mode (modes.ErrRolledBack)
//	record     the new slot's applied config, only now that it is healthy
//	retire     blue/green only: the old slot's record removed, then its
//	           files (Mode.Destroy)
//
// Then the lock is released, the node handed to systemd as bootstrap does
// (daemon-reload: the generator wires the node target to the new slot;
// unbounded-node.target started, whose fence does not run again as the new
// slot's unit already runs; the daemon started), and the journal removed.
//
// Lock. A repave holds the installation lock from start to end, as
// bootstrap does, because between "old stopped" and "record removed" the
// host is in no state the generator should start a node from (two
// records, or a record whose slot is stopped): while the host is owned,
// the generator starts only the unit the record names, so a power cut
// anywhere in the repave boots into unbounded-repave.service, which
// resumes from its journal and finishes or rolls back; recovery, reset,
// bootstrap and a second repave wait (69). The daemon: one that runs keeps
// running (it checks the lock only at its start and before dispatching a
// new operation) and reports the repave it started; one that starts while
// the repave runs exits 69, and the repave starts it again at the end.
//
// Kind. The isolation change (lib/isolation) is carried out by these
// steps too, as a Kind: its own names (lock owner, journal, unit,
// request), plan (the method, the token's review, the other slot) and
// reprovision handoff; a journal whose running mode differs from its
// mode switches across modes (modes.Change) and retires the old mode.
package repave

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"unbounded-cloud.io/agent/lib/adopt"
	"unbounded-cloud.io/agent/lib/artifacts"
	"unbounded-cloud.io/agent/lib/config"
	"unbounded-cloud.io/agent/lib/modes"
	"unbounded-cloud.io/agent/lib/modes/all"
	"unbounded-cloud.io/agent/lib/outcome"
	"unbounded-cloud.io/agent/lib/owed"
	"unbounded-cloud.io/agent/lib/request"
	"unbounded-cloud.io/agent/lib/state"
	"unbounded-cloud.io/agent/lib/steps"
	"unbounded-cloud.io/agent/lib/unitnames"
)

// Operation is the owner name of the ownership lock and the journal's name.
const Operation = "repave"

// Unit is the unit that runs a repave; the ownership record names it, so
// that the generator resumes it after a reboot mid-repave.
const Unit = unitnames.Repave

// Concern is the request file's name (/var/lib/unbounded/requests/repave.json).
const Concern = "repave"

// Request parameters (MachineOperation spec.parameters) a repave reads.
const (
	// ParamForce "true": repave even when the desired config is the
	// applied one, and go on when the drain times out (or the cluster
	// cannot be asked) instead of failing; not when the drain refuses
	// pods without a controller (ParamDeleteUnmanaged).
	ParamForce = "force"
	// ParamDrainTimeout is a Go duration ("90s", "10m") bounding the
	// drain; absent: the --drain-timeout flag (default 5 min).
	ParamDrainTimeout = "drainTimeout"
	// ParamDeleteUnmanaged "true": the drain evicts the pods without a
	// controller too (nothing creates them again: they are lost), where
	// without it such pods refuse the drain (kube.ErrUnmanagedPods) and
	// the repave fails with the Node as it was. Force does not decide
	// this: it goes on past a drain that timed out, not past pods that
	// an eviction would lose.
	ParamDeleteUnmanaged = "deleteUnmanaged"
)

// Steps, in order.
const (
	StepPlan      = "plan"
	StepArtifacts = "artifacts"
	StepBuild     = "build"
	StepCordon    = "cordon"
	StepDrain     = "drain"
	StepSwitch    = "switch"
	StepRecord    = "record"
	StepRetire    = "retire"
)

// StepDocs are the steps in the order they run, each with what it does:
// the one list of them (the package doc details each; --help shows
// them).
var StepDocs = []steps.Doc{
	{Name: StepPlan, Does: "the desired config against the applied one (unchanged: nothing to do unless forced), journaled"},
	{Name: StepArtifacts, Does: "kubelet, containerd, runc and CNI plugins of the desired config, verified"},
	{Name: StepBuild, Does: "blue/green: the other slot built while the old node serves"},
	{Name: StepCordon, Does: "the Node cordoned"},
	{Name: StepDrain, Does: "its pods evicted (PodDisruptionBudgets honoured), bounded by the drain timeout"},
	{Name: StepSwitch, Does: "the old node stopped, the Node deleted, the allocation fence, the new node started and waited for until Ready; rolled back when it does not come up"},
	{Name: StepRecord, Does: "the new slot's applied config recorded"},
	{Name: StepRetire, Does: "the old slot's record, then its files, removed"},
}

// Steps lists the steps in the order they run.
var Steps = steps.Names(StepDocs)

// CrashPoints are the crash points of lib/repave, in the order a repave
// reaches them; the mode's own ("repave/after-old-stopped", ...) come in
// the switch, and "repave/after-node-deleted" in its Fence hook.
var CrashPoints = func() []string {
	out := []string{"repave/after-lock"}
	for _, s := range Steps {
		out = append(out, steps.CrashPoint(Operation, s))
	}
	return append(out, "repave/after-release")
}()

// ErrModeChange is returned when the desired config names another
// isolation mode: that is an isolation change, not a repave.
var ErrModeChange = errors.New("the desired config changes the isolation mode")

// Journal is what a repave keeps between runs.
type Journal struct {
	// From is the running slot, To the slot the new stack goes into (the
	// same in an in-place mode), Mode their mode.
	From string `json:"from"`
	To   string `json:"to"`
	Mode string `json:"mode"`
	// FromMode is the running mode of an isolation change ("": Mode).
	FromMode string `json:"from-mode,omitempty"`
	// Method is an isolation change's (modes.MethodInPlace).
	Method string `json:"method,omitempty"`
	// RunningSlot is the slot whose node runs: From until the new
	// node is recorded, then To. With two records on the host (an
	// isolation change between its record and retire steps) it says
	// which one is active (state.ReadInPlaceJournal reads it).
	RunningSlot string `json:"running-slot,omitempty"`
	// Config is the desired effective config (lib/config, as JSON, the
	// bootstrap token referenced by file): a resumed run applies exactly
	// this, whatever the files on disk say by then.
	Config json.RawMessage `json:"config"`
	// The run's options, kept for a resume: a resumed run drains as the
	// first one was told to.
	Options
	// Request is the UID of the daemon's request this run carries out
	// ("" for a start by hand).
	Request string `json:"request,omitempty"`
	// The steps done, and where the last run got to, for the next run
	// and for `unbounded status`.
	steps.Record
	// Cordoned says the Node was cordoned by this repave (a failure
	// uncordons it).
	Cordoned  bool      `json:"cordoned,omitempty"`
	StartedAt time.Time `json:"started-at,omitzero"`
}

// RunningMode is the mode of the running slot (From).
func (j *Journal) RunningMode() string {
	if j.FromMode != "" {
		return j.FromMode
	}
	return j.Mode
}

// Options are a run's options, from the flags and the daemon's request
// (its drainTimeout wins; its "true" force or deleteUnmanaged adds to the
// flags).
type Options struct {
	// Force repaves an unchanged config, and goes on past a drain that
	// timed out or a cluster that cannot be asked.
	Force bool `json:"force,omitempty"`
	// DeleteUnmanaged evicts the pods without a controller
	// (kube.Drainer.DeleteUnmanaged).
	DeleteUnmanaged bool `json:"delete-unmanaged,omitempty"`
	// DrainTimeout bounds the drain.
	DrainTimeout time.Duration `json:"drain-timeout,omitempty"`
}

// Cluster is what a repave asks of the cluster about its Node; the real
// one is lib/kube's Drainer with the daemon's client certificate.
type Cluster interface {
	GetNode(ctx context.Context) (*corev1.Node, error)
	SetUnschedulable(ctx context.Context, on bool) error
	Drain(ctx context.Context) error
	DeleteNode(ctx context.Context) error
}

// Repave runs one repave on one host, or the operation its Kind says.
// The zero value of every field but Paths is the real host; tests
// replace them.
type Repave struct {
	steps.Host
	// Kind is the operation the steps carry out; nil: the repave.
	Kind Kind
	// Force repaves an unchanged config, and goes on past a drain that
	// timed out (the request's "force" parameter does the same), but not
	// past pods without a controller (DeleteUnmanaged).
	Force bool
	// DrainTimeout bounds the drain; 0 is kube.DefaultDrainTimeout (the
	// request's "drainTimeout" parameter wins).
	DrainTimeout time.Duration
	// DeleteUnmanaged lets the drain evict the pods without a controller
	// (the request's "deleteUnmanaged" parameter does the same).
	DeleteUnmanaged bool
	// ReadyTimeout bounds the wait for the new node; 0 is
	// readiness.DefaultNewNodeTimeout.
	ReadyTimeout time.Duration
	// DNSReady asks the new node's node-local DNS cache (nil:
	// readiness.LocalDNSReady), when its config runs one.
	DNSReady func(context.Context) error
	// Mode returns the isolation mode named by the config; nil: the real
	// nspawn or none mode.
	Mode func(name string) (modes.Mode, error)
	// Fetch fetches the verified artifacts; nil: lib/artifacts.
	Fetch func(ctx context.Context, cfg *config.Config) ([]artifacts.Result, error)
	// Cluster returns the cluster client for cfg's Node, draining as o
	// says; nil: lib/kube's Drainer with the stored client certificate.
	Cluster func(cfg *config.Config, o Options) (Cluster, error)
	// Healthy waits for the new node; nil: bootstrap's ready wait.
	Healthy func(ctx context.Context, cfg *config.Config, slot string, m modes.Mode) error
	// Fence runs the allocation fence; nil: unbounded-fence.service.
	Fence func(ctx context.Context) error

	early *earlyFence
	// planned is the journal this run carries out, once planned or
	// resumed (its outcome's names).
	planned *Journal
}

// Names are an operation's names: the lock's owner, the journal's name
// and its crash points' prefix (Operation), the unit the lock names, so
// that the generator resumes it after a reboot (Unit), and the request
// file's (Concern).
type Names struct{ Operation, Unit, Concern string }

// Kind is an operation the repave's steps carry out: the repave itself
// (Repave.Kind nil), or lib/isolation's change between modes. The
// adoption, the lock, the plan, the steps, the failure path and the
// hand-over are the repave's, written once; a Kind decides at the points
// below.
type Kind interface {
	Names() Names
	// Start runs before the lock is taken (an older agent's host
	// adopted); done ends the run with err.
	Start(ctx context.Context) (done bool, err error)
	// Decide says, once the desired config is read and before anything
	// else is checked, whether it asks for this operation of the node
	// that active records: an error, nothing to do (the daemon's
	// request is then carried out), or neither.
	Decide(active *state.AppliedConfig, cfg *config.Config) (nothing bool, err error)
	// Plan completes a new journal, planned from active to cfg, before
	// anything on the host is touched.
	Plan(ctx context.Context, j *Journal, active *state.AppliedConfig, cfg *config.Config, req *request.Request) error
	// Planned is told of the journal the run follows, new or resumed,
	// with the lock held; done ends the run with err, the lock released
	// (or handed on) by it.
	Planned(ctx context.Context, lock *state.Lock, j *Journal, cfg *config.Config) (done bool, err error)
	// Done is the status line of a run that did its steps.
	Done(j *Journal) string
}

// repaveKind is the repave itself: the desired config in the running
// mode.
type repaveKind struct{}

func (repaveKind) Names() Names { return Names{Operation: Operation, Unit: Unit, Concern: Concern} }

func (repaveKind) Start(context.Context) (bool, error) { return false, nil }

func (repaveKind) Decide(active *state.AppliedConfig, cfg *config.Config) (bool, error) {
	if cfg.Mode != active.Mode {
		return false, fmt.Errorf("%w from %s to %s (%s): changing the isolation mode is an isolation change (unbounded-isolation.service), not a repave; the node was left as it is",
			ErrModeChange, active.Mode, cfg.Mode, strings.Join(cfg.Files, ", "))
	}
	return false, nil
}

func (repaveKind) Plan(context.Context, *Journal, *state.AppliedConfig, *config.Config, *request.Request) error {
	return nil
}

func (repaveKind) Planned(context.Context, *state.Lock, *Journal, *config.Config) (bool, error) {
	return false, nil
}

func (repaveKind) Done(j *Journal) string {
	return fmt.Sprintf("repaved: slot %s runs the desired config (mode %s), slot %s retired", j.To, j.Mode, retired(j))
}

func (r *Repave) kind() Kind {
	if r.Kind != nil {
		return r.Kind
	}
	return repaveKind{}
}

func (r *Repave) names() Names { return r.kind().Names() }

func (r *Repave) mode(name string) (modes.Mode, error) {
	if r.Mode != nil {
		return r.Mode(name)
	}
	return all.For(name, r.Paths, r.Logger())
}

// ErrNothingToDo is returned (and maps to exit 0) when the desired config
// is the applied one and the repave was not forced.
var ErrNothingToDo = errors.New("the desired config is the applied one: nothing to repave (--force repaves anyway)")

// Run repaves the host, or resumes an interrupted repave. Its error maps
// to the exit code with exitcode.For (ErrNothingToDo is a success: the
// caller says so and exits 0).
func (r *Repave) Run(ctx context.Context) error {
	err := r.run(ctx)
	if r.Kind == nil {
		r.recordOutcome(ctx, err)
	}
	return err
}

// recordOutcome leaves the repave's end on the host (lib/outcome), for
// `unbounded status` (the operation's own status is the daemon's, from
// the unit's result). Nothing to do, another installation's lock and a
// stop by SIGTERM (the journal resumes) are no outcome.
func (r *Repave) recordOutcome(ctx context.Context, err error) {
	j := r.planned
	if j == nil || errors.Is(err, ErrNothingToDo) || errors.Is(err, state.ErrOwned) || ctx.Err() != nil {
		return
	}
	o := outcome.Record{Concern: outcome.Repave, UID: j.Request, From: j.From, To: j.To, StartedAt: j.StartedAt, Time: r.Time().UTC(),
		State: outcome.Succeeded, Message: r.kind().Done(j)}
	if err != nil {
		o.State, o.Reason, o.Message = outcome.Failed, "RepaveFailed", err.Error()
		o.Step, _ = steps.Failed(err)
		if errors.Is(err, modes.ErrRolledBack) {
			o.Reason = outcome.ReasonRolledBack
		}
	}
	if werr := outcome.Write(r.Paths, o); werr != nil {
		r.Logger().Error("the repave's outcome was not recorded", "error", werr.Error())
	}
}

func (r *Repave) run(ctx context.Context) error {
	k, n := r.kind(), r.names()
	// A host the older agent installed is adopted first (lib/adopt): the
	// repave then replaces the adopted node as any other.
	ad := &adopt.Adopt{Host: r.Host}
	if err := ad.Run(ctx); err != nil {
		return err
	}
	if done, err := k.Start(ctx); done {
		return err
	}
	r.Status("taking the ownership lock")
	lock, err := state.AcquireOwnership(r.Paths, n.Operation, n.Unit)
	if err != nil {
		return err // 69: another installation owns the host
	}
	r.Crash(n.Operation + "/after-lock")
	// A record a power cut left staged goes under its own name first (the
	// first writer after the boot).
	if err := state.FinishApplied(r.Paths); err != nil {
		lock.Release()
		return err
	}
	j, cfg, m, err := r.plan(ctx)
	if err != nil {
		lock.Release()
		return err
	}
	if j == nil {
		if err := lock.Release(); err != nil {
			return err
		}
		return ErrNothingToDo
	}
	r.planned = j
	if done, err := k.Planned(ctx, lock, j, cfg); done {
		return err
	}
	err = r.steps(ctx, j, cfg, m)
	if err != nil {
		return r.fail(ctx, j, cfg, lock, err)
	}
	// The lock goes before the hand-over (the generator wires the node
	// target only on a host no installation owns), the journal after it:
	// a crash in between leaves a journal with every step done, and the
	// next run (or unbounded-lifecycle at the next boot) only hands the
	// node over.
	if err := lock.Release(); err != nil {
		return fmt.Errorf("release the ownership lock: %w", err)
	}
	r.Crash(n.Operation + "/after-release")
	if err := r.handOver(ctx); err != nil {
		return err
	}
	// Carried out, before the journal goes: a crash in between resumes
	// the journal, never the request again.
	if err := request.MarkTaken(r.Paths, n.Concern, j.Request); err != nil {
		return err
	}
	if err := state.RemoveJournal(r.Paths, n.Operation); err != nil {
		return err
	}
	r.Status("%s", k.Done(j))
	return nil
}

func retired(j *Journal) string {
	if j.From == j.To {
		return "none"
	}
	return j.From
}

// fail ends a run that failed in a step: a rolled-back (or never
// switched) node is uncordoned and handed back to systemd; the journal
// goes when the host is as it was, else it stays for the next run.
func (r *Repave) fail(ctx context.Context, j *Journal, cfg *config.Config, lock *state.Lock, err error) error {
	step, _ := steps.Failed(err)
	// A context that a SIGTERM ended must still let the clean-up through.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	switched := j.IsDone(StepSwitch)
	// As before: the switch never began, rolled back, or the mode does
	// not repave in this release (it did nothing).
	asBefore := !switched && (step != StepSwitch || errors.Is(err, modes.ErrRolledBack) || errors.Is(err, modes.ErrNotImplemented))
	if asBefore {
		if j.Cordoned {
			r.uncordonOwed(cctx, j, cfg, err)
		}
		if j.From != j.To && !errors.Is(err, modes.ErrRolledBack) && j.IsDone(StepBuild) {
			// Built but never started: the old node never stopped.
			// The new slot goes, so that nothing half-made stays.
			if m, merr := r.mode(j.Mode); merr == nil {
				if derr := m.Destroy(cctx, j.To); derr != nil {
					r.Logger().Error("new slot not removed after the failed repave", "slot", j.To, "error", derr.Error())
				}
			}
		}
		if terr := request.MarkTaken(r.Paths, r.names().Concern, j.Request); terr != nil {
			r.Logger().Error("the daemon's request not marked carried out", "error", terr.Error())
		}
		if rerr := state.RemoveJournal(r.Paths, r.names().Operation); rerr != nil {
			r.Logger().Error(r.names().Operation+" journal not removed", "error", rerr.Error())
		}
	} else {
		// The journal's step says which step failed and why (lib/steps).
		if werr := state.WriteJournal(r.Paths, r.names().Operation, j); werr != nil {
			r.Logger().Error(r.names().Operation+" journal not written", "error", werr.Error())
		}
	}
	r.Status("%s failed in step %s: %v", r.names().Operation, step, err)
	if rerr := lock.Release(); rerr != nil {
		r.Logger().Error("ownership lock not released", "error", rerr.Error())
	}
	if asBefore {
		// The old node runs again (or never stopped): hand it back to
		// systemd as it was (the generator wires it again).
		if herr := r.handOver(cctx); herr != nil {
			r.Logger().Error("node not handed back to systemd", "error", herr.Error())
		}
	}
	return err
}

// uncordonOwed uncordons the Node of a repave that failed with the node
// as it was. The write is owed first (lib/owed), durably: if the cluster
// does not answer within the retries, or the host loses power before,
// the daemon makes it once the API server answers; a Node is never left
// cordoned by a repave that did not replace it.
func (r *Repave) uncordonOwed(ctx context.Context, j *Journal, cfg *config.Config, cause error) {
	why := cause.Error()
	if len(why) > 300 {
		why = why[:300] + "..."
	}
	w := owed.Write{Kind: owed.Uncordon, Node: cfg.Machine, By: r.names().Operation, Since: r.Time().UTC(),
		Why: "the " + r.names().Operation + " failed with the node as it was (" + why + ")"}
	if err := owed.Owe(r.Paths, w); err != nil {
		r.Logger().Error("the owed uncordon was not recorded", "error", err.Error())
	}
	c, err := r.cluster(cfg, j.Options)
	if err == nil {
		err = c.SetUnschedulable(ctx, false)
	}
	if err != nil {
		r.Logger().Error("Node not uncordoned after the failed repave; the daemon uncordons it once the API server answers (unbounded status lists it)",
			"node", cfg.Machine, "error", err.Error())
		return
	}
	r.Logger().Info("Node uncordoned: the repave failed and the node is as it was", "node", cfg.Machine)
	if err := owed.Settle(r.Paths, owed.Uncordon); err != nil {
		r.Logger().Error("the owed uncordon was made but its record stays", "error", err.Error())
	}
}

// handOver reloads (the generator wires the node target to the active
// slot now that the host is no longer owned) and starts the node target
// and the daemon.
func (r *Repave) handOver(ctx context.Context) error {
	sd, err := r.Manager(ctx)
	if err != nil {
		return err
	}
	defer sd.Close()
	// The daemon's start queued, not waited for: a daemon that runs (the
	// one that started this repave, waiting for it) is left alone; one
	// that exited 69 while the host was owned starts again.
	return steps.HandOver(ctx, sd, steps.WaitNode, nil)
}
