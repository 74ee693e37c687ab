package system_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/uuid"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/fleet"
)

// joinHost runs `kubectl unbounded join` for machine (lib/fleet.Join, as
// the plugin runs it) against the test control plane, with the API
// server and CA the host reaches, and waits until the API server's
// authenticator knows the token (its Secret informer lags the write).
func joinHost(t *testing.T, env *kubeEnv, machine, mode, image, version string) *fleet.Joined {
	t.Helper()
	ctx := context.Background()
	if err := fleet.CheckInstalled(ctx, env.kube.Discovery(), env.kube); err != nil {
		t.Fatalf("the test control plane lacks the manifests: %v", err)
	}
	j, err := fleet.Join(ctx, env.kube, fleet.JoinOptions{Machine: machine, TTL: time.Hour, Mode: mode, Image: image,
		APIServer: env.Host(), KubernetesVersion: version, CA: env.CAPEM(t)})
	if err != nil {
		t.Fatalf("join %s: %v", machine, err)
	}
	t.Cleanup(func() { fleet.Revoke(context.Background(), env.kube, machine) })
	waitUntil(t, 30*time.Second, "join's token authenticates", func(ctx context.Context) (bool, error) {
		ok, _, _, err := env.TokenAuthenticated(ctx, j.Token)
		return ok, err
	})
	return j
}

// A host given exactly the three files `kubectl unbounded join` wrote
// (its agent.toml, CA and token; the test's mirror and versions in a
// drop-in beside them) becomes a Ready Node; once its token is revoked
// (`join --revoke`), the fence of this host, launched for an allocation,
// refuses the node's next start (exit 77, BootstrapTokenRejected: the
// daemon has no certificate here, no approver signed its CSR) and the
// node stays down.
func TestJoinedHostBootsFromJoinsFilesAndARevokedTokenKeepsItsNodeDown(t *testing.T) {
	defer scenario(t)()
	// Launched for an allocation: the fence checks the host's credential
	// only then (a host without one starts whatever its token says).
	uid := string(uuid.NewUUID())
	f := newFirstBoot(t, firstBootOptions{mode: "none", join: true, extra: fmt.Sprintf("\n[allocation]\nuid = %q\n\n[fence]\nretry-budget = \"5s\"\n", uid)})
	logJournalsOnFailure(t, f)
	allocatedHost(t, f, uid)
	for _, want := range []struct{ path, data string }{
		{fleet.HostConfig, string(f.joined.AgentTOML)},
		{fleet.HostToken, f.joined.Token + "\n"},
		{fleet.HostCA, string(f.joined.CA)},
	} {
		if got, err := f.m.ReadFile(want.path); err != nil || string(got) != want.data {
			t.Fatalf("%s on the host is not join's (%v)", want.path, err)
		}
	}
	begin := time.Now()
	f.m.Start()
	f.wantBootstrapped(t, "none", kubeletUnit)
	t.Logf("first boot from join's files: %v", time.Since(begin).Round(time.Millisecond))
	if t.Failed() {
		return
	}

	// The operator's way into a mode none node: the running version's
	// tools on PATH, the host's units' journal.
	if out, err := f.m.Run("unbounded", "exec", "--", "kubelet", "--version"); err != nil || !strings.Contains(out, "Kubernetes v") {
		t.Errorf("unbounded exec -- kubelet --version: %v\n%s", err, out)
	}
	if out, err := f.m.Run("unbounded", "logs", "containerd", "-n", "20"); err != nil || !strings.Contains(out, "containerd") {
		t.Errorf("unbounded logs containerd: %v\n%s", err, out)
	}

	if n, err := fleet.Revoke(context.Background(), f.env.kube, f.name); err != nil || n != 1 {
		t.Fatalf("revoke: %d %v", n, err)
	}
	waitUntil(t, 30*time.Second, "the revoked token no longer authenticates", func(ctx context.Context) (bool, error) {
		ok, _, _, err := f.env.TokenAuthenticated(ctx, f.joined.Token)
		return !ok, err
	})
	if out, err := f.m.Systemctl("start", restartUnit); err == nil {
		t.Errorf("a restart with a revoked token succeeded:\n%s\n%s", out, f.m.Journal(restartUnit))
	}
	if p := showProps(t, f.m, restartUnit, "ExecMainStatus"); p["ExecMainStatus"] != "77" {
		t.Errorf("restart with a revoked token: %v, want exit 77\n%s", p, f.m.Journal(restartUnit))
	}
	if r := fenceRecord(t, f.m); r == nil || r.Reason != v1alpha3.ReasonBootstrapTokenRejected {
		t.Errorf("fence record after the revoke: %+v, want %s", r, v1alpha3.ReasonBootstrapTokenRejected)
	}
	if a := isActive(f.m, kubeletUnit); a == "active" || a == "activating" {
		t.Errorf("%s is %s after the fence refused", kubeletUnit, a)
	}
	if j := f.m.Journal(fenceUnit); strings.Contains(j, f.joined.Token) {
		t.Error("the fence's journal holds the bootstrap token")
	}
}
