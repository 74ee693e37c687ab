package fence

// Main with a temporary root holding a real /etc/unbounded/agent.toml,
// against the real API server: the exit codes the unit sees.

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"

	"unbounded-cloud.io/agent/lib/api/identity"
	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/exitcode"
	"unbounded-cloud.io/agent/lib/fence"
	"unbounded-cloud.io/agent/lib/fence/record"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/kube"
	"unbounded-cloud.io/agent/lib/kube/clustertest"
	"unbounded-cloud.io/agent/tests/fixtures"
)

// writeHost writes the config, CA and token of a host under a new root.
func writeHost(t testing.TB, apiServer, caPEM, token, machine, uid string) string {
	t.Helper()
	root := t.TempDir()
	p := hostpaths.New(root)
	files := map[string]struct {
		data string
		mode os.FileMode
	}{
		"/etc/unbounded/ca.crt":          {caPEM, 0o644},
		"/etc/unbounded/bootstrap-token": {token + "\n", 0o600},
		hostpaths.ConfigFileHost: {fmt.Sprintf(`machine = %q
mode = "none"
[cluster]
api-server = %q
kubernetes-version = "1.36.3"
[allocation]
uid = %q
[fence]
retry-budget = "2s"
`, machine, apiServer, uid), 0o644},
	}
	for path, f := range files {
		full := p.Join(path)
		os.MkdirAll(filepath.Dir(full), 0o755)
		if err := os.WriteFile(full, []byte(f.data), f.mode); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestMainExitsZeroForABoundMachineAnd77OnceItIsFenced(t *testing.T) {
	env := clustertest.Get(t)
	ctx := context.Background()
	machine, uid := clustertest.UniqueName("main"), clustertest.NewUID()
	m := &v1alpha3.Machine{Spec: v1alpha3.MachineSpec{Allocation: &v1alpha3.AllocationRef{Name: "a", UID: uid}}}
	m.Name = machine
	ms := env.Machines(t)
	if _, err := ms.Create(ctx, m); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { env.DeleteMachine(machine) })
	token, _ := env.BootstrapToken(t, machine)
	ca, _ := os.ReadFile(env.CAFile())
	root := writeHost(t, env.Host(), string(ca), token, machine, uid)
	c, k := env.MintClientCert(t, identity.AgentUserName(machine), []string{identity.AgentGroup}, time.Now().Add(-time.Minute), time.Now().Add(time.Hour))
	p := hostpaths.New(root)
	if err := (kube.CertStore{Dir: p.PKIDir()}).Save(c, k); err != nil {
		t.Fatal(err)
	}
	// As on a booted host, where tmpfiles created it: the record is
	// written only into an existing runtime directory.
	if err := os.MkdirAll(p.RunDir(), 0o755); err != nil {
		t.Fatal(err)
	}
	wantRecord := func(outcome record.Outcome, reason string) {
		t.Helper()
		r, err := record.Read(p)
		if err != nil || r == nil {
			t.Fatalf("record: %v %v", r, err)
		}
		if r.Outcome != outcome || r.Reason != reason || r.Via != string(fence.ViaCertificate) || r.AllocationUID != uid {
			t.Errorf("record %+v, want outcome %s, reason %q, via %s, allocation %s", r, outcome, reason, fence.ViaCertificate, uid)
		}
	}

	if code := Main([]string{"--root", root}); code != exitcode.OK {
		t.Fatalf("bound machine: exit %d, want 0", code)
	}
	wantRecord(record.Allowed, "")

	cur, _ := ms.Get(ctx, machine)
	cur.Spec.Allocation.Fenced = true
	if _, err := ms.Update(ctx, cur); err != nil {
		t.Fatal(err)
	}
	if code := Main([]string{"--root", root}); code != exitcode.Refused {
		t.Fatalf("fenced machine: exit %d, want 77", code)
	}
	wantRecord(record.Refused, v1alpha3.ReasonAllocationFenced)
	cur, _ = ms.Get(ctx, machine)
	if !meta.IsStatusConditionTrue(cur.Status.Conditions, v1alpha3.ConditionAllocationLaunchRefused) {
		t.Errorf("conditions %+v, want AllocationLaunchRefused True", cur.Status.Conditions)
	}
}

func TestMainAllowsWithoutAllocationWithoutTouchingTheNetwork(t *testing.T) {
	// The config's API server is a loopback listener that records every
	// connection: the fence must not open one.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	conns := make(chan net.Conn, 256)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns <- c
		}
	}()
	root := writeHost(t, "https://"+ln.Addr().String(), string(fixtures.CA(t)), "abcdef.0123456789abcdef", "w1", "")
	if code := Main([]string{"--root", root}); code != exitcode.OK {
		t.Fatalf("exit %d, want 0", code)
	}
	// A connection of our own, once accepted, shows that every earlier
	// one has been accepted too (the listener accepts in order): no wait
	// for a quiet period.
	probe, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer probe.Close()
	for c := range conns {
		c.Close()
		if c.RemoteAddr().String() == probe.LocalAddr().String() {
			break
		}
		t.Errorf("the fence connected to the API server (from %s): with no allocation it must not ask the network", c.RemoteAddr())
	}
}

func TestMainFailsClosedWithoutConfig(t *testing.T) {
	if code := Main([]string{"--root", t.TempDir()}); code != exitcode.ConfigInvalid {
		t.Fatalf("exit %d, want 78 (no config: the node must not start)", code)
	}
}

// The record names the credential of the deciding read for every outcome
// that a read decided, and none for an interrupted check.
func TestRecordOfNamesTheCredentialThatDecided(t *testing.T) {
	for _, c := range []struct {
		err     error
		via     fence.Credential
		outcome record.Outcome
	}{
		{nil, fence.ViaCertificate, record.Allowed},
		{&fence.Refusal{Reason: "BootstrapTokenRejected"}, fence.ViaToken, record.Refused},
		{&fence.Refusal{Reason: "ClusterUnreachable", NoAnswer: true}, fence.ViaCertificate, record.NoAnswer},
		{fence.ErrInterrupted, "", record.Interrupted},
	} {
		r := recordOf(c.err, "uid-1", c.via)
		if r.Outcome != c.outcome || r.Via != string(c.via) || r.AllocationUID != "uid-1" {
			t.Errorf("recordOf(%v, %q) = %+v, want outcome %s via %q", c.err, c.via, r, c.outcome, c.via)
		}
	}
}
