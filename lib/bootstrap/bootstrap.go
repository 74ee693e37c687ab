// Package bootstrap is the first boot of a host (unbounded-bootstrap.service,
// ARCHITECTURE section 6): from /etc/unbounded/agent.toml to a Ready Node,
// its applied config recorded, the node target and the daemon started.
//
// Phases, in order, run by lib/steps: each one is shown as STATUS= in
// `systemctl status`, journaled in /var/lib/unbounded/journal/
// bootstrap.json once done (atomic, with a SHA-256 sidecar), and followed
// by a crash point "bootstrap/after-<phase>" (lib/crashpoint):
//
//	config     load and validate the config (exit 78 on an error; the host
//	           is not touched), report Running on the Machine (creating
//	           it when absent: bootstrap is the only place that registers
//	           a Machine, lib/report)
//	hostprep   kernel modules, sysctls, swap off (lib/hostprep; recorded
//	           so that reset undoes exactly that)
//	artifacts  kubelet, containerd, runc, CNI plugins, verified
//	           (lib/artifacts; 75 for what a retry can fix, else 1)
//	slot       the mode builds slot kube1 (lib/modes: Prepare)
//	fence      unbounded-fence.service started and waited for: the
//	           generator writes no fence drop-in while an installation
//	           owns the host, so bootstrap runs the check itself (77 when
//	           refused: no node runs)
//	start      the mode starts the slot's supervising unit(s)
//	ready      bounded wait for the supervising unit(s) active, kubelet's
//	           healthz, and the Node registered and Ready; the timeout
//	           error says what was still missing
//	record     the slot's applied config, only now that the node is
//	           healthy; Succeeded (with the Bootstrapped condition) on the
//	           Machine
//
// Then the ownership lock, held since the start, is released and the
// node is handed over to systemd: daemon-reload (the generator now sees
// the applied config and wires the node target, the mode target and the
// fence drop-in), unbounded-node.target started WITHOUT waiting (it is
// ordered After= this unit, so its job runs when bootstrap exits), and
// unbounded-daemon.service started last (it exits 69 while the host is
// owned, hence after the release).
//
// Every phase is idempotent and the journal records the config it was
// done for: a rerun after a crash, a reboot or an exit 75 skips what is
// done for the same config and redoes the rest. A host found already
// bootstrapped (an applied config exists: a separate /var the generator
// saw unmounted, or a crash between the record and the hand-over) is
// handed over again, never bootstrapped twice.
//
// A final failure reports Failed with a reason on the Machine, stops a
// node it started (no node runs without a record), releases the lock and
// exits 1 (77, 78); the journal stays, so the next start resumes. A
// temporary failure (75) makes the unit retry; each retry waits longer
// (Backoff) before it works again.
package bootstrap

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"unbounded-cloud.io/agent/lib/adopt"
	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/artifacts"
	"unbounded-cloud.io/agent/lib/backoff"
	"unbounded-cloud.io/agent/lib/config"
	"unbounded-cloud.io/agent/lib/exitcode"
	"unbounded-cloud.io/agent/lib/fence"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/hostprep"
	"unbounded-cloud.io/agent/lib/kube"
	"unbounded-cloud.io/agent/lib/lifecycle"
	"unbounded-cloud.io/agent/lib/modes"
	"unbounded-cloud.io/agent/lib/modes/all"
	"unbounded-cloud.io/agent/lib/modes/facts"
	"unbounded-cloud.io/agent/lib/outcome"
	"unbounded-cloud.io/agent/lib/readiness"
	"unbounded-cloud.io/agent/lib/report"
	"unbounded-cloud.io/agent/lib/state"
	"unbounded-cloud.io/agent/lib/steps"
	"unbounded-cloud.io/agent/lib/unitnames"
	"unbounded-cloud.io/agent/lib/version"
)

// Operation is the owner name of the ownership lock and the journal's name.
const Operation = "bootstrap"

// Unit is the unit that runs bootstrap; the ownership record names it, so
// that the generator resumes it after a reboot mid-bootstrap.
const Unit = unitnames.Bootstrap

// FirstSlot is the slot a first boot prepares.
const FirstSlot = "kube1"

// Phases, in order.
const (
	PhaseConfig    = "config"
	PhaseHostPrep  = "hostprep"
	PhaseArtifacts = "artifacts"
	PhaseSlot      = "slot"
	PhaseFence     = "fence"
	PhaseStart     = "start"
	PhaseReady     = "ready"
	PhaseRecord    = "record"
)

// PhaseDocs are the phases in the order they run, each with what it
// does: the one list of them (--help shows them).
var PhaseDocs = []steps.Doc{
	{Name: PhaseConfig, Does: "the configuration read and checked against this host (node.ip, devices)"},
	{Name: PhaseHostPrep, Does: "kernel modules, sysctls and swap as a node needs them, each change recorded for reset"},
	{Name: PhaseArtifacts, Does: "kubelet, containerd, runc and CNI plugins fetched and verified"},
	{Name: PhaseSlot, Does: "the node built in slot " + FirstSlot + " (the node image's tree, the container's bundle, or mode none's version)"},
	{Name: PhaseFence, Does: "the allocation fence asked whether this host may run a node"},
	{Name: PhaseStart, Does: "the node's supervising units started"},
	{Name: PhaseReady, Does: "the node units, the kubelet's healthz and the Node Ready, bounded"},
	{Name: PhaseRecord, Does: "the slot's applied config recorded, Succeeded reported"},
}

// Phases lists the phases in the order they run.
var Phases = steps.Names(PhaseDocs)

// CrashPoints are bootstrap's own named crash points, in the order a run
// reaches them ("bootstrap/after-<phase>" for each phase, then the hand
// over); lib/hostprep's ("hostprep/...") are reached inside the hostprep
// phase.
var CrashPoints = func() []string {
	var out []string
	out = append(out, "bootstrap/after-lock")
	for _, p := range Phases {
		out = append(out, steps.CrashPoint(Operation, p))
	}
	return append(out, "bootstrap/after-release", "bootstrap/after-reload")
}()

// CrashAfterApplied is the crash point between the record and its
// Succeeded report, inside the record phase: not in CrashPoints, whose
// chain resumes each point in turn (a recorded host is handed over, and
// never reaches the points after it).
const CrashAfterApplied = "bootstrap/after-applied"

// DefaultReadyTimeout bounds the wait for a Ready Node.
const DefaultReadyTimeout = readiness.DefaultNewNodeTimeout

// DefaultBackoff is the delay before the second try after an exit 75; it
// doubles with each further temporary failure, up to MaxBackoff. The unit
// adds its own RestartSec= to it.
const (
	DefaultBackoff = 10 * time.Second
	MaxBackoff     = 5 * time.Minute
)

// Journal is what bootstrap keeps between runs.
type Journal struct {
	// Input is the SHA-256 of everything the phases are built from (the
	// effective config, the CA and the bootstrap token): a phase done for
	// another input is done again.
	Input string `json:"input"`
	Mode  string `json:"mode"`
	Slot  string `json:"slot"`
	// The phases done, and where the last run got to (the last phase
	// done, or the phase that failed and why), for the next run and for
	// `unbounded status`.
	steps.Record
	// TempFailures counts the runs in a row that ended with exit 75, and
	// LastTempFailure says when the last one did: the next run waits
	// Backoff before it retries.
	TempFailures    int       `json:"temp-failures,omitempty"`
	LastTempFailure time.Time `json:"last-temp-failure,omitzero"`
	LastError       string    `json:"last-error,omitempty"`
}

// Reporter is the bootstrap status on the Machine (lib/report's Reporter).
type Reporter interface {
	Running(ctx context.Context) error
	Succeeded(ctx context.Context) error
	Failed(ctx context.Context, reason, message string) error
}

// Probe looks at the started node. Each field's zero value is the real
// host.
type Probe struct {
	// Healthz answers nil when kubelet's healthz says ok; nil is
	// readiness.Healthz.
	Healthz func(ctx context.Context) error
	// Node reads the Node as the API server has it; nil reads it with the
	// kubelet's own client certificate (see NodeReader).
	Node readiness.NodeSource
	// DNSReady answers nil when the node-local DNS cache serves; nil is
	// readiness.LocalDNSReady. Asked only of a node that runs it.
	DNSReady func(ctx context.Context) error
}

// Bootstrap runs the first boot on one host. The zero value of every field
// but Paths is the real host; tests replace them.
type Bootstrap struct {
	// Host is the host's seams (paths, service manager, notify, crash
	// point, clock, logger); its zero value but Paths is the real host.
	steps.Host
	// Config is the config to bootstrap; nil: the config on disk
	// (config.Load). A reprovision bootstraps its handoff's target
	// config, whose mode the config on disk may not name.
	Config func() (*config.Config, error)
	// Mode returns the isolation mode named by the config; nil: the real
	// nspawn or none mode.
	Mode func(name string) (modes.Mode, error)
	// HostPrep prepares the host; nil: lib/hostprep on the real host.
	HostPrep func(ctx context.Context) error
	// Fetch fetches the verified artifacts; nil: lib/artifacts with the
	// config's [artifacts].
	Fetch func(ctx context.Context, cfg *config.Config) ([]artifacts.Result, error)
	// Reporter reports on the Machine; nil: lib/report with the config's
	// credentials.
	Reporter func(cfg *config.Config) Reporter
	// Probe looks at the started node.
	Probe func(cfg *config.Config, mode, slot string) Probe
	// ReadyTimeout bounds the ready phase; 0 is DefaultReadyTimeout.
	ReadyTimeout time.Duration
	// PollInterval is the ready phase's poll period; 0 is 2 s.
	PollInterval time.Duration
	// CSINodeGrace is how long a registered Node may stay NotReady
	// because the kubelet's CSINode is not initialized before the node
	// stack is restarted once (readiness.CSINode); 0 is its default.
	CSINodeGrace time.Duration
	// CSINodeAfterStart, when set, is how long after the ready wait began
	// the kubelet's early CSINode tries are over for a caller that started
	// the kubelet right before the wait (a repave): a registered Node that
	// still waits for its CSINode by then is restarted at once, without
	// CSINodeGrace (see ready).
	CSINodeAfterStart time.Duration
	// Backoff is the first retry delay after an exit 75; 0 is
	// DefaultBackoff, negative is none.
	Backoff time.Duration
}

func (b *Bootstrap) mode(name string) (modes.Mode, error) {
	if b.Mode != nil {
		return b.Mode(name)
	}
	return all.For(name, b.Paths, b.Logger())
}

// Run bootstraps the host, or hands over a host that is bootstrapped
// already. Its error maps to the exit code with exitcode.For.
func (b *Bootstrap) Run(ctx context.Context) error {
	// A host the older agent installed is adopted first (lib/adopt): its
	// node is then this agent's, handed over below as a bootstrapped
	// host's is, and never bootstrapped over.
	if err := b.adopt(ctx); err != nil {
		return err
	}
	b.Status("taking the ownership lock")
	lock, err := state.AcquireOwnership(b.Paths, Operation, Unit)
	if err != nil {
		// Another installation (reset, repave, reprovision) owns the
		// host: deferred (69). Its unit goes on with it.
		if errors.Is(err, state.ErrOwned) {
			b.resumeOwner(ctx)
		}
		return err
	}
	b.Crash("bootstrap/after-lock")

	// The first writer after a boot that cut an earlier run between the
	// staging of its record and the renames: the record goes under its
	// own name before anything reads it.
	if err := state.FinishApplied(b.Paths); err != nil {
		lock.Release()
		return err
	}
	active, err := state.ReadActive(b.Paths)
	if err != nil {
		lock.Release()
		return fmt.Errorf("applied state: %w", err)
	}
	if active != nil {
		b.Logger().Info("host already bootstrapped; handing the node over to systemd instead of bootstrapping again",
			"slot", active.Slot, "mode", active.Mode)
		if err := state.RemoveJournal(b.Paths, Operation); err != nil {
			lock.Release()
			return err
		}
		return b.handOver(ctx, lock)
	}

	cfg, j, rep, err := b.load(ctx)
	if err != nil {
		// Nothing on the host was changed for this run: the journal of
		// an earlier run stays as it was.
		lock.Release()
		return err
	}
	if err := b.phases(ctx, cfg, j, rep); err != nil {
		return b.fail(ctx, cfg, j, rep, lock, err)
	}
	if err := lock.Release(); err != nil {
		return fmt.Errorf("release the ownership lock: %w", err)
	}
	b.Crash("bootstrap/after-release")
	return b.start(ctx)
}

// adopt adopts a host the older agent installed (lib/adopt), or returns
// nil at once on any other. Another installation owning the host is
// deferred to, as for bootstrap's own lock.
func (b *Bootstrap) adopt(ctx context.Context) error {
	err := (&adopt.Adopt{Host: b.Host}).Run(ctx)
	if errors.Is(err, state.ErrOwned) {
		b.resumeOwner(ctx)
	}
	return err
}

// resumeOwner queues the unit of the installation that owns the host
// (lib/lifecycle's Resume) unless it runs. This bootstrap was pulled in by
// a generator that ran before a separate /var was mounted and took the
// host for a fresh one; the owner's unit (a repave cut by a power loss)
// would otherwise wait for something to start it. A record of bootstrap
// itself (another bootstrap runs) or one that cannot be read is left
// alone. Best effort: the exit is 69 whatever happens here.
func (b *Bootstrap) resumeOwner(ctx context.Context) {
	own, err := state.ReadOwnership(b.Paths)
	if own == nil || err != nil || own.Owner == Operation {
		return
	}
	sd, err := b.Manager(ctx)
	if err != nil {
		b.Logger().Warn("cannot resume the installation that owns the host", "owner", own.Owner, "unit", own.Unit, "error", err.Error())
		return
	}
	defer sd.Close()
	why := fmt.Sprintf("the installation %q owns the host (bootstrap defers to it)", own.Owner)
	if err := lifecycle.Resume(ctx, sd, b.Logger(), own.Unit, why); err != nil {
		b.Logger().Warn("cannot resume the installation that owns the host", "owner", own.Owner, "unit", own.Unit, "error", err.Error())
	}
}

// load is the config phase: the config, the journal of an earlier run, and
// the Running report.
func (b *Bootstrap) load(ctx context.Context) (*config.Config, *Journal, Reporter, error) {
	b.Status("phase %s: loading %s", PhaseConfig, b.Paths.ConfigFile())
	load := b.Config
	if load == nil {
		load = func() (*config.Config, error) { return config.Load(b.Paths) }
	}
	cfg, err := load()
	if err != nil {
		return nil, nil, nil, err
	}
	// lib/config accepts an empty image (it is only needed by this mode);
	// say so now, before the host is changed, not after host preparation
	// and downloads when the slot is built.
	if facts.FromNodeImage(cfg.Mode) && cfg.Nspawn.Image == "" {
		return nil, nil, nil, fmt.Errorf("%w: %s: [nspawn] image is not set; mode %s builds the node from that image",
			exitcode.ErrConfigInvalid, strings.Join(cfg.Files, ", "), cfg.Mode)
	}
	// node.ip and devices.allow against this host: said now, not once the host is prepared and the slot is built.
	if err := modes.CheckHost(cfg); err != nil {
		return nil, nil, nil, err
	}
	input, err := inputSum(cfg)
	if err != nil {
		return nil, nil, nil, err
	}
	var j Journal
	found, err := state.ReadJournal(b.Paths, Operation, &j)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("bootstrap journal: %w", err)
	}
	switch {
	case !found:
		j = Journal{Input: input, Mode: cfg.Mode, Slot: FirstSlot}
	case j.Input != input || j.Mode != cfg.Mode:
		// The config (or CA, or token) changed since the interrupted
		// run: everything built from it is built again. The slot of the
		// old input is rebuilt by the slot phase (destroyed first when
		// it runs); the host preparation does not depend on the input.
		b.Logger().Info("the configuration changed since the interrupted bootstrap; its phases run again")
		if j.Mode != "" && j.Mode != cfg.Mode {
			if err := b.destroyStale(ctx, j.Mode, j.Slot); err != nil {
				return nil, nil, nil, err
			}
		}
		j = Journal{Input: input, Mode: cfg.Mode, Slot: FirstSlot, TempFailures: j.TempFailures, LastTempFailure: j.LastTempFailure}
	}
	rep := b.reporter(cfg)
	if err := b.wait(ctx, &j); err != nil {
		return nil, nil, nil, err
	}
	// Only a rejected bootstrap token stops here (lib/report): the host
	// has no business preparing a node for a cluster that refuses it.
	if err := rep.Running(ctx); err != nil {
		return nil, nil, nil, err
	}
	return cfg, &j, rep, nil
}

// destroyStale removes the slot an interrupted run built in another mode.
func (b *Bootstrap) destroyStale(ctx context.Context, mode, slot string) error {
	m, err := b.mode(mode)
	if err != nil {
		return nil // a mode this build does not know built nothing
	}
	b.Status("removing slot %s of mode %s left by an interrupted bootstrap", slot, mode)
	return m.Destroy(ctx, slot)
}

// wait is the growing delay before a run that follows exit 75.
func (b *Bootstrap) wait(ctx context.Context, j *Journal) error {
	if j.TempFailures == 0 || b.Backoff < 0 {
		return nil
	}
	d := Backoff(b.Backoff, j.TempFailures) - b.Time().Sub(j.LastTempFailure)
	if d <= 0 {
		return nil
	}
	b.Status("retry %d after a temporary failure (%s): waiting %s", j.TempFailures, j.LastError, d.Round(time.Second))
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%w: stopped while waiting to retry: %w", exitcode.ErrTemporary, ctx.Err())
	}
}

// Backoff is the delay before retry n (n >= 1) with first delay base (0:
// DefaultBackoff): base, 2*base, 4*base, ... up to MaxBackoff.
func Backoff(base time.Duration, n int) time.Duration {
	if base == 0 {
		base = DefaultBackoff
	}
	return backoff.Doubling(base, MaxBackoff, n)
}

func (b *Bootstrap) reporter(cfg *config.Config) Reporter {
	if b.Reporter != nil {
		return b.Reporter(cfg)
	}
	return &report.Reporter{
		Machine:     cfg.Machine,
		Mode:        v1alpha3.IsolationMode(cfg.Mode),
		Credentials: credentials(cfg, b.Paths),
		Log:         b.Logger(),
	}
}

func credentials(cfg *config.Config, p hostpaths.Paths) kube.Credentials {
	return kube.CredentialsFor(cfg, p.PKIDir())
}

// inputSum is the SHA-256 over what the phases build from. The token's
// bytes go into the sum, never into the journal.
func inputSum(cfg *config.Config) (string, error) {
	h := sha256.New()
	data, err := json.Marshal(cfg)
	if err != nil {
		return "", err
	}
	h.Write(data)
	for _, f := range []string{cfg.Cluster.CAFile, cfg.Cluster.BootstrapTokenFile} {
		data, err := os.ReadFile(cfg.Resolve(f))
		if err != nil {
			return "", err
		}
		sum := sha256.Sum256(data)
		h.Write(sum[:])
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// phases runs every phase not done yet for this input (lib/steps).
func (b *Bootstrap) phases(ctx context.Context, cfg *config.Config, j *Journal, rep Reporter) error {
	var m modes.Mode
	var results []artifacts.Result
	run := &steps.Runner{
		Paths: b.Paths, Operation: Operation, Journal: j, Label: "phase",
		// A phase done after temporary failures ends the backoff; the
		// config phase, which every run does, does not.
		OnDone: func(phase string) {
			if phase != PhaseConfig {
				j.TempFailures, j.LastTempFailure, j.LastError = 0, time.Time{}, ""
			}
		},
		Notify: b.Notify, CrashPoint: b.CrashPoint, Log: b.Logger(),
	}
	// Skipped when journaled done for this input: the host preparation
	// and the slot. The others run again in every run: the config (load
	// did it; the mode is needed), the artifacts (their results are
	// needed, and the verified cache makes it cheap), and the fence, the
	// start and the wait, which are only valid for the run they belong
	// to (a rerun checks the fence again before it starts the node, and
	// waits for the node it started; starting a running unit is a
	// no-op).
	return run.Run(ctx, []steps.Step{
		// The config phase changes nothing on the host; its journal
		// entry is written with the next phase's.
		{Name: PhaseConfig, Always: true, Unjournaled: true, Run: func(context.Context) (err error) {
			m, err = b.mode(cfg.Mode)
			return err
		}},
		{Name: PhaseHostPrep, Status: "kernel modules, sysctls, swap off", Run: b.hostPrep},
		{Name: PhaseArtifacts, Always: true, Status: fmt.Sprintf("kubelet %s, containerd, runc, CNI plugins", cfg.Cluster.KubernetesVersion),
			Run: func(ctx context.Context) (err error) { results, err = b.fetch(ctx, cfg); return err }},
		{Name: PhaseSlot, Status: fmt.Sprintf("preparing slot %s (mode %s)", j.Slot, cfg.Mode),
			Run: func(ctx context.Context) error { return b.prepareSlot(ctx, cfg, m, j.Slot, results) }},
		{Name: PhaseFence, Always: true, Run: b.fence},
		{Name: PhaseStart, Always: true, Status: "starting " + strings.Join(facts.Supervising(cfg.Mode, j.Slot), ", "),
			Run: func(ctx context.Context) error { return m.Start(ctx, j.Slot) }},
		{Name: PhaseReady, Always: true, Run: func(ctx context.Context) error { return b.ready(ctx, cfg, j.Slot, m) }},
		// Done: the applied config is the record from here on.
		{Name: PhaseRecord, Always: true, Final: true, Status: "recording the applied config of slot " + j.Slot,
			Run: func(ctx context.Context) error { return b.record(ctx, cfg, j.Slot, rep) }},
	})
}

func (b *Bootstrap) hostPrep(ctx context.Context) error {
	if b.HostPrep != nil {
		return b.HostPrep(ctx)
	}
	// lib/hostprep logs each change as it makes it.
	h := &hostprep.Host{Paths: b.Paths, CrashPoint: b.Crash, Log: b.Logger()}
	_, err := h.Prepare(ctx, hostprep.DefaultPlan())
	return err
}

func (b *Bootstrap) fetch(ctx context.Context, cfg *config.Config) ([]artifacts.Result, error) {
	if b.Fetch != nil {
		return b.Fetch(ctx, cfg)
	}
	return artifacts.FetchConfig(ctx, cfg, b.Paths, b.Logger())
}

func (b *Bootstrap) prepareSlot(ctx context.Context, cfg *config.Config, m modes.Mode, slot string, results []artifacts.Result) error {
	files := map[string]string{}
	for _, r := range results {
		files[r.Name] = r.File
	}
	a, err := modes.ArtifactsByName(files)
	if err != nil {
		return err
	}
	s, err := modes.SlotFromConfig(cfg, slot, a)
	if err != nil {
		return err
	}
	err = m.Prepare(ctx, s)
	if errors.Is(err, modes.ErrSlotActive) {
		// A node of an interrupted run (another config, or a journal
		// that did not get written) runs in the slot. No applied config
		// exists, so it is no node of the cluster's yet: rebuild it.
		b.Status("phase %s: slot %s runs a node of an interrupted bootstrap; removing it first", PhaseSlot, slot)
		if err := m.Destroy(ctx, slot); err != nil {
			return err
		}
		err = m.Prepare(ctx, s)
	}
	return err
}

// fence runs the allocation fence for the node about to start. The
// generator wires the fence in front of the node unit only on a host with
// an applied config and no installation owning it; during bootstrap
// neither holds, so bootstrap starts the fence itself and waits for its
// verdict.
func (b *Bootstrap) fence(ctx context.Context) error {
	b.Status("phase %s: asking the cluster whether this host may start its node", PhaseFence)
	sd, err := b.Manager(ctx)
	if err != nil {
		return err
	}
	defer sd.Close()
	return fence.RunUnit(ctx, sd)
}

// record writes the applied config of the healthy node and reports
// Succeeded.
func (b *Bootstrap) record(ctx context.Context, cfg *config.Config, slot string, rep Reporter) error {
	data, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	a := &state.AppliedConfig{
		Slot:              slot,
		Mode:              cfg.Mode,
		Machine:           cfg.Machine,
		KubernetesVersion: cfg.Cluster.KubernetesVersion,
		AgentVersion:      version.Version,
		AppliedAt:         b.Time().UTC(),
		Config:            data,
	}
	if err := state.WriteApplied(b.Paths, a); err != nil {
		return err
	}
	b.Crash(CrashAfterApplied)
	// Best effort (lib/report): the node is up whatever the report does;
	// a report that does not land is the daemon's to make (it reports
	// Succeeded for a host with an applied record).
	_ = rep.Succeeded(ctx)
	b.recordOutcome(outcome.Record{State: outcome.Succeeded, To: cfg.Mode, Message: fmt.Sprintf("the node runs in mode %s in slot %s", cfg.Mode, slot)})
	return nil
}

// recordOutcome leaves the bootstrap's end on the host (lib/outcome), for
// `unbounded status` (the Machine has it from lib/report).
func (b *Bootstrap) recordOutcome(o outcome.Record) {
	o.Concern, o.Time = outcome.Bootstrap, b.Time().UTC()
	if err := outcome.Write(b.Paths, o); err != nil {
		b.Logger().Error("the bootstrap's outcome was not recorded", "error", err.Error())
	}
}
