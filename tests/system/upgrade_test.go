package system_test

import (
	"context"
	"crypto/md5"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/upgrade"
	"unbounded-cloud.io/agent/tests/system/harness"
)

const upgradeUnit = "unbounded-upgrade.service"

// buildAgentDeb builds the package under test again with the multicall
// executable and the CLI built from this tree with another version stamp
// (a newer build of itself), and control Version its Debian form. broken replaces
// the daemon's link with a script that exits 1 at once: a package whose
// daemon never comes up.
func buildAgentDeb(t *testing.T, stamp string, broken bool) string {
	t.Helper()
	dir := t.TempDir()
	tree := filepath.Join(dir, "tree")
	run := func(name string, args ...string) {
		t.Helper()
		cmd := exec.Command(name, args...)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s %v: %v\n%s", name, args, err, out)
		}
	}
	run("dpkg-deb", "-R", os.Getenv(harness.EnvDeb), tree)
	// The multicall executable and the CLI, which says the version an
	// image carries (lifecycle asks it).
	repo, _ := filepath.Abs("../..")
	for pkg, exe := range map[string]string{"./cmd/unbounded-agent": "usr/libexec/unbounded/unbounded-agent", "./cmd/unbounded": "usr/bin/unbounded"} {
		build := exec.Command("go", "build", "-ldflags",
			"-s -w -X unbounded-cloud.io/agent/lib/version.Version="+stamp, "-o", filepath.Join(tree, exe), pkg)
		build.Dir, build.Env = repo, append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", pkg, err, out)
		}
	}
	if broken {
		link := filepath.Join(tree, "usr/libexec/unbounded/daemon")
		os.Remove(link)
		if err := os.WriteFile(link, []byte("#!/bin/sh\necho 'this daemon never comes up' >&2\nexit 1\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// control's Version and md5sums (dpkg --verify checks them).
	control := filepath.Join(tree, "DEBIAN/control")
	data, err := os.ReadFile(control)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, l := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(l, "Version: ") {
			l = "Version: " + strings.Replace(stamp, "-", "~", 1)
		}
		lines = append(lines, l)
	}
	os.WriteFile(control, []byte(strings.Join(lines, "\n")), 0o644)
	sums := filepath.Join(tree, "DEBIAN/md5sums")
	data, _ = os.ReadFile(sums)
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		_, name, _ := strings.Cut(l, "  ")
		if b, err := os.ReadFile(filepath.Join(tree, name)); err == nil {
			l = fmt.Sprintf("%x  %s", md5.Sum(b), name)
		}
		out = append(out, l)
	}
	os.WriteFile(sums, []byte(strings.Join(out, "\n")+"\n"), 0o644)
	deb := filepath.Join(dir, "unbounded-agent_"+stamp+".deb")
	run("dpkg-deb", "--root-owner-group", "-Zgzip", "-z1", "--build", tree, deb)
	return deb
}

// putPackage copies deb into the host at /srv/packages (outside the
// upgrade unit's private /tmp) and returns its path there and its sum.
func putPackage(t *testing.T, f *firstBoot, deb string) (string, string) {
	t.Helper()
	data, err := os.ReadFile(deb)
	if err != nil {
		t.Fatal(err)
	}
	in := "/srv/packages/" + filepath.Base(deb)
	f.m.WriteFile(in, data, 0o644)
	s := sha256.Sum256(data)
	return in, hex.EncodeToString(s[:])
}

func (e *kubeEnv) createUpgrade(t *testing.T, machine, version, url, sum string) *v1alpha3.MachineOperation {
	t.Helper()
	in := &v1alpha3.MachineOperation{
		ObjectMeta: metav1.ObjectMeta{GenerateName: machine + "-", Labels: map[string]string{v1alpha3.MachineLabel: machine}},
		Spec: v1alpha3.MachineOperationSpec{MachineRef: v1alpha3.MachineRef{Name: machine}, Operation: v1alpha3.OperationAgentUpgrade,
			Parameters: map[string]string{"version": version, "url": url, "sha256": sum}},
	}
	out := &v1alpha3.MachineOperation{}
	if err := e.api.Post().Resource(v1alpha3.ResourceMachineOperations).Body(in).Do(context.Background()).Into(out); err != nil {
		t.Fatalf("create operation: %v", err)
	}
	return out
}

// nodePIDs are the node's processes an agent upgrade must leave alone.
func nodePIDs(t *testing.T, f *firstBoot) string {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "machine %s", mainPID(t, f.m, nspawnKube1))
	for _, u := range []string{"containerd.service", "kubelet.service"} {
		out, err := f.m.Run("unbounded", "exec", "--", "systemctl", "show", "-p", "MainPID", "--value", u)
		if err != nil {
			t.Fatalf("%s's main pid in the node: %v", u, err)
		}
		fmt.Fprintf(&b, ", %s %s", u, strings.TrimSpace(out))
	}
	return b.String()
}

// watchNotReady counts the Node's NotReady (or missing) looks until stop.
func (f *firstBoot) watchNotReady(stop <-chan struct{}) *atomic.Int32 {
	var n atomic.Int32
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
			if ok, _ := f.nodeReady(context.Background()); !ok {
				n.Add(1)
			}
		}
	}()
	return &n
}

// agentUpgraded waits for the Machine's AgentUpgraded condition with
// status and reason, and a message that says words.
func (f *firstBoot) agentUpgraded(t *testing.T, status metav1.ConditionStatus, reason, words string) *metav1.Condition {
	t.Helper()
	return f.agentUpgradedWithin(t, time.Minute, status, reason, words)
}

// setAgentSpec sets the Machine's spec.agent (nil: removes it).
func (f *firstBoot) setAgentSpec(t *testing.T, a *v1alpha3.AgentSpec) {
	t.Helper()
	patch, _ := json.Marshal(map[string]any{"spec": map[string]any{"agent": a}})
	if err := f.env.api.Patch(types.MergePatchType).Resource(v1alpha3.ResourceMachines).Name(f.name).Body(patch).Do(context.Background()).Error(); err != nil {
		t.Fatalf("Machine %s spec.agent = %+v: %v", f.name, a, err)
	}
}

// agentUpgradedWithin is agentUpgraded waiting at most within.
func (f *firstBoot) agentUpgradedWithin(t *testing.T, within time.Duration, status metav1.ConditionStatus, reason, words string) *metav1.Condition {
	t.Helper()
	var c *metav1.Condition
	waitUntil(t, within, "AgentUpgraded="+string(status)+" "+reason+" saying "+words, func(ctx context.Context) (bool, error) {
		c = meta.FindStatusCondition(f.machine(t).Status.Conditions, v1alpha3.ConditionAgentUpgraded)
		return c != nil && c.Status == status && c.Reason == reason && strings.Contains(c.Message, words), nil
	})
	return c
}

// TestAgentUpgradeByOperationKeepsTheNodeAndRollsBackADaemonThatNeverComesUp:
// on one booted nspawn host, (1) an AgentUpgrade MachineOperation to a newer
// build of the package under test (another version stamp): Complete, the
// Machine reports the new version and AgentUpgraded=True, the daemon runs
// the new executable, the node's machine, containerd and kubelet keep
// their processes, the Node is never NotReady, dpkg --verify is clean;
// (2) one to a package whose daemon never comes up: rolled back by
// itself, Failed, AgentUpgraded=False RolledBack, the daemon on the
// previous version, the node untouched; (3) a package staged with a wrong
// .sha256 (unbounded-upgrade.path): refused before anything changed,
// AgentUpgraded=False naming the mismatch, the files in rejected/; (3b)
// one asked by the Machine's spec.agent (an https package server); (4) an
// upgrade cut after its install, and one cut after the daemon's restart,
// each then power-cut: resumed at boot with the
// node started as usual, Complete; (4b) a rollback cut in its middle:
// finished at boot, the previous package back; (5) the host made
// image-based: an override, then an image update supersedes it.
func TestAgentUpgradeByOperationKeepsTheNodeAndRollsBackADaemonThatNeverComesUp(t *testing.T) {
	defer scenario(t)()
	// The package server of spec.agent: https on loopback, forwarded to
	// the host, its certificate in the host's system roots (after boot).
	pkgDir := t.TempDir()
	pkgServer := httptest.NewTLSServer(http.FileServer(http.Dir(pkgDir)))
	t.Cleanup(pkgServer.Close)
	f := newFirstBoot(t, firstBootOptions{serve: []string{pkgServer.URL}, prepared: true})
	f.bootNode(t)
	roots, _ := f.m.ReadFile("/etc/ssl/certs/ca-certificates.crt")
	roots = append(roots, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: pkgServer.Certificate().Raw})...)
	f.m.WriteFile("/etc/ssl/certs/ca-certificates.crt", roots, 0o644)
	const newer, broken = "9.9.9-up1", "9.9.9-up2"
	good := buildAgentDeb(t, newer, false)
	bad := buildAgentDeb(t, broken, true)
	// The rollback's wait is bounded by --timeout: 20 s, not 60.
	f.m.WriteFile("/etc/systemd/system/"+upgradeUnit+".d/timeout.conf",
		[]byte("[Service]\nExecStart=\nExecStart=/usr/libexec/unbounded/upgrade --timeout=20s\n"), 0o644)
	if out, err := f.m.Systemctl("daemon-reload"); err != nil {
		t.Fatalf("daemon-reload: %v\n%s", err, out)
	}

	// (1) The newer build, by operation.
	pids := nodePIDs(t, f)
	daemonBefore := mainPID(t, f.m, daemonUnit)
	stop := make(chan struct{})
	notReady := f.watchNotReady(stop)
	path, sum := putPackage(t, f, good)
	begin := time.Now()
	op := f.env.createUpgrade(t, f.name, strings.Replace(newer, "-", "~", 1), "file://"+path, sum)
	done := waitOpFinished(t, f, op.Name, 5*time.Minute)
	close(stop)
	t.Logf("AgentUpgrade to %s: %s %s %q after %v", newer, done.Status.State, done.Status.Reason, done.Status.Message, time.Since(begin).Round(time.Millisecond))
	if done.Status.State != v1alpha3.OperationComplete {
		t.Fatalf("AgentUpgrade ended %s: %s\n%s", done.Status.State, done.Status.Message, f.m.Journal(upgradeUnit))
	}
	if out, _ := f.m.Run("journalctl", "-q", "--no-pager", "-o", "short-precise", "-u", upgradeUnit); out != "" {
		t.Logf("the upgrade's journal:\n%s", out)
	}
	waitUntil(t, time.Minute, "the Machine reports agent "+newer, func(ctx context.Context) (bool, error) {
		a := f.machine(t).Status.Agent
		return a != nil && a.Version == newer, nil
	})
	f.agentUpgraded(t, metav1.ConditionTrue, "Upgraded", "to "+strings.Replace(newer, "-", "~", 1))
	if d := mainPID(t, f.m, daemonUnit); d == daemonBefore || d == "0" {
		t.Errorf("daemon main pid %s -> %s: want a new daemon", daemonBefore, d)
	}
	if out, _ := f.m.Run("/usr/libexec/unbounded/unbounded-agent", "--version"); !strings.Contains(out, newer) {
		t.Errorf("installed agent says %q, want %s", out, newer)
	}
	if got := nodePIDs(t, f); got != pids {
		t.Errorf("the node's processes changed in the upgrade: %s -> %s", pids, got)
	}
	if n := notReady.Load(); n != 0 {
		t.Errorf("the Node was not Ready %d times (every 200 ms) during the upgrade", n)
	}
	if out, err := f.m.Run("dpkg", "--verify", "unbounded-agent"); err != nil || strings.TrimSpace(out) != "" {
		t.Errorf("dpkg --verify after the upgrade: %v\n%s", err, out)
	}
	if t.Failed() {
		return
	}

	// (2) A package whose daemon never comes up: rolled back.
	pids = nodePIDs(t, f)
	path, sum = putPackage(t, f, bad)
	begin = time.Now()
	op = f.env.createUpgrade(t, f.name, strings.Replace(broken, "-", "~", 1), "file://"+path, sum)
	done = waitOpFinished(t, f, op.Name, 5*time.Minute)
	t.Logf("AgentUpgrade to the broken %s: %s %s after %v", broken, done.Status.State, done.Status.Reason, time.Since(begin).Round(time.Millisecond))
	if done.Status.State != v1alpha3.OperationFailed {
		t.Errorf("AgentUpgrade to a daemon that never comes up ended %s, want Failed", done.Status.State)
	}
	c := f.agentUpgraded(t, metav1.ConditionFalse, "RolledBack", "to "+strings.Replace(broken, "-", "~", 1))
	if !strings.Contains(c.Message, "rolled back to "+strings.Replace(newer, "-", "~", 1)) {
		t.Errorf("AgentUpgraded message %q does not say it rolled back to %s", c.Message, newer)
	}
	if out, _ := f.m.Run("dpkg-query", "-W", "-f", "${Version}", "unbounded-agent"); out != strings.Replace(newer, "-", "~", 1) {
		t.Errorf("installed version after the rollback %q, want %s", out, newer)
	}
	if st := isActive(f.m, daemonUnit); st != "active" {
		t.Errorf("daemon %s after the rollback", st)
	}
	if got := nodePIDs(t, f); got != pids {
		t.Errorf("the node's processes changed in the rolled back upgrade: %s -> %s", pids, got)
	}
	if t.Failed() {
		return
	}

	// (3) Staged by an operator with a wrong .sha256.
	data, _ := os.ReadFile(good)
	f.m.WriteFile("/var/lib/unbounded/upgrade/staged/agent.deb", data, 0o600)
	f.m.WriteFile("/var/lib/unbounded/upgrade/staged/agent.deb.sha256", []byte(strings.Repeat("0", 64)+"  agent.deb\n"), 0o600)
	c = f.agentUpgraded(t, metav1.ConditionFalse, "UpgradeFailed", "checksum mismatch")
	if !strings.Contains(c.Message, "checksum mismatch") || !strings.Contains(c.Message, strings.Repeat("0", 64)) {
		t.Errorf("AgentUpgraded message %q does not name the mismatch", c.Message)
	}
	if out, _ := f.m.Run("ls", "/var/lib/unbounded/upgrade/staged", "/var/lib/unbounded/upgrade/rejected"); !strings.Contains(out, "agent.deb.sha256") {
		t.Errorf("staged and rejected: %s", out)
	}
	if out, _ := f.m.Run("dpkg-query", "-W", "-f", "${Version}", "unbounded-agent"); out != strings.Replace(newer, "-", "~", 1) {
		t.Errorf("installed version after the refused staged package %q, want %s", out, newer)
	}
	if t.Failed() {
		return
	}

	// (3b) Asked by the Machine's spec.agent: the daemon writes the
	// request and starts the unit; the package on an https package
	// server the host trusts. Then spec.agent is removed: it is
	// declarative, and left in place it would take the host back to
	// this version after every later upgrade.
	{
		const to = "9.9.9-up3"
		pids = nodePIDs(t, f)
		deb := buildAgentDeb(t, to, false)
		if err := os.Link(deb, filepath.Join(pkgDir, filepath.Base(deb))); err != nil {
			t.Fatal(err)
		}
		_, sum := putPackage(t, f, deb)
		begin = time.Now()
		f.setAgentSpec(t, &v1alpha3.AgentSpec{Version: strings.Replace(to, "-", "~", 1), URL: pkgServer.URL + "/" + filepath.Base(deb), SHA256: sum})
		waitUntil(t, 2*time.Minute, "the Machine reports agent "+to+" (spec.agent)", func(ctx context.Context) (bool, error) {
			a := f.machine(t).Status.Agent
			return a != nil && a.Version == to, nil
		})
		t.Logf("spec.agent %s: reported %v after the spec changed", to, time.Since(begin).Round(time.Millisecond))
		f.agentUpgraded(t, metav1.ConditionTrue, "Upgraded", "to "+strings.Replace(to, "-", "~", 1))
		if out, _ := f.m.Run("dpkg-query", "-W", "-f", "${Version}", "unbounded-agent"); out != strings.Replace(to, "-", "~", 1) {
			t.Errorf("installed version after spec.agent %q, want %s", out, to)
		}
		if got := nodePIDs(t, f); got != pids {
			t.Errorf("the node's processes changed in the spec.agent upgrade: %s -> %s", pids, got)
		}
		f.setAgentSpec(t, nil)
		if t.Failed() {
			return
		}
	}

	// (4) An upgrade by operation cut right after its install (the
	// daemon stopped first, as the power cut that follows stops it:
	// nothing reports the cut), and staged ones cut in the package
	// manager's install between unpack and configure (dpkg leaves the
	// package half-installed), right after the daemon's restart, after
	// the record's last write (the package in installed/, the outcome
	// recorded, the request taken, the journal still there) and after
	// the journal's removal with the installation lock still held, each
	// followed by a power cut of the whole host: at boot the node starts
	// as on any boot, the upgrade is resumed and finishes on the new
	// version (the operation Complete; never rolled back, never left
	// owning the host with the daemon down), and dpkg has nothing
	// half-installed. (Issue 41's windows 1, 2 and 4, cut for real; the
	// versions rise, the last is 9.9.9-up5, which (4b) and (5) expect.)
	for _, c := range []struct{ point, to string }{
		{"upgrade/after-install", "9.9.9-up4"},
		{"upgrade/after-unpack", "9.9.9-up4a"},
		{"upgrade/after-activate", "9.9.9-up4b"},
		{"upgrade/after-request-taken", "9.9.9-up4c"},
		{"upgrade/before-release", "9.9.9-up5"},
	} {
		point, to := c.point, c.to
		path, sum = putPackage(t, f, buildAgentDeb(t, to, false))
		setCrashPoint(t, f, upgradeUnit, point)
		f.daemonWatchdog(t, false)
		byOp := point == "upgrade/after-install"
		cursor := journalCursor(t, f)
		if byOp {
			op = f.env.createUpgrade(t, f.name, strings.Replace(to, "-", "~", 1), "file://"+path, sum)
			waitUntil(t, 2*time.Minute, "the AgentUpgrade operation InProgress and its unit running", func(ctx context.Context) (bool, error) {
				o := f.op(ctx, op.Name)
				st := showProps(t, f.m, upgradeUnit, "ActiveState")["ActiveState"]
				return o != nil && o.Status.State == v1alpha3.OperationInProgress && (st == "activating" || st == "active"), nil
			})
			if out, err := f.m.Run("sh", "-c", "kill -STOP $(systemctl show -p MainPID --value "+daemonUnit+")"); err != nil {
				t.Fatalf("stop the daemon: %v\n%s", err, out)
			}
		} else {
			// Started by hand here, the path unit stopped: it would
			// start the crashing run again and again while the staged
			// files are there (its trigger was (3)'s). Not by an
			// operation or spec.agent: the new daemon, which must run to
			// be waited for, would start the crashing run again too.
			f.m.Systemctl("stop", "unbounded-upgrade.path")
			data, _ := f.m.ReadFile(path)
			f.m.WriteFile("/var/lib/unbounded/upgrade/staged/agent.deb", data, 0o600)
			f.m.WriteFile("/var/lib/unbounded/upgrade/staged/agent.deb.sha256", []byte(sum+"\n"), 0o600)
			if out, err := f.m.Systemctl("start", "--no-block", upgradeUnit); err != nil {
				t.Fatalf("start %s: %v\n%s", upgradeUnit, err, out)
			}
		}
		wantCrashedAt(t, f, upgradeUnit, point, waitUnitDone(t, f, upgradeUnit, cursor, 5*time.Minute))
		f.m.PowerCut()
		setCrashPoint(t, f, upgradeUnit, "")
		f.daemonWatchdog(t, true)
		begin = time.Now()
		f.m.Start()
		if byOp {
			done = waitOpFinished(t, f, op.Name, 5*time.Minute)
			t.Logf("power cut at %s: operation %s %s/%s %v after the boot began: %s", point, op.Name, done.Status.State, done.Status.Reason,
				time.Since(begin).Round(time.Millisecond), done.Status.Message)
			if done.Status.State != v1alpha3.OperationComplete {
				t.Fatalf("operation ended %s: %s\n%s", done.Status.State, done.Status.Message, f.m.Journal(upgradeUnit))
			}
		}
		waitUntil(t, 2*time.Minute, "the Machine reports agent "+to, func(ctx context.Context) (bool, error) {
			a := f.machine(t).Status.Agent
			return a != nil && a.Version == to, nil
		})
		f.agentUpgraded(t, metav1.ConditionTrue, "Upgraded", "to "+strings.Replace(to, "-", "~", 1))
		t.Logf("power cut at %s: agent %s reported %v after the boot began", point, to, time.Since(begin).Round(time.Millisecond))
		waitUntil(t, 3*time.Minute, "Node Ready after the power cut", f.nodeReady)
		if out, err := f.m.Run("dpkg", "--audit"); err != nil || strings.TrimSpace(out) != "" {
			t.Errorf("dpkg --audit after the resumed upgrade: %v\n%s", err, out)
		}
		if out, _ := f.m.Run("dpkg-query", "-W", "-f", "${Version}", "unbounded-agent"); out != strings.Replace(to, "-", "~", 1) {
			t.Errorf("installed version after the resumed upgrade %q, want %s", out, to)
		}
		if t.Failed() {
			return
		}
	}

	// (4b) A power cut in the middle of a rollback: a package whose
	// daemon never comes up, staged by hand, cut as its rollback begins
	// (the journal says rolling back, the broken package installed). At
	// boot the broken daemon fails, lifecycle resumes the upgrade, which
	// finishes the rollback: the previous package installed and its
	// daemon running, nothing half-installed, and the Machine told
	// (AgentUpgraded=False, rolled back).
	{
		const broken, back = "9.9.9-up6", "9.9.9-up5"
		path, sum = putPackage(t, f, buildAgentDeb(t, broken, true))
		setCrashPoint(t, f, upgradeUnit, "upgrade/rolling-back")
		f.m.Systemctl("stop", "unbounded-upgrade.path")
		cursor := journalCursor(t, f)
		data, _ := f.m.ReadFile(path)
		f.m.WriteFile("/var/lib/unbounded/upgrade/staged/agent.deb", data, 0o600)
		f.m.WriteFile("/var/lib/unbounded/upgrade/staged/agent.deb.sha256", []byte(sum+"\n"), 0o600)
		if out, err := f.m.Systemctl("start", "--no-block", upgradeUnit); err != nil {
			t.Fatalf("start %s: %v\n%s", upgradeUnit, err, out)
		}
		wantCrashedAt(t, f, upgradeUnit, "upgrade/rolling-back", waitUnitDone(t, f, upgradeUnit, cursor, 5*time.Minute))
		if out, _ := f.m.Run("dpkg-query", "-W", "-f", "${Version}", "unbounded-agent"); out != strings.Replace(broken, "-", "~", 1) {
			t.Fatalf("installed version when the rollback was cut %q, want the broken %s", out, broken)
		}
		f.m.PowerCut()
		setCrashPoint(t, f, upgradeUnit, "")
		begin = time.Now()
		f.m.Start()
		c := f.agentUpgradedWithin(t, 3*time.Minute, metav1.ConditionFalse, "RolledBack", "to "+strings.Replace(broken, "-", "~", 1))
		t.Logf("power cut mid-rollback: AgentUpgraded=False %s %v after the boot began: %s", c.Reason, time.Since(begin).Round(time.Millisecond), c.Message)
		if !strings.Contains(c.Message, "rolled back to "+strings.Replace(back, "-", "~", 1)) {
			t.Errorf("AgentUpgraded message %q does not say it rolled back to %s", c.Message, back)
		}
		waitUntil(t, 2*time.Minute, "the Machine reports agent "+back, func(ctx context.Context) (bool, error) {
			a := f.machine(t).Status.Agent
			return a != nil && a.Version == back, nil
		})
		if out, _ := f.m.Run("dpkg-query", "-W", "-f", "${Version}", "unbounded-agent"); out != strings.Replace(back, "-", "~", 1) {
			t.Errorf("installed version after the resumed rollback %q, want %s", out, back)
		}
		if out, err := f.m.Run("dpkg", "--audit"); err != nil || strings.TrimSpace(out) != "" {
			t.Errorf("dpkg --audit after the resumed rollback: %v\n%s", err, out)
		}
		if st := isActive(f.m, daemonUnit); st != "active" {
			t.Errorf("daemon %s after the resumed rollback", st)
		}
		waitUntil(t, 3*time.Minute, "Node Ready after the power cut mid-rollback", f.nodeReady)
		if t.Failed() {
			return
		}
	}

	// (4c) Issue 41's window 3: an upgrade whose every run is cut right
	// after the daemon's restart on the new version (a new agent that
	// takes its own upgrade down) is resumed at most upgrade.MaxResumes
	// times, each resumed run cut at the same place; the run after that
	// rolls it back (the previous package installed, nothing
	// half-installed) and the Machine says why.
	{
		const to, back = "9.9.9-up5c", "9.9.9-up5"
		path, sum = putPackage(t, f, buildAgentDeb(t, to, false))
		setCrashPoint(t, f, upgradeUnit, upgrade.CrashAfterDaemonRestart)
		f.m.Systemctl("stop", "unbounded-upgrade.path")
		data, _ := f.m.ReadFile(path)
		f.m.WriteFile("/var/lib/unbounded/upgrade/staged/agent.deb", data, 0o600)
		f.m.WriteFile("/var/lib/unbounded/upgrade/staged/agent.deb.sha256", []byte(sum+"\n"), 0o600)
		for i := 0; i <= upgrade.MaxResumes; i++ {
			cursor := journalCursor(t, f)
			if out, err := f.m.Systemctl("start", "--no-block", upgradeUnit); err != nil {
				t.Fatalf("start %s: %v\n%s", upgradeUnit, err, out)
			}
			wantCrashedAt(t, f, upgradeUnit, upgrade.CrashAfterDaemonRestart, waitUnitDone(t, f, upgradeUnit, cursor, 5*time.Minute))
		}
		setCrashPoint(t, f, upgradeUnit, "")
		begin = time.Now()
		if out, err := f.m.Systemctl("start", "--no-block", upgradeUnit); err != nil {
			t.Fatalf("start %s: %v\n%s", upgradeUnit, err, out)
		}
		c := f.agentUpgradedWithin(t, 3*time.Minute, metav1.ConditionFalse, "RolledBack", "to "+strings.Replace(to, "-", "~", 1))
		t.Logf("an upgrade cut %d times after the daemon's restart: AgentUpgraded=False %s %v after the last run began: %s",
			upgrade.MaxResumes+1, c.Reason, time.Since(begin).Round(time.Millisecond), c.Message)
		if !strings.Contains(c.Message, fmt.Sprintf("resumed %d times", upgrade.MaxResumes)) {
			t.Errorf("AgentUpgraded message %q does not say the upgrade was resumed %d times", c.Message, upgrade.MaxResumes)
		}
		waitUntil(t, 2*time.Minute, "the Machine reports agent "+back, func(ctx context.Context) (bool, error) {
			a := f.machine(t).Status.Agent
			return a != nil && a.Version == back, nil
		})
		if out, _ := f.m.Run("dpkg-query", "-W", "-f", "${Version}", "unbounded-agent"); out != strings.Replace(back, "-", "~", 1) {
			t.Errorf("installed version after the bounded resumes %q, want %s back", out, back)
		}
		if out, err := f.m.Run("dpkg", "--audit"); err != nil || strings.TrimSpace(out) != "" {
			t.Errorf("dpkg --audit after the bounded resumes: %v\n%s", err, out)
		}
		// The path unit again, as a boot starts it: (5) stages by it.
		// (The rejected package's files moved out of staged/: nothing
		// triggers it now.)
		if out, err := f.m.Systemctl("start", "unbounded-upgrade.path"); err != nil {
			t.Fatalf("start unbounded-upgrade.path: %v\n%s", err, out)
		}
		if t.Failed() {
			return
		}
	}

	// (5) The same host as an image-based one: /usr read-only (a bind
	// mount of itself, remounted read-only, in the host's namespace). A
	// staged upgrade installs nothing: the daemon runs the staged agent
	// through the override, /usr and dpkg are untouched, status says so.
	// Then an image update: the host off, a newer package's files put
	// into /usr as an image build does, and at boot lifecycle removes
	// the override: the daemon runs the image's agent again.
	for _, args := range [][]string{{"mount", "--bind", "/usr", "/usr"}, {"mount", "-o", "remount,bind,ro", "/usr"}} {
		if out, err := f.m.Run(args...); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
	}
	const staged, image = "9.9.9-up7", "9.9.9-up8"
	path, sum = putPackage(t, f, buildAgentDeb(t, staged, false))
	data, _ = f.m.ReadFile(path)
	f.m.WriteFile("/var/lib/unbounded/upgrade/staged/agent.deb", data, 0o600)
	f.m.WriteFile("/var/lib/unbounded/upgrade/staged/agent.deb.sha256", []byte(sum+"\n"), 0o600)
	f.agentUpgraded(t, metav1.ConditionTrue, "Upgraded", "to "+strings.Replace(staged, "-", "~", 1))
	daemonRuns := func() string {
		out, _ := f.m.Run("sh", "-c", "/proc/$(systemctl show -p MainPID --value "+daemonUnit+")/exe --version")
		return strings.TrimSpace(out)
	}
	if v := daemonRuns(); !strings.Contains(v, staged) {
		t.Errorf("with the override the daemon runs %q, want %s", v, staged)
	}
	if out, _ := f.m.Run("dpkg-query", "-W", "-f", "${Version}", "unbounded-agent"); out != "9.9.9~up5" {
		t.Errorf("dpkg says %q after the override, want the package installed before it, 9.9.9~up5", out)
	}
	if out, err := f.m.Run("dpkg", "--verify", "unbounded-agent"); err != nil || strings.TrimSpace(out) != "" {
		t.Errorf("dpkg --verify with the override (nothing in /usr may change): %v\n%s", err, out)
	}
	if out, _ := f.m.Run("unbounded", "status"); !strings.Contains(out, "override active: the agent's units run "+strings.Replace(staged, "-", "~", 1)) {
		t.Errorf("unbounded status does not show the override:\n%s", out)
	}
	if t.Failed() {
		return
	}
	newImage := buildAgentDeb(t, image, false)
	f.m.Stop()
	if out, err := exec.Command("dpkg-deb", "-x", newImage, f.m.Root()).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb -x into the host's /usr: %v\n%s", err, out)
	}
	f.m.Start()
	waitUntil(t, 2*time.Minute, "the Machine reports the image's agent "+image, func(ctx context.Context) (bool, error) {
		a := f.machine(t).Status.Agent
		return a != nil && a.Version == image, nil
	})
	if v := daemonRuns(); !strings.Contains(v, image) {
		t.Errorf("after the image update the daemon runs %q, want the image's %s", v, image)
	}
	for _, left := range []string{"/etc/systemd/system/unbounded-daemon.service.d/50-unbounded-agent-override.conf", "/var/lib/unbounded/agent/override.json"} {
		if _, err := os.Lstat(filepath.Join(f.m.Root(), left)); !os.IsNotExist(err) {
			t.Errorf("%s is left after the image update (%v)", left, err)
		}
	}
	waitUntil(t, 3*time.Minute, "Node Ready after the image update", f.nodeReady)
}
