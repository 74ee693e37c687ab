package fence

// A real SIGTERM to a real fence process while it retries an API server
// that does not answer: what systemd does when it stops the unit (a stop,
// a shutdown, TimeoutStartSec). The process is this test binary, re-run
// as the fence by TestMain (bench_test.go).

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"unbounded-cloud.io/agent/lib/exitcode"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/kube/clustertest"
)

// selfSignedPEM is a CA certificate for a host whose cluster never answers.
func selfSignedPEM(t *testing.T) string {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "unanswering-cluster"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

func TestSIGTERMWhileRetryingLogsOneLineAndExitsPromptlyFailingClosed(t *testing.T) {
	// A loopback port that refuses connections: every read gets no answer
	// and is retried.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	root := writeHost(t, "https://"+addr, selfSignedPEM(t), "abcdef.0123456789abcdef", "w1", clustertest.NewUID())
	cfgFile := hostpaths.New(root).Join(hostpaths.ConfigFileHost)
	cfg, _ := os.ReadFile(cfgFile)
	// Far longer than the test: the process must end on the signal, not
	// on its budget.
	cfg = []byte(strings.Replace(string(cfg), `retry-budget = "2s"`, `retry-budget = "10m"`, 1))
	if err := os.WriteFile(cfgFile, cfg, 0o644); err != nil {
		t.Fatal(err)
	}

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "UNBOUNDED_FENCE_MAIN_ROOT="+root) // see TestMain
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	lines := make(chan string, 1000)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()

	var before []string
	timeout := time.After(20 * time.Second)
	for retries := 0; retries < 3; {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("fence exited before it retried:\n%s", strings.Join(before, "\n"))
			}
			before = append(before, l)
			if strings.Contains(l, "retrying") {
				retries++
			}
		case <-timeout:
			t.Fatalf("no three retries within 20s:\n%s", strings.Join(before, "\n"))
		}
	}
	signalled := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	var after []string
	for l := range lines {
		after = append(after, l)
	}
	err = cmd.Wait()
	took := time.Since(signalled)
	var exit *exec.ExitError
	code := 0
	if errors.As(err, &exit) {
		code = exit.ExitCode()
	}
	t.Logf("before the signal:\n%s\nafter it (exit %d after %s):\n%s", strings.Join(before, "\n"), code, took.Round(time.Millisecond), strings.Join(after, "\n"))
	// A line or two of the retry in flight may land between the read
	// above and the signal; what the signal itself causes is one line.
	var caused []string
	for _, l := range after {
		if !strings.Contains(l, "retrying") {
			caused = append(caused, l)
		}
	}
	if len(caused) != 1 || !strings.Contains(caused[0], "interrupted") || !strings.Contains(caused[0], "terminated") {
		t.Errorf("the signal caused %d lines, want one saying the check was interrupted by it: %q", len(caused), caused)
	}
	if n := len(after) - len(caused); n > 1 {
		t.Errorf("%d retry lines after the signal: the retries went on", n)
	}
	if code != exitcode.TempFail {
		t.Errorf("exit %d, want %d: not allowed (the node stays down), and not the cluster's refusal (77)", code, exitcode.TempFail)
	}
	if took > 2*time.Second {
		t.Errorf("exited %s after SIGTERM, want promptly", took)
	}
}
