// Command unbounded-controller is the cluster side of the agent, run in
// the cluster (two replicas, one leading): it approves the hosts'
// certificate requests by the rules of lib/csrapproval (lib/controller).
// It is never installed on a host.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"unbounded-cloud.io/agent/lib/concern"
	"unbounded-cloud.io/agent/lib/controller"
	"unbounded-cloud.io/agent/lib/logging"
	"unbounded-cloud.io/agent/lib/version"
)

type cli struct {
	Kubeconfig              string        `help:"Kubeconfig file (default: the pod's service account, in the cluster)." type:"existingfile"`
	LeaderElect             bool          `help:"Act only while holding the lease unbounded-controller (run two replicas)." default:"true" negatable:""`
	LeaderElectionNamespace string        `help:"Namespace of the lease (default: the pod's own)." env:"POD_NAMESPACE"`
	MetricsBindAddress      string        `help:"Address of /metrics (Prometheus text format); 0 turns it off." default:":8080"`
	HealthProbeBindAddress  string        `help:"Address of /healthz and /readyz; 0 turns them off." default:":8081"`
	ServingPatience         time.Duration `help:"How long a kubelet serving certificate request may wait for its Node to list the addresses it names before it is denied." default:"1m"`
	KubeAPIQPS              float32       `name:"kube-api-qps" help:"Requests per second to the API server, sustained (client-go's own default, 5, approved 100 simultaneous requests in 18 s at the 99th percentile)." default:"50"`
	KubeAPIBurst            int           `name:"kube-api-burst" help:"Requests to the API server in a burst above --kube-api-qps." default:"100"`
}

func main() { os.Exit(run(os.Args[1:])) }

func run(args []string) int {
	var c cli
	if code, done := concern.Parse("unbounded-controller",
		"The cluster side of unbounded-agent: approves the hosts' certificate requests (the daemon's client certificate, the kubelet's serving certificate) "+
			"by the rules the README states, each decision a condition on the request, an Event and a metric; runs MachineRollouts.",
		&c, args, os.Stdout, os.Stderr); done {
		return code
	}
	log := logging.New(os.Stderr, slog.LevelInfo)
	cfg, err := restConfig(c.Kubeconfig)
	if err != nil {
		log.Error("the cluster's credentials: " + err.Error())
		return 1
	}
	if c.KubeAPIQPS <= 0 || c.KubeAPIBurst < 1 {
		log.Error(fmt.Sprintf("--kube-api-qps %v and --kube-api-burst %d must be above zero", c.KubeAPIQPS, c.KubeAPIBurst))
		return 1
	}
	cfg.QPS, cfg.Burst = c.KubeAPIQPS, c.KubeAPIBurst
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	log.Info("unbounded-controller starting", "version", version.Version, "leader_elect", c.LeaderElect)
	if err := controller.Run(ctx, cfg, controller.Options{
		LeaderElect: c.LeaderElect, LeaderElectionNamespace: c.LeaderElectionNamespace,
		MetricsAddr: c.MetricsBindAddress, ProbeAddr: c.HealthProbeBindAddress,
		Patience: c.ServingPatience, Log: log,
	}); err != nil {
		log.Error(err.Error())
		return 1
	}
	return 0
}

// restConfig is the kubeconfig's, or the pod's service account's.
func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		return rest.InClusterConfig()
	}
	return clientcmd.BuildConfigFromFlags("", kubeconfig)
}
