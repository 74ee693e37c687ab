package system_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"unbounded-cloud.io/agent/lib/api/identity"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/kube"
	"unbounded-cloud.io/agent/lib/state"
	"unbounded-cloud.io/agent/tests/kubeenv"
	"unbounded-cloud.io/agent/tests/system/harness"
)

// TestSandboxedDaemonStoresTheCertificateItObtains: the daemon of a host
// whose client certificate has not been issued yet starts on the bootstrap
// token, requests a certificate, and, once the cluster side approves it,
// stores it under /var/lib/unbounded/pki from inside its sandbox (the write
// to the host root the unit's ReadWritePaths= is there for), 0600, and
// switches to it, with no denial in its journal.
func TestSandboxedDaemonStoresTheCertificateItObtains(t *testing.T) {
	env := requireKube(t)
	harness.Require(t, false)
	bin := buildAgent(t)

	machine := kubeenv.UniqueName(t, "sys-sbx-cert")
	env.registerMachine(t, machine) // the daemon requests a certificate only while its Machine lives
	id, secret := kubeenv.RandomTokenID(t)
	token := env.CreateBootstrapToken(t, id, secret, identity.BootstrapAgentsGroup, identity.BootstrapGroup(machine))

	m := harness.New(t, harness.Options{
		HostNetwork: true,
		Files: []harness.File{
			{Path: hostpaths.LibexecDirHost + "/unbounded-agent", Data: readFile(t, bin), Mode: 0o755},
			{Path: hostpaths.UnitDirHost + "/" + daemonUnit, Data: readRepoFile(t, "units", daemonUnit), Mode: 0o644},
			{Path: state.TmpfilesConfHost, Data: readRepoFile(t, "deb", "unbounded-agent.tmpfiles"), Mode: 0o644},
			{Path: hostpaths.ConfigFileHost, Data: []byte(fmt.Sprintf(`machine = %q
mode = "nspawn"

[cluster]
api-server = %q
ca-file = %q
bootstrap-token-file = %q
kubernetes-version = "1.36.3"
`, machine, env.Host(), caFile, tokenFile)), Mode: 0o644},
			{Path: caFile, Data: env.caPEM, Mode: 0o644},
			{Path: tokenFile, Data: []byte(token + "\n"), Mode: 0o600},
		},
	})
	p := hostpaths.New(m.Root())
	if err := os.Symlink("unbounded-agent", p.Libexec("daemon")); err != nil {
		t.Fatal(err)
	}
	if err := state.WriteApplied(p, &state.AppliedConfig{Slot: "kube1", Mode: "nspawn", Machine: machine}); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p.HostRoot(), 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(p.PKIDir()); !os.IsNotExist(err) {
		t.Fatalf("%s before the daemon ran: %v, want none", p.PKIDir(), err)
	}
	m.Start()

	if out, err := m.Systemctl("start", daemonUnit); err != nil {
		t.Fatalf("systemctl start %s: %v\n%s\n%s", daemonUnit, err, out, m.Journal(daemonUnit))
	}
	approveAgentCSR(t, env, m, machine)

	// The daemon stores the certificate, then restarts its watches with
	// it, which its STATUS= says (no longer "client certificate pending").
	store := kube.CertStore{Dir: filepath.Join(m.Root(), hostpaths.HostRootHost, "pki")}
	switched := func() bool {
		pair, err := store.Load()
		if err != nil || kube.CheckIdentity(pair.Cert, machine) != nil {
			return false
		}
		st, _ := m.Systemctl("show", "-p", "StatusText", "--value", daemonUnit)
		return strings.TrimSpace(st) == "watching Machine "+machine
	}
	deadline := time.Now().Add(60 * time.Second)
	for !switched() {
		if hits := sandboxDenials(m.Journal(daemonUnit)); len(hits) > 0 {
			t.Fatalf("the daemon's sandbox refused it:\n  %s", strings.Join(hits, "\n  "))
		}
		if time.Now().After(deadline) {
			t.Fatalf("the daemon did not switch to its certificate within 60s:\n%s", m.Journal(daemonUnit))
		}
		time.Sleep(200 * time.Millisecond)
	}
	fi, err := os.Stat(store.Path())
	if err != nil {
		t.Fatalf("no stored certificate: %v\n%s", err, m.Journal(daemonUnit))
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("stored certificate and key: mode %v, want 0600", fi.Mode().Perm())
	}
	if pair, err := store.Load(); err != nil || pair.Cert.Subject.CommonName != identity.AgentUserName(machine) {
		t.Errorf("stored certificate: %v (err %v), want one for %s", pair, err, identity.AgentUserName(machine))
	}
	if s := m.UnitState(daemonUnit); s.ActiveState != "active" {
		t.Errorf("%s is %s after switching credentials, want active", daemonUnit, s)
	}
	assertNoSandboxDenials(t, m, daemonUnit)
}

// approveAgentCSR approves, as the cluster-side approver does, the
// machine's daemon's CSRs that wait for a decision, once there is one.
// Every pending one: a host reset or power-cut in the test sent one per
// daemon that ran, and only the newest daemon's is still watched.
func approveAgentCSR(t *testing.T, env *kubeEnv, m *harness.Machine, machine string) {
	t.Helper()
	// The daemon asks once it runs: after a reprovision or a reset that
	// is after a bootstrap and a hand-over, minutes on a loaded host.
	const within = 4 * time.Minute
	begin := time.Now()
	for approvePendingAgentCSRs(t, env, machine) == 0 {
		if time.Since(begin) > within {
			jobs, _ := m.Systemctl("list-jobs")
			t.Fatalf("the daemon sent no CSR within %v:\n%s\n%s\njobs:\n%s", within, m.UnitState(daemonUnit), m.Journal(daemonUnit), jobs)
		}
		time.Sleep(200 * time.Millisecond)
	}
	logWait(t, begin, "the daemon's CSR")
}

// approvePendingAgentCSRs approves the machine's daemon's CSRs that have
// no decision yet and returns how many it approved.
func approvePendingAgentCSRs(t *testing.T, env *kubeEnv, machine string) int {
	t.Helper()
	prefix := "unbounded-agent-" + machine + "-"
	l, err := env.kube.CertificatesV1().CertificateSigningRequests().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, c := range l.Items {
		if !strings.HasPrefix(c.Name, prefix) || len(c.Status.Conditions) > 0 {
			continue
		}
		env.ApproveCSR(t, c.Name)
		t.Cleanup(func() {
			env.kube.CertificatesV1().CertificateSigningRequests().Delete(context.Background(), c.Name, metav1.DeleteOptions{})
		})
		n++
	}
	return n
}

func readFile(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
