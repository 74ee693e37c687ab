package units_test

import (
	"bufio"
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"unbounded-cloud.io/agent/lib/hostpaths"

	"unbounded-cloud.io/agent/lib/unitnames"
	"unbounded-cloud.io/agent/tests/tiers"
)

// presetRule is one line of a preset file.
type presetRule struct {
	enable  bool
	pattern string
}

// readPresets parses the shipped preset files (systemd.preset(5)): the
// first line whose glob matches a unit decides.
func readPresets(t *testing.T) []presetRule {
	t.Helper()
	var rules []presetRule
	for _, f := range presets(t) {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(bytes.NewReader(data))
		for n := 1; sc.Scan(); n++ {
			line := strings.TrimSpace(sc.Text())
			if line == "" || line[0] == '#' || line[0] == ';' {
				continue
			}
			f := strings.Fields(line)
			if len(f) != 2 || (f[0] != "enable" && f[0] != "disable") {
				t.Fatalf("%s:%d: %q is not \"enable|disable PATTERN\"", f, n, line)
			}
			rules = append(rules, presetRule{enable: f[0] == "enable", pattern: f[1]})
		}
	}
	return rules
}

// presetEnables says what the preset decides for unit; ok is false when
// no line matches.
func presetEnables(rules []presetRule, unit string) (enable, ok bool) {
	for _, r := range rules {
		if m, _ := path.Match(r.pattern, unit); m {
			return r.enable, true
		}
	}
	return false, false
}

func TestPresetEndsWithDisableAll(t *testing.T) {
	rules := readPresets(t)
	if last := rules[len(rules)-1]; last.enable || last.pattern != "unbounded-*" {
		t.Fatalf("the last preset line is %+v; `disable unbounded-*` keeps every unit not named above disabled", last)
	}
}

// stubUnit stands in for a unit of presetStubs that units/ does not hold
// (yet), so that the preset's policy is checked against an [Install]
// section for it now.
type stubUnit struct {
	name, wantedBy string
	enabled        bool
}

// presetStubs are the units whose enablement matters to the boot: the ones
// that start bootstrap, a node or the daemon must stay disabled even with
// WantedBy=multi-user.target; the ones hooked on the node target are
// enabled.
var presetStubs = []stubUnit{
	{unitnames.Bootstrap, "multi-user.target", false},
	{unitnames.Daemon, "multi-user.target", false},
	{unitnames.Fence, "multi-user.target", false},
	{"unbounded-containerd.service", "multi-user.target", false},
	{"unbounded-kubelet.service", "multi-user.target", false},
	{unitnames.LocalDNS, "multi-user.target", false},
	{"unbounded-reset.service", "multi-user.target", false},
	{"unbounded-repave.service", "multi-user.target", false},
	{unitnames.Isolation, "multi-user.target", false},
	{unitnames.Reprovision, "multi-user.target", false},
	{"unbounded-health.timer", unitnames.NodeTarget, true},
	{"unbounded-upgrade.path", unitnames.NodeTarget, true},
}

func writeStub(t *testing.T, unitDir string, s stubUnit) {
	t.Helper()
	body := "[Unit]\nDescription=Stand-in for " + s.name + "\n"
	switch {
	case strings.HasSuffix(s.name, ".timer"):
		body += "[Timer]\nOnActiveSec=1h\nUnit=" + strings.TrimSuffix(s.name, ".timer") + ".service\n"
	case strings.HasSuffix(s.name, ".path"):
		body += "[Path]\nPathExists=/var/lib/unbounded/upgrade/staged\nUnit=" + strings.TrimSuffix(s.name, ".path") + ".service\n"
	default:
		body += "[Service]\nType=oneshot\nExecStart=/bin/true\n"
	}
	body += "[Install]\nWantedBy=" + s.wantedBy + "\n"
	if err := os.WriteFile(filepath.Join(unitDir, s.name), []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestPresetAllEnablesOnlyWhatThePresetSays runs systemd's own preset logic
// (systemctl --root=TREE preset-all, what a first install does) over the
// installed tree and checks the outcome unit by unit against the preset
// file, and the preset's policy: nothing is linked where it would start
// without the generator pulling in the node target.
func TestPresetAllEnablesOnlyWhatThePresetSays(t *testing.T) {
	systemctl, err := exec.LookPath("systemctl")
	if err != nil {
		tiers.Skip(t, tiers.Lint, "systemctl is not installed: preset-all needs systemd's own preset logic")
	}
	rules := readPresets(t)
	// The package's files only: over a copy of the host's whole unit
	// directory preset-all also presets the host's units (without the
	// host's own preset files, so it trips over their aliases), which says
	// nothing about this package.
	tree := installTree(t, false)
	unitDir := hostpaths.New(tree).UnitDir()
	shipped := shippedUnits(t)
	var stubs []stubUnit
	for _, s := range presetStubs {
		if slices.Contains(shipped, s.name) {
			continue // the real unit is checked below instead
		}
		writeStub(t, unitDir, s)
		stubs = append(stubs, s)
	}

	cmd := exec.Command(systemctl, "--root="+tree, "preset-all")
	out, err := cmd.CombinedOutput()
	if err != nil || strings.Contains(string(out), "Failed") {
		t.Fatalf("systemctl preset-all: %v\n%s", err, out)
	}
	t.Logf("systemctl --root=TREE preset-all:\n%s", out)
	isEnabled := func(unit string) string {
		out, _ := exec.Command(systemctl, "--root="+tree, "is-enabled", unit).Output()
		return strings.TrimSpace(string(out))
	}

	for _, s := range stubs {
		want := map[bool]string{true: "enabled", false: "disabled"}[s.enabled]
		if got := isEnabled(s.name); got != want {
			t.Errorf("%s (stand-in, WantedBy=%s): %s after preset-all, want %s", s.name, s.wantedBy, got, want)
		}
	}
	for _, name := range shipped {
		if isTemplate(name) {
			continue
		}
		u := parseUnit(t, name, name)
		got := isEnabled(name)
		if !u.hasSection("Install") {
			if got != "static" {
				t.Errorf("%s has no [Install] section but is %q", name, got)
			}
			continue
		}
		enable, ok := presetEnables(rules, name)
		if !ok {
			t.Errorf("%s matches no preset line", name)
		}
		want := map[bool]string{true: "enabled", false: "disabled"}[enable]
		if got != want {
			t.Errorf("%s: %s after preset-all, the preset says %s", name, got, want)
		}
	}

	// The policy: every link preset-all made to an agent unit sits under
	// the node target, which only the generator pulls in.
	etc := filepath.Join(tree, "etc/systemd/system")
	linked := 0
	filepath.WalkDir(etc, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.Type()&fs.ModeSymlink == 0 {
			return nil
		}
		target, _ := os.Readlink(p)
		if !strings.HasPrefix(filepath.Base(target), "unbounded-") {
			return nil
		}
		linked++
		if dir := filepath.Base(filepath.Dir(p)); dir != unitnames.NodeTarget+".wants" {
			rel, _ := filepath.Rel(etc, p)
			t.Errorf("preset-all linked %s -> %s: it would start without the generator pulling in the node target", rel, target)
		}
		return nil
	})
	if linked == 0 {
		t.Errorf("preset-all linked no agent unit at all; the stand-ins hooked on %s should have been", unitnames.NodeTarget)
	}
}
