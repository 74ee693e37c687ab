package kubeenv

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"unbounded-cloud.io/agent/tests/tiers"
)

// envBin is the kube-testenv binary with-env.sh built and runs.
const envBin = "UNBOUNDED_TEST_KUBE_BIN"

// StartPrivate starts a control plane of the test's own (the kube-testenv
// binary with-env.sh built, with manifests applied) and returns it; it is
// stopped when the test ends. For tests that must be alone in their
// cluster: upstream's end-to-end specs schedule pods on any Node and
// expect every Node to be Ready, which the Nodes other tests create and
// delete are not. It skips (fails, where the kube tier is required) when
// there is no binary.
func StartPrivate(t testing.TB, manifests ...string) *Env {
	t.Helper()
	return Private{Manifests: manifests}.Start(t)
}

// Private is a control plane of a test's own (StartPrivate).
type Private struct {
	// Manifests are applied before it is ready.
	Manifests []string
	// NoServingApprover leaves the kubelets' serving CSRs to an approver
	// the test runs in the cluster (kube-testenv --no-serving-approver).
	NoServingApprover bool
}

// Start starts the control plane p describes, as StartPrivate does.
func (p Private) Start(t testing.TB) *Env {
	t.Helper()
	Get(t) // the same skip reasons as every Kubernetes test
	bin := os.Getenv(envBin)
	if bin == "" {
		tiers.Skip(t, tiers.Kube, "kubeenv: %s is not set: run under tests/kube/with-env.sh", envBin)
	}
	// A short directory: node sockets under it (kubelets/NAME.sock) are
	// unix socket paths, at most 107 bytes.
	dir, err := os.MkdirTemp("", "kube-private-")
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"--dir", dir}
	for _, m := range p.Manifests {
		args = append(args, "--manifests", m)
	}
	if p.NoServingApprover {
		args = append(args, "--no-serving-approver")
	}
	var stderr bytes.Buffer
	cmd := exec.Command(bin, args...)
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	begin := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 4)
	exited := make(chan error, 1)
	go func() {
		s := bufio.NewScanner(out)
		for s.Scan() {
			lines <- s.Text()
		}
		close(lines)
		exited <- cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		os.RemoveAll(dir)
	})
	timeout := time.After(3 * time.Minute)
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("kubeenv: private kube-testenv exited before READY: %v\nstderr:\n%s", <-exited, stderr.String())
			}
			kc, found := strings.CutPrefix(l, "READY ")
			if !found {
				continue
			}
			env, err := loadDir(kc, dir)
			if err != nil {
				t.Fatalf("kubeenv: private kube-testenv: %v", err)
			}
			t.Logf("kubeenv: private API server %s ready in %v", env.Host(), time.Since(begin).Round(time.Millisecond))
			return env
		case <-timeout:
			t.Fatalf("kubeenv: private kube-testenv not READY within 3m\nstderr:\n%s", stderr.String())
		}
	}
}
