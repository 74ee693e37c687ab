// Package testenv runs a disposable Kubernetes control plane for tests, all
// in this process, from the k8s.io/kubernetes module: an embedded etcd and
// kube-apiserver on loopback, kube-controller-manager with the controllers a
// joining node meets (see controllers) and kube-scheduler. See ../README.md.
package testenv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	bootstrapapi "k8s.io/cluster-bootstrap/token/api"
	"k8s.io/component-base/version"
)

// Options configure one environment.
type Options struct {
	// Dir receives kubeconfig, ca.crt, ca.key, admin-token, the API
	// server's own credentials and etcd's data. It is created if needed;
	// etcd data from an earlier run in it is removed.
	Dir string
	// Manifests are applied before the environment reports ready.
	Manifests []string
	// Listen is the loopback address everything binds to.
	Listen string
	// SigningDuration is the lifetime of certificates issued for approved
	// CSRs that do not ask for less (kube-controller-manager's
	// --cluster-signing-duration).
	SigningDuration time.Duration
	// NoWarmUp skips the warm-up of new custom resources (see warmUp).
	NoWarmUp bool
	// NodeMonitorGracePeriod is how long after its kubelet's last report a
	// Node is marked NotReady (kube-controller-manager's
	// --node-monitor-grace-period).
	NodeMonitorGracePeriod time.Duration
	// NoServingApprover leaves kubernetes.io/kubelet-serving CSRs
	// undecided, for an approver of the cluster's own (unbounded-controller
	// running in it): by default the environment approves them
	// (approveKubeletServing).
	NoServingApprover bool
	// Ready is called once with the kubeconfig path when everything is up.
	Ready func(kubeconfig string)
	Log   *slog.Logger
}

// Run starts the environment, calls opts.Ready, and serves until ctx is
// cancelled; it then stops the API server and closes etcd.
func Run(ctx context.Context, opts Options) error {
	if strings.HasPrefix(version.Get().GitVersion, "v0.0.0") {
		// Unstamped, the server reports v0.0.0-master, which kubectl and
		// client-go version checks reject in confusing ways.
		return errors.New("kube-testenv was built without its version: build it with tests/kube/with-env.sh or the -ldflags shown in tests/kube/README.md")
	}
	log := opts.Log
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	start := time.Now()
	dir, err := filepath.Abs(opts.Dir)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	// A fresh cluster at every start: etcd refuses old data whose member
	// had other (random) ports, and tests must not see an earlier run.
	if err := os.RemoveAll(filepath.Join(dir, "etcd")); err != nil {
		return err
	}
	manifests, err := readManifests(opts.Manifests)
	if err != nil {
		return err
	}

	p, err := newPKI(opts.Listen)
	if err != nil {
		return fmt.Errorf("generate credentials: %w", err)
	}
	kubeletCert, kubeletKey, err := p.kubeletClientCert()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(dir, KubeletsDir), 0o700); err != nil {
		return err
	}
	// The "cluster" network's proxy (kubelets.go) listens in a short
	// directory of its own: a unix socket path has at most 107 bytes, and
	// dir may be a test's long t.TempDir().
	netDir, err := os.MkdirTemp("", "kube-testenv-net-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(netDir)
	egressSock := filepath.Join(netDir, "cluster.sock")
	for _, f := range []struct {
		name string
		data []byte
		mode os.FileMode
	}{
		{"ca.crt", p.caCertPEM, 0o644},
		{"ca.key", p.caKeyPEM, 0o600},
		{"apiserver.crt", p.servingCertPEM, 0o644},
		{"apiserver.key", p.servingKeyPEM, 0o600},
		{"sa.key", p.saKeyPEM, 0o600},
		{"admin-token", []byte(p.adminToken + "\n"), 0o600},
		{"tokens.csv", []byte(p.adminToken + `,admin,admin,"system:masters"` + "\n"), 0o600},
		{"kubelet-client.crt", kubeletCert, 0o644},
		{"kubelet-client.key", kubeletKey, 0o600},
		{"egress-selector.yaml", egressConfig(egressSock), 0o644},
	} {
		if err := writeFileAtomic(filepath.Join(dir, f.name), f.data, f.mode); err != nil {
			return err
		}
	}

	etcd, etcdURL, err := startEtcd(dir, opts.Listen)
	for try := 1; err != nil && try < 3 && strings.Contains(err.Error(), "address already in use"); try++ {
		etcd, etcdURL, err = startEtcd(dir, opts.Listen)
	}
	if err != nil {
		return err
	}
	defer etcd.Close()
	log.Info("etcd ready", "url", etcdURL, "after", time.Since(start).Round(time.Millisecond))

	ln, err := net.Listen("tcp", net.JoinHostPort(opts.Listen, "0"))
	if err != nil {
		return err
	}
	host := "https://" + ln.Addr().String()
	admin := &rest.Config{
		Host:            host,
		BearerToken:     p.adminToken,
		TLSClientConfig: rest.TLSClientConfig{CAData: p.caCertPEM},
		QPS:             -1, // no client-side throttling in setup
	}
	client, err := kubernetes.NewForConfig(admin)
	if err != nil {
		ln.Close()
		return err
	}
	// Before anything in this process looks a name up (dns.go).
	installNodeResolver(client, log)
	serverCtx, stopServer := context.WithCancel(context.Background())
	defer stopServer()
	serverDone, err := startAPIServer(serverCtx, ln, apiserverFlags(dir, etcdURL, opts.Listen))
	if err != nil {
		ln.Close()
		return err
	}
	// stop cancels the server and waits for it, so etcd (closed by the
	// deferred call above) outlives every request the server still makes.
	stop := func() error {
		stopServer()
		select {
		case err := <-serverDone:
			return err
		case <-time.After(30 * time.Second):
			return errors.New("kube-apiserver did not stop within 30s")
		}
	}

	if err := waitReady(ctx, client, serverDone); err != nil {
		return errors.Join(err, stop())
	}
	egressLn, err := net.Listen("unix", egressSock)
	if err != nil {
		return errors.Join(err, stop())
	}
	defer egressLn.Close()
	go (&kubeletProxy{dir: filepath.Join(dir, KubeletsDir), client: client, log: log}).serve(egressLn)
	if err := bindKubeletClient(ctx, client); err != nil {
		return errors.Join(fmt.Errorf("kubelet client binding: %w", err), stop())
	}
	log.Info("kube-apiserver ready", "host", host, "after", time.Since(start).Round(time.Millisecond))

	// The controllers and the scheduler run with the admin credentials, from
	// a kubeconfig of their own: the one tests read is written at READY.
	controllersKubeconfig := filepath.Join(dir, "controllers.kubeconfig")
	if err := writeKubeconfig(controllersKubeconfig, host, p); err != nil {
		return errors.Join(err, stop())
	}
	ctrlCtx, stopControllers := context.WithCancel(context.Background())
	defer stopControllers()
	kcmDone, err := startControllerManager(ctrlCtx, controllerManagerFlags(dir, controllersKubeconfig, opts.SigningDuration, opts.NodeMonitorGracePeriod))
	if err != nil {
		return errors.Join(err, stop())
	}
	log.Info("kube-controller-manager started", "after", time.Since(start).Round(time.Millisecond))
	schedDone, err := startScheduler(ctrlCtx, controllersKubeconfig)
	if err != nil {
		stopControllers()
		<-kcmDone
		return errors.Join(err, stop())
	}
	log.Info("kube-scheduler started", "after", time.Since(start).Round(time.Millisecond))
	if !opts.NoServingApprover {
		go approveKubeletServing(ctrlCtx, client, log)
	}
	// stopAll stops the controllers and the scheduler before the API server,
	// so that none of them logs a storm of refused connections on the way out.
	stopAll := func() error {
		stopControllers()
		var errs []error
		for name, ch := range map[string]<-chan error{"kube-controller-manager": kcmDone, "kube-scheduler": schedDone} {
			select {
			case err := <-ch:
				if err != nil {
					errs = append(errs, fmt.Errorf("%s: %w", name, err))
				}
			case <-time.After(15 * time.Second):
				errs = append(errs, fmt.Errorf("%s did not stop within 15s", name))
			}
		}
		return errors.Join(append(errs, stop())...)
	}

	if err := applyManifests(ctx, admin, manifests, !opts.NoWarmUp); err != nil {
		return errors.Join(fmt.Errorf("manifests: %w", err), stopAll())
	}
	log.Info("manifests applied", "after", time.Since(start).Round(time.Millisecond))
	if err := publishClusterInfo(ctx, client, host, p.caCertPEM); err != nil {
		return errors.Join(err, stopAll())
	}
	if err := waitControllers(ctx, client, kcmDone, schedDone); err != nil {
		return errors.Join(err, stopAll())
	}
	log.Info("controllers ready", "after", time.Since(start).Round(time.Millisecond))

	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := writeKubeconfig(kubeconfig, host, p); err != nil {
		return errors.Join(err, stopAll())
	}
	log.Info("ready", "kubeconfig", kubeconfig, "after", time.Since(start).Round(time.Millisecond))
	if opts.Ready != nil {
		opts.Ready(kubeconfig)
	}

	select {
	case <-ctx.Done():
		log.Info("stopping")
	case err := <-serverDone:
		stopControllers()
		return fmt.Errorf("kube-apiserver stopped: %v", err)
	case err := <-kcmDone:
		return errors.Join(fmt.Errorf("kube-controller-manager stopped: %v", err), stopAll())
	case err := <-schedDone:
		return errors.Join(fmt.Errorf("kube-scheduler stopped: %v", err), stopAll())
	}
	return stopAll()
}

// waitReady waits for /readyz (which covers the post-start hooks: RBAC
// bootstrap roles, priority classes, system namespaces) and for kube-system,
// where bootstrap token Secrets live.
func waitReady(ctx context.Context, client kubernetes.Interface, serverDone <-chan error) error {
	var last string
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 90*time.Second, true, func(ctx context.Context) (bool, error) {
		select {
		case err := <-serverDone:
			return false, fmt.Errorf("kube-apiserver stopped while starting: %v", err)
		default:
		}
		body, err := client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err != nil {
			last = fmt.Sprintf("%v: %s", err, body)
			return false, nil
		}
		if _, err := client.CoreV1().Namespaces().Get(ctx, metav1.NamespaceSystem, metav1.GetOptions{}); err != nil {
			last = err.Error()
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("kube-apiserver not ready: %w (last: %s)", err, last)
	}
	return nil
}

func writeKubeconfig(path, host string, p *pki) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["kube-testenv"] = &clientcmdapi.Cluster{Server: host, CertificateAuthorityData: p.caCertPEM}
	cfg.AuthInfos["admin"] = &clientcmdapi.AuthInfo{Token: p.adminToken}
	cfg.Contexts["admin@kube-testenv"] = &clientcmdapi.Context{Cluster: "kube-testenv", AuthInfo: "admin"}
	cfg.CurrentContext = "admin@kube-testenv"
	data, err := clientcmd.Write(*cfg)
	if err != nil {
		return err
	}
	return writeFileAtomic(path, data, 0o600)
}

// waitControllers waits until the controllers have done their first work in
// the default namespace (its ServiceAccount, with the root CA ConfigMap
// beside it), so a test that creates a pod at READY finds what the pod
// mounts, as in a cluster that has been up for a while.
func waitControllers(ctx context.Context, client kubernetes.Interface, kcmDone, schedDone <-chan error) error {
	var last string
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		select {
		case err := <-kcmDone:
			return false, fmt.Errorf("kube-controller-manager stopped while starting: %v", err)
		case err := <-schedDone:
			return false, fmt.Errorf("kube-scheduler stopped while starting: %v", err)
		default:
		}
		if _, err := client.CoreV1().ServiceAccounts(metav1.NamespaceDefault).Get(ctx, "default", metav1.GetOptions{}); err != nil {
			last = "ServiceAccount default/default: " + err.Error()
			return false, nil
		}
		if _, err := client.CoreV1().ConfigMaps(metav1.NamespaceDefault).Get(ctx, "kube-root-ca.crt", metav1.GetOptions{}); err != nil {
			last = "ConfigMap default/kube-root-ca.crt: " + err.Error()
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("controllers not ready: %w (last: %s)", err, last)
	}
	return nil
}

// publishClusterInfo writes kube-public/cluster-info as kubeadm does: the
// API server's address and CA in a kubeconfig without credentials, readable
// anonymously; the bootstrap-signer controller adds a signature per
// bootstrap token that allows signing, so a joining host can check the CA
// it was given with its token.
func publishClusterInfo(ctx context.Context, client kubernetes.Interface, host string, caPEM []byte) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[""] = &clientcmdapi.Cluster{Server: host, CertificateAuthorityData: caPEM}
	data, err := clientcmd.Write(*cfg)
	if err != nil {
		return err
	}
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: bootstrapapi.ConfigMapClusterInfo, Namespace: metav1.NamespacePublic},
		Data:       map[string]string{bootstrapapi.KubeConfigKey: string(data)},
	}
	if _, err := client.CoreV1().ConfigMaps(metav1.NamespacePublic).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create kube-public/cluster-info: %w", err)
	}
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "kubeadm:bootstrap-signer-clusterinfo", Namespace: metav1.NamespacePublic},
		Rules: []rbacv1.PolicyRule{{
			APIGroups: []string{""}, Resources: []string{"configmaps"},
			ResourceNames: []string{bootstrapapi.ConfigMapClusterInfo}, Verbs: []string{"get"},
		}},
	}
	if _, err := client.RbacV1().Roles(metav1.NamespacePublic).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create the cluster-info Role: %w", err)
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role.Name, Namespace: metav1.NamespacePublic},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "system:anonymous"}},
	}
	if _, err := client.RbacV1().RoleBindings(metav1.NamespacePublic).Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create the cluster-info RoleBinding: %w", err)
	}
	return nil
}
