package daemon

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/version"
)

// The Machine's spec.agent asks for an upgrade once per spec: not for the
// running version, not without a package URL and SHA-256, not while an
// upgrade runs or its failure is unreported, and not again after one for
// this generation of the Machine failed.
func TestSpecAgentAsksForOneUpgradePerSpec(t *testing.T) {
	sum := "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	newDaemon := func(agent *v1alpha3.AgentSpec, conds ...metav1.Condition) *daemon {
		p := hostpaths.New(t.TempDir())
		m := &v1alpha3.Machine{ObjectMeta: metav1.ObjectMeta{Name: "m", Generation: 4}, Spec: v1alpha3.MachineSpec{Agent: agent}}
		m.Status.Conditions = conds
		return &daemon{p: p, machineObj: m, handled: map[string]bool{}, log: slog.New(slog.DiscardHandler)}
	}
	other := &v1alpha3.AgentSpec{Version: "9.9.9", URL: "https://127.0.0.1:1/a.deb", SHA256: sum}

	if j := newDaemon(nil).agentUpgradeJob(); j != nil {
		t.Errorf("no spec.agent: %+v", j)
	}
	if j := newDaemon(&v1alpha3.AgentSpec{Version: version.Version, URL: other.URL, SHA256: sum}).agentUpgradeJob(); j != nil {
		t.Errorf("the running version: %+v", j)
	}
	d := newDaemon(&v1alpha3.AgentSpec{Version: "9.9.9"})
	if j := d.agentUpgradeJob(); j != nil || len(d.handled) != 1 {
		t.Errorf("no URL and SHA-256: %+v, handled %v (want nil, and said once)", j, d.handled)
	}
	j := newDaemon(other).agentUpgradeJob()
	if j == nil || j.typ != v1alpha3.OperationAgentUpgrade || j.params["version"] != "9.9.9" || j.params["url"] != other.URL || j.params["sha256"] != sum {
		t.Fatalf("another version: %+v", j)
	}

	d = newDaemon(other)
	writeFile(t, d.p.Journal("upgrade"), "{}")
	if j := d.agentUpgradeJob(); j != nil {
		t.Errorf("while an upgrade's journal exists: %+v", j)
	}
	d = newDaemon(other)
	writeFile(t, d.p.UpgradeFailed(), `{"step":"verify","message":"checksum mismatch"}`)
	if j := d.agentUpgradeJob(); j != nil {
		t.Errorf("with an unreported failure: %+v", j)
	}
	failed := metav1.Condition{Type: v1alpha3.ConditionAgentUpgraded, Status: metav1.ConditionFalse, Reason: "RolledBack", ObservedGeneration: 4}
	if j := newDaemon(other, failed).agentUpgradeJob(); j != nil {
		t.Errorf("after a failed upgrade of this generation: %+v", j)
	}
	failed.ObservedGeneration = 3
	if j := newDaemon(other, failed).agentUpgradeJob(); j == nil {
		t.Error("after a failed upgrade of an earlier generation (the spec changed since): no job")
	}
}

func writeFile(t *testing.T, file, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(file), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}
