package kubeenv

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"unbounded-cloud.io/agent/tests/tiers"
)

// with-env.sh must never let the Kubernetes tests pass silently when it
// cannot give them an API server: it runs the command with the reason in
// UNBOUNDED_TEST_KUBE_SKIP (or, when the kube tier is required, fails).
// The tests clear both switches (CI sets them) unless they test them.

func runWithEnv(t *testing.T, env []string) (stdout, stderr string, code int) {
	t.Helper()
	script, err := filepath.Abs("../kube/with-env.sh")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("bash", script, "sh", "-c", `echo "kubeconfig=[$UNBOUNDED_TEST_KUBECONFIG] skip=[$UNBOUNDED_TEST_KUBE_SKIP]"; exit 7`)
	cmd.Env = append(os.Environ(), env...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err = cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatal(err)
	}
	return o.String(), e.String(), cmd.ProcessState.ExitCode()
}

func TestWithEnvRunsTheCommandWithASkipReasonWhenItCannotBuild(t *testing.T) {
	t.Parallel()
	// No go on PATH: the build cannot even start.
	env := []string{"PATH=/usr/bin:/bin", "KUBE_TESTENV_BIN=" + filepath.Join(t.TempDir(), "kube-testenv"),
		"UNBOUNDED_TEST_KUBECONFIG=/stale/kubeconfig", "UNBOUNDED_TEST_KUBE_REQUIRED=", "UNBOUNDED_TEST_REQUIRED=system,packages"}
	if _, err := exec.LookPath("/usr/bin/go"); err == nil {
		t.Skip("go is in /usr/bin: cannot take it off PATH")
	}
	stdout, stderr, code := runWithEnv(t, env)
	if code != 7 {
		t.Errorf("exit status %d, want the command's 7\nstderr:\n%s", code, stderr)
	}
	if !strings.Contains(stdout, "kubeconfig=[] skip=[cannot build kube-testenv: ") {
		t.Errorf("command saw %q, want no kubeconfig and a skip reason about the build", stdout)
	}
	if !strings.Contains(stderr, "BUILD FAILED") {
		t.Errorf("the build failure is not shown loudly on stderr:\n%s", stderr)
	}
}

func TestWithEnvFailsWithoutRunningTheCommandWhenTheEnvironmentIsRequired(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("/usr/bin/go"); err == nil {
		t.Skip("go is in /usr/bin: cannot take it off PATH")
	}
	for _, required := range [][]string{
		{"UNBOUNDED_TEST_REQUIRED=system,kube", "UNBOUNDED_TEST_KUBE_REQUIRED="},
		{"UNBOUNDED_TEST_REQUIRED= packages , kubernetes", "UNBOUNDED_TEST_KUBE_REQUIRED="},
		{"UNBOUNDED_TEST_REQUIRED=", "UNBOUNDED_TEST_KUBE_REQUIRED=1"}, // the older switch
	} {
		env := append([]string{"PATH=/usr/bin:/bin", "KUBE_TESTENV_BIN=" + filepath.Join(t.TempDir(), "kube-testenv")}, required...)
		stdout, stderr, code := runWithEnv(t, env)
		if code != 3 || stdout != "" {
			t.Errorf("%v: exit status %d, stdout %q; want 3 and the command not run\nstderr:\n%s", required, code, stdout, stderr)
		}
		if !strings.Contains(stderr, "the kube tier is required") {
			t.Errorf("%v: stderr does not say why it stopped:\n%s", required, stderr)
		}
	}
}

func TestWithEnvSkipsWithTheLogTailWhenTheEnvironmentCannotStart(t *testing.T) {
	t.Parallel()
	// Only under with-env.sh: there the binary is built and this build is
	// a no-op; elsewhere it would be a cold build of Kubernetes.
	bin := os.Getenv(envBin)
	if bin == "" {
		tiers.Skip(t, tiers.Kube, "kubeenv: %s is not set: run under tests/kube/with-env.sh", envBin)
	}
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("apiVersion: v1\nkind: ConfigMap\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, code := runWithEnv(t, []string{"KUBE_TESTENV_BIN=" + bin, "UNBOUNDED_TEST_MANIFESTS=" + bad, "UNBOUNDED_TEST_KUBE_REQUIRED=", "UNBOUNDED_TEST_REQUIRED="})
	if code != 7 {
		t.Errorf("exit status %d, want the command's 7\nstderr:\n%s", code, stderr)
	}
	if !strings.Contains(stdout, "kubeconfig=[] skip=[test API server exited before it was ready") {
		t.Errorf("command saw %q, want no kubeconfig and the reason", stdout)
	}
	if !strings.Contains(stderr, bad+":1: key metadata.name is missing") {
		t.Errorf("stderr does not show the environment's own error:\n%s", stderr)
	}
}
