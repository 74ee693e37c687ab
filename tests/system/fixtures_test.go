package system_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path"
	"slices"
	"strings"
	"testing"
	"time"

	"unbounded-cloud.io/agent/lib/config"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/state"
	"unbounded-cloud.io/agent/tests/fixtures"
	"unbounded-cloud.io/agent/tests/system/harness"
)

// Paths inside the machine, as the host sees them.
const (
	unitDir      = hostpaths.UnitDirHost
	generatorDir = "/run/systemd/generator"
	tokenFile    = "/etc/unbounded/bootstrap-token"
	caFile       = "/etc/unbounded/ca.crt"
	fenceUnit    = "unbounded-fence.service"
	kmsgPrefix   = "unbounded-generator: "
)

// writeValidConfig writes the operator configuration of a host about to be
// bootstrapped: agent.toml (ARCHITECTURE section 8), the 0600 bootstrap
// token file and the CA file it names.
//
// The API server is a closed loopback port (nothing listens on port 1 in
// the machine's own network namespace, nor on the VM's where a machine
// shares it): every dial is refused at once, no packet leaves the
// machine, and the real fence gets no answer and refuses once its retry
// budget is spent. The budget is
// the minimum (1 s) so that a refusal ends the boot in seconds; with the
// default (2 min) the boot would wait for the fence past the harness's
// boot timeout.
func writeValidConfig(t *testing.T, m *harness.Machine) {
	t.Helper()
	m.WriteFile(hostpaths.ConfigFileHost, []byte(`machine = "site-w1"
mode = "nspawn"

[cluster]
api-server = "https://127.0.0.1:1"
ca-file = "`+caFile+`"
bootstrap-token-file = "`+tokenFile+`"
kubernetes-version = "1.36.3"
cluster-dns = "10.96.0.10"

[fence]
retry-budget = "1s"
`), 0o644)
	m.WriteFile(tokenFile, []byte("abcdef.0123456789abcdef\n"), 0o600)
	m.WriteFile(caFile, fixtures.CA(t), 0o644)
	// The scenario is about a valid config: prove it with the agent's own
	// loader, over the machine's root as `unbounded config check --root`
	// would read it.
	if _, err := config.Load(hostpaths.New(m.Root())); err != nil {
		t.Fatalf("the fixture config is not valid: %v", err)
	}
}

// writeAllocation adds a config drop-in saying the host was launched for
// the MachineAllocation uid: the fence then has to ask the cluster.
func writeAllocation(t *testing.T, m *harness.Machine, uid string) {
	t.Helper()
	m.WriteFile(hostpaths.ConfigDropinDirHost+"/50-allocation.toml", []byte("[allocation]\nuid = \""+uid+"\"\n"), 0o644)
	if _, err := config.Load(hostpaths.New(m.Root())); err != nil {
		t.Fatalf("the fixture config with its allocation is not valid: %v", err)
	}
}

// writeApplied records an applied config for slot, with its SHA-256
// sidecar, the way the agent records it (lib/state), into the stopped
// machine's root.
func writeApplied(t *testing.T, m *harness.Machine, slot, mode string) {
	t.Helper()
	err := state.WriteApplied(hostpaths.New(m.Root()), &state.AppliedConfig{
		Slot:              slot,
		Mode:              mode,
		Machine:           "site-w1",
		KubernetesVersion: "1.36.3",
		AppliedAt:         time.Now().UTC(),
	})
	if err != nil {
		t.Fatalf("write applied config of %s: %v", slot, err)
	}
}

// writeOwnership leaves the installation lock record of an installation
// that was interrupted (the machine was powered off while it ran).
func writeOwnership(t *testing.T, m *harness.Machine, unit string) {
	t.Helper()
	data, err := json.Marshal(state.Ownership{Owner: "bootstrap", Unit: unit, PID: 4242, Since: time.Now().UTC()})
	if err != nil {
		t.Fatal(err)
	}
	if err := state.WriteFileAtomic(hostpaths.New(m.Root()).Ownership(), append(data, '\n'), 0o600); err != nil {
		t.Fatal(err)
	}
}

// generated returns what the generator wrote: every entry under the
// generator's output directory that is about the agent (its name or its
// link target mentions "unbounded"), as path -> "-> target" for links and
// path -> contents for files. systemd's own generators (getty, fstab) write
// into the same directory and are left out.
func generated(t *testing.T, m *harness.Machine) map[string]string {
	t.Helper()
	out := map[string]string{}
	var walk func(dir string)
	walk = func(dir string) {
		entries, err := m.ReadDir(dir)
		if err != nil {
			t.Fatalf("read %s: %v", dir, err)
		}
		for _, e := range entries {
			p := path.Join(dir, e.Name())
			rel := strings.TrimPrefix(p, generatorDir+"/")
			switch {
			case e.Type()&fs.ModeSymlink != 0:
				target, err := m.Readlink(p)
				if err != nil {
					t.Fatal(err)
				}
				if strings.Contains(rel, "unbounded") || strings.Contains(target, "unbounded") {
					out[rel] = "-> " + target
				}
			case e.IsDir():
				walk(p)
			default:
				data, err := m.ReadFile(p)
				if err != nil {
					t.Fatal(err)
				}
				if strings.Contains(rel, "unbounded") {
					out[rel] = string(data)
				}
			}
		}
	}
	walk(generatorDir)
	return out
}

// wantGenerated compares the generator's output with want, where a file's
// expected value is a list of lines it must contain.
func wantGenerated(t *testing.T, m *harness.Machine, want map[string][]string) {
	t.Helper()
	got := generated(t, m)
	if !slices.Equal(slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(want))) {
		t.Errorf("generator wrote %v,\nwant exactly %v", fmtGenerated(got), slices.Sorted(maps.Keys(want)))
		return
	}
	for name, lines := range want {
		for _, l := range lines {
			if !slices.Contains(strings.Split(got[name], "\n"), l) {
				t.Errorf("generator output %s = %q, want a line %q", name, got[name], l)
			}
		}
	}
}

func fmtGenerated(g map[string]string) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(g)) {
		b.WriteString("\n  " + k)
		if strings.HasPrefix(g[k], "-> ") {
			b.WriteString(" " + g[k])
		}
	}
	return b.String()
}

// link is the expected generator output for a wants link to a shipped unit.
func link(unit string) []string { return []string{"-> " + path.Join(unitDir, unit)} }

// fenceDropIn is the expected content of the fence drop-in.
var fenceDropIn = []string{"[Unit]", "Requires=" + fenceUnit, "After=" + fenceUnit}

func generatorKmsg(m *harness.Machine) []string {
	var out []string
	for _, l := range m.Kmsg() {
		if strings.HasPrefix(l, kmsgPrefix) {
			out = append(out, l)
		}
	}
	return out
}

// wantNoNodeUnits asserts the safe state: neither the node target nor the
// daemon pulled in, nothing under the node target, the node target and
// the daemon not running.
func wantNoNodeUnits(t *testing.T, m *harness.Machine) {
	t.Helper()
	wants := m.Wants("multi-user.target")
	for _, u := range []string{"unbounded-node.target", "unbounded-daemon.service"} {
		if slices.Contains(wants, u) {
			t.Errorf("multi-user.target wants %s; want the node units left out", u)
		}
	}
	if s := m.UnitState("unbounded-node.target"); s.LoadState == "loaded" {
		for _, prop := range []string{"Wants", "Requires"} {
			// The health timer and the upgrade's path unit are the
			// units the package itself hangs on the node target (the
			// preset enables them, WantedBy=unbounded-node.target):
			// they run only once the node target is started, so they
			// never start a node.
			w := slices.DeleteFunc(m.UnitStrings("unbounded-node.target", prop), func(u string) bool {
				return u == "unbounded-health.timer" || u == "unbounded-upgrade.path"
			})
			if len(w) != 0 {
				t.Errorf("unbounded-node.target %s %v; want nothing but the health timer and the upgrade's path unit", prop, w)
			}
		}
	}
	for _, d := range []string{"unbounded-node.target.wants", "unbounded-node.target.requires"} {
		if _, err := m.ReadDir(path.Join(generatorDir, d)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("generator wrote %s (err %v); want none", d, err)
		}
	}
	if a := isActive(m, "unbounded-node.target"); a == "active" {
		t.Errorf("systemctl is-active unbounded-node.target = %s; the node is not up", a)
	}
	if s := m.UnitState("unbounded-daemon.service"); s.ActiveState == "active" || s.ActiveState == "activating" {
		t.Errorf("unbounded-daemon.service is %s; want it not started", s)
	}
}

// isActive is what an operator asks with `systemctl is-active UNIT`: the
// unit's ActiveState (harness.Machine.Show), "" when the machine cannot
// say.
func isActive(m *harness.Machine, unit string) string {
	kv, _ := m.Show(unit, "ActiveState")
	return kv["ActiveState"]
}

// wantFencedUnit asserts, over D-Bus, that unit is required by target and
// requires and is ordered after the fence, through the generator's drop-in.
func wantFencedUnit(t *testing.T, m *harness.Machine, target, unit string) {
	t.Helper()
	if r := m.UnitStrings(target, "Requires"); !slices.Contains(r, unit) {
		t.Errorf("%s Requires = %v; want %s", target, r, unit)
	}
	if a := m.UnitStrings(target, "After"); !slices.Contains(a, unit) {
		t.Errorf("%s After = %v; want %s (Requires= without it would not fail the target)", target, a, unit)
	}
	// The generator links a node unit only when it is installed: a
	// not-found unit here would be a generator bug (systemd would drop
	// the Requires= on it at boot and reach the target over nothing).
	if s := m.UnitState(unit); s.LoadState != "loaded" {
		t.Errorf("%s is %s; the generator must not require a unit that does not load", unit, s)
		return
	}
	for _, prop := range []string{"Requires", "After"} {
		if v := m.UnitStrings(unit, prop); !slices.Contains(v, fenceUnit) {
			t.Errorf("%s %s = %v; want %s", unit, prop, v, fenceUnit)
		}
	}
	dropIn := path.Join(generatorDir, unit+".d", "50-unbounded-fence.conf")
	if v := m.UnitStrings(unit, "DropInPaths"); !slices.Contains(v, dropIn) {
		t.Errorf("%s DropInPaths = %v; want %s", unit, v, dropIn)
	}
}

// scrapeHostMetrics is the body of GET /metrics from the daemon's metrics
// address inside the machine (its loopback), read by the machine's bash
// (/dev/tcp: the test rootfs has no HTTP client).
func scrapeHostMetrics(t *testing.T, m *harness.Machine, ip string, port int) string {
	t.Helper()
	script := fmt.Sprintf(`exec 3<>/dev/tcp/%s/%d && printf 'GET /metrics HTTP/1.0\r\nHost: %s\r\n\r\n' >&3 && cat <&3`, ip, port, ip)
	out, err := m.Run("bash", "-c", script)
	if err != nil {
		t.Fatalf("GET /metrics from %s:%d: %v\n%s", ip, port, err, out)
	}
	head, body, ok := strings.Cut(strings.ReplaceAll(out, "\r\n", "\n"), "\n\n")
	if !ok || !strings.HasPrefix(head, "HTTP/1.0 200") && !strings.HasPrefix(head, "HTTP/1.1 200") {
		t.Fatalf("GET /metrics from %s:%d answered:\n%s", ip, port, out)
	}
	return body
}
