package system_test

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/config"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/state"
	"unbounded-cloud.io/agent/lib/unitnames"
	"unbounded-cloud.io/agent/tests/system/harness"
)

// The older agent (Azure/unbounded's cmd/agent) is not run here: its
// binary needs its own control plane's objects and downloads. Its host is
// built the cheapest honest way instead: a host this agent first-booted
// (a real node in kube1: real kubelet, containerd, pods) is rewritten into
// the older layout while its node keeps running. This agent's records
// and credentials go; the older agent's applied config (its format, its
// bare-hex sidecar, the bootstrap token inline), its other state, its
// binary with the links of its self-upgrade, its daemon's unit and the
// recovery unit and script that roll that daemon back, all enabled as it
// enabled them, with the machine enabled by `machinectl enable`, take
// their place. The older daemon is a stand-in that idles and fails when
// stopped, as a crashing one would: its OnFailure= recovery restarts it,
// so an adoption that let the rollback run would show it.

// olderDaemonScript stands in for the older agent's binary.
const olderDaemonScript = `#!/bin/sh
# Stand-in for the older agent's binary (Azure/unbounded cmd/agent), put
# here by the adoption scenario of the system tests.
case "$1" in
daemon)
	trap 'echo "older daemon: stopped, failing" >&2; exit 1' TERM
	echo "older daemon: running" >&2
	while :; do sleep 1; done
	;;
esac
exit 0
`

// olderRecoveryScript stands in for the older agent's recovery: roll the
// daemon back to its last good binary and restart it.
const olderRecoveryScript = `#!/bin/sh
echo "older recovery: rolling the daemon back and restarting it" >&2
ln -sfn "$(readlink -f /usr/local/bin/unbounded-agent-last-good)" /usr/local/bin/unbounded-agent-current
systemctl reset-failed unbounded-agent-daemon.service || true
systemctl restart unbounded-agent-daemon.service
`

// The older agent's units, with the settings its own carried: the daemon
// restarted always and rolled back on failure, WantedBy=multi-user.target.
const olderDaemonUnit = `[Unit]
Description=Unbounded Agent Daemon (the older agent's, a test stand-in)
After=network-online.target machines.target
Wants=network-online.target machines.target
OnFailure=unbounded-agent-daemon-recovery.service
StartLimitIntervalSec=60
StartLimitBurst=3

[Service]
Type=simple
ExecStart=/usr/local/bin/unbounded-agent-current daemon
Restart=always
RestartSec=10

[Install]
WantedBy=multi-user.target
`

const olderRecoveryUnit = `[Unit]
Description=Recover Unbounded Agent Daemon to last known good binary (the older agent's, a test stand-in)

[Service]
Type=oneshot
TimeoutStartSec=7min
ExecStart=/usr/local/bin/unbounded-agent-daemon-recovery.sh
`

// makeOlderAgentHost turns the first-booted host f, its node running,
// into a host the older agent installed (see above). It never touches the
// node machine.
func makeOlderAgentHost(t *testing.T, f *firstBoot) {
	t.Helper()
	cfg, err := config.Load(f.paths)
	if err != nil {
		t.Fatal(err)
	}
	// This agent's units stop (the node target and its mode target stop
	// without stopping the machine: nothing of it is PartOf= them).
	if out, err := f.m.Systemctl("stop", daemonUnit, "unbounded-health.timer", "unbounded-health.service", "unbounded-upgrade.path",
		"unbounded-lifecycle.service", unitnames.NodeTarget, unitnames.ModeTarget("nspawn")); err != nil {
		t.Fatalf("stop this agent's units: %v\n%s", err, out)
	}
	// Its records and credentials go: the applied config, the daemon's
	// certificate, the daemon's requests. What the node runs on stays
	// (the slot's containerd store is bound into the machine; the
	// artifact cache; the host preparation's record, so that the reset
	// at the end undoes what the first boot did).
	if err := state.RemoveApplied(f.paths, "kube1"); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{f.paths.PKIDir(), filepath.Dir(f.paths.Request("repave")), f.paths.JournalDir()} {
		if err := os.RemoveAll(d); err != nil {
			t.Fatal(err)
		}
	}
	ca, err := os.ReadFile(cfg.Resolve(cfg.Cluster.CAFile))
	if err != nil {
		t.Fatal(err)
	}
	token, err := os.ReadFile(cfg.Resolve(cfg.Cluster.BootstrapTokenFile))
	if err != nil {
		t.Fatal(err)
	}
	labels := cfg.Node.Labels
	if labels == nil {
		labels = map[string]string{}
	}
	older := map[string]any{
		"MachineName": f.name,
		"Cluster": map[string]any{
			"CaCertBase64": base64.StdEncoding.EncodeToString(ca),
			"ClusterDNS":   cfg.Cluster.ClusterDNS,
			"Version":      "v" + cfg.Cluster.KubernetesVersion,
		},
		"Kubelet": map[string]any{
			// The older agent's form: host:port, https implied.
			"ApiServer":          strings.TrimPrefix(cfg.Cluster.APIServer, "https://"),
			"BootstrapToken":     strings.TrimSpace(string(token)),
			"Labels":             labels,
			"RegisterWithTaints": append([]string{}, cfg.Node.Taints...),
		},
		"OCIImage": cfg.Nspawn.Image,
	}
	data, err := json.MarshalIndent(older, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	rec := hostpaths.LegacyStateDirHost + "/kube1-applied-config.json"
	f.m.WriteFile(rec, data, 0o600)
	f.m.WriteFile(rec+".sha256", []byte(hex.EncodeToString(sum[:])+"\n"), 0o600)
	f.m.WriteFile(hostpaths.LegacyStateDirHost+"/kube1-nspawn-lifecycle.json", []byte(`{"version":1,"machineName":"kube1","nvidiaRequired":false,"nvidia":{}}`), 0o600)
	f.m.WriteFile(hostpaths.LegacyBinaryHost, []byte(olderDaemonScript), 0o755)
	f.m.WriteFile(hostpaths.LegacyBinaryHost+"-blue", []byte(olderDaemonScript), 0o755)
	f.m.WriteFile(hostpaths.LegacyRecoveryScriptHost, []byte(olderRecoveryScript), 0o755)
	f.m.WriteFile(hostpaths.LegacyUnitHost, []byte(olderDaemonUnit), 0o644)
	f.m.WriteFile(hostpaths.LegacyRecoveryUnitHost, []byte(olderRecoveryUnit), 0o644)
	sh := `set -e
ln -sfn /usr/local/bin/unbounded-agent-blue /usr/local/bin/unbounded-agent-current
ln -sfn /usr/local/bin/unbounded-agent-blue /usr/local/bin/unbounded-agent-last-good
systemctl enable unbounded-agent-daemon.service
machinectl enable kube1
systemctl start unbounded-agent-daemon.service`
	if out, err := f.m.Run("sh", "-c", sh); err != nil {
		t.Fatalf("enable the older agent's units: %v\n%s", err, out)
	}
	for _, l := range []string{"/etc/systemd/system/multi-user.target.wants/" + unitnames.LegacyDaemon, "/etc/systemd/system/machines.target.wants/" + nspawnKube1} {
		if _, err := f.m.Readlink(l); err != nil {
			t.Fatalf("the older agent's enablement %s: %v", l, err)
		}
	}
	if p := showProps(t, f.m, unitnames.LegacyDaemon, "ActiveState"); p["ActiveState"] != "active" {
		t.Fatalf("the older daemon is %v", p)
	}
}

// olderNodePIDs are the node's processes, read without this agent (which
// has no record of the node on the older agent's host): the machine's,
// and its containerd's and kubelet's.
func olderNodePIDs(t *testing.T, f *firstBoot) string {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "machine %s", mainPID(t, f.m, nspawnKube1))
	for _, u := range []string{unitnames.MachineContainerd, unitnames.MachineKubelet} {
		out, err := f.m.Systemctl("-M", "kube1", "show", "-p", "MainPID", "--value", u)
		pid := strings.TrimSpace(out)
		if err != nil || pid == "" || pid == "0" {
			t.Fatalf("%s's main pid in the node: %q, %v", u, pid, err)
		}
		fmt.Fprintf(&b, ", %s %s", u, pid)
	}
	return b.String()
}

// statusJSON is what the scenario reads of `unbounded status --json`.
type statusJSON struct {
	State    string `json:"state"`
	NextBoot struct {
		Action string   `json:"action"`
		Units  []string `json:"units"`
	} `json:"next-boot"`
	Legacy struct {
		Detected bool           `json:"detected"`
		Adopted  *state.Adopted `json:"adopted"`
	} `json:"legacy"`
}

func readStatus(t *testing.T, f *firstBoot) statusJSON {
	t.Helper()
	out, err := f.m.Run("unbounded", "status", "--json")
	if err != nil {
		t.Fatalf("unbounded status --json: %v\n%s", err, out)
	}
	var s statusJSON
	if err := json.Unmarshal([]byte(out), &s); err != nil {
		t.Fatalf("unbounded status --json: %v\n%s", err, out)
	}
	return s
}

// TestAdoptOlderAgentsHostKeepsItsNodeThenRepavesAndResets: a host the
// older agent installed, its node running in kube1, gets this agent's
// package and boots (the package's daemon-reload runs the generator, and
// the boot's own transaction, multi-user.target, is started as the boot
// starts it): unbounded-lifecycle.service adopts the node before this
// agent's daemon starts. The node's machine, containerd and kubelet keep
// their processes; the older daemon and recovery units are stopped,
// disabled and gone (the older daemon fails as it stops, and no rollback
// restarts it); the state is under /var/lib/unbounded; `unbounded status`
// says "legacy root: adopted". The node is then this agent's: its daemon
// gets its certificate and repaves it by a MachineOperation into kube2,
// and `unbounded reset --yes` leaves nothing of either layout.
func TestAdoptOlderAgentsHostKeepsItsNodeThenRepavesAndResets(t *testing.T) {
	defer scenario(t)()
	f := newFirstBoot(t, firstBootOptions{})
	before := rootManifest(t, f.m.Root())
	ns := f.bootNode(t)
	if t.Failed() {
		return
	}
	begin := time.Now()
	makeOlderAgentHost(t, f)
	pids := olderNodePIDs(t, f)
	t.Logf("the older agent's host, built in %v; its node: %s", time.Since(begin).Round(time.Millisecond), pids)
	if s := readStatus(t, f); !s.Legacy.Detected || s.Legacy.Adopted != nil || s.State != "not-bootstrapped" {
		t.Errorf("status on the older agent's host: %+v", s)
	}

	// The package is installed (again: its files are in the image), and
	// the host boots into it.
	adoptAt := time.Now()
	deb, _ := putPackage(t, f, os.Getenv(harness.EnvDeb))
	if out, err := f.m.Run("dpkg", "-i", deb); err != nil {
		t.Fatalf("dpkg -i: %v\n%s", err, out)
	}
	f.m.MustRun("rm", "-rf", "/srv/packages")
	if s := readStatus(t, f); s.NextBoot.Action != "adopt" {
		t.Errorf("next boot on the older agent's host with a config: %+v, want adopt", s.NextBoot)
	}
	cursor := journalCursor(t, f)
	if out, err := f.m.Systemctl("start", "--no-block", "multi-user.target"); err != nil {
		t.Fatalf("start multi-user.target: %v\n%s", err, out)
	}
	waitUntil(t, 2*time.Minute, "lifecycle ran and the daemon is up", func(context.Context) (bool, error) {
		l := showProps(t, f.m, unitnames.Lifecycle, "ActiveState")["ActiveState"]
		if l == "failed" {
			return false, fmt.Errorf("lifecycle failed:\n%s", f.m.Journal(unitnames.Lifecycle))
		}
		return l == "active" && isActive(f.m, daemonUnit) == "active" && isActive(f.m, unitnames.NodeTarget) == "active", nil
	})
	t.Logf("adopted: the package installed, lifecycle done, the node target and the daemon active in %v", time.Since(adoptAt).Round(time.Millisecond))
	lifecycleLog, _ := f.m.Run("journalctl", "-q", "--no-pager", "-o", "cat", "--after-cursor", cursor, "-t", "lifecycle")
	t.Logf("lifecycle:\n%s", lifecycleLog)

	if now := olderNodePIDs(t, f); now != pids {
		t.Errorf("the adoption restarted the node: %s -> %s", pids, now)
	}
	for _, u := range unitnames.Legacy {
		p := showProps(t, f.m, u, "LoadState", "ActiveState", "UnitFileState")
		if p["LoadState"] != "not-found" || p["ActiveState"] != "inactive" {
			t.Errorf("the older agent's %s after the adoption: %v, want not-found and inactive", u, p)
		}
	}
	if j, _ := f.m.Run("journalctl", "-q", "--no-pager", "-o", "cat", "--after-cursor", cursor); strings.Contains(j, "older recovery:") || strings.Count(j, "older daemon: running") > 0 {
		t.Errorf("the older agent's recovery ran, or its daemon started again:\n%s", j)
	}
	for _, p := range []string{hostpaths.LegacyStateDirHost, hostpaths.LegacyUnitHost, hostpaths.LegacyRecoveryUnitHost,
		"/etc/systemd/system/multi-user.target.wants/" + unitnames.LegacyDaemon, "/etc/systemd/system/machines.target.wants/" + nspawnKube1} {
		if _, err := os.Lstat(f.paths.Join(p)); !os.IsNotExist(err) {
			t.Errorf("%s is left after the adoption (%v)", p, err)
		}
	}
	for _, b := range hostpaths.LegacyBinaries {
		if _, err := os.Lstat(f.paths.Join(hostpaths.LegacyBinDirHost + "/" + b)); !os.IsNotExist(err) {
			t.Errorf("%s/%s is left after the adoption (%v)", hostpaths.LegacyBinDirHost, b, err)
		}
	}
	a, err := state.ReadActive(f.paths)
	if err != nil || a == nil || a.Slot != "kube1" || a.Mode != "nspawn" || a.Machine != f.name {
		t.Fatalf("this agent's record after the adoption: %+v, %v", a, err)
	}
	if data, _ := os.ReadFile(f.paths.AppliedConfig("kube1")); strings.Contains(string(data), "CaCertBase64") {
		t.Errorf("the record is the older one, not converted:\n%s", data)
	}
	s := readStatus(t, f)
	if s.Legacy.Detected || s.Legacy.Adopted == nil || s.Legacy.Adopted.Slot != "kube1" || s.State != "bootstrapped" {
		t.Errorf("status after the adoption: %+v", s)
	}
	if out, _ := f.m.Run("unbounded", "status"); !regexp.MustCompile(`legacy root: +adopted`).MatchString(out) {
		t.Errorf("unbounded status does not say the legacy root is adopted:\n%s", out)
	} else {
		t.Logf("unbounded status:\n%s", out)
	}
	// The node is this agent's: its daemon gets its certificate (the
	// older host had none), and the Node and the pod are as they were.
	f.waitAgentCertificate(t)
	if ok, _ := f.nodeReady(context.Background()); !ok {
		t.Errorf("Node %s not Ready after the adoption", f.name)
	}
	f.waitPodRunning(t, ns, time.Minute)
	if failed := failedUnits(t, f.m, "unbounded*"); len(failed) != 0 {
		t.Errorf("failed units after the adoption: %v", failed)
	}
	if t.Failed() {
		return
	}

	// A repave works: a forced Repave operation, through the daemon.
	op := &v1alpha3.MachineOperation{
		ObjectMeta: metav1.ObjectMeta{GenerateName: f.name + "-", Labels: map[string]string{v1alpha3.MachineLabel: f.name}},
		Spec: v1alpha3.MachineOperationSpec{MachineRef: v1alpha3.MachineRef{Name: f.name}, Operation: v1alpha3.OperationRepave,
			Parameters: map[string]string{"force": "true"}},
	}
	created := &v1alpha3.MachineOperation{}
	if err := f.env.api.Post().Resource(v1alpha3.ResourceMachineOperations).Body(op).Do(context.Background()).Into(created); err != nil {
		t.Fatalf("create operation: %v", err)
	}
	repaveAt := time.Now()
	done := waitOpFinished(t, f, created.Name, 10*time.Minute)
	t.Logf("Repave operation %s: %s (%s) after %v", created.Name, done.Status.State, done.Status.Message, time.Since(repaveAt).Round(time.Millisecond))
	if done.Status.State != v1alpha3.OperationComplete {
		t.Fatalf("the repave of the adopted node ended %s: %s\ndaemon:\n%s\nrepave:\n%s", done.Status.State, done.Status.Message, f.m.Journal(daemonUnit), f.m.Journal(repaveService))
	}
	f.wantSlot(t, "kube2", "")
	f.waitPodRunning(t, ns, 3*time.Minute)
	if t.Failed() {
		return
	}

	// Reset leaves nothing of either layout: the host's root is as it was
	// before the first boot, but for the package installed again.
	resetAt := time.Now()
	if out, err := f.m.Run("unbounded", "reset", "--yes"); err != nil {
		t.Fatalf("unbounded reset --yes: %v\n%s", err, out)
	}
	t.Logf("unbounded reset --yes: %v", time.Since(resetAt).Round(time.Millisecond))
	wantNothingOfOursRunning(t, f)
	id, _ := os.ReadFile(filepath.Join(f.m.Root(), "etc/machine-id"))
	exclusions := append(manifestExclusions(strings.TrimSpace(string(id))),
		struct {
			re  *regexp.Regexp
			why string
		}{regexp.MustCompile(`^/var/lib/dpkg(/.*)?$|^/var/log/dpkg\.log$|^/var/log/apt(/.*)?$`), "dpkg's record of the package installed again"},
		struct {
			re  *regexp.Regexp
			why string
		}{regexp.MustCompile(`^/etc/systemd/system/machines\.target\.wants$`), "systemd's directory, which `machinectl enable` made for the older agent; reset removed the link in it"},
	)
	var diff, excused []string
	for _, d := range rootManifestDiff(before, rootManifest(t, f.m.Root())) {
		p := strings.Fields(d)[1]
		why := ""
		for _, ex := range exclusions {
			if ex.re.MatchString(p) {
				why = ex.why
			}
		}
		if why == "" {
			diff = append(diff, d)
		} else {
			excused = append(excused, d+": "+why)
		}
	}
	t.Logf("after reset, changed on the host's root but excluded (%d):\n  %s", len(excused), strings.Join(excused, "\n  "))
	if len(diff) > 0 {
		t.Errorf("after the reset of the adopted host, its root differs from before the first boot:\n  %s", strings.Join(diff, "\n  "))
	}
	if s := readStatus(t, f); s.Legacy.Detected || s.Legacy.Adopted != nil || s.State != "not-bootstrapped" {
		t.Errorf("status after the reset: %+v", s)
	}
	t.Logf("older agent's host to reset: %v", time.Since(begin).Round(time.Millisecond))
}
