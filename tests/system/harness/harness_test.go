package harness_test

import (
	"slices"
	"strings"
	"testing"

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
