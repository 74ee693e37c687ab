package harness_test

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"unbounded-cloud.io/agent/tests/system/harness"
)

func TestMain(m *testing.M) { harness.Main(m) }

// probeGenerator is a hand-made generator: it pulls a unit in, and reports
// through /dev/kmsg with the boot id, so the test can tell boots apart.
const probeGenerator = `#!/bin/sh
set -e
mkdir -p "$1/multi-user.target.wants"
ln -sf /etc/systemd/system/probe.service "$1/multi-user.target.wants/probe.service"
echo "<3>probe-generator: ran in boot $(cat /proc/sys/kernel/random/boot_id)" >/dev/kmsg
`

const probeService = `[Unit]
Description=Probe service of the harness self-test
[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/sh -c 'echo probe-ran'
`

func probeFiles() []harness.File {
	return []harness.File{
		{Path: "/etc/systemd/system-generators/probe", Data: []byte(probeGenerator), Mode: 0o755},
		{Path: "/etc/systemd/system/probe.service", Data: []byte(probeService), Mode: 0o644},
	}
}

func TestBootRunsGeneratorsAndReportsUnitsOverDBus(t *testing.T) {
	t.Parallel()
	m := harness.Boot(t, harness.Options{Files: probeFiles()})

	if w := m.Wants("multi-user.target"); !slices.Contains(w, "probe.service") {
		t.Errorf("multi-user.target Wants = %v, want probe.service (pulled in by the generator)", w)
	}
	if s := m.UnitState("probe.service"); s.ActiveState != "active" || s.Result != "success" {
		t.Errorf("probe.service = %s, want active with result success", s)
	}
	if s := m.UnitState("no-such.service"); s.LoadState != "not-found" {
		t.Errorf("no-such.service load state = %s, want not-found", s.LoadState)
	}
	if j := m.Journal("probe.service"); !strings.Contains(j, "probe-ran") {
		t.Errorf("journal of probe.service = %q, want the line probe-ran", j)
	}
	link, err := m.Readlink("/run/systemd/generator/multi-user.target.wants/probe.service")
	if err != nil || link != "/etc/systemd/system/probe.service" {
		t.Errorf("generator link = %q, %v", link, err)
	}
	out, err := m.Systemctl("is-active", "probe.service")
	if err != nil || strings.TrimSpace(out) != "active" {
		t.Errorf("systemctl is-active probe.service = %q, %v", out, err)
	}
	if _, err := m.Systemctl("is-active", "no-such.service"); err == nil {
		t.Error("systemctl is-active no-such.service succeeded, want an error")
	}
	bootID := strings.TrimSpace(m.MustRun("cat", "/proc/sys/kernel/random/boot_id"))
	if want := "probe-generator: ran in boot " + bootID; !slices.Contains(m.Kmsg(), want) {
		t.Errorf("kmsg = %q, want the line %q", m.Kmsg(), want)
	}
}

func TestRebootKeepsFilesAndRunsGeneratorsAgain(t *testing.T) {
	t.Parallel()
	m := harness.Boot(t, harness.Options{Files: probeFiles()})
	m.WriteFile("/var/lib/probe/kept", []byte("kept\n"), 0o600)
	m.WriteFile("/run/probe-volatile", []byte("gone\n"), 0o644)
	first := strings.TrimSpace(m.MustRun("cat", "/proc/sys/kernel/random/boot_id"))

	m.Reboot()

	second := strings.TrimSpace(m.MustRun("cat", "/proc/sys/kernel/random/boot_id"))
	if first == second {
		t.Fatalf("boot id %s unchanged across Reboot", first)
	}
	if data, err := m.ReadFile("/var/lib/probe/kept"); err != nil || string(data) != "kept\n" {
		t.Errorf("/var/lib/probe/kept after reboot = %q, %v", data, err)
	}
	if mode := strings.TrimSpace(m.MustRun("stat", "-c", "%a", "/var/lib/probe/kept")); mode != "600" {
		t.Errorf("mode of /var/lib/probe/kept = %s, want 600", mode)
	}
	if _, err := m.ReadFile("/run/probe-volatile"); err == nil {
		t.Error("/run/probe-volatile survived the reboot")
	}
	for _, id := range []string{first, second} {
		if want := "probe-generator: ran in boot " + id; !slices.Contains(m.Kmsg(), want) {
			t.Errorf("kmsg = %q, want the line %q", m.Kmsg(), want)
		}
	}
	if s := m.UnitState("probe.service"); s.ActiveState != "active" {
		t.Errorf("probe.service after reboot = %s, want active", s)
	}
}

// TestNetworkIsNewAtEveryBootWithTheTestsListenersOnItsLoopback: a machine
// with Options.Network reaches, on its own loopback from its first moment,
// what the test listens on in the namespace it is given, and every boot
// gets a new namespace, as a host's network is new at every boot: what the
// boot before left in it (a link here) is gone, and the listeners of the
// boot before are ended before the next boot's are opened.
func TestNetworkIsNewAtEveryBootWithTheTestsListenersOnItsLoopback(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	boots, ended := 0, 0
	t.Cleanup(func() { // after the machine's own cleanup (LIFO)
		mu.Lock()
		defer mu.Unlock()
		if ended != boots || (boots != 2 && !t.Failed()) {
			t.Errorf("%d boots, %d networks ended after the machine was destroyed; want 2 and 2", boots, ended)
		}
	})
	network := func(netns string) (func(), error) {
		lns, err := harness.ListenIn(netns, "127.0.0.1:7777")
		if err != nil {
			return nil, err
		}
		mu.Lock()
		boots++
		n, open := boots, boots-ended
		mu.Unlock()
		if open != 1 {
			t.Errorf("boot %d: %d networks open, want only its own", n, open)
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				c, err := lns[0].Accept()
				if err != nil {
					return
				}
				fmt.Fprintf(c, "boot %d\n", n)
				c.Close()
			}
		}()
		return func() {
			lns[0].Close()
			<-done
			mu.Lock()
			ended++
			mu.Unlock()
		}, nil
	}
	m := harness.Boot(t, harness.Options{Network: network})
	read := func() string {
		out, err := m.Run("bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/7777 && cat <&3")
		if err != nil {
			t.Fatalf("read the test's listener from the machine: %v", err)
		}
		return strings.TrimSpace(out)
	}
	if got := read(); got != "boot 1" {
		t.Errorf("first boot read %q from 127.0.0.1:7777, want boot 1", got)
	}
	m.MustRun("ip", "link", "add", "ubt-probe", "type", "veth", "peer", "name", "ubt-probe1")

	m.Reboot()

	if got := read(); got != "boot 2" {
		t.Errorf("second boot read %q from 127.0.0.1:7777, want boot 2", got)
	}
	if out, err := m.Run("ip", "link", "show", "ubt-probe"); err == nil {
		t.Errorf("the link the first boot made is in the second boot's network:\n%s", out)
	}
}

// TestWaitJournalEndsOnTheLine: a wait for a line that a unit writes later
// ends with that line, one for a line never written ends at its timeout
// with an error, and neither leaves a journalctl behind.
func TestWaitJournalEndsOnTheLine(t *testing.T) {
	t.Parallel()
	m := harness.Boot(t, harness.Options{})
	cursor := strings.TrimSpace(m.MustRun("sh", "-c", "journalctl -q -n 0 --show-cursor | sed -n 's/^-- cursor: //p'"))
	m.MustRun("systemd-run", "--unit=probe-later", "--on-active=2", "--timer-property=AccuracySec=10ms", "/bin/echo", "probe-later-line")
	begin := time.Now()
	l, err := m.WaitJournal(time.Minute, func(l string) bool { return l == "probe-later-line" }, "--after-cursor", cursor)
	if err != nil || l != "probe-later-line" {
		t.Fatalf("WaitJournal = %q, %v; want the line", l, err)
	}
	if took := time.Since(begin); took > 30*time.Second {
		t.Errorf("the wait took %v for a line written after 2 s", took)
	}
	if _, err := m.WaitJournal(3*time.Second, func(l string) bool { return l == "never-written" }, "--after-cursor", cursor); err == nil || !strings.Contains(err.Error(), "within 3s") {
		t.Errorf("WaitJournal for a line never written = %v, want its timeout", err)
	}
	// Killed ones the machine's PID 1 has not reaped yet are no
	// journalctl that runs.
	if out, _ := m.Run("sh", "-c", "ps -C journalctl -o stat=,args= | grep -v '^Z' || true"); strings.TrimSpace(out) != "" {
		t.Errorf("journalctl processes left in the machine: %s", out)
	}
}
