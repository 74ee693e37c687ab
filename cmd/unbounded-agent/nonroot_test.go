package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"unbounded-cloud.io/agent/tests/fixtures"

	"unbounded-cloud.io/agent/lib/exitcode"
)

// runAs runs bin with args, as nobody (65534) when nobody is set, and
// returns its exit code and output.
func runAs(t *testing.T, nobody bool, bin string, args ...string) (int, string, string) {
	t.Helper()
	name := bin
	if nobody {
		setpriv, err := exec.LookPath("setpriv")
		if err != nil {
			t.Skip("setpriv (util-linux) is not installed")
		}
		name, args = setpriv, append([]string{"--reuid=65534", "--regid=65534", "--clear-groups", "--", bin}, args...)
	}
	cmd := exec.Command(name, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		return ee.ExitCode(), out.String(), errb.String()
	case err != nil:
		t.Fatalf("%s: %v", name, err)
	}
	return 0, out.String(), errb.String()
}

// Run by hand without root, each concern says in one line that it needs
// root and exits 4, instead of a false "token owned by uid 0", a refusal
// or a silent "deferred". The host tree is what the package and bootstrap
// leave: /var/lib/unbounded 0700, the token 0600, both root's.
func TestConcernsRunWithoutRootSayTheyNeedRoot(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary; skipped with -short")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root to run the concerns as nobody with setpriv")
	}
	if fi, err := os.Stat(os.TempDir()); err != nil || fi.Mode().Perm()&0o001 == 0 {
		t.Skipf("the temporary directory %s is not open to other users (TMPDIR): nobody could not reach the test files", os.TempDir())
	}
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go toolchain on PATH to build cmd/unbounded-agent")
	}
	binDir := t.TempDir()
	bin := filepath.Join(binDir, "unbounded-agent")
	build := exec.Command(gobin, "build", "-trimpath", "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	root := t.TempDir()
	// An allocation UID makes the fence ask the cluster; the API server is a
	// closed loopback port and the retry budget 1 s:
	// the run as root (the control) refuses quickly and sends nothing
	// beyond loopback.
	files := map[string]struct {
		content string
		mode    os.FileMode
	}{
		"etc/unbounded/agent.toml":      {"machine = \"site-w1\"\n[cluster]\napi-server = \"https://127.0.0.1:1\"\nkubernetes-version = \"1.36.3\"\n[allocation]\nuid = \"5f0c8a2e-3b1d-4c6e-9a7f-2d8e1b4c6a90\"\n[fence]\nretry-budget = \"1s\"\n", 0o644},
		"etc/unbounded/ca.crt":          {string(fixtures.CA(t)), 0o644},
		"etc/unbounded/bootstrap-token": {"q1w2e3.r4t5y6u7i8o9p0a1\n", 0o600},
	}
	for f, c := range files {
		path := filepath.Join(root, f)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(c.content), c.mode); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(root, "var/lib/unbounded/pki"), 0o700); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{binDir, filepath.Dir(binDir), root, filepath.Dir(root), filepath.Join(root, "var"), filepath.Join(root, "var/lib")} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(filepath.Join(root, "var/lib/unbounded"), 0o700); err != nil {
		t.Fatal(err)
	}

	for _, concern := range []string{"fence", "daemon", "bootstrap", "reset"} {
		code, stdout, stderr := runAs(t, true, bin, concern, "--root", root)
		if code != exitcode.NeedsRoot || stdout != "" || strings.Count(stderr, "\n") != 1 ||
			!strings.HasPrefix(stderr, concern+": needs root: ") || !strings.HasSuffix(stderr, "; run it as root\n") {
			t.Errorf("%s as nobody: exit %d, want %d and one line; stdout %q, stderr %q", concern, code, exitcode.NeedsRoot, stdout, stderr)
		}
	}
	// With the host root readable (a tree without /var/lib/unbounded),
	// the fence still stops at the token, and says so.
	if err := os.RemoveAll(filepath.Join(root, "var/lib/unbounded")); err != nil {
		t.Fatal(err)
	}
	code, _, stderr := runAs(t, true, bin, "fence", "--root", root)
	if code != exitcode.NeedsRoot || !strings.Contains(stderr, "fence: needs root: /etc/unbounded/bootstrap-token (under root "+root+") is readable only by root") ||
		strings.Contains(stderr, "owned by uid") {
		t.Errorf("fence as nobody, token root's: exit %d, stderr %q", code, stderr)
	}
	// The control: as root the same tree gets to the cluster, which does
	// not answer, and the fence refuses (77), not "needs root".
	if code, _, stderr := runAs(t, false, bin, "fence", "--root", root); code != exitcode.Refused || strings.Contains(stderr, "needs root") {
		t.Errorf("fence as root: exit %d, want %d; stderr %s", code, exitcode.Refused, stderr)
	}
	if code, _, _ := runAs(t, true, bin, "--help"); code != 0 {
		t.Errorf("--help as nobody: exit %d", code)
	}
}
