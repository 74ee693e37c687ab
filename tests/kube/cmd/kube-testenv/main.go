// Command kube-testenv runs a disposable Kubernetes control plane for tests
// (embedded etcd, in-process kube-apiserver, CSR signers) and prints
// "READY <kubeconfig>" on stdout once it serves. It stops on SIGTERM or
// SIGINT. See tests/kube/README.md.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/alecthomas/kong"
	"google.golang.org/grpc/grpclog"
	"k8s.io/klog/v2"

	"unbounded-cloud.io/agent/tests/kube/testenv"
)

type cli struct {
	Dir               string        `required:"" type:"path" help:"Working directory: kubeconfig, ca.crt, ca.key, admin-token and etcd data go here."`
	Manifests         []string      `type:"existingfile" help:"Multi-document YAML applied before READY (CRDs first, waited for). May repeat."`
	Listen            string        `default:"127.0.0.1" help:"Loopback address to listen on."`
	SigningDuration   time.Duration `default:"24h" help:"Lifetime of certificates issued for approved CSRs that do not ask for less."`
	Verbose           int           `short:"v" default:"0" help:"Verbosity of the API server's own log (klog -v)."`
	NoWarmUp          bool          `help:"Skip the warm-up of new custom resources (to measure what it saves)."`
	NoServingApprover bool          `help:"Leave kubernetes.io/kubelet-serving CSRs to an approver of the cluster's own (unbounded-controller): by default the environment approves them as such an approver does."`
	NodeGrace         time.Duration `name:"node-monitor-grace-period" default:"20s" help:"A Node is NotReady this long after its kubelet's last report (kube-controller-manager's flag; its default is 50s). Keep it above the kubelet's lease renewal interval (10s by default)."`
}

func main() {
	var c cli
	kong.Parse(&c, kong.Description("Runs etcd and kube-apiserver on loopback for tests."))
	if err := os.MkdirAll(c.Dir, 0o700); err != nil {
		fmt.Fprintln(os.Stderr, "kube-testenv:", err)
		os.Exit(1)
	}
	quietKlog(filepath.Join(c.Dir, "kube-apiserver.log"), c.Verbose)
	log := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("component", "kube-testenv")

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	err := testenv.Run(ctx, testenv.Options{
		Dir:                    c.Dir,
		Manifests:              c.Manifests,
		Listen:                 c.Listen,
		SigningDuration:        c.SigningDuration,
		NoWarmUp:               c.NoWarmUp,
		NodeMonitorGracePeriod: c.NodeGrace,
		NoServingApprover:      c.NoServingApprover,
		Log:                    log,
		Ready:                  func(kubeconfig string) { fmt.Printf("READY %s\n", kubeconfig) },
	})
	if err != nil {
		log.Error("failed", "err", err)
		os.Exit(1)
	}
}

// quietKlog keeps the API server's start-up chatter (hundreds of info lines)
// off stderr: only warnings and errors are shown, so a failing start is
// readable in the tail that with-env.sh prints. The whole log goes to file,
// in the environment's directory (klog would otherwise litter /tmp).
func quietKlog(file string, v int) {
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	for k, val := range map[string]string{
		"logtostderr":     "false",
		"alsologtostderr": "false",
		"stderrthreshold": "WARNING",
		"log_file":        file,
		"v":               fmt.Sprint(v),
	} {
		if err := fs.Set(k, val); err != nil {
			panic(err)
		}
	}
	// The API server's etcd clients log every cancelled dial of their
	// start-up probes as a warning, a hundred lines per start; errors
	// still show.
	grpclog.SetLoggerV2(grpclog.NewLoggerV2(io.Discard, io.Discard, os.Stderr))
}
