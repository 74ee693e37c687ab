//go:build demo

package demo_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"unbounded-cloud.io/agent/lib/csrapproval"
	"unbounded-cloud.io/agent/tests/kubeenv"
)

// envController is the unbounded-controller binary the demo runs beside
// the control plane (demo.sh sets it, and starts the control plane without
// its own approver of kubelet serving certificates: the controller is the
// cluster's approver, as in a cluster).
const envController = "UNBOUNDED_DEMO_CONTROLLER"

// startController runs unbounded-controller against the demo's control
// plane with the admin kubeconfig (in a cluster it is a Deployment with
// its own service account: unbounded manifests --controller-image), one
// replica, so without leader election, and without its metrics and probe
// ports (nothing scrapes them here). It is stopped when the test ends. It
// returns false when the demo runs without one.
func startController(t *testing.T, o *out) bool {
	t.Helper()
	bin := os.Getenv(envController)
	if bin == "" {
		o.say("no unbounded-controller (%s is not set): nothing approves the agent's certificate requests", envController)
		return false
	}
	var stderr bytes.Buffer
	cmd := exec.Command(bin, "--kubeconfig", os.Getenv(kubeenv.EnvKubeconfig), "--no-leader-elect",
		"--metrics-bind-address=0", "--health-probe-bind-address=0")
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("unbounded-controller's log:\n%s", stderr.String())
		}
	})
	o.say("unbounded-controller (PID %d) approves the agents' and kubelets' certificate requests by the rules of lib/csrapproval", cmd.Process.Pid)
	return true
}

// showApprovals waits until the host's two certificate requests, its
// daemon's client certificate and its kubelet's serving certificate,
// are decided, and shows who decided them and why.
func showApprovals(t *testing.T, ctx context.Context, o *out, kube kubernetes.Interface, name string, since time.Time) {
	t.Helper()
	kinds := map[string]string{
		certificatesv1.KubeAPIServerClientSignerName: "the daemon's client certificate",
		certificatesv1.KubeletServingSignerName:      "the kubelet's serving certificate",
	}
	shown := map[string]bool{}
	waitUntil(t, ctx, 3*time.Minute, "the host's certificate requests decided", func(ctx context.Context) (bool, error) {
		l, err := kube.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		for _, c := range l.Items {
			kind := kinds[c.Spec.SignerName]
			mine := (c.Spec.SignerName == certificatesv1.KubeAPIServerClientSignerName && strings.HasPrefix(c.Name, "unbounded-agent-"+name+"-")) ||
				(c.Spec.SignerName == certificatesv1.KubeletServingSignerName && c.Spec.Username == "system:node:"+name)
			if !mine || shown[c.Name] || len(c.Status.Conditions) == 0 {
				continue
			}
			shown[c.Name] = true
			cond := c.Status.Conditions[0]
			by := "unbounded-controller"
			if cond.Reason != csrapproval.ReasonApproved && cond.Reason != csrapproval.ReasonDenied {
				by = "not the controller (reason " + cond.Reason + ")"
			}
			o.say("%s: CSR %s %s by %s %s after the boot started: %s", kind, c.Name, strings.ToLower(string(cond.Type)), by,
				took(cond.LastUpdateTime.Sub(since.Truncate(time.Second))), cond.Message)
			if cond.Type != certificatesv1.CertificateApproved {
				t.Errorf("%s: CSR %s %s: %s", kind, c.Name, cond.Type, cond.Message)
			}
		}
		n := 0
		for k := range shown {
			if strings.HasPrefix(k, "unbounded-agent-") {
				n |= 1
			} else {
				n |= 2
			}
		}
		return n == 3, nil
	})
}
