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
package repave

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"unbounded-cloud.io/agent/lib/adopt"
	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/artifacts"
	"unbounded-cloud.io/agent/lib/config"
	"unbounded-cloud.io/agent/lib/crashpoint"
	"unbounded-cloud.io/agent/lib/exitcode"
	"unbounded-cloud.io/agent/lib/fence"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/kube"
	"unbounded-cloud.io/agent/lib/modes"
	"unbounded-cloud.io/agent/lib/modes/all"
	"unbounded-cloud.io/agent/lib/modes/facts"
	"unbounded-cloud.io/agent/lib/owed"
	"unbounded-cloud.io/agent/lib/readiness"
	"unbounded-cloud.io/agent/lib/reprovision"
	"unbounded-cloud.io/agent/lib/request"
	"unbounded-cloud.io/agent/lib/sdstatus"
	"unbounded-cloud.io/agent/lib/state"
	"unbounded-cloud.io/agent/lib/steps"
	"unbounded-cloud.io/agent/lib/unitnames"
	"unbounded-cloud.io/agent/lib/units"
	"unbounded-cloud.io/agent/lib/version"
)

// Operation is the owner name of the ownership lock and the journal's name.
const Operation = "repave"

// IsolationOperation, IsolationUnit and IsolationConcern are the same for
// a Repave run as an isolation change (Repave.Isolation,
// unbounded-isolation.service): its lock's owner and journal
// (journal/isolation.json, whose running-slot says which of two records
// runs: state.ReadInPlaceJournal), its unit, its request file.
const (
	IsolationOperation = "isolation"
	IsolationUnit      = unitnames.Isolation
	IsolationConcern   = "isolation"
)

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
	// ParamMethod forces the method of an isolation change
	// (modes.MethodInPlace or modes.MethodReprovision: the daemon passes
	// the Machine's spec.isolation.method); absent or empty: --method,
	// else the table's (modes.ChangeMethodAsked).
	ParamMethod = "method"
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

// Steps lists the steps in the order they run.
var Steps = []string{StepPlan, StepArtifacts, StepBuild, StepCordon, StepDrain, StepSwitch, StepRecord, StepRetire}

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

// IsolationCrashPoints are the crash points of an isolation change in
// order: its steps', with modes.Change's inside the switch.
var IsolationCrashPoints = func() []string {
	out := []string{IsolationOperation + "/after-lock"}
	for _, s := range Steps {
		if s == StepSwitch {
			out = append(out, IsolationOperation+"/after-node-deleted")
			out = append(out, modes.ChangeCrashPoints...)
		}
		out = append(out, steps.CrashPoint(IsolationOperation, s))
	}
	return append(out, IsolationOperation+"/after-release")
}()

// ErrModeChange is returned when the desired config names another
// isolation mode: that is an isolation change, not a repave.
var ErrModeChange = errors.New("the desired config changes the isolation mode")

// ErrTokenRejected: an isolation change found the bootstrap token
// refused by the API server before it touched the host. The new mode's
// kubelet joins by TLS bootstrap with that token: the change would end in
// a node that cannot register.
var ErrTokenRejected = errors.New("the API server does not accept the bootstrap token")

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

// Repave runs one repave on one host. The zero value of every field but
// Paths is the real host; tests replace them.
type Repave struct {
	Paths hostpaths.Paths
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
	// Systemd connects to the service manager; nil: the system bus.
	Systemd func(ctx context.Context) (units.Manager, error)
	// Fetch fetches the verified artifacts; nil: lib/artifacts.
	Fetch func(ctx context.Context, cfg *config.Config) ([]artifacts.Result, error)
	// Cluster returns the cluster client for cfg's Node, draining as o
	// says; nil: lib/kube's Drainer with the stored client certificate.
	Cluster func(cfg *config.Config, o Options) (Cluster, error)
	// Healthy waits for the new node; nil: bootstrap's ready wait.
	Healthy func(ctx context.Context, cfg *config.Config, slot string, m modes.Mode) error
	// Fence runs the allocation fence; nil: unbounded-fence.service.
	Fence func(ctx context.Context) error
	// Isolation runs the repave as an isolation change
	// (unbounded-isolation.service): the desired mode differs from the
	// running one, and the new node is built in the other slot in the
	// other mode (modes.Change). A desired config in the running mode is
	// nothing to do.
	Isolation bool
	// Method forces an isolation change's method (modes.MethodInPlace,
	// modes.MethodReprovision; the request's "method" parameter wins);
	// "": the table's (modes.ChangeMethod).
	Method string
	// GiveUpAfter is how long after the handoff began a reprovision
	// gives up; 0: reprovision.DefaultGiveUpAfter.
	GiveUpAfter time.Duration
	// Self is the executable a reprovision handoff copies; "": this
	// process's (os.Executable).
	Self string
	// ReviewToken asks the API server whether cfg's bootstrap token
	// authenticates (an isolation change asks before it touches the
	// host); nil: a TokenReview with the token itself.
	ReviewToken func(ctx context.Context, cfg *config.Config) error
	// Notify sends an sd_notify state; nil: sd_notify.
	Notify     func(state string)
	CrashPoint func(name string)
	Now        func() time.Time
	Log        *slog.Logger

	early *earlyFence
	// change is the isolation change this run carries out, once planned
	// or resumed (its outcome is recorded for the daemon).
	change *state.IsolationOutcome
}

// op is the lock's owner and the journal's name; unit the unit that
// runs it; concern its request file's name.
func (r *Repave) op() string {
	if r.Isolation {
		return IsolationOperation
	}
	return Operation
}

func (r *Repave) unit() string {
	if r.Isolation {
		return IsolationUnit
	}
	return Unit
}

func (r *Repave) concern() string {
	if r.Isolation {
		return IsolationConcern
	}
	return Concern
}

// fromMode is the mode of the running slot.
func (j *Journal) fromMode() string {
	if j.FromMode != "" {
		return j.FromMode
	}
	return j.Mode
}

func (r *Repave) log() *slog.Logger {
	if r.Log != nil {
		return r.Log
	}
	return slog.Default()
}

func (r *Repave) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

func (r *Repave) crash(name string) { crashpoint.Via(r.CrashPoint, name) }

func (r *Repave) status(format string, args ...any) {
	sdstatus.Show(r.log(), r.Notify, format, args...)
}

func (r *Repave) systemd(ctx context.Context) (units.Manager, error) {
	if r.Systemd != nil {
		return r.Systemd(ctx)
	}
	return units.Dial(ctx)
}

func (r *Repave) mode(name string) (modes.Mode, error) {
	if r.Mode != nil {
		return r.Mode(name)
	}
	return all.For(name, r.Paths, r.log())
}

// ErrNothingToDo is returned (and maps to exit 0) when the desired config
// is the applied one and the repave was not forced.
var ErrNothingToDo = errors.New("the desired config is the applied one: nothing to repave (--force repaves anyway)")

// Run repaves the host, or resumes an interrupted repave. Its error maps
// to the exit code with exitcode.For (ErrNothingToDo is a success: the
// caller says so and exits 0).
func (r *Repave) Run(ctx context.Context) error {
	err := r.run(ctx)
	if r.Isolation {
		r.recordOutcome(ctx, err)
	}
	return err
}

// recordOutcome leaves an isolation change's end on the host for the
// daemon (state.IsolationOutcome), which reports it on the Machine: a
// change carried out, or one that failed (rolled back, refused before it
// touched the host, or stopped with its journal left for the next run).
// Nothing to do, a handoff (the reprovision reports itself), another
// installation's lock and a stop by SIGTERM (the journal resumes) are no
// outcome.
func (r *Repave) recordOutcome(ctx context.Context, err error) {
	if r.change == nil || errors.Is(err, ErrNothingToDo) || errors.Is(err, ErrHandedOff) || errors.Is(err, state.ErrOwned) || ctx.Err() != nil {
		return
	}
	o := *r.change
	o.EndedAt = r.now().UTC()
	if err == nil {
		o.State = "Succeeded"
		o.Message = fmt.Sprintf("the node runs in mode %s (isolation changed %s from %s)", o.To, o.Method, o.From)
	} else {
		o.State = "Failed"
		o.Message = err.Error()
	}
	if werr := state.WriteIsolationOutcome(r.Paths, o); werr != nil {
		r.log().Error("the isolation change's outcome was not recorded for the daemon", "error", werr.Error())
	}
}

func (r *Repave) run(ctx context.Context) error {
	// A host the older agent installed is adopted first (lib/adopt): the
	// repave then replaces the adopted node as any other.
	ad := &adopt.Adopt{Paths: r.Paths, Systemd: r.Systemd, Notify: r.Notify, CrashPoint: r.CrashPoint, Log: r.log()}
	if err := ad.Run(ctx); err != nil {
		return err
	}
	if r.Isolation {
		// A handoff staged by an earlier run (cut before it started the
		// reprovision): the change is the handoff's now.
		if live, err := state.HandoffLive(r.Paths); err != nil || live {
			if err != nil {
				return fmt.Errorf("the reprovision handoff: %w", err)
			}
			r.status("a reprovision handoff is in progress (%s): starting %s", reprovision.Dir(r.Paths), unitnames.Reprovision)
			return r.startHandoff(ctx, "the target mode")
		}
	}
	r.status("taking the ownership lock")
	lock, err := state.AcquireOwnership(r.Paths, r.op(), r.unit())
	if err != nil {
		return err // 69: another installation owns the host
	}
	r.crash(r.op() + "/after-lock")
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
	if j.Method == modes.MethodReprovision {
		return r.handOff(ctx, lock, j, cfg)
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
	r.crash(r.op() + "/after-release")
	if err := r.handOver(ctx); err != nil {
		return err
	}
	// Carried out, before the journal goes: a crash in between resumes
	// the journal, never the request again.
	if err := request.MarkTaken(r.Paths, r.concern(), j.Request); err != nil {
		return err
	}
	if err := state.RemoveJournal(r.Paths, r.op()); err != nil {
		return err
	}
	if r.Isolation {
		r.status("isolation changed from %s to %s: slot %s runs the node in mode %s, slot %s (mode %s) retired", j.fromMode(), j.Mode, j.To, j.Mode, j.From, j.fromMode())
		return nil
	}
	r.status("repaved: slot %s runs the desired config (mode %s), slot %s retired", j.To, j.Mode, retired(j))
	return nil
}

func retired(j *Journal) string {
	if j.From == j.To {
		return "none"
	}
	return j.From
}

// plan returns the journal to run (resumed, or new), the desired config
// and the mode; a nil journal means nothing to do.
func (r *Repave) plan(ctx context.Context) (*Journal, *config.Config, modes.Mode, error) {
	var j Journal
	found, err := state.ReadJournal(r.Paths, r.op(), &j)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("%s journal: %w", r.op(), err)
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
		r.status("resuming the %s of slot %s (mode %s) into %s (mode %s) from step %q", r.op(), j.From, j.fromMode(), j.To, j.Mode, j.Step)
		if r.Isolation {
			r.change = &state.IsolationOutcome{From: j.fromMode(), To: j.Mode, Method: j.Method, StartedAt: j.StartedAt}
		}
		return &j, cfg, m, nil
	}
	active, err := state.ReadActive(r.Paths)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("applied state: %w", err)
	}
	if active == nil {
		return nil, nil, nil, fmt.Errorf("this host has no applied config: it was never bootstrapped, so there is no node to repave (unbounded-bootstrap.service builds the first one)")
	}
	r.status("step %s: reading the desired config", StepPlan)
	cfg, req, err := r.desired()
	if err != nil {
		return nil, nil, nil, err
	}
	opts, err := r.options(req)
	if err != nil {
		return nil, nil, nil, err
	}
	if cfg.Mode != active.Mode && !r.Isolation {
		return nil, nil, nil, fmt.Errorf("%w from %s to %s (%s): changing the isolation mode is an isolation change (unbounded-isolation.service), not a repave; the node was left as it is",
			ErrModeChange, active.Mode, cfg.Mode, strings.Join(cfg.Files, ", "))
	}
	if r.Isolation && cfg.Mode == active.Mode {
		r.status("the desired mode %s is the running one: no isolation change to make", cfg.Mode)
		if req != nil {
			if err := request.MarkTaken(r.Paths, r.concern(), req.UID); err != nil {
				return nil, nil, nil, err
			}
		}
		return nil, nil, nil, nil
	}
	if cfg.Machine != active.Machine && active.Machine != "" {
		return nil, nil, nil, fmt.Errorf("%w: the desired config names machine %q, the node runs as %q: a repave keeps the Node's name (reset and bootstrap the host to rename it)",
			exitcode.ErrConfigInvalid, cfg.Machine, active.Machine)
	}
	// node.ip must be an address of this host: said before the drain.
	if _, err := modes.NodeIPs(cfg); err != nil {
		return nil, nil, nil, err
	}
	// So must every device devices.allow names.
	if _, err := modes.Devices(cfg); err != nil {
		return nil, nil, nil, err
	}
	want, err := effective(cfg)
	if err != nil {
		return nil, nil, nil, err
	}
	if same, err := sameConfig(want, active.Config); err != nil {
		return nil, nil, nil, err
	} else if same && !opts.Force && !r.Isolation {
		r.status("the desired config is the one slot %s runs: nothing to do", active.Slot)
		if req != nil {
			if err := request.MarkTaken(r.Paths, r.concern(), req.UID); err != nil {
				return nil, nil, nil, err
			}
		}
		return nil, nil, nil, nil
	}
	m, err := r.mode(cfg.Mode)
	if err != nil {
		return nil, nil, nil, err
	}
	j = Journal{
		From: active.Slot, To: modes.TargetSlot(m, active.Slot), Mode: active.Mode,
		Config: want, Options: opts, StartedAt: r.now().UTC(),
	}
	if r.Isolation {
		if err := r.planChange(ctx, &j, active, cfg, req); err != nil {
			return nil, nil, nil, err
		}
	}
	if req != nil {
		j.Request = req.UID
	}
	r.log().Info("repave planned", "from", j.From, "to", j.To, "mode", j.Mode,
		"kubernetes_version", cfg.Cluster.KubernetesVersion, "force", opts.Force, "delete_unmanaged", opts.DeleteUnmanaged, "drain_timeout", opts.DrainTimeout.String())
	return &j, cfg, m, nil
}

// planChange plans an isolation change into j (journal, desired config
// and request decided): the method, the other slot, and the bootstrap
// token checked with the API server, all before anything on the host is
// touched.
func (r *Repave) planChange(ctx context.Context, j *Journal, active *state.AppliedConfig, cfg *config.Config, req *request.Request) error {
	r.change = &state.IsolationOutcome{From: active.Mode, To: cfg.Mode, StartedAt: j.StartedAt}
	// The method asked for: the request's (the Machine's
	// spec.isolation.method), else --method, else the table's.
	asked, by := r.Method, "--method"
	if req != nil && req.Parameters[ParamMethod] != "" {
		asked, by = req.Parameters[ParamMethod], "the daemon's request"
	}
	method, err := modes.ChangeMethodAsked(active.Mode, cfg.Mode, asked)
	if err != nil {
		if asked != "" {
			err = fmt.Errorf("%w (asked by %s)", err, by)
		}
		return fmt.Errorf("%w (%s); the node was left as it is", err, strings.Join(cfg.Files, ", "))
	}
	r.change.Method = method
	// Before anything is touched, and before a reprovision's handoff
	// too (handOff comes after the plan): the new mode's kubelet joins
	// with the token.
	r.status("step %s: asking the API server whether it accepts the bootstrap token (the new mode's kubelet joins with it)", StepPlan)
	if err := r.reviewToken(ctx, cfg); err != nil {
		return err
	}
	j.FromMode, j.Method = active.Mode, method
	j.To, j.RunningSlot = hostpaths.OtherSlot(active.Slot), active.Slot
	j.Mode = cfg.Mode
	r.log().Info("isolation change planned", "from_mode", active.Mode, "to_mode", cfg.Mode, "method", method, "from", j.From, "to", j.To)
	return nil
}

// ErrHandedOff: an isolation change staged a reprovision handoff and
// started unbounded-reprovision.service, which resets the host and
// bootstraps the target mode; the change is still in progress (exit 0).
var ErrHandedOff = errors.New("handed off to the reprovision")

// handOff stages the reprovision handoff of j (lib/reprovision), releases
// the lock and starts unbounded-reprovision.service. Nothing of the node
// was touched before: the reprovision's reset is its first change.
func (r *Repave) handOff(ctx context.Context, lock *state.Lock, j *Journal, cfg *config.Config) error {
	self := r.Self
	if self == "" {
		var err error
		if self, err = os.Executable(); err != nil {
			lock.Release()
			return err
		}
	}
	giveUp := r.GiveUpAfter
	if giveUp <= 0 {
		giveUp = reprovision.DefaultGiveUpAfter
	}
	now := r.now().UTC()
	h := reprovision.Journal{FromMode: j.FromMode, ToMode: j.Mode, Machine: cfg.Machine, Request: j.Request, StartedAt: now, Deadline: now.Add(giveUp)}
	// The lock goes first: the handoff's reset and bootstrap take it
	// themselves, and a handoff staged under a lock a crash left would
	// find the host owned. A crash before the staging leaves the host as
	// it was.
	if err := request.MarkTaken(r.Paths, r.concern(), j.Request); err != nil {
		lock.Release()
		return err
	}
	if err := lock.Release(); err != nil {
		return err
	}
	r.status("staging the reprovision handoff %s -> %s in %s (gives up at %s)", j.FromMode, j.Mode, reprovision.Dir(r.Paths), h.Deadline.Format(time.RFC3339))
	if err := reprovision.Stage(r.Paths, h, j.Config, self); err != nil {
		return err
	}
	r.crash(IsolationOperation + "/after-handoff-staged")
	return r.startHandoff(ctx, j.Mode)
}

// startHandoff starts unbounded-reprovision.service on the staged
// handoff (after a daemon-reload: the generator then names it too).
func (r *Repave) startHandoff(ctx context.Context, to string) error {
	sd, err := r.systemd(ctx)
	if err != nil {
		return err
	}
	defer sd.Close()
	if err := sd.Reload(ctx); err != nil {
		return err
	}
	if err := sd.EnqueueStart(ctx, unitnames.Reprovision); err != nil {
		return err
	}
	r.status("handed off: %s resets the host and bootstraps mode %s", unitnames.Reprovision, to)
	return ErrHandedOff
}

// reviewToken says whether the API server accepts cfg's bootstrap token:
// ErrTokenRejected when it does not (nothing on the host was touched), a
// temporary error when it cannot be asked.
func (r *Repave) reviewToken(ctx context.Context, cfg *config.Config) error {
	if r.ReviewToken != nil {
		return r.ReviewToken(ctx, cfg)
	}
	bc, err := kube.CredentialsFor(cfg, r.Paths.PKIDir()).BootstrapConfig()
	if err != nil {
		return fmt.Errorf("%w: %v", ErrTokenRejected, err)
	}
	st, err := kube.ReviewOwnToken(ctx, bc)
	switch {
	case err == nil && st.Authenticated:
		return nil
	case err == nil, apierrors.IsUnauthorized(err):
		return fmt.Errorf("%w (%s: revoked or expired); the node was left as it is in its mode: a node of the new mode could not join", ErrTokenRejected, cfg.Cluster.BootstrapTokenFile)
	case kube.NoAnswer(err):
		return fmt.Errorf("%w: the bootstrap token could not be checked: %w (the node was left as it is)", exitcode.ErrTemporary, err)
	}
	return fmt.Errorf("the bootstrap token could not be checked: %w (the node was left as it is)", err)
}

// desired is the config to apply: the config on disk, with the Machine's
// spec from the daemon's request laid over it when there is a request.
func (r *Repave) desired() (*config.Config, *request.Request, error) {
	cfg, err := config.Load(r.Paths)
	if err != nil {
		return nil, nil, err
	}
	req, err := request.Read(r.Paths, r.concern())
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
	if request.Taken(r.Paths, r.concern(), req.UID) {
		r.log().Info("the daemon's request was carried out by an earlier run; the desired config is the config on disk",
			"request", r.Paths.Request(r.concern()), "uid", req.UID)
		return cfg, nil, nil
	}
	if len(req.Desired) > 0 {
		var spec v1alpha3.MachineSpec
		if err := json.Unmarshal(req.Desired, &spec); err != nil {
			return nil, nil, fmt.Errorf("the daemon's request %s: desired: %w", r.Paths.Request(r.concern()), err)
		}
		overlay(cfg, &spec)
	}
	r.log().Info("desired config: the config on disk with the Machine's spec from the daemon's request",
		"request", r.Paths.Request(r.concern()), "operation", req.Operation, "uid", req.UID)
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
		r.log().Warn("this repave is for the vanished Node: the daemon found the Machine's Node gone; repaving although the config is unchanged",
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
		return nil, fmt.Errorf("%w: %s journal: config: %v", state.ErrCorrupt, r.op(), err)
	}
	if err != nil {
		return nil, fmt.Errorf("resuming the %s: %w", r.op(), err)
	}
	return cfg, nil
}

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
	run := &steps.Runner{
		Paths: r.Paths, Operation: r.op(), Journal: j,
		Notify: r.Notify, CrashPoint: r.CrashPoint, Log: r.log(),
	}
	return run.Run(ctx, []steps.Step{
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
			r.status("step %s: building slot %s while slot %s serves", StepBuild, j.To, j.From)
			start := time.Now()
			if err := m.Prepare(ctx, slot); err != nil {
				return err
			}
			r.log().Info("new slot built while the old node serves", "slot", j.To, "took", time.Since(start).Round(time.Millisecond).String())
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
			if j.fromMode() != j.Mode {
				var err error
				if old, err = r.mode(j.fromMode()); err != nil {
					return err
				}
			}
			return r.retire(ctx, j, old)
		}},
	})
}

func (r *Repave) fetch(ctx context.Context, cfg *config.Config) ([]artifacts.Result, error) {
	r.status("step %s: kubelet %s, containerd, runc, CNI plugins", StepArtifacts, cfg.Cluster.KubernetesVersion)
	if r.Fetch != nil {
		return r.Fetch(ctx, cfg)
	}
	f := artifacts.New(cfg, r.Paths)
	f.Log = r.log()
	return f.FetchAll(ctx, artifacts.FromConfig(cfg, runtime.GOARCH))
}

func (r *Repave) cluster(cfg *config.Config, o Options) (Cluster, error) {
	if r.Cluster != nil {
		return r.Cluster(cfg, o)
	}
	creds := kube.CredentialsFor(cfg, r.Paths.PKIDir())
	// Only the daemon's certificate may cordon and delete the Node (the
	// admission policy of lib/api/manifests refuses a bootstrap token).
	rc, _, err := creds.CertConfig(r.now())
	if err != nil {
		return nil, fmt.Errorf("the daemon's client certificate (%s), which cordons, drains and deletes the Node: %w", creds.Certs.Path(), err)
	}
	d, err := kube.NewDrainer(rc, cfg.Machine)
	if err != nil {
		return nil, err
	}
	d.Timeout, d.DeleteUnmanaged, d.Log = o.DrainTimeout, o.DeleteUnmanaged, r.log()
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
			r.log().Info("the Node does not exist: nothing to cordon or drain", "node", cfg.Machine)
			return nil
		}
		if err == nil {
			// Journaled before the patch: a crash after it still
			// uncordons on failure.
			j.Cordoned = true
			if err = state.WriteJournal(r.Paths, r.op(), j); err == nil {
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
		r.log().Warn("the cluster cannot be asked; forced: repaving without cordon and drain", "error", err.Error())
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
		r.log().Warn("the old node is not running (a repave resumed after a reboot): nothing to drain gracefully", "slot", j.From)
		return nil
	}
	r.status("step %s: evicting the pods of Node %s (at most %s)", StepDrain, cfg.Machine, j.DrainTimeout)
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
		r.log().Warn("drain did not finish; forced: repaving anyway", "error", err.Error())
		return nil
	case errors.Is(err, kube.ErrDrainTimeout):
		return fmt.Errorf("%w; the Node is uncordoned and the node left as it was (force repaves anyway)", err)
	}
	return err
}

// oldRuns says whether every supervising unit of the old stack runs.
func (r *Repave) oldRuns(ctx context.Context, j *Journal) (bool, error) {
	sd, err := r.systemd(ctx)
	if err != nil {
		return false, err
	}
	defer sd.Close()
	for _, u := range facts.Supervising(j.fromMode(), j.From) {
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
	r.status("step %s: replacing the node stack of slot %s (mode %s) by slot %s (mode %s)", StepSwitch, j.From, j.fromMode(), j.To, j.Mode)
	h := modes.RepaveHooks{
		Fence: func(ctx context.Context) error {
			// The old kubelet is stopped now: a Node deleted before
			// would have been registered again by it.
			if c, err := cluster(); err == nil {
				if err := c.DeleteNode(ctx); err != nil && !(j.Force && unreachable(err)) {
					return err
				}
				r.log().Info("Node deleted: the new kubelet registers it afresh under the same name", "node", cfg.Machine)
			} else if !(j.Force && unreachable(err)) {
				return err
			}
			r.crash(r.op() + "/after-node-deleted")
			if ok, err := r.earlyVerdict(ctx); ok {
				r.log().Info("allocation fence: using the check made during the drain", "allowed", err == nil)
				return err
			}
			r.status("step %s: running the allocation fence for slot %s", StepSwitch, j.To)
			return r.fence(ctx)
		},
		Healthy: func(ctx context.Context, slot string) error {
			r.status("step %s: waiting for slot %s to be healthy", StepSwitch, slot)
			if slot == j.From && j.fromMode() != j.Mode {
				// A rollback of an isolation change: the old node
				// runs in the old mode.
				old, err := r.mode(j.fromMode())
				if err != nil {
					return err
				}
				oc := *cfg
				oc.Mode = j.fromMode()
				return r.healthy(ctx, &oc, slot, old)
			}
			return r.healthy(ctx, cfg, slot, m)
		},
		Crash: r.crash,
	}
	start := time.Now()
	if j.fromMode() != j.Mode {
		old, err := r.mode(j.fromMode())
		if err != nil {
			return err
		}
		sd, err := r.systemd(ctx)
		if err != nil {
			return err
		}
		defer sd.Close()
		if err := modes.Change(ctx, sd, old, j.From, m, s, h); err != nil {
			return err
		}
		r.log().Info("node stack switched across modes", "from", j.From, "from_mode", j.fromMode(), "to", j.To, "mode", j.Mode, "took", time.Since(start).Round(time.Millisecond).String())
		return nil
	}
	if err := m.Repave(ctx, j.From, s, h); err != nil {
		return err
	}
	r.log().Info("node stack switched", "from", j.From, "to", j.To, "took", time.Since(start).Round(time.Millisecond).String())
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
	sd, err := r.systemd(ctx)
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
	sd, err := r.systemd(ctx)
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
	r.status("step %s: waiting (at most %s) for the node units, kubelet healthz and Node %s Ready", StepSwitch, timeout, cfg.Machine)
	err = kube.NotUpExit(chk.Wait(ctx, readiness.Wait{Timeout: timeout, Poll: ReadyPoll, Log: r.log(),
		Status: func(line string) { sdstatus.Notify(r.Notify, fmt.Sprintf("STATUS=step %s: %s", StepSwitch, line)) },
		CSINode: &readiness.CSINode{AfterStart: CSINodeEarlyTriesOver,
			Restart: func(ctx context.Context) error { return m.Restart(ctx, slot) }},
	}))
	if err == nil {
		r.log().Info("node up", "node", cfg.Machine, "slot", slot)
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
		AppliedAt:         r.now().UTC(),
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
			r.status("step %s: removing what the old node stack ran", StepRetire)
			if err := sr.RemoveSuperseded(ctx); err != nil {
				// The next repave (or the mode's lifecycle hooks)
				// removes it; the new node runs and is recorded.
				r.log().Warn("superseded files not removed yet", "error", err.Error())
			}
		}
		return nil
	}
	r.status("step %s: removing slot %s (its record, then its files)", StepRetire, j.From)
	if err := state.RemoveApplied(r.Paths, j.From); err != nil {
		return err
	}
	return m.Destroy(ctx, j.From)
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
					r.log().Error("new slot not removed after the failed repave", "slot", j.To, "error", derr.Error())
				}
			}
		}
		if terr := request.MarkTaken(r.Paths, r.concern(), j.Request); terr != nil {
			r.log().Error("the daemon's request not marked carried out", "error", terr.Error())
		}
		if rerr := state.RemoveJournal(r.Paths, r.op()); rerr != nil {
			r.log().Error(r.op()+" journal not removed", "error", rerr.Error())
		}
	} else {
		// The journal's step says which step failed and why (lib/steps).
		if werr := state.WriteJournal(r.Paths, r.op(), j); werr != nil {
			r.log().Error(r.op()+" journal not written", "error", werr.Error())
		}
	}
	r.status("%s failed in step %s: %v", r.op(), step, err)
	if rerr := lock.Release(); rerr != nil {
		r.log().Error("ownership lock not released", "error", rerr.Error())
	}
	if asBefore {
		// The old node runs again (or never stopped): hand it back to
		// systemd as it was (the generator wires it again).
		if herr := r.handOver(cctx); herr != nil {
			r.log().Error("node not handed back to systemd", "error", herr.Error())
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
	w := owed.Write{Kind: owed.Uncordon, Node: cfg.Machine, By: r.op(), Since: r.now().UTC(),
		Why: "the " + r.op() + " failed with the node as it was (" + why + ")"}
	if err := owed.Owe(r.Paths, w); err != nil {
		r.log().Error("the owed uncordon was not recorded", "error", err.Error())
	}
	c, err := r.cluster(cfg, j.Options)
	if err == nil {
		err = c.SetUnschedulable(ctx, false)
	}
	if err != nil {
		r.log().Error("Node not uncordoned after the failed repave; the daemon uncordons it once the API server answers (unbounded status lists it)",
			"node", cfg.Machine, "error", err.Error())
		return
	}
	r.log().Info("Node uncordoned: the repave failed and the node is as it was", "node", cfg.Machine)
	if err := owed.Settle(r.Paths, owed.Uncordon); err != nil {
		r.log().Error("the owed uncordon was made but its record stays", "error", err.Error())
	}
}

// handOver reloads (the generator wires the node target to the active
// slot now that the host is no longer owned) and starts the node target
// and the daemon.
func (r *Repave) handOver(ctx context.Context) error {
	sd, err := r.systemd(ctx)
	if err != nil {
		return err
	}
	defer sd.Close()
	// The daemon's start queued, not waited for: a daemon that runs (the
	// one that started this repave, waiting for it) is left alone; one
	// that exited 69 while the host was owned starts again.
	return steps.HandOver(ctx, sd, steps.WaitNode, nil)
}
