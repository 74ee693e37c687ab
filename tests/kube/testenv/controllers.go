package testenv

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/kubernetes/cmd/kube-controller-manager/app"
	kcmoptions "k8s.io/kubernetes/cmd/kube-controller-manager/app/options"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	scheduleroptions "k8s.io/kubernetes/cmd/kube-scheduler/app/options"
)

// controllers are the kube-controller-manager controllers the environment
// runs: what a kubeadm cluster runs that a node joining it meets. Left out:
// node-ipam (nothing here routes pod CIDRs), the volume, job, daemonset,
// statefulset, endpoint and quota controllers (no test uses them; each
// costs informers and start-up time), and the cloud controllers.
var controllers = []string{
	// Kubelet TLS bootstrap: auto-approval of nodeclient/selfnodeclient CSRs
	// (by SubjectAccessReview of the requester), the four signers with the
	// cluster CA, and the cleaner of old CSRs.
	"certificatesigningrequest-approving-controller",
	"certificatesigningrequest-signing-controller",
	"certificatesigningrequest-cleaner-controller",
	// Bootstrap tokens: expired ones are deleted, kube-public/cluster-info
	// is signed with each token (kubeadm's discovery).
	"token-cleaner-controller",
	"bootstrap-signer-controller",
	// Nodes: NotReady (and tainted) when the kubelet stops reporting, pods
	// evicted from them, pods of deleted nodes collected.
	"node-lifecycle-controller",
	"taint-eviction-controller",
	"pod-garbage-collector-controller",
	// Workloads.
	"garbage-collector-controller",
	"replicaset-controller",
	"deployment-controller",
	"disruption-controller",
	// Namespaces and what pods of every namespace mount.
	"namespace-controller",
	"serviceaccount-controller",
	"serviceaccount-token-controller",
	"root-ca-certificate-publisher-controller",
	"clusterrole-aggregation-controller",
}

// controllerManagerFlags are the flags of a kube-controller-manager running
// the controllers above with the cluster CA. It authenticates with the admin
// kubeconfig and one client for all controllers
// (--use-service-account-credentials=false): what it may do is not under
// test, what it does is.
func controllerManagerFlags(dir, kubeconfig string, signingDuration, nodeGrace time.Duration) []string {
	return []string{
		"--kubeconfig=" + kubeconfig,
		"--controllers=" + strings.Join(controllers, ","),
		"--leader-elect=false",
		// No serving port: nothing scrapes it, and two environments on one
		// host must not collide on 10257.
		"--secure-port=0",
		"--use-service-account-credentials=false",
		"--cluster-signing-cert-file=" + filepath.Join(dir, "ca.crt"),
		"--cluster-signing-key-file=" + filepath.Join(dir, "ca.key"),
		fmt.Sprintf("--cluster-signing-duration=%s", signingDuration),
		"--service-account-private-key-file=" + filepath.Join(dir, "sa.key"),
		"--root-ca-file=" + filepath.Join(dir, "ca.crt"),
		// A Node goes NotReady nodeGrace after its kubelet's last lease
		// renewal or status (default 50 s; a test waits for it). It must stay
		// above the kubelet's lease renewal interval (10 s by default, a
		// quarter of nodeLeaseDurationSeconds), or a healthy node flaps.
		fmt.Sprintf("--node-monitor-grace-period=%s", nodeGrace),
		"--node-monitor-period=1s",
		// The default start interval is 0 plus a jitter of up to 100 %;
		// explicit so start-up stays as measured.
		"--controller-start-interval=0s",
	}
}

// startControllerManager runs kube-controller-manager in this process until
// ctx is cancelled. The returned channel yields Run's error and is closed.
func startControllerManager(ctx context.Context, flags []string) (<-chan error, error) {
	s, err := kcmoptions.NewKubeControllerManagerOptions()
	if err != nil {
		return nil, err
	}
	known, disabled, aliases := app.KnownControllers(), app.ControllersDisabledByDefault(), app.ControllerAliases()
	named := s.Flags(known, disabled, aliases)
	s.ParsedFlags = &named
	fs := pflag.NewFlagSet("kube-controller-manager", pflag.ContinueOnError)
	for _, f := range named.FlagSets {
		fs.AddFlagSet(f)
	}
	if err := fs.Parse(flags); err != nil {
		return nil, fmt.Errorf("kube-controller-manager flags: %w", err)
	}
	// The registry of feature gates and versions is the process's, shared
	// with the API server, which has set it already from the same (empty)
	// flags; setting it again is what the stock command does.
	if err := s.ComponentGlobalsRegistry.Set(); err != nil {
		return nil, err
	}
	c, err := s.Config(ctx, known, disabled, aliases)
	if err != nil {
		return nil, fmt.Errorf("kube-controller-manager config: %w", err)
	}
	done := make(chan error, 1)
	go func() {
		defer close(done)
		err := app.Run(ctx, c.Complete())
		if errors.Is(err, context.Canceled) {
			err = nil
		}
		done <- err
	}()
	return done, nil
}

// startScheduler runs kube-scheduler (default profile) in this process until
// ctx is cancelled, with the admin kubeconfig, no leader election and no
// serving port.
func startScheduler(ctx context.Context, kubeconfig string) (<-chan error, error) {
	opts := scheduleroptions.NewOptions()
	fs := pflag.NewFlagSet("kube-scheduler", pflag.ContinueOnError)
	for _, f := range opts.Flags.FlagSets {
		fs.AddFlagSet(f)
	}
	if err := fs.Parse([]string{
		"--kubeconfig=" + kubeconfig,
		"--leader-elect=false",
		"--secure-port=0",
	}); err != nil {
		return nil, fmt.Errorf("kube-scheduler flags: %w", err)
	}
	if err := opts.ComponentGlobalsRegistry.Set(); err != nil {
		return nil, err
	}
	cc, sched, err := scheduler.Setup(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("kube-scheduler setup: %w", err)
	}
	done := make(chan error, 1)
	go func() {
		defer close(done)
		err := scheduler.Run(ctx, cc, sched)
		if ctx.Err() != nil {
			// Without leader election Run always ends in an error
			// ("finished without leader elect"), also on a clean stop.
			err = nil
		}
		done <- err
	}()
	return done, nil
}
