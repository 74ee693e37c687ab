package recovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/config"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/kube"
	"unbounded-cloud.io/agent/lib/state"
)

// Reasons of the Recovered condition and of recovery's Events.
const (
	// ReasonUnitFailed: a unit failed; recovery repaired what was needed
	// (the daemon runs). Condition True, Event Warning.
	ReasonUnitFailed = "UnitFailed"
	// ReasonRepairFailed: a unit failed (or the state was unusable) and
	// recovery could not repair everything; the message says what is
	// left and how to fix it. Condition False.
	ReasonRepairFailed = "RepairFailed"
	// ReasonHeldBack: the unit failed again past the rate limit; recovery
	// did nothing. Said once per window. Condition False.
	ReasonHeldBack = "RecoveryHeldBack"
	// ReasonDeferred: an installation owns the host; recovery only
	// reported. Condition Unknown.
	ReasonDeferred = "InstallationOwnsHost"
)

// Report is what recovery says on the Machine.
type Report struct {
	// Unit is the failed unit (or GeneratorInstance).
	Unit   string
	Reason string
	// Message says what failed, how, and what recovery did.
	Message string
	// Lines are the failed run's last journal lines, oldest first.
	Lines []string
	// Repaired: the condition is True.
	Repaired bool
}

// status is the Recovered condition's status for r.
func (r Report) status() metav1.ConditionStatus {
	switch {
	case r.Reason == ReasonDeferred:
		return metav1.ConditionUnknown
	case r.Repaired:
		return metav1.ConditionTrue
	}
	return metav1.ConditionFalse
}

// text is the message with the journal lines, at most max bytes: when it
// is too long the oldest lines go first, so that the last lines (which
// say why the unit failed) stay.
func (r Report) text(max int) string {
	if len(r.Lines) == 0 {
		return kube.Truncate(r.Message, max)
	}
	head := r.Message + "\nLast journal lines of " + r.Unit + ":"
	lines := r.Lines
	for {
		s := head + "\n" + strings.Join(lines, "\n")
		if len(s) <= max || len(lines) <= 1 {
			return kube.Truncate(s, max)
		}
		lines = lines[1:]
	}
}

// report writes rep on the Machine, best effort: a recovery whose cluster
// does not answer still repaired the host and said it in the journal.
func (r *Recovery) report(ctx context.Context, log *slog.Logger, rep Report) {
	send := r.Host.Report
	if send == nil {
		mr := &MachineReporter{Paths: r.Paths, Now: r.Host.Now}
		send = mr.Report
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := send(ctx, rep); errors.Is(err, ErrEventOnly) {
		log.Warn("recovery reported on the Machine as an Event; its condition was not set", "reason", rep.Reason, "error", err)
		return
	} else if err != nil {
		log.Warn("recovery not reported on the Machine (it is in this journal)", "reason", rep.Reason, "error", err)
		return
	}
	log.Info("recovery reported on the Machine", "reason", rep.Reason)
}

// MachineReporter writes a Report on this host's Machine: the Recovered
// condition and an Event. The Machine's name comes from the active
// applied config when there is one (what the node runs as), else from
// the config file; the credential is the daemon's client certificate
// while one is usable, else the bootstrap token (lib/kube.Credentials).
type MachineReporter struct {
	Paths hostpaths.Paths
	Now   func() time.Time
}

func (m *MachineReporter) now() time.Time {
	if m.Now != nil {
		return m.Now()
	}
	return time.Now()
}

// Report writes rep; an error says why it could not.
func (m *MachineReporter) Report(ctx context.Context, rep Report) error {
	cfg, err := config.Load(m.Paths)
	if err != nil {
		return fmt.Errorf("no credential to report with: %w", err)
	}
	machine := cfg.Machine
	if a, err := state.ReadActive(m.Paths); err == nil && a != nil && a.Machine != "" {
		machine = a.Machine
	}
	creds := kube.CredentialsFor(cfg, m.Paths.PKIDir())
	rc, _, err := creds.CertConfig(m.now())
	usingToken := err != nil
	if usingToken {
		if rc, err = creds.BootstrapConfig(); err != nil {
			return fmt.Errorf("no usable credential: %w", err)
		}
	}
	ms, err := kube.NewMachines(rc)
	if err != nil {
		return err
	}
	var uid types.UID
	_, cerr := ms.MutateStatus(ctx, machine, func(mc *v1alpha3.Machine) bool {
		uid = mc.UID
		return meta.SetStatusCondition(&mc.Status.Conditions, metav1.Condition{
			Type:               v1alpha3.ConditionRecovered,
			Status:             rep.status(),
			Reason:             rep.Reason,
			Message:            rep.text(4096),
			ObservedGeneration: mc.Generation,
		})
	})
	if cerr != nil {
		cerr = fmt.Errorf("machine %s: condition %s: %w", machine, v1alpha3.ConditionRecovered, cerr)
		if usingToken && apierrors.IsForbidden(cerr) {
			// The cluster's admission policy keeps the bootstrap token
			// to the bootstrap's conditions; the rest of the status is
			// the daemon's identity's, whose certificate this host has
			// not been issued yet. The Event below still tells.
			cerr = fmt.Errorf("%w (the bootstrap token may not set it; the agent's client certificate, once issued, may)", cerr)
		}
	}
	// The Event is recorded whether or not the condition was taken.
	ev := kube.MachineEvent(machine, uid, "unbounded-recover", corev1.EventTypeWarning, rep.Reason, rep.text(1024), m.now())
	if err := kube.PostEvent(ctx, rc, ev); err != nil {
		return errors.Join(cerr, fmt.Errorf("machine %s: event: %w", machine, err))
	}
	if cerr != nil {
		return fmt.Errorf("%w: %w", ErrEventOnly, cerr)
	}
	return nil
}

// ErrEventOnly: the Event was recorded, the condition was not.
var ErrEventOnly = errors.New("reported as an Event only")

// rel shows the paths in s as the host sees them (p's root stripped).
func rel(p hostpaths.Paths, s string) string {
	if p.Root == "" || p.Root == "/" {
		return s
	}
	return strings.ReplaceAll(s, filepath.Clean(p.Root), "")
}
