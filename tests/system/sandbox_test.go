package system_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/state"
	"unbounded-cloud.io/agent/tests/system/harness"
)

// The sandboxes of the shipped units under a real systemd (ARCHITECTURE
// section 6, "Sandboxing"). units/security_test.go scores the unit files;
// here systemd applies them. The daemon's and the fence's own scenarios
// (daemon_test.go, fence_test.go) run the real binaries in them and check
// that their journals hold no denial (assertNoSandboxDenials); this file
// runs a probe under each unit's exact sandbox (the shipped unit, with a
// drop-in that only swaps what it runs) to show what the sandbox allows,
// what it refuses, and that a refusal is seen in the journal.

// sandboxDenialRE matches what a sandbox refusal looks like in a unit's
// journal: the errno texts of EACCES, EPERM and EROFS as programs print
// them (Go, the shell, systemd's tools), and systemd's own "could not set
// the sandbox up" (exit statuses 200-243 such as 226/NAMESPACE, 218/
// CAPABILITIES, 228/SECCOMP: "status=226/NAMESPACE").
var sandboxDenialRE = regexp.MustCompile(`(?i)permission denied|operation not permitted|read-only file system|\bE(ACCES|PERM|ROFS)\b|status=2[0-4][0-9]/[A-Z]|Failed to set up|Failed at step`)

// sandboxDenials returns the lines of journal that look like a sandbox
// refusal.
func sandboxDenials(journal string) []string {
	var hits []string
	for _, l := range strings.Split(journal, "\n") {
		if sandboxDenialRE.MatchString(l) {
			hits = append(hits, l)
		}
	}
	return hits
}

// assertNoSandboxDenials fails t for every line of unit's journal (this
// boot) that looks like a sandbox refusal: a privilege the unit's job needs
// and its sandbox took away.
func assertNoSandboxDenials(t *testing.T, m *harness.Machine, unit string) {
	t.Helper()
	if hits := sandboxDenials(m.Journal(unit)); len(hits) > 0 {
		t.Errorf("%s's journal shows its sandbox refusing it something:\n  %s", unit, strings.Join(hits, "\n  "))
	}
}

// assertSandboxed checks that the running main process of unit is in the
// sandbox its unit file asks for, as the kernel sees it: no capability,
// no_new_privs, a seccomp filter, only root mapped in its user namespace,
// and a mount namespace where the system is read-only but for writable.
// systemd skips some sandboxing where the kernel lacks it (a seccomp
// filter, for one), so the unit file's score alone does not prove this.
func assertSandboxed(t *testing.T, m *harness.Machine, unit string, writable ...string) {
	t.Helper()
	pid := strings.TrimSpace(m.MustRun("systemctl", "show", "-P", "MainPID", unit))
	if pid == "" || pid == "0" {
		t.Fatalf("%s has no main process", unit)
	}
	status := m.MustRun("cat", "/proc/"+pid+"/status")
	fields := map[string]string{}
	for _, l := range strings.Split(status, "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok {
			fields[k] = strings.TrimSpace(v)
		}
	}
	for k, want := range map[string]string{
		"CapInh": "0000000000000000", "CapPrm": "0000000000000000", "CapEff": "0000000000000000",
		"CapBnd": "0000000000000000", "CapAmb": "0000000000000000",
		"NoNewPrivs": "1", "Seccomp": "2", "Uid": "0\t0\t0\t0",
	} {
		if fields[k] != want {
			t.Errorf("%s (pid %s): %s is %q, want %q", unit, pid, k, fields[k], want)
		}
	}
	// PrivateUsers=yes: a user namespace that maps root to root and no
	// one else.
	if um := strings.Fields(m.MustRun("cat", "/proc/"+pid+"/uid_map")); strings.Join(um, " ") != "0 0 1" {
		t.Errorf("%s (pid %s): uid_map %q, want only root mapped (\"0 0 1\")", unit, pid, um)
	}
	// Write where the unit may and where it may not, in its mount
	// namespace (as root with every capability: what stops the write is
	// the mount, not a permission).
	probe := ".sandbox-probe-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	for _, dir := range writable {
		f := filepath.Join(dir, probe)
		if out, err := m.Run("nsenter", "-t", pid, "-m", "--", "sh", "-c", "echo probe >"+f+" && rm "+f); err != nil {
			t.Errorf("%s: %s is not writable in its sandbox: %v %s", unit, dir, err, out)
		}
	}
	for _, dir := range []string{"/etc/unbounded", "/usr/libexec/unbounded", "/var/lib", "/run/systemd"} {
		_, err := m.Run("nsenter", "-t", pid, "-m", "--", "sh", "-c", "echo probe >"+filepath.Join(dir, probe))
		if err == nil || !strings.Contains(err.Error(), "Read-only file system") {
			t.Errorf("%s: writing %s in its sandbox: %v, want \"Read-only file system\"", unit, dir, err)
			m.Run("rm", "-f", filepath.Join(dir, probe))
		}
	}
}

// sandboxProbe runs under a unit's sandbox and says, one line per attempt,
// what it was allowed to do ("PROBE ALLOWED <what>") and what not ("PROBE
// DENIED <what>: <the error>").
const sandboxProbe = `#!/bin/sh
try() {
	what=$1
	shift
	if err=$("$@" 2>&1 >/dev/null); then
		echo "PROBE ALLOWED $what"
	else
		echo "PROBE DENIED $what: $err"
	fi
}
try write-state sh -c 'echo probe >/var/lib/unbounded/probe'
try write-run sh -c 'echo probe >/run/unbounded/probe'
# Where a root process could define units (/run/systemd/system) or
# otherwise change the running system.
try write-run-systemd sh -c 'echo probe >/run/systemd/probe'
try write-etc sh -c 'echo probe >/etc/unbounded/probe'
try read-token cat /etc/unbounded/bootstrap-token
try read-key cat /var/lib/unbounded/pki/probe.key
# What the daemon does to start a unit: StartUnit over the system bus.
try start-unit busctl call org.freedesktop.systemd1 /org/freedesktop/systemd1 \
	org.freedesktop.systemd1.Manager StartUnit ss sandbox-probe-target.service replace
# systemctl as root talks to systemd's private socket, not the bus.
try systemd-private-bus systemctl --no-pager show -P Version
# What the daemon does to report a failed unit: its journal, read with
# journalctl. The target logged its marker before the probe started
# (ExecStartPre= of the probe's unit starts it and waits).
try read-journal sh -c 'journalctl -q -o cat -u sandbox-probe-target.service | grep -q "SANDBOX PROBE TARGET RAN"'
echo "PROBE END"
`

const sandboxProbeTarget = `[Unit]
Description=What the sandbox probe starts over D-Bus
[Service]
Type=oneshot
ExecStart=/bin/echo "SANDBOX PROBE TARGET RAN"
`

// probeDropIn makes unit run the probe in its own sandbox: only what runs,
// and how systemd waits for it, change. The target is started (and has
// logged) before the probe runs, so that reading its journal does not
// depend on the probe's own start-unit attempt.
const probeDropIn = `[Service]
Type=oneshot
Restart=no
WatchdogSec=0
ExecStartPre=+/bin/systemctl start sandbox-probe-target.service
ExecStart=
ExecStart=/usr/local/bin/sandbox-probe
`

func TestSandboxesGrantTheJobAndRefuseTheRest(t *testing.T) {
	harness.Require(t, false)
	files := []harness.File{
		{Path: state.TmpfilesConfHost, Data: readRepoFile(t, "deb", "unbounded-agent.tmpfiles"), Mode: 0o644},
		{Path: "/usr/local/bin/sandbox-probe", Data: []byte(sandboxProbe), Mode: 0o755},
		{Path: "/etc/systemd/system/sandbox-probe-target.service", Data: []byte(sandboxProbeTarget), Mode: 0o644},
		{Path: tokenFile, Data: []byte("abcdef.0123456789abcdef\n"), Mode: 0o600},
		{Path: hostpaths.HostRootHost + "/pki/probe.key", Data: []byte("not a key\n"), Mode: 0o600},
	}
	units := []string{daemonUnit, fenceUnit}
	for _, u := range units {
		files = append(files,
			harness.File{Path: hostpaths.UnitDirHost + "/" + u, Data: readRepoFile(t, "units", u), Mode: 0o644},
			harness.File{Path: "/etc/systemd/system/" + u + ".d/probe.conf", Data: []byte(probeDropIn), Mode: 0o644})
	}
	m := harness.New(t, harness.Options{Files: files})
	if err := os.Chmod(filepath.Join(m.Root(), hostpaths.HostRootHost), 0o700); err != nil {
		t.Fatal(err)
	}
	m.Start()

	// /run/unbounded is the tmpfiles.d entry's, applied at boot by
	// systemd-tmpfiles-setup.service, with the mode and owner it declares.
	if out := m.MustRun("stat", "-c", "%F %a %U:%G", hostpaths.RunDirHost); strings.TrimSpace(out) != "directory 755 root:root" {
		t.Errorf("%s after boot: %q, want a directory 755 root:root", hostpaths.RunDirHost, strings.TrimSpace(out))
	}

	// What each unit's job needs (ARCHITECTURE section 6): true is
	// allowed, false refused. The daemon writes its state and requests,
	// starts units over D-Bus and reads the journal; the fence reads, and
	// writes only its record of the last answer under /run/unbounded
	// (fence.json: which kind of refusal, for the health timer's retry).
	want := map[string]map[string]bool{
		daemonUnit: {
			"write-state": true, "write-run": true, "write-run-systemd": false, "write-etc": false, "read-token": true, "read-key": true,
			"start-unit": true, "systemd-private-bus": true, "read-journal": true,
		},
		fenceUnit: {
			"write-state": false, "write-run": true, "write-run-systemd": false, "write-etc": false, "read-token": true, "read-key": true,
			"start-unit": false, "systemd-private-bus": false,
		},
	}
	for _, u := range units {
		t.Run(u, func(t *testing.T) {
			m.Run("rm", "-f", "/var/lib/unbounded/probe", "/run/unbounded/probe", "/etc/unbounded/probe")
			if out, err := m.Systemctl("start", u); err != nil {
				t.Fatalf("systemctl start %s (probe): %v %s\n%s", u, err, out, m.Journal(u))
			}
			j := m.Journal(u)
			if !strings.Contains(j, "PROBE END") {
				t.Fatalf("the probe did not finish under %s:\n%s", u, j)
			}
			denials := strings.Join(sandboxDenials(j), "\n")
			for what, allowed := range want[u] {
				var line string
				for _, l := range strings.Split(j, "\n") {
					if strings.HasPrefix(l, "PROBE ALLOWED "+what) || strings.HasPrefix(l, "PROBE DENIED "+what+":") {
						line = l
					}
				}
				switch {
				case line == "":
					t.Errorf("%s: the probe said nothing about %s:\n%s", u, what, j)
				case allowed && !strings.HasPrefix(line, "PROBE ALLOWED "):
					t.Errorf("%s: its sandbox refuses %s, which its job needs: %s", u, what, line)
				case !allowed && !strings.HasPrefix(line, "PROBE DENIED "):
					t.Errorf("%s: its sandbox allows %s, which its job does not need: %s", u, what, line)
				case !allowed && !strings.Contains(denials, line):
					// The detector the daemon's and the fence's own
					// scenarios rely on must see every refusal.
					t.Errorf("%s: refusal %q is not recognized by sandboxDenialRE", u, line)
				}
			}
			// The online score of what systemd loaded agrees with the
			// lint's offline one: within the bound of ARCHITECTURE
			// section 6.
			out, _ := m.Run("systemd-analyze", "security", "--no-pager", u)
			mm := regexp.MustCompile(`Overall exposure level for \S+: ([0-9.]+)`).FindStringSubmatch(out)
			if mm == nil {
				t.Fatalf("systemd-analyze security %s printed no exposure:\n%s", u, out)
			}
			score, _ := strconv.ParseFloat(mm[1], 64)
			bound := map[string]float64{daemonUnit: 2.5, fenceUnit: 2.0}[u]
			t.Logf("%s: exposure %.1f under the running systemd (bound %.1f)", u, score, bound)
			if score > bound {
				t.Errorf("%s: exposure %.1f under the running systemd, above %.1f", u, score, bound)
			}
		})
	}
	if t.Failed() {
		fmt.Fprintln(os.Stderr, m.Journal("sandbox-probe-target.service"))
	}
}

// readRepoFile reads a file of this repository by its path from the root.
func readRepoFile(t *testing.T, elem ...string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(append([]string{"..", ".."}, elem...)...))
	if err != nil {
		t.Fatal(err)
	}
	return b
}
