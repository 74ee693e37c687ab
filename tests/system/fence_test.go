package system_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/uuid"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/kube"
	"unbounded-cloud.io/agent/lib/state"
	"unbounded-cloud.io/agent/tests/system/harness"
)

// The fence's system scenario: a host of mode none whose allocation is
// fenced boots. The real generator wires the node units behind the real
// unbounded-fence.service (from this tree, running the multicall binary
// built from this tree) which asks the real API server of tests/kube on
// the host's loopback. The node units are stand-ins (long-running sleeps
// under the none mode's unit names): what is tested is whether systemd
// starts them, not what they run.

func TestFencedAllocationKeepsTheNodeDownAtBootUntilUnfenced(t *testing.T) {
	env := requireKube(t)
	harness.Require(t, true)
	bin := buildAgent(t)
	ctx := context.Background()

	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	machine := "sys-fence-" + hex.EncodeToString(rnd[:])
	uid := string(uuid.NewUUID())
	in := &v1alpha3.Machine{
		ObjectMeta: metav1.ObjectMeta{Name: machine},
		Spec: v1alpha3.MachineSpec{Allocation: &v1alpha3.AllocationRef{
			Name: "alloc-" + machine, UID: uid, Fenced: true}},
	}
	if err := env.api.Post().Resource(v1alpha3.ResourceMachines).Body(in).Do(ctx).Error(); err != nil {
		t.Fatalf("create Machine: %v", err)
	}
	t.Cleanup(func() {
		env.api.Delete().Resource(v1alpha3.ResourceMachines).Name(machine).Do(context.Background())
	})

	binData, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	fenceData, err := os.ReadFile(filepath.Join("..", "..", "units", fenceUnit))
	if err != nil {
		t.Fatal(err)
	}
	files := []harness.File{
		// This tree's fence and binary, over whatever the package holds.
		{Path: hostpaths.LibexecDirHost + "/unbounded-agent", Data: binData, Mode: 0o755},
		{Path: hostpaths.UnitDirHost + "/" + fenceUnit, Data: fenceData, Mode: 0o644},
		{Path: hostpaths.ConfigFileHost, Data: []byte(fmt.Sprintf(`machine = %q
mode = "none"

[cluster]
api-server = %q
ca-file = "/etc/unbounded/ca.crt"
bootstrap-token-file = "/etc/unbounded/bootstrap-token"
kubernetes-version = "1.36.3"

[allocation]
uid = %q

[fence]
retry-budget = "5s"
`, machine, env.admin.Host, uid)), Mode: 0o644},
		{Path: "/etc/unbounded/ca.crt", Data: env.caPEM, Mode: 0o644},
		// Not used while the certificate is valid; the config requires it.
		{Path: "/etc/unbounded/bootstrap-token", Data: []byte("abcdef.0123456789abcdef\n"), Mode: 0o600},
	}
	for _, u := range noneUnits {
		files = append(files, harness.File{Path: "/etc/systemd/system/" + u, Data: []byte(`[Unit]
Description=Stand-in for ` + u + ` (fence system test)
[Service]
ExecStart=/bin/sleep infinity
`), Mode: 0o644})
	}
	m := harness.New(t, harness.Options{Package: true, HostNetwork: true, Files: files})
	p := hostpaths.New(m.Root())
	os.Remove(p.Libexec("fence"))
	if err := os.Symlink("unbounded-agent", p.Libexec("fence")); err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM := env.agentCert(t, machine)
	if err := (kube.CertStore{Dir: p.PKIDir()}).Save(certPEM, keyPEM); err != nil {
		t.Fatal(err)
	}
	if err := state.WriteApplied(p, &state.AppliedConfig{Slot: "kube1", Mode: "none", Machine: machine,
		KubernetesVersion: "1.36.3", AppliedAt: time.Now().UTC()}); err != nil {
		t.Fatal(err)
	}

	m.Start()

	// At boot: the generator pulled the node in behind the fence, the
	// fence refused (77), and systemd started no node unit.
	props := showProps(t, m, fenceUnit, "ActiveState", "Result", "ExecMainStatus")
	if props["ExecMainStatus"] != "77" || props["ActiveState"] != "failed" {
		t.Errorf("%s after boot: %v, want failed with exit status 77\n%s", fenceUnit, props, m.Journal(fenceUnit))
	}
	for _, u := range append([]string{"unbounded-node.target"}, noneUnits...) {
		if a := isActive(m, u); a == "active" || a == "activating" {
			t.Errorf("after boot with a fenced allocation: %s is %s, want not started", u, a)
		}
	}
	if j := m.Journal(fenceUnit); !strings.Contains(j, "reason="+v1alpha3.ReasonAllocationFenced) {
		t.Errorf("fence journal does not name the reason:\n%s", j)
	}
	cond := machineCondition(t, env, machine)
	if cond == nil || cond.Status != metav1.ConditionTrue || cond.Reason != v1alpha3.ReasonAllocationFenced {
		t.Errorf("AllocationLaunchRefused after boot = %+v, want True/AllocationFenced", cond)
	}

	// The cluster side unfences; the operator starts the node again.
	cur := &v1alpha3.Machine{}
	if err := env.api.Get().Resource(v1alpha3.ResourceMachines).Name(machine).Do(ctx).Into(cur); err != nil {
		t.Fatal(err)
	}
	cur.Spec.Allocation.Fenced = false
	if err := env.api.Put().Resource(v1alpha3.ResourceMachines).Name(machine).Body(cur).Do(ctx).Error(); err != nil {
		t.Fatalf("unfence: %v", err)
	}
	if out, err := m.Systemctl("start", "unbounded-node.target"); err != nil {
		t.Fatalf("systemctl start unbounded-node.target after unfencing: %v\n%s\n%s", err, out, m.Journal(fenceUnit))
	}
	for _, u := range append([]string{"unbounded-node.target"}, noneUnits...) {
		if a := isActive(m, u); a != "active" {
			t.Errorf("after unfencing: %s is %s, want active", u, a)
		}
	}
	// Oneshot without RemainAfterExit: the passed fence is inactive again,
	// ready to run at the next node start.
	if s := m.UnitState(fenceUnit); s.ActiveState != "inactive" || s.Result != "success" {
		t.Errorf("%s after the allowed start = %s, want inactive with result success", fenceUnit, s)
	}
	cond = machineCondition(t, env, machine)
	if cond == nil || cond.Status != metav1.ConditionFalse || cond.Reason != v1alpha3.ReasonAllowed {
		t.Errorf("AllocationLaunchRefused after the allowed start = %+v, want False/Allowed", cond)
	}
	// Both checks ran in the unit's sandbox (sandbox_test.go).
	assertNoSandboxDenials(t, m, fenceUnit)
}

func machineCondition(t *testing.T, env *kubeEnv, machine string) *metav1.Condition {
	t.Helper()
	got := &v1alpha3.Machine{}
	if err := env.api.Get().Resource(v1alpha3.ResourceMachines).Name(machine).Do(context.Background()).Into(got); err != nil {
		t.Fatal(err)
	}
	return meta.FindStatusCondition(got.Status.Conditions, v1alpha3.ConditionAllocationLaunchRefused)
}
