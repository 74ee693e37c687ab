// Package controller is the cluster side of the agent
// (cmd/unbounded-controller): a controller-runtime manager, with leader
// election, Prometheus metrics and health probes, that runs the
// controllers a fleet needs in the cluster. Today: the approver of the
// hosts' certificate requests (CSRApprover) and the MachineRollouts
// (Rollouts). It is never linked into a
// host's binaries (controller-runtime is the cluster side's only).
package controller

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
)

// Options configure the manager.
type Options struct {
	// LeaderElect: only the replica holding the lease
	// (LeaderElectionNamespace/unbounded-controller) acts.
	LeaderElect             bool
	LeaderElectionNamespace string
	// MetricsAddr serves /metrics ("0": not served); ProbeAddr /healthz and
	// /readyz ("0": not served).
	MetricsAddr, ProbeAddr string
	// Patience is CSRApprover.Patience (0: DefaultPatience).
	Patience time.Duration
	Log      *slog.Logger
}

// LeaseName is the leader election lease's name.
const LeaseName = "unbounded-controller"

// Scheme holds the types the controller reads: Kubernetes' own and the
// agent's API.
func Scheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		return nil, err
	}
	if err := v1alpha3.AddToScheme(s); err != nil {
		return nil, err
	}
	return s, nil
}

func init() {
	metrics.Registry.MustRegister(csrDecisions)
}

// Run runs the controllers against the cluster of cfg until ctx is done.
func Run(ctx context.Context, cfg *rest.Config, o Options) error {
	s, err := Scheme()
	if err != nil {
		return err
	}
	log := logr.FromSlogHandler(o.Log.Handler())
	ctrl.SetLogger(log)
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                        s,
		Logger:                        log,
		Metrics:                       metricsserver.Options{BindAddress: o.MetricsAddr},
		HealthProbeBindAddress:        o.ProbeAddr,
		LeaderElection:                o.LeaderElect,
		LeaderElectionID:              LeaseName,
		LeaderElectionNamespace:       o.LeaderElectionNamespace,
		LeaderElectionReleaseOnCancel: true,
	})
	if err != nil {
		return fmt.Errorf("controller manager: %w", err)
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		return err
	}
	a := &CSRApprover{Client: mgr.GetClient(), Events: mgr.GetEventRecorder("unbounded-controller"), Patience: o.Patience}
	if err := a.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("CSR approver: %w", err)
	}
	// The fleet, counted from the cache at each scrape.
	if err := metrics.Registry.Register(&FleetCollector{Reader: mgr.GetCache()}); err != nil {
		return fmt.Errorf("fleet metrics: %w", err)
	}
	ro := &Rollouts{Client: mgr.GetClient(), Live: mgr.GetAPIReader(), Events: mgr.GetEventRecorder("unbounded-controller")}
	if err := ro.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("rollouts: %w", err)
	}
	return mgr.Start(ctx)
}
