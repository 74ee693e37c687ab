package daemon

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/report"
	"unbounded-cloud.io/agent/lib/version"
	"unbounded-cloud.io/agent/tests/fixtures"
)

// A host whose certificate is not issued yet (no approver has approved
// its CSR) runs its daemon on the bootstrap token: it reports what the
// token may (the agent version), says once that the certificate is
// pending, and does not try the writes the cluster refuses the token
// (isolation, slot: the admission policy's [bootstrap-status] rule).
func TestDaemonOnTheBootstrapTokenReportsOnlyWhatTheTokenMayAndSaysOnceWhy(t *testing.T) {
	env := getEnv(t)
	machine := env.newMachine(t)
	p := tokenHost(t, env, machine)
	var logs, status fixtures.Buffer
	fake := newFakeSystemd()
	host := fake.host()
	host.Notify = func(s string) error { _, err := status.Write([]byte(s + "\n")); return err }
	d := startDaemon(t, Options{Paths: p, Host: host, PollInterval: 20 * time.Millisecond, NodeGoneGrace: time.Hour,
		Log: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})

	var m *v1alpha3.Machine
	eventually(t, 20*time.Second, "the agent version reported with the token", func() bool {
		var err error
		m, err = env.ops.machines.Get(context.Background(), machine)
		return err == nil && m.Status.Agent != nil && m.Status.Agent.Version == version.Version
	})
	// Long enough for a refused write and its 30 s retry to show up in
	// the log if the daemon made one.
	time.Sleep(2 * time.Second)
	if err := d.stop(t); err != nil {
		t.Fatalf("daemon: %v", err)
	}
	out := logs.String()
	if m.Status.Isolation != nil || m.Status.NodeName != "" {
		t.Errorf("Machine status %+v: the token may not write isolation or the Node name", m.Status)
	}
	if strings.Contains(out, "cannot report the Machine status") || strings.Contains(out, "bootstrap-status") {
		t.Errorf("the daemon tried a write the token may not make:\n%s", out)
	}
	if n := strings.Count(out, "until this host's client certificate is issued"); n != 1 {
		t.Errorf("the pending certificate was said %d times, want once:\n%s", n, out)
	}
	if st := status.String(); !strings.Contains(st, "STATUS=watching Machine "+machine+" (client certificate pending") {
		t.Errorf("sd_notify %q does not say the certificate is pending", st)
	}
}

// A power cut between first boot's record and its report leaves the
// Machine Running with Bootstrapped=False on a host that runs its node:
// the daemon, which the next boot starts, makes the report the bootstrap
// owed.
func TestDaemonMakesTheBootstrapsSucceededReportALostOneOwed(t *testing.T) {
	f := newFixture(t)
	m, err := f.env.ops.machines.Get(context.Background(), f.machine)
	if err != nil {
		t.Fatal(err)
	}
	report.SetBootstrap(m, v1alpha3.BootstrapRunning, "Running", "bootstrap running", time.Now())
	if _, err := f.env.ops.machines.UpdateStatus(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	startDaemon(t, f.opts)
	eventually(t, 20*time.Second, "the Machine reports the bootstrap Succeeded", func() bool {
		m, err := f.env.ops.machines.Get(context.Background(), f.machine)
		return err == nil && m.Status.Bootstrap != nil && m.Status.Bootstrap.State == v1alpha3.BootstrapSucceeded &&
			meta.IsStatusConditionTrue(m.Status.Conditions, v1alpha3.ConditionBootstrapped) && m.Status.Phase == v1alpha3.MachineReady
	})
}
