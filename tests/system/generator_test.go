// Package system_test boots the built package in a real systemd (tier 5 of
// ARCHITECTURE section 9) and checks what the generator makes of the host's
// state at boot. Each scenario prepares the host's files in a stopped
// machine that has the package installed, boots it, and reads the outcome
// from systemd over D-Bus, from the generator's output directory and from
// the machine's /dev/kmsg.
//
// The fence that runs is the package's (unbounded-fence.service and its
// binary) unless a scenario says otherwise: it allows a host launched for
// no allocation, and refuses one launched for an allocation, as the
// machines reach no API server. Where a scenario needs a fence it can turn
// from "allow" to "refuse", it overrides the unit's ExecStart= with a
// drop-in in /etc, as an operator could.
package system_test

import (
	"os"
	"path"
	"slices"
	"strings"
	"testing"

	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/tests/system/harness"
)

func TestMain(m *testing.M) { harness.Main(m) }

func TestFreshHostWithConfigPullsInBootstrapAtBoot(t *testing.T) {
	defer scenario(t)()
	m := harness.New(t, harness.Options{Package: true})
	writeValidConfig(t, m)
	m.Start()

	wantGenerated(t, m, map[string][]string{
		"multi-user.target.wants/unbounded-bootstrap.service": link("unbounded-bootstrap.service"),
	})
	if w := m.Wants("multi-user.target"); !slices.Contains(w, "unbounded-bootstrap.service") {
		t.Errorf("multi-user.target Wants = %v; want unbounded-bootstrap.service", w)
	}
	wantNoNodeUnits(t, m)
	if k := generatorKmsg(m); len(k) != 0 {
		t.Errorf("generator reported %q on a sound host", k)
	}
}

func TestAppliedNspawnConfigStartsSlotBehindFence(t *testing.T) {
	defer scenario(t)()
	m := harness.New(t, harness.Options{Package: true})
	writeValidConfig(t, m)
	writeApplied(t, m, "kube2", "nspawn")
	m.Start()

	wantGenerated(t, m, map[string][]string{
		"multi-user.target.wants/unbounded-node.target":                      link("unbounded-node.target"),
		"multi-user.target.wants/unbounded-daemon.service":                   link("unbounded-daemon.service"),
		"unbounded-node.target.requires/unbounded-mode-nspawn.target":        link("unbounded-mode-nspawn.target"),
		"unbounded-mode-nspawn.target.requires/systemd-nspawn@kube2.service": link("systemd-nspawn@.service"),
		"systemd-nspawn@kube2.service.d/50-unbounded-fence.conf":             fenceDropIn,
	})
	mu := m.Wants("multi-user.target")
	for _, u := range []string{"unbounded-node.target", "unbounded-daemon.service"} {
		if !slices.Contains(mu, u) {
			t.Errorf("multi-user.target Wants = %v; want %s", mu, u)
		}
	}
	if slices.Contains(mu, "unbounded-bootstrap.service") {
		t.Error("multi-user.target wants unbounded-bootstrap.service on a bootstrapped host")
	}
	wantNodeTargetRequires(t, m, "unbounded-mode-nspawn.target")
	wantFencedUnit(t, m, "unbounded-mode-nspawn.target", "systemd-nspawn@kube2.service")
	for _, prop := range []string{"Wants", "Requires"} {
		if w := m.UnitStrings("unbounded-mode-nspawn.target", prop); slices.Contains(w, "systemd-nspawn@kube1.service") {
			t.Errorf("unbounded-mode-nspawn.target %s the inactive slot: %v", prop, w)
		}
	}
	if k := generatorKmsg(m); len(k) != 0 {
		t.Errorf("generator reported %q on a sound host", k)
	}

	// The package's fence allowed the start (no allocation is
	// configured), and the machine failed: the test machine has no
	// /var/lib/machines/kube2. With Requires= that failure fails the mode
	// target and the node target: the node is not up, and
	// `systemctl is-active unbounded-node.target` says so. The boot
	// itself went on (multi-user.target only wants the node).
	if s := m.UnitState(fenceUnit); s.ActiveState != "inactive" || s.Result != "success" {
		t.Errorf("%s = %s; want inactive with result success (allowed: no allocation configured)", fenceUnit, s)
	}
	if s := m.UnitState("systemd-nspawn@kube2.service"); s.ActiveState != "failed" {
		t.Errorf("systemd-nspawn@kube2.service = %s; want failed (no machine image in the test machine)", s)
	}
	wantNodeDown(t, m, "unbounded-mode-nspawn.target")
}

// TestFenceRefusalAtBootKeepsTheNodeTargetDown runs the package's fence
// for a host launched for an allocation: the machine reaches no API
// server, so the fence refuses once its retry budget is spent. The node
// unit is never started and the node target is not active.
func TestFenceRefusalAtBootKeepsTheNodeTargetDown(t *testing.T) {
	defer scenario(t)()
	m := harness.New(t, harness.Options{Package: true})
	writeValidConfig(t, m)
	writeAllocation(t, m, "6f0c7a52-3c1e-4d5e-9a8b-0c1d2e3f4a5b")
	writeApplied(t, m, "kube2", "nspawn")
	m.Start()

	wantNodeTargetRequires(t, m, "unbounded-mode-nspawn.target")
	wantFencedUnit(t, m, "unbounded-mode-nspawn.target", "systemd-nspawn@kube2.service")
	if s := m.UnitState(fenceUnit); s.ActiveState != "failed" || s.Result != "exit-code" {
		t.Errorf("%s = %s; want failed with result exit-code (refused: no API server)", fenceUnit, s)
	}
	if s := m.UnitState("systemd-nspawn@kube2.service"); s.ActiveState != "inactive" || s.Result != "success" {
		t.Errorf("systemd-nspawn@kube2.service = %s; want never started (inactive, no failure of its own)", s)
	}
	wantNodeDown(t, m, "unbounded-mode-nspawn.target")
	if j := m.Journal(fenceUnit); !strings.Contains(j, "refused") {
		t.Errorf("fence journal does not say it refused:\n%s", j)
	}
}

// wantNodeDown asserts that the mode target and the node target are not
// active, as an operator asks it, and that the boot reached
// multi-user.target anyway.
func wantNodeDown(t *testing.T, m *harness.Machine, modeTarget string) {
	t.Helper()
	for _, u := range []string{modeTarget, "unbounded-node.target"} {
		if a := isActive(m, u); a != "inactive" {
			t.Errorf("systemctl is-active %s = %q; want inactive: the node is not up", u, a)
		}
	}
	if a := isActive(m, "multi-user.target"); a != "active" {
		t.Errorf("multi-user.target is %s; a node that does not come up must not fail it", a)
	}
}

// wantNodeTargetRequires asserts, over D-Bus, that the node target
// requires exactly the mode target (and no longer merely wants it).
func wantNodeTargetRequires(t *testing.T, m *harness.Machine, modeTarget string) {
	t.Helper()
	if r := m.UnitStrings("unbounded-node.target", "Requires"); !slices.Equal(r, []string{modeTarget}) {
		t.Errorf("unbounded-node.target Requires = %v; want only %s", r, modeTarget)
	}
	if w := m.Wants("unbounded-node.target"); slices.Contains(w, modeTarget) {
		t.Errorf("unbounded-node.target Wants = %v; the mode target must be required, not wanted", w)
	}
	if a := m.UnitStrings("unbounded-node.target", "After"); !slices.Contains(a, modeTarget) {
		t.Errorf("unbounded-node.target After = %v; want %s", a, modeTarget)
	}
}

// TestAppliedNoneConfigStartsHostStackBehindFence boots a host of mode
// none with the package's own fence (no allocation configured: it allows)
// and stand-ins for the runtime units, which the package does not ship
// yet: the node target requires the mode target, which requires both
// units, each fenced, and all of it is up.
func TestAppliedNoneConfigStartsHostStackBehindFence(t *testing.T) {
	defer scenario(t)()
	m := harness.New(t, harness.Options{Package: true})
	writeValidConfig(t, m)
	writeApplied(t, m, "kube1", "none")
	standInNoneUnits(t, m)
	m.Start()

	wantGenerated(t, m, noneOutput)
	wantNodeTargetRequires(t, m, "unbounded-mode-none.target")
	for _, u := range noneUnits {
		if s := m.UnitState(u); s.LoadState != "loaded" {
			t.Errorf("%s is %s; the scenario installed a stand-in", u, s)
		}
		wantFencedUnit(t, m, "unbounded-mode-none.target", u)
	}
	if k := generatorKmsg(m); len(k) != 0 {
		t.Errorf("generator reported %q on a sound host", k)
	}
	for _, u := range append([]string{"unbounded-node.target", "unbounded-mode-none.target"}, noneUnits...) {
		if a := isActive(m, u); a != "active" {
			t.Errorf("systemctl is-active %s = %q; want active (fence allowed, units started)", u, a)
		}
	}
	if s := m.UnitState(fenceUnit); s.ActiveState != "inactive" || s.Result != "success" {
		t.Errorf("%s = %s; want inactive with result success (allowed: no allocation configured)", fenceUnit, s)
	}
}

// TestNoneModeWithoutItsNodeUnitsBootsIntoSafeStateAndReportsToKmsg: the
// package is installed, the host is bootstrapped in mode none, but the
// operator masked the runtime units (`systemctl mask`: a link to /dev/null
// in /etc/systemd/system). systemd would drop the mode target's Requires=
// on them at boot and reach unbounded-node.target over nothing; the
// generator writes the safe state instead and says which units are masked.
func TestNoneModeWithoutItsNodeUnitsBootsIntoSafeStateAndReportsToKmsg(t *testing.T) {
	defer scenario(t)()
	m := harness.New(t, harness.Options{Package: true})
	writeValidConfig(t, m)
	writeApplied(t, m, "kube1", "none")
	etc := path.Join(m.Root(), hostpaths.UnitDirEtcHost)
	if err := os.MkdirAll(etc, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, u := range noneUnits {
		if _, err := os.Stat(path.Join(m.Root(), unitDir, u)); err != nil {
			t.Fatalf("%s: the package should ship it: %v", u, err)
		}
		if err := os.Symlink("/dev/null", path.Join(etc, u)); err != nil {
			t.Fatal(err)
		}
	}
	m.Start()

	wantGenerated(t, m, map[string][]string{
		"multi-user.target.wants/unbounded-recover@generator.service": link("unbounded-recover@.service"),
	})
	wantNoNodeUnits(t, m)
	if a := isActive(m, "unbounded-mode-none.target"); a == "active" {
		t.Errorf("systemctl is-active unbounded-mode-none.target = %q; nothing of the node runs", a)
	}
	if w := m.Wants("multi-user.target"); !slices.Contains(w, "unbounded-recover@generator.service") {
		t.Errorf("multi-user.target Wants = %v; want unbounded-recover@generator.service", w)
	}
	k := generatorKmsg(m)
	want := []string{"mode none", "node and daemon not started",
		"unbounded-containerd.service: masked by /etc/systemd/system/unbounded-containerd.service",
		"unbounded-kubelet.service: masked by /etc/systemd/system/unbounded-kubelet.service"}
	if len(k) != 1 {
		t.Fatalf("generator kmsg lines = %q; want one", k)
	}
	for _, w := range want {
		if !strings.Contains(k[0], w) {
			t.Errorf("generator kmsg line %q does not say %q", k[0], w)
		}
	}
	if strings.Contains(k[0], fenceUnit) {
		t.Errorf("generator kmsg line %q names the fence, which is installed", k[0])
	}
	t.Logf("kmsg: %q", k)
}

var noneUnits = []string{"unbounded-containerd.service", "unbounded-kubelet.service"}

var noneOutput = map[string][]string{
	"multi-user.target.wants/unbounded-node.target":                    link("unbounded-node.target"),
	"multi-user.target.wants/unbounded-daemon.service":                 link("unbounded-daemon.service"),
	"unbounded-node.target.requires/unbounded-mode-none.target":        link("unbounded-mode-none.target"),
	"unbounded-mode-none.target.requires/unbounded-containerd.service": link("unbounded-containerd.service"),
	"unbounded-mode-none.target.requires/unbounded-kubelet.service":    link("unbounded-kubelet.service"),
	"unbounded-containerd.service.d/50-unbounded-fence.conf":           fenceDropIn,
	"unbounded-kubelet.service.d/50-unbounded-fence.conf":              fenceDropIn,
}

// Stand-ins for what the package does not ship yet or what cannot run in
// the test machine: the none mode's runtime units (long-running, like the
// real ones), and a fence that allows unless /run/test-fence-refuse
// exists. The fence stand-in is a drop-in over the package's unit, so its
// Type=oneshot without RemainAfterExit (run anew at every node start) is
// the package's. Every run logs a line, counted by fenceRuns.
const (
	fenceRefuseFlag = "/run/test-fence-refuse"
	fenceRunLine    = "test fence: checked"
)

func standInNoneNode(t *testing.T, m *harness.Machine) {
	t.Helper()
	standInNoneUnits(t, m)
	m.WriteFile("/etc/systemd/system/"+fenceUnit+".d/90-test-stand-in.conf", []byte(`# The system test's fence: allows unless `+fenceRefuseFlag+` exists.
[Service]
ExecStart=
ExecStart=/bin/sh -c 'echo "`+fenceRunLine+`"; if test -e `+fenceRefuseFlag+`; then echo refused; exit 77; fi'
`), 0o644)
}

// standInNoneUnits installs the none mode's runtime units in
// /etc/systemd/system as long-running stand-ins (without them the
// generator, rightly, keeps the node down) and the installed version
// they would run from, as writeApplied's record names it: lifecycle
// checks that versions/current is complete and fails, rightly, on a
// host that lacks it.
func standInNoneUnits(t *testing.T, m *harness.Machine) {
	t.Helper()
	const v = "1.36.3"
	for _, f := range []string{"bin/kubelet", "bin/containerd", "etc/kubelet/kubelet.env", "etc/containerd/config.toml"} {
		m.WriteFile(hostpaths.VersionsDirHost+"/"+v+"/"+f, []byte("# stand-in (system test)\n"), 0o644)
	}
	if err := os.Symlink(v, path.Join(m.Root(), hostpaths.VersionsDirHost, "current")); err != nil {
		t.Fatal(err)
	}
	for _, u := range noneUnits {
		m.WriteFile(hostpaths.UnitDirEtcHost+"/"+u, []byte(`[Unit]
Description=Stand-in for `+u+` (system test)
[Service]
ExecStart=/bin/sleep infinity
`), 0o644)
	}
}

func fenceRuns(t *testing.T, m *harness.Machine) int {
	t.Helper()
	return strings.Count(m.Journal(fenceUnit), fenceRunLine)
}

// TestNodeTargetIsActiveExactlyWhileTheFencedNodeStackIsUp is "systemctl
// is-active unbounded-node.target answers whether the node is up", in the
// none mode with stand-in runtime units and an allowing fence: up at boot;
// down when a node unit is stopped (what repave's stop of the old stack
// does); up again, fence checked again, when the node target is started;
// and refused, with nothing started, when the fence says no.
func TestNodeTargetIsActiveExactlyWhileTheFencedNodeStackIsUp(t *testing.T) {
	defer scenario(t)()
	m := harness.New(t, harness.Options{Package: true})
	writeValidConfig(t, m)
	writeApplied(t, m, "kube1", "none")
	standInNoneNode(t, m)
	m.Start()

	wantGenerated(t, m, noneOutput)
	wantNodeTargetRequires(t, m, "unbounded-mode-none.target")
	for _, u := range noneUnits {
		wantFencedUnit(t, m, "unbounded-mode-none.target", u)
	}
	wantUp := func(when string, fenceRunsWant int) {
		t.Helper()
		for _, u := range append([]string{"unbounded-node.target", "unbounded-mode-none.target"}, noneUnits...) {
			if a := isActive(m, u); a != "active" {
				t.Errorf("%s: systemctl is-active %s = %q; want active", when, u, a)
			}
		}
		if n := fenceRuns(t, m); n != fenceRunsWant {
			t.Errorf("%s: the fence ran %d times; want %d (once per start of the node stack)", when, n, fenceRunsWant)
		}
	}
	wantUp("after boot", 1)

	// Stopping a node unit stops the node (Requires= propagates an
	// explicit stop upwards): the node target says so.
	if _, err := m.Systemctl("stop", "unbounded-kubelet.service"); err != nil {
		t.Fatal(err)
	}
	for _, u := range []string{"unbounded-node.target", "unbounded-mode-none.target"} {
		if a := isActive(m, u); a != "inactive" {
			t.Errorf("after stopping the kubelet: systemctl is-active %s = %q; want inactive", u, a)
		}
	}
	if a := isActive(m, "unbounded-containerd.service"); a != "active" {
		t.Errorf("after stopping the kubelet: containerd is %s; a stop propagates to what requires the unit, not to what it requires", a)
	}

	// Starting the node target starts the stack again, behind the fence.
	if _, err := m.Systemctl("start", "unbounded-node.target"); err != nil {
		t.Fatalf("start unbounded-node.target with an allowing fence: %v", err)
	}
	wantUp("after the node target was started again", 2)

	// Repave's last step, as units/unbounded-node.target describes it:
	// the node units already run, the node target is not active (here
	// stopped through the mode target), and it is started. The fence
	// does not run: systemd drops the start jobs of running units, and
	// the Requires= of their drop-ins with them. So the fence must have
	// checked the new slot before it started; this start cannot.
	if _, err := m.Systemctl("stop", "unbounded-mode-none.target"); err != nil {
		t.Fatal(err)
	}
	if a := isActive(m, "unbounded-node.target"); a != "inactive" {
		t.Errorf("after stopping the mode target: node target %q; want inactive", a)
	}
	m.WriteFile(fenceRefuseFlag, nil, 0o644)
	if _, err := m.Systemctl("start", "unbounded-node.target"); err != nil {
		t.Errorf("start of the node target over running units: %v; want it to succeed without the fence", err)
	}
	if n := fenceRuns(t, m); n != 2 {
		t.Errorf("start of the node target over running units: the fence ran %d times in all; want still 2", n)
	}
	if a := isActive(m, "unbounded-node.target"); a != "active" {
		t.Errorf("start of the node target over running units: %q; want active", a)
	}

	// A refusal from a stopped node: nothing starts.
	if _, err := m.Systemctl(append([]string{"stop"}, noneUnits...)...); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Systemctl("start", "unbounded-node.target"); err == nil {
		t.Error("systemctl start unbounded-node.target succeeded with a refusing fence; want it to fail")
	}
	for _, u := range append([]string{"unbounded-node.target", "unbounded-mode-none.target"}, noneUnits...) {
		if a := isActive(m, u); a != "inactive" {
			t.Errorf("fence refused: systemctl is-active %s = %q; want inactive", u, a)
		}
	}
	if s := m.UnitState(fenceUnit); s.ActiveState != "failed" || s.Result != "exit-code" {
		t.Errorf("fence refused: %s = %s; want failed with exit-code", fenceUnit, s)
	}
	if n := fenceRuns(t, m); n != 3 {
		t.Errorf("the fence ran %d times in all; want 3", n)
	}
}

// TestMissingFenceUnitBootsIntoSafeStateAndReportsToKmsg: with the package
// installed but its fence unit gone, a bootstrapped host starts no node
// and no daemon, pulls in recovery, and the generator says why on kmsg.
func TestMissingFenceUnitBootsIntoSafeStateAndReportsToKmsg(t *testing.T) {
	defer scenario(t)()
	m := harness.New(t, harness.Options{Package: true})
	writeValidConfig(t, m)
	writeApplied(t, m, "kube2", "nspawn")
	fence := path.Join(m.Root(), unitDir, fenceUnit)
	if _, err := os.Stat(fence); err != nil {
		t.Fatalf("the package did not install %s: %v", fenceUnit, err)
	}
	if err := os.Remove(fence); err != nil {
		t.Fatal(err)
	}
	m.Start()

	wantGenerated(t, m, map[string][]string{
		"multi-user.target.wants/unbounded-recover@generator.service": link("unbounded-recover@.service"),
	})
	wantNoNodeUnits(t, m)
	if s := m.UnitState(fenceUnit); s.LoadState != "not-found" {
		t.Errorf("%s is %s; the scenario removed it", fenceUnit, s)
	}
	if s := m.UnitState("systemd-nspawn@kube2.service"); s.ActiveState != "inactive" {
		t.Errorf("systemd-nspawn@kube2.service is %s; want inactive without a fence", s)
	}
	k := generatorKmsg(m)
	if len(k) != 1 || !strings.Contains(k[0], fenceUnit) || !strings.Contains(k[0], "not in /etc/systemd/system, /run/systemd/system or /usr/lib/systemd/system") {
		t.Errorf("generator kmsg lines = %q; want one line naming the missing %s", k, fenceUnit)
	}
	t.Logf("kmsg: %q", k)
}

func TestOwnershipLockKeepsNodeAndDaemonDownAndResumesInstallation(t *testing.T) {
	defer scenario(t)()
	m := harness.New(t, harness.Options{Package: true})
	writeValidConfig(t, m)
	writeApplied(t, m, "kube2", "nspawn")
	writeOwnership(t, m, "unbounded-bootstrap.service")
	// The resumed installation must still own the host while the
	// generator's decision is looked at: the real bootstrap would hand
	// the node over within a second (bootstrap_test.go covers that), so
	// it is held here by a stand-in that never finishes (Type=simple,
	// so that the boot, which orders multi-user.target after it, ends).
	m.WriteFile("/etc/systemd/system/unbounded-bootstrap.service.d/50-hold.conf", []byte("[Service]\nType=simple\nExecStart=\nExecStart=/bin/sleep infinity\n"), 0o644)
	m.Start()
	if s := m.UnitState("unbounded-bootstrap.service"); s.ActiveState != "active" {
		t.Errorf("unbounded-bootstrap.service is %s; want it resumed (the stand-in running)", s)
	}

	wantGenerated(t, m, map[string][]string{
		"multi-user.target.wants/unbounded-bootstrap.service": link("unbounded-bootstrap.service"),
	})
	wantNoNodeUnits(t, m)
	for _, prop := range []string{"Wants", "Requires"} {
		if w := m.UnitStrings("unbounded-mode-nspawn.target", prop); slices.Contains(w, "systemd-nspawn@kube2.service") {
			t.Errorf("unbounded-mode-nspawn.target %s %v while an installation owns the host", prop, w)
		}
	}
	if s := m.UnitState("systemd-nspawn@kube2.service"); s.ActiveState != "inactive" {
		t.Errorf("systemd-nspawn@kube2.service is %s; want inactive while an installation owns the host", s)
	}
	if k := generatorKmsg(m); len(k) != 0 {
		t.Errorf("generator reported %q; a held lock is not an error", k)
	}
}

func TestCorruptAppliedConfigBootsIntoSafeStateAndReportsToKmsg(t *testing.T) {
	defer scenario(t)()
	m := harness.New(t, harness.Options{Package: true})
	writeValidConfig(t, m)
	writeApplied(t, m, "kube2", "nspawn")
	// Change the record after its sidecar was written: a checksum
	// mismatch, as a torn or tampered write leaves it.
	record := hostpaths.New(m.Root()).AppliedConfig("kube2")
	data, err := os.ReadFile(record)
	if err != nil {
		t.Fatal(err)
	}
	tampered := strings.Replace(string(data), `"site-w1"`, `"site-w2"`, 1)
	if tampered == string(data) {
		t.Fatalf("record %s has no machine name to change:\n%s", record, data)
	}
	if err := os.WriteFile(record, []byte(tampered), 0o600); err != nil {
		t.Fatal(err)
	}
	m.Start()

	// The boot finished (Start waited for it); the safe state is one
	// where none of the agent's units ran and failed on the way, except
	// recovery, which the generator pulled in: it cannot repair a record
	// whose checksum does not match (nothing may guess which node to
	// run), says so, and fails so that `systemctl --failed` shows it.
	if failed := failedUnits(t, m, "unbounded*"); !slices.Equal(failed, []string{"unbounded-recover@generator.service"}) {
		t.Errorf("agent units failed in the safe state: %v, want only unbounded-recover@generator.service (system %s)", failed, m.State)
	}
	if j := m.Journal("unbounded-recover@generator.service"); !strings.Contains(j, "NOT REPAIRED") || !strings.Contains(j, hostpaths.New("").AppliedConfig("kube2")) {
		t.Errorf("recovery's journal does not say what it could not repair:\n%s", j)
	}
	wantGenerated(t, m, map[string][]string{
		"multi-user.target.wants/unbounded-recover@generator.service": link("unbounded-recover@.service"),
	})
	wantNoNodeUnits(t, m)
	if w := m.Wants("multi-user.target"); !slices.Contains(w, "unbounded-recover@generator.service") {
		t.Errorf("multi-user.target Wants = %v; want unbounded-recover@generator.service", w)
	}
	k := generatorKmsg(m)
	if len(k) != 1 || !strings.Contains(k[0], hostpaths.New("").AppliedConfig("kube2")) {
		t.Errorf("generator kmsg lines = %q; want one line naming %s", k, hostpaths.New("").AppliedConfig("kube2"))
	}
	t.Logf("kmsg: %q", k)
}

func TestConfigWrittenAfterInstallPullsInBootstrapAtNextBoot(t *testing.T) {
	defer scenario(t)()
	m := harness.Boot(t, harness.Options{Package: true})
	if g := generated(t, m); len(g) != 0 {
		t.Errorf("generator wrote %v on a host without config; want nothing", fmtGenerated(g))
	}
	wantNoNodeUnits(t, m)
	id := machineID(t, m)

	writeValidConfig(t, m)
	m.Reboot()

	if again := machineID(t, m); again != id {
		t.Errorf("machine id %s became %s across a reboot; a host keeps its id", id, again)
	}
	wantGenerated(t, m, map[string][]string{
		"multi-user.target.wants/unbounded-bootstrap.service": link("unbounded-bootstrap.service"),
	})
	if k := generatorKmsg(m); len(k) != 0 {
		t.Errorf("generator reported %q on a sound host", k)
	}
}

// machineID is the machine's id: /etc/machine-id, which must be what
// systemd reports (org.freedesktop.DBus.Peer.GetMachineId of PID 1) and
// what D-Bus reads (/var/lib/dbus/machine-id).
// failedUnits lists the loaded units matching pattern that systemd holds
// as failed.
func failedUnits(t *testing.T, m *harness.Machine, pattern string) []string {
	t.Helper()
	out, err := m.Systemctl("list-units", "--all", "--failed", "--plain", "--no-legend", pattern)
	if err != nil {
		t.Fatalf("systemctl list-units --failed: %v %s", err, out)
	}
	var units []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if f := strings.Fields(l); len(f) > 0 {
			units = append(units, f[0])
		}
	}
	return units
}

func machineID(t *testing.T, m *harness.Machine) string {
	t.Helper()
	etc := strings.TrimSpace(m.MustRun("cat", "/etc/machine-id"))
	dbus := strings.TrimSpace(m.MustRun("cat", "/var/lib/dbus/machine-id"))
	out := m.MustRun("busctl", "call", "org.freedesktop.systemd1", "/org/freedesktop/systemd1", "org.freedesktop.DBus.Peer", "GetMachineId")
	pid1 := strings.Trim(strings.TrimPrefix(strings.TrimSpace(out), "s "), `"`)
	if len(etc) != 32 || dbus != etc || pid1 != etc {
		t.Fatalf("/etc/machine-id %q, /var/lib/dbus/machine-id %q, systemd's machine id %q (busctl: %q); want one 32-digit id", etc, dbus, pid1, out)
	}
	return etc
}

// TestEveryMachineHasItsOwnMachineID: the machines share one rootfs and
// one package layer, but, like the hosts of a fleet, not their identity
// (TESTING.md: each node rootfs copy needs its own machine id).
func TestEveryMachineHasItsOwnMachineID(t *testing.T) {
	defer scenario(t)()
	a := harness.Boot(t, harness.Options{Package: true})
	b := harness.Boot(t, harness.Options{Package: true})
	ida, idb := machineID(t, a), machineID(t, b)
	if ida == idb {
		t.Errorf("machines %s and %s share the machine id %s", a.Name, b.Name, ida)
	}
	t.Logf("machine ids: %s %s", ida, idb)
}
