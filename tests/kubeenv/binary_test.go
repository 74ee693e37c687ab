package kubeenv

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"unbounded-cloud.io/agent/tests/tiers"
)

// These tests start a second kube-testenv of their own (the binary
// with-env.sh built), to check what the shared one cannot show: that
// --manifests is applied before READY, and how the binary stops.

type testenvProcess struct {
	cmd    *exec.Cmd
	stderr *bytes.Buffer
	lines  chan string
	exited chan error
}

func startTestenv(t *testing.T, args ...string) *testenvProcess {
	t.Helper()
	Get(t) // the same skip reasons as every Kubernetes test
	bin := os.Getenv(envBin)
	if bin == "" {
		tiers.Skip(t, tiers.Kube, "kubeenv: %s is not set: run under tests/kube/with-env.sh", envBin)
	}
	p := &testenvProcess{stderr: &bytes.Buffer{}, lines: make(chan string, 16), exited: make(chan error, 1)}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Stderr = p.stderr
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		s := bufio.NewScanner(out)
		for s.Scan() {
			p.lines <- s.Text()
		}
		close(p.lines)
		p.exited <- p.cmd.Wait()
	}()
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		<-p.lines
	})
	return p
}

// ready waits for the READY line and returns the kubeconfig it names.
func (p *testenvProcess) ready(t *testing.T) string {
	t.Helper()
	timeout := time.After(120 * time.Second)
	for {
		select {
		case l, ok := <-p.lines:
			if !ok {
				t.Fatalf("kube-testenv exited before READY: %v\nstderr:\n%s", <-p.exited, p.stderr)
			}
			if kc, found := strings.CutPrefix(l, "READY "); found {
				return kc
			}
			t.Errorf("stdout line before READY: %q (stdout must carry only READY)", l)
		case <-timeout:
			t.Fatalf("no READY within 120s\nstderr:\n%s", p.stderr)
		}
	}
}

func TestKubeTestenvAppliesManifestsBeforeReadyAndStopsOnSIGTERM(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	manifests, err := filepath.Abs("testdata/widgets.yaml")
	if err != nil {
		t.Fatal(err)
	}
	p := startTestenv(t, "--dir", dir, "--manifests", manifests)
	kubeconfig := p.ready(t)
	if kubeconfig != filepath.Join(dir, "kubeconfig") {
		t.Errorf("READY %s, want %s", kubeconfig, filepath.Join(dir, "kubeconfig"))
	}
	for name, want := range map[string]os.FileMode{"kubeconfig": 0o600, "ca.key": 0o600, "admin-token": 0o600, "ca.crt": 0o644} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Error(err)
		} else if fi.Mode().Perm() != want {
			t.Errorf("%s has mode %v, want %v", name, fi.Mode().Perm(), want)
		}
	}

	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	kube := kubernetes.NewForConfigOrDie(cfg)
	dyn := dynamic.NewForConfigOrDie(cfg)
	ctx := context.Background()
	widgets := dyn.Resource(schema.GroupVersionResource{Group: "kubeenv.unbounded-cloud.io", Version: "v1", Resource: "widgets"})

	// Everything in the file is there at READY, the custom resource
	// too although the file lists it before its CRD.
	if w, err := widgets.Get(ctx, "from-manifests", metav1.GetOptions{}); err != nil {
		t.Errorf("Widget from the manifests: %v", err)
	} else if size, _, _ := unstructured.NestedInt64(w.Object, "spec", "size"); size != 3 {
		t.Errorf("Widget from the manifests has spec.size %d, want 3", size)
	}
	if _, err := kube.RbacV1().ClusterRoles().Get(ctx, "kubeenv-widget-reader", metav1.GetOptions{}); err != nil {
		t.Errorf("ClusterRole from the manifests: %v", err)
	}
	if _, err := kube.RbacV1().ClusterRoleBindings().Get(ctx, "kubeenv-widget-reader", metav1.GetOptions{}); err != nil {
		t.Errorf("ClusterRoleBinding from the manifests: %v", err)
	}
	if cm, err := kube.CoreV1().ConfigMaps("default").Get(ctx, "kubeenv-widget-config", metav1.GetOptions{}); err != nil {
		t.Errorf("ConfigMap from the manifests (no namespace given: default): %v", err)
	} else if cm.Data["colour"] != "blue" {
		t.Errorf("ConfigMap data = %v", cm.Data)
	}

	// Warmed up: the first watch is not refused with 429, and the first
	// create does not wait for a fresh CRD's storage (seconds, unwarmed).
	w, err := widgets.Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Errorf("first watch of the new resource: %v", err)
	} else {
		w.Stop()
	}
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kubeenv.unbounded-cloud.io/v1", "kind": "Widget",
		"metadata": map[string]any{"name": "first"}, "spec": map[string]any{"size": int64(1)},
	}}
	start := time.Now()
	if _, err := widgets.Create(ctx, obj, metav1.CreateOptions{}); err != nil {
		t.Fatalf("first create: %v", err)
	}
	took := time.Since(start)
	t.Logf("kubeenv: first create of a Widget took %v", took.Round(time.Millisecond))
	if took > 1500*time.Millisecond {
		t.Errorf("first create took %v: the warm-up did not pay the new resource's start", took)
	}
	// The schema from the file is enforced.
	bad := obj.DeepCopy()
	bad.SetName("bad")
	unstructured.SetNestedField(bad.Object, int64(0), "spec", "size")
	if _, err := widgets.Create(ctx, bad, metav1.CreateOptions{}); err == nil || !strings.Contains(err.Error(), "spec.size") {
		t.Errorf("create with spec.size 0: err = %v, want a validation error on spec.size", err)
	}

	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	select {
	case <-p.lines:
	case <-time.After(15 * time.Second):
		t.Fatalf("still running 15s after SIGTERM\nstderr:\n%s", p.stderr)
	}
	if err := <-p.exited; err != nil {
		t.Errorf("exit after SIGTERM: %v, want status 0\nstderr:\n%s", err, p.stderr)
	}
	t.Logf("kubeenv: stopped %v after SIGTERM", time.Since(stopped).Round(time.Millisecond))
}

func TestKubeTestenvRefusesABadManifestNamingFileAndLine(t *testing.T) {
	t.Parallel()
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	os.WriteFile(bad, []byte("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: fine\n---\n# no kind\napiVersion: v1\nmetadata:\n  name: broken\n"), 0o644)
	p := startTestenv(t, "--dir", t.TempDir(), "--manifests", bad)
	for l := range p.lines {
		t.Errorf("stdout: %q, want nothing", l)
	}
	err := <-p.exited
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Errorf("exit: %v, want status 1", err)
	}
	if want := bad + ":7: key kind is missing"; !strings.Contains(p.stderr.String(), want) {
		t.Errorf("stderr does not name the file, line and key (%q):\n%s", want, p.stderr)
	}
}
