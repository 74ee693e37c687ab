package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"

	"github.com/spf13/pflag"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/client-go/rest"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
	"k8s.io/kubernetes/cmd/kube-apiserver/app/options"
)

// apiserverFlags are the flags of a kube-apiserver run the way this project's
// clusters run it where it matters to the agent: bootstrap tokens, Node and
// RBAC authorization, client certificates from one CA.
func apiserverFlags(dir, etcdURL, host string) []string {
	return []string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=" + host,
		"--advertise-address=" + host,
		"--tls-cert-file=" + filepath.Join(dir, "apiserver.crt"),
		"--tls-private-key-file=" + filepath.Join(dir, "apiserver.key"),
		"--client-ca-file=" + filepath.Join(dir, "ca.crt"),
		"--token-auth-file=" + filepath.Join(dir, "tokens.csv"),
		"--enable-bootstrap-token-auth",
		"--authorization-mode=Node,RBAC",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + filepath.Join(dir, "sa.key"),
		"--service-account-signing-key-file=" + filepath.Join(dir, "sa.key"),
		"--service-cluster-ip-range=10.96.0.0/16",
		// No Endpoints object for the kubernetes Service: nothing in the
		// environment runs in a pod that would use it, and the lease
		// reconciler only adds writes.
		"--endpoint-reconciler-type=none",
		// The path to kubelets (kubelets.go): a client certificate of the
		// cluster CA, kubelets' serving certificates verified against it,
		// Nodes dialled by name first, through the "cluster" network's
		// proxy.
		"--kubelet-client-certificate=" + filepath.Join(dir, "kubelet-client.crt"),
		"--kubelet-client-key=" + filepath.Join(dir, "kubelet-client.key"),
		"--kubelet-certificate-authority=" + filepath.Join(dir, "ca.crt"),
		"--kubelet-preferred-address-types=Hostname,InternalDNS,InternalIP,ExternalDNS,ExternalIP",
		"--egress-selector-config-file=" + filepath.Join(dir, "egress-selector.yaml"),
		// Privileged containers, as kubeadm's API server allows them (the
		// default refuses them; CNI and storage DaemonSets need them, and
		// so does upstream's PrivilegedPod conformance spec).
		"--allow-privileged=true",
		// A test run is one process: there is nothing to drain for.
		"--shutdown-delay-duration=0s",
	}
}

// startAPIServer runs kube-apiserver in this process on ln until ctx is
// cancelled. The returned channel yields Run's error (nil on a clean stop)
// and is then closed.
func startAPIServer(ctx context.Context, ln net.Listener, flags []string) (<-chan error, error) {
	s := options.NewServerRunOptions()
	fs := pflag.NewFlagSet("kube-apiserver", pflag.ContinueOnError)
	for _, f := range s.Flags().FlagSets {
		fs.AddFlagSet(f)
	}
	if err := fs.Parse(flags); err != nil {
		return nil, fmt.Errorf("kube-apiserver flags: %w", err)
	}
	s.SecureServing.Listener = ln
	s.SecureServing.BindPort = ln.Addr().(*net.TCPAddr).Port
	// The stock binary keeps a successful token check for 10 s, so a
	// deleted bootstrap token would go on authenticating; tests of token
	// revocation (and the fence) need the answer the cluster gives now.
	// There is no flag for this: it can only be set in-process.
	s.Authentication.TokenSuccessCacheTTL = 0
	s.Authentication.TokenFailureCacheTTL = 0

	if err := s.GenericServerRunOptions.ComponentGlobalsRegistry.Set(); err != nil {
		return nil, err
	}
	// The API server's loopback clients would otherwise log every
	// deprecation warning they cause themselves.
	rest.SetDefaultWarningHandler(rest.NoWarnings{})

	completed, err := s.Complete(ctx)
	if err != nil {
		return nil, fmt.Errorf("complete kube-apiserver options: %w", err)
	}
	if errs := completed.Validate(); len(errs) != 0 {
		return nil, fmt.Errorf("kube-apiserver options: %w", utilerrors.NewAggregate(errs))
	}
	config, err := app.NewConfig(completed)
	if err != nil {
		return nil, fmt.Errorf("kube-apiserver config: %w", err)
	}
	cc, err := config.Complete()
	if err != nil {
		return nil, fmt.Errorf("kube-apiserver config: %w", err)
	}
	server, err := app.CreateServerChain(cc)
	if err != nil {
		return nil, fmt.Errorf("kube-apiserver server chain: %w", err)
	}
	prepared, err := server.PrepareRun()
	if err != nil {
		return nil, fmt.Errorf("kube-apiserver prepare: %w", err)
	}
	done := make(chan error, 1)
	go func() {
		defer close(done)
		err := prepared.Run(ctx)
		if errors.Is(err, context.Canceled) {
			err = nil
		}
		done <- err
	}()
	return done, nil
}
