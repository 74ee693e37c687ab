package fence

import (
	"context"
	"os"
	"os/exec"
	"testing"
	"time"

	"unbounded-cloud.io/agent/lib/api/identity"
	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/kube"
	"unbounded-cloud.io/agent/lib/kube/clustertest"
)

// TestMain lets a benchmark run Main in a fresh process of this test
// binary, as systemd runs the one-shot: UNBOUNDED_FENCE_MAIN_ROOT=DIR makes
// the binary run the fence with --root DIR and exit with its code.
func TestMain(m *testing.M) {
	if root := os.Getenv("UNBOUNDED_FENCE_MAIN_ROOT"); root != "" {
		os.Exit(Main([]string{"--root", root}))
	}
	os.Exit(m.Run())
}

// BenchmarkFenceAllowedProcess is the allowed path as a node start pays
// it: a new process, config load, certificate from disk, a new TLS
// connection and one GET of the Machine (goal < 100 ms).
func BenchmarkFenceAllowedProcess(b *testing.B) {
	env := clustertest.Get(b)
	machine, uid := clustertest.UniqueName("bench"), clustertest.NewUID()
	m := &v1alpha3.Machine{Spec: v1alpha3.MachineSpec{Allocation: &v1alpha3.AllocationRef{Name: "a", UID: uid}}}
	m.Name = machine
	if _, err := env.Machines(b).Create(context.Background(), m); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { env.DeleteMachine(machine) })
	token, _ := env.BootstrapToken(b, machine)
	ca, _ := os.ReadFile(env.CAFile())
	root := writeHost(b, env.Host(), string(ca), token, machine, uid)
	c, k := env.MintClientCert(b, identity.AgentUserName(machine), []string{identity.AgentGroup}, time.Now().Add(-time.Minute), time.Now().Add(time.Hour))
	if err := (kube.CertStore{Dir: hostpaths.New(root).PKIDir()}).Save(c, k); err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	for b.Loop() {
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), "UNBOUNDED_FENCE_MAIN_ROOT="+root)
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("fence process: %v\n%s", err, out)
		}
	}
	b.ReportMetric(float64(time.Since(start).Microseconds())/1000/float64(b.N), "ms/check")
}
