package system_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/uuid"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/tests/system/nodestack"
)

// First boots that fail, on the first-boot fixture (firstboot_test.go):
// the real unbounded-bootstrap.service at boot, under real systemd,
// against the test control plane, the loopback mirror and registry. Each
// one ends with the exit code of ARCHITECTURE section 6 and leaves a host
// that needs nobody to clean it: no applied config, the ownership lock
// released, no node running, no slot half built, the reason on the
// Machine. None of them needs a Ready node: they fail before the node
// starts (the fence's scenario after the slot is built).
//
// OnFailure=unbounded-recover@%n.service: systemd starts recovery after
// each of these failures (also after 77 and 78, which recovery leaves
// alone). The host is looked at once recovery has finished: it holds the
// installation lock for a moment and is a queued job while it runs. These
// scenarios check that the failed bootstrap itself left the host
// consistent, so recovery has nothing to clean after a failed first boot
// (it reports, and repairs no daemon on a host without an applied config).

// bootstrapEnded boots f and waits (bounded) until bootstrap's first run
// has ended, whatever it ended with; it returns the unit's properties
// then. A run that ends 75 leaves the unit activating (auto-restart)
// rather than failed, so "ended" is the main process's exit time, not a
// state.
func (f *firstBoot) bootstrapEnded(t *testing.T) map[string]string {
	t.Helper()
	begin := time.Now()
	f.m.Start()
	var p map[string]string
	waitUntil(t, 5*time.Minute, "bootstrap's first run ended", func(context.Context) (bool, error) {
		p = showProps(t, f.m, bootstrapUnit, "ActiveState", "SubState", "Result", "ExecMainStatus", "ExecMainExitTimestampMonotonic", "NRestarts")
		return p["ExecMainExitTimestampMonotonic"] != "" && p["ExecMainExitTimestampMonotonic"] != "0", nil
	})
	t.Logf("boot and bootstrap's run: %v, %v", time.Since(begin).Round(time.Millisecond), p)
	return p
}

// wantFinalExit asserts that bootstrap ended with code and that systemd
// will not run it again: the unit is failed (not waiting to restart) and
// was never restarted.
func wantFinalExit(t *testing.T, f *firstBoot, p map[string]string, code int) {
	t.Helper()
	if p["ExecMainStatus"] != fmt.Sprint(code) || p["ActiveState"] != "failed" || p["Result"] != "exit-code" || p["NRestarts"] != "0" {
		t.Errorf("%s: %v, want exit status %d, failed, no restart\n%s", bootstrapUnit, p, code, f.m.Journal(bootstrapUnit))
	}
}

// wantJournalSays asserts that bootstrap's journal holds every one of
// words.
func wantJournalSays(t *testing.T, f *firstBoot, words ...string) string {
	t.Helper()
	j := f.m.Journal(bootstrapUnit)
	// And by its identifier: journald may store the last line a process
	// wrote without the unit's name when the process was gone before
	// journald read it (seen with the configuration error, written just
	// before the exit); its identifier comes with the stream.
	if byName, err := f.m.Run("journalctl", "-q", "--no-pager", "-b", "-o", "cat", "-t", "bootstrap"); err == nil {
		j += byName
	}
	for _, w := range words {
		if !strings.Contains(j, w) {
			t.Errorf("bootstrap's journal does not say %q:\n%s", w, j)
		}
	}
	for _, l := range strings.Split(j, "\n") {
		if strings.Contains(l, "bootstrap failed") {
			t.Logf("journal: %s", l)
		}
	}
	return j
}

// wantMachineFailed asserts the Machine's status.bootstrap: Failed, with
// reason, and a message holding every one of words.
func wantMachineFailed(t *testing.T, f *firstBoot, reason string, words ...string) {
	t.Helper()
	b := f.machine(t).Status.Bootstrap
	if b == nil || b.State != v1alpha3.BootstrapFailed || b.Reason != reason {
		t.Errorf("Machine %s status.bootstrap = %+v, want Failed with reason %s", f.name, b, reason)
		return
	}
	t.Logf("Machine status.bootstrap: %s %s: %s", b.State, b.Reason, b.Message)
	for _, w := range words {
		if !strings.Contains(b.Message, w) {
			t.Errorf("Machine status.bootstrap message does not say %q: %q", w, b.Message)
		}
	}
}

// wantConsistentAfterFailure asserts what a failed first boot leaves: no
// applied config (the generator pulls bootstrap in again at the next
// boot), the ownership lock released (reset, the daemon, a rerun may
// own the host), no node unit running or queued, the bootstrap journal
// (what a rerun resumes from) whole, and, when slotBuilt is false, no
// slot at all: nothing under /var/lib/machines (not even a temporary
// unpack directory) and no machine settings in /etc/systemd/nspawn.
func wantConsistentAfterFailure(t *testing.T, f *firstBoot, phase string, slotBuilt bool) {
	t.Helper()
	recovery := waitFinished(t, f.m, "unbounded-recover@"+bootstrapUnit+".service", "Result")
	if recovery["Result"] != "success" {
		t.Errorf("recovery after the failed bootstrap: %v\n%s", recovery, f.m.Journal("unbounded-recover@"+bootstrapUnit+".service"))
	}
	applied := f.paths.AppliedConfig("kube1")
	for _, p := range []string{applied, applied + ".sha256", f.paths.Ownership()} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("after the failed bootstrap %s exists (%v)", f.paths.Rel(p), err)
		}
	}
	if data, err := os.ReadFile(f.paths.Journal("bootstrap")); err != nil {
		t.Errorf("bootstrap journal: %v (a rerun resumes from it)", err)
	} else if _, err := os.Stat(hostpaths.Checksum(f.paths.Journal("bootstrap"))); err != nil {
		t.Errorf("bootstrap journal %s has no checksum sidecar: %v", data, err)
	}
	for _, u := range []string{"unbounded-node.target", "unbounded-mode-nspawn.target", "systemd-nspawn@kube1.service", "unbounded-daemon.service"} {
		if a := isActive(f.m, u); a == "active" || a == "activating" || a == "reloading" {
			t.Errorf("after the failed bootstrap %s is %s, want not running", u, a)
		}
	}
	if out, _ := f.m.Run("machinectl", "list", "--no-legend"); strings.Contains(out, "kube1") {
		t.Errorf("machine kube1 is registered after the failed bootstrap:\n%s", out)
	}
	if jobs, _ := f.m.Systemctl("list-jobs", "--no-legend"); strings.Contains(jobs, "unbounded") || strings.Contains(jobs, "nspawn") {
		t.Errorf("jobs queued after the failed bootstrap:\n%s", jobs)
	}
	entries, err := os.ReadDir(f.paths.Join(hostpaths.MachinesDirHost))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !slotBuilt || e.Name() != "kube1" {
			t.Errorf("/var/lib/machines/%s left by the failed bootstrap (slot built: %v)", e.Name(), slotBuilt)
		}
	}
	if !slotBuilt {
		if _, err := os.Stat(f.paths.NspawnConfig("kube1")); !os.IsNotExist(err) {
			t.Errorf("%s written by a bootstrap that failed before the slot was built (%v)", f.paths.Rel(f.paths.NspawnConfig("kube1")), err)
		}
	}
	// Nothing half downloaded stays behind a final failure: a .part is
	// only kept for a download that a retry resumes.
	filepath.WalkDir(f.paths.ArtifactsDir(), func(p string, d os.DirEntry, err error) error {
		if err == nil && strings.HasSuffix(p, ".part") {
			t.Errorf("partial download %s left by a final failure", f.paths.Rel(p))
		}
		return nil
	})
	// What an operator who looks sees: `systemctl status` and `unbounded
	// status` name the phase that failed.
	if st := showProps(t, f.m, bootstrapUnit, "StatusText")["StatusText"]; !strings.HasPrefix(st, "failed in phase "+phase+": ") {
		t.Errorf("systemctl status of %s says %q, want the failed phase %s and why", bootstrapUnit, st, phase)
	}
	if out, err := f.m.Run("unbounded", "status"); err != nil || !strings.Contains(out, "step "+phase+" failed: ") {
		t.Errorf("unbounded status does not say that bootstrap failed in phase %s (%v):\n%s", phase, err, out)
	} else {
		t.Logf("unbounded status:\n%s", out)
	}
	assertNoSandboxDenials(t, f.m, bootstrapUnit)
	t.Logf("recovery:\n%s", f.m.Journal("unbounded-recover@"+bootstrapUnit+".service"))
}

// The mirror serves a kubelet that is not the one its SHA256SUMS lists
// (a corrupted or tampered file): bootstrap stops at the artifacts, exit
// 1, naming the artifact and both sums; the wrong bytes are not kept.
func TestFirstBootArtifactChecksumMismatchExits1AndLeavesTheHostConsistent(t *testing.T) {
	defer scenario(t)()
	f := newFirstBoot(t, firstBootOptions{})
	kubelet := filepath.Join(f.mirrorDir, f.stage.Path("kubelet"))
	want, err := nodestack.FileSHA256(kubelet)
	if err != nil {
		t.Fatal(err)
	}
	// A hard link to the staged kubelet: replace it, do not write into it.
	if err := os.Remove(kubelet); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(kubelet, []byte("#!/bin/sh\necho not the kubelet the mirror's sums file lists\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	got, err := nodestack.FileSHA256(kubelet)
	if err != nil {
		t.Fatal(err)
	}

	p := f.bootstrapEnded(t)
	wantFinalExit(t, f, p, 1)
	wantJournalSays(t, f, "kubelet", want, got, "mismatch")
	wantMachineFailed(t, f, "ArtifactChecksumMismatch", "kubelet", want, got)
	wantConsistentAfterFailure(t, f, "artifacts", false)
	// The cache holds no kubelet: the next run downloads it again.
	if entries, err := os.ReadDir(filepath.Join(f.paths.ArtifactsDir(), "kubelet")); err == nil {
		for _, e := range entries {
			files, _ := os.ReadDir(filepath.Join(f.paths.ArtifactsDir(), "kubelet", e.Name()))
			for _, file := range files {
				t.Errorf("the cache keeps kubelet/%s/%s after a checksum mismatch", e.Name(), file.Name())
			}
		}
	}
	// The unit is not retried: the mirror served the wrong file once.
	served := 0
	for _, r := range f.mirror.Requests() {
		if strings.HasSuffix(r.Path, "/kubelet") {
			served++
		}
	}
	if served != 1 {
		t.Errorf("the mirror served the kubelet %d times, want once (no retry of a mismatch)", served)
	}
}

// The allocation this host was launched for is fenced before it boots:
// bootstrap builds the slot, asks the fence, which refuses (77); no node
// runs, the Machine says AllocationLaunchRefused.
func TestFirstBootFencedAllocationExits77AndNoNodeRuns(t *testing.T) {
	defer scenario(t)()
	uid := string(uuid.NewUUID())
	f := newFirstBoot(t, firstBootOptions{extra: fmt.Sprintf("\n[allocation]\nuid = %q\n", uid)})
	in := &v1alpha3.Machine{
		ObjectMeta: metav1.ObjectMeta{Name: f.name},
		Spec: v1alpha3.MachineSpec{Allocation: &v1alpha3.AllocationRef{
			Name: "alloc-" + f.name, UID: uid, Fenced: true}},
	}
	if err := f.env.api.Post().Resource(v1alpha3.ResourceMachines).Body(in).Do(context.Background()).Error(); err != nil {
		t.Fatalf("create Machine: %v", err)
	}

	p := f.bootstrapEnded(t)
	wantFinalExit(t, f, p, 77)
	wantJournalSays(t, f, fenceUnit, "77")
	if j := f.m.Journal(fenceUnit); !strings.Contains(j, "reason="+v1alpha3.ReasonAllocationFenced) {
		t.Errorf("the fence's journal does not name the reason:\n%s", j)
	}
	cond := machineCondition(t, f.env, f.name)
	if cond == nil || cond.Status != metav1.ConditionTrue || cond.Reason != v1alpha3.ReasonAllocationFenced {
		t.Errorf("Machine condition AllocationLaunchRefused = %+v, want True/AllocationFenced", cond)
	}
	wantMachineFailed(t, f, v1alpha3.ConditionAllocationLaunchRefused)
	// The slot was built (the fence runs after it), and stays for the
	// run that follows an unfencing; only the node is not started.
	if _, err := os.Stat(filepath.Join(f.paths.MachineDir("kube1"), "usr")); err != nil {
		t.Errorf("slot kube1: %v", err)
	}
	wantConsistentAfterFailure(t, f, "fence", true)
	if n, err := f.env.kube.CoreV1().Nodes().Get(context.Background(), f.name, metav1.GetOptions{}); err == nil {
		t.Errorf("Node %s registered by a host whose allocation is fenced (created %v)", f.name, n.CreationTimestamp)
	}
}

// Bad input of four kinds, each on its own test host. Each is clear in
// the journal, ends with the code of the contract, and leaves the host
// consistent.
func TestFirstBootBadInput(t *testing.T) {
	defer scenario(t)()

	// A Kubernetes version the mirror does not have. The config is
	// valid on its face ("1.99.0" is a version; lib/config cannot know
	// which versions a mirror holds), so this is not 78: the mirror's
	// answer is final (its sums file has no such kubelet; the file
	// itself would be a 404), and a retry asks the same mirror the same
	// question: 1, naming the artifact's URL, not a loop of 75.
	t.Run("UnknownKubernetesVersion", func(t *testing.T) {
		defer scenario(t)()
		f := newFirstBoot(t, firstBootOptions{})
		f.m.WriteFile(hostpaths.ConfigDropinDirHost+"/50-version.toml", []byte("[cluster]\nkubernetes-version = \"1.99.0\"\n"), 0o644)
		p := f.bootstrapEnded(t)
		wantFinalExit(t, f, p, 1)
		url := f.mirror.URL + "/kubelet/v1.99.0/"
		wantJournalSays(t, f, "kubelet 1.99.0", url)
		wantMachineFailed(t, f, "ArtifactsFailed", "kubelet 1.99.0", url)
		wantConsistentAfterFailure(t, f, "artifacts", false)
	})

	// An image reference the registry does not have (manifest unknown):
	// final, 1, naming the reference.
	t.Run("ImageNotInRegistry", func(t *testing.T) {
		defer scenario(t)()
		f := newFirstBoot(t, firstBootOptions{})
		ref := f.reg.Host + "/unbounded/node:no-such-tag"
		f.m.WriteFile(hostpaths.ConfigDropinDirHost+"/50-image.toml", []byte(fmt.Sprintf("[nspawn]\nimage = %q\n", ref)), 0o644)
		p := f.bootstrapEnded(t)
		wantFinalExit(t, f, p, 1)
		wantJournalSays(t, f, ref, "not found", "MANIFEST_UNKNOWN")
		wantMachineFailed(t, f, "NodeImageNotFound", ref)
		wantConsistentAfterFailure(t, f, "slot", false)
	})

	// A node address ([node] ip) that is none of the host's: the kubelet
	// would register an address nothing answers on. 78 before anything
	// on the host changes, naming the drop-in, its line and the key.
	t.Run("NodeIPNotTheHosts", func(t *testing.T) {
		defer scenario(t)()
		f := newFirstBoot(t, firstBootOptions{})
		f.m.WriteFile(hostpaths.ConfigDropinDirHost+"/50-ip.toml", []byte("[node]\nip = \"192.0.2.99\"\n"), 0o644)
		p := f.bootstrapEnded(t)
		wantFinalExit(t, f, p, 78)
		wantJournalSays(t, f, "50-ip.toml:2", "node.ip", "192.0.2.99 is not an address of this host")
		for _, path := range []string{f.paths.Ownership(), f.paths.Journal("bootstrap"), f.paths.HostPrepRecord(),
			f.paths.AppliedConfig("kube1"), f.paths.NspawnConfig("kube1"), f.paths.MachineDir("kube1")} {
			if _, err := os.Stat(path); !os.IsNotExist(err) {
				t.Errorf("after a bad node.ip %s exists (%v): the host was changed", f.paths.Rel(path), err)
			}
		}
	})

	// A registry that answers every request with 200 and a body that
	// is not a manifest (a captive portal, a proxy in the way). 1, not
	// 75: the registry is reachable and answered; asking it again gets
	// the same answer until someone fixes the registry or the network
	// path to it, which a retry loop would only hide behind an
	// "activating (auto-restart)" unit. A failed unit and Failed on the
	// Machine say it; the next boot, or `systemctl start
	// unbounded-bootstrap`, resumes once it is fixed.
	t.Run("RegistryAnswersGarbage", func(t *testing.T) {
		defer scenario(t)()
		f := newFirstBoot(t, firstBootOptions{reg: nodestack.StartRegistry(t)})
		f.reg.SetGarbage(true)
		p := f.bootstrapEnded(t)
		wantFinalExit(t, f, p, 1)
		wantJournalSays(t, f, f.nodeRef, "not an image manifest", "this is not a registry")
		wantMachineFailed(t, f, "SlotPreparationFailed", f.nodeRef, "not an image manifest")
		wantConsistentAfterFailure(t, f, "slot", false)
	})
}
