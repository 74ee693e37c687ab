package system_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/state"
	"unbounded-cloud.io/agent/tests/system/harness"
)

// The real unbounded-bootstrap.service of the package, at boot, under
// systemd. These scenarios need no node stack: a full first boot to a
// Ready Node needs the node-stack fixtures (artifact mirror, registry,
// node image, kubelet) and is the lead's scenario on top of them.

const bootstrapUnit = "unbounded-bootstrap.service"

// waitFinished waits (bounded) until the oneshot unit has run and ended,
// and returns its properties.
func waitFinished(t *testing.T, m *harness.Machine, unit string, props ...string) map[string]string {
	t.Helper()
	props = append(props, "ActiveState", "InvocationID")
	deadline := time.Now().Add(90 * time.Second)
	for {
		p := showProps(t, m, unit, props...)
		if p["InvocationID"] != "" && (p["ActiveState"] == "inactive" || p["ActiveState"] == "failed") {
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not finish within 90 s: %v\n%s", unit, p, m.Journal(unit))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// hostRootFiles lists what is under /var/lib/unbounded in the machine.
func hostRootFiles(t *testing.T, m *harness.Machine) []string {
	t.Helper()
	root := filepath.Join(m.Root(), hostpaths.HostRootHost)
	var out []string
	filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err == nil && p != root {
			rel, _ := filepath.Rel(root, p)
			out = append(out, rel)
		}
		return nil
	})
	return out
}

func TestBootstrapWithAnInvalidConfigExits78AtBootWithoutRetryAndChangesNothing(t *testing.T) {
	defer scenario(t)()
	m := harness.New(t, harness.Options{Package: true})
	writeValidConfig(t, m)
	m.WriteFile(hostpaths.ConfigDropinDirHost+"/50-typo.toml", []byte("[cluster]\napi-servr = \"https://10.0.0.2:6443\"\n"), 0o644)
	before := hostRootFiles(t, m)
	m.Start()

	p := waitFinished(t, m, bootstrapUnit, "ExecMainStatus", "NRestarts", "Result")
	if p["ExecMainStatus"] != "78" || p["NRestarts"] != "0" {
		t.Errorf("%s: %v, want exit status 78 and no restart\n%s", bootstrapUnit, p, m.Journal(bootstrapUnit))
	}
	j := m.Journal(bootstrapUnit)
	if !strings.Contains(j, "50-typo.toml") || !strings.Contains(j, "api-servr") {
		t.Errorf("the journal does not name the file and the key:\n%s", j)
	}
	if after := hostRootFiles(t, m); !slices.Equal(before, after) {
		t.Errorf("/var/lib/unbounded changed: %q -> %q", before, after)
	}
	assertNoSandboxDenials(t, m, bootstrapUnit)
}

// A host with a separate /var: the generator runs before /var is mounted
// and sees a fresh host with a config, so it pulls in bootstrap; by the
// time bootstrap runs (RequiresMountsFor=/var/lib/unbounded), the applied
// config is there. Bootstrap hands the node over instead of bootstrapping
// again. The late mount is played by an ExecStartPre= that puts the host
// root's state in place just before bootstrap runs.
func TestBootstrapOnABootstrappedHostHandsTheNodeOverInsteadOfBootstrappingAgain(t *testing.T) {
	defer scenario(t)()
	m := harness.New(t, harness.Options{Package: true})
	writeValidConfig(t, m)
	// Launched for an allocation: the fence has to ask the cluster, which
	// this machine (private network) cannot reach.
	writeAllocation(t, m, "5f0c8a2e-3b1d-4c6e-9a7f-2d8e1b4c6a90")
	// The state of the bootstrapped host, outside /var/lib/unbounded: the
	// generator must not see it at boot.
	err := state.WriteApplied(hostpaths.New(filepath.Join(m.Root(), "root/late")), &state.AppliedConfig{
		Slot: "kube1", Mode: "nspawn", Machine: "site-w1", KubernetesVersion: "1.36.3", AppliedAt: time.Now().UTC()})
	if err != nil {
		t.Fatal(err)
	}
	m.WriteFile("/etc/systemd/system/"+bootstrapUnit+".d/50-late-var.conf", []byte(`[Service]
# The separate /var of the scenario, mounted after the generators ran.
ExecStartPre=+/bin/cp -a /root/late/var/lib/unbounded/. /var/lib/unbounded/
`), 0o644)
	m.Start()

	p := waitFinished(t, m, bootstrapUnit, "ExecMainStatus", "NRestarts")
	if p["ExecMainStatus"] != "0" {
		t.Fatalf("%s: %v\n%s", bootstrapUnit, p, m.Journal(bootstrapUnit))
	}
	j := m.Journal(bootstrapUnit)
	if !strings.Contains(j, "already bootstrapped") {
		t.Errorf("bootstrap did not recognise the bootstrapped host:\n%s", j)
	}
	for _, phase := range []string{"phase hostprep", "phase artifacts", "phase slot"} {
		if strings.Contains(j, phase) {
			t.Errorf("bootstrap ran %q on a bootstrapped host:\n%s", phase, j)
		}
	}
	// Its reload made the generator wire the node: the node target and
	// the daemon are wanted now, the slot's unit is behind the fence.
	if w := m.Wants("multi-user.target"); !slices.Contains(w, "unbounded-node.target") || !slices.Contains(w, "unbounded-daemon.service") {
		t.Errorf("after the hand-over multi-user.target Wants = %v", w)
	}
	wantFencedUnit(t, m, "unbounded-mode-nspawn.target", "systemd-nspawn@kube1.service")
	// The node target's start was queued and ran once bootstrap had
	// exited: the fence ran for it (and, with no cluster reachable from
	// this machine, refused, so the node stays down: fail closed).
	f := waitFinished(t, m, fenceUnit, "ExecMainStatus")
	if f["ExecMainStatus"] == "0" {
		t.Errorf("the fence allowed without a cluster: %v", f)
	}
	if a := isActive(m, "systemd-nspawn@kube1.service"); a == "active" || a == "activating" {
		t.Errorf("node unit %s after a refused fence", a)
	}
	// The daemon was started, by bootstrap: the boot transaction did not
	// hold it (the generator linked it only at bootstrap's reload).
	if d := showProps(t, m, "unbounded-daemon.service", "InvocationID", "ActiveState"); d["InvocationID"] == "" {
		t.Errorf("daemon never started: %v", d)
	}
	if files := hostRootFiles(t, m); slices.Contains(files, "ownership") || slices.Contains(files, "journal/bootstrap.json") {
		t.Errorf("bootstrap left its lock or journal: %q", files)
	}
	assertNoSandboxDenials(t, m, bootstrapUnit)
}
