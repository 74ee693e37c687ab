package units_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"unbounded-cloud.io/agent/lib/hostpaths"

	"unbounded-cloud.io/agent/tests/tiers"
)

// verifyFailures are the stderr fragments of systemd-analyze verify that
// fail the lint. verify exits 0 on an unknown key (it only says "Unknown
// key ..., ignoring"), so stderr is what tells a typo from a setting.
var verifyFailures = []string{"Unknown key", "ignoring", "Unknown section", "Failed to"}

func lookSystemdAnalyze() (string, bool) {
	path, err := exec.LookPath("systemd-analyze")
	return path, err == nil
}

func requireSystemdAnalyze(t *testing.T) string {
	t.Helper()
	path, ok := lookSystemdAnalyze()
	if !ok {
		tiers.Skip(t, tiers.Lint, "systemd-analyze is not installed (apt-get install systemd): unit lint needs systemd's own parser")
	}
	return path
}

// verify runs systemd-analyze verify on one unit of tree and fails the
// test on a non-zero exit or any line of verifyFailures.
func verify(t *testing.T, analyze, tree, name string) {
	t.Helper()
	verifyFile(t, analyze, tree, filepath.Join(hostpaths.New(tree).UnitDir(), name))
}

// verifyFile is verify of the unit file unitPath (in tree), wherever it
// lies.
func verifyFile(t *testing.T, analyze, tree, unitPath string) {
	t.Helper()
	name := filepath.Base(unitPath)
	cmd := exec.Command(analyze, "verify", "--root="+tree, "--recursive-errors=no", unitPath)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cmd.Stdout = &stderr
	err := cmd.Run()
	var bad []string
	for _, line := range strings.Split(stderr.String(), "\n") {
		for _, f := range verifyFailures {
			if strings.Contains(line, f) {
				bad = append(bad, line)
				break
			}
		}
	}
	if err != nil || len(bad) > 0 {
		t.Errorf("systemd-analyze verify %s: %v\n%s", name, err, stderr.String())
	}
}

// TestUnitsPassSystemdAnalyzeVerify checks every shipped unit with
// systemd's own loader, in a tree laid out as the package installs it.
func TestUnitsPassSystemdAnalyzeVerify(t *testing.T) {
	analyze := requireSystemdAnalyze(t)
	tree := installTree(t, true)
	unitDir := hostpaths.New(tree).UnitDir()
	for _, name := range shippedUnits(t) {
		t.Run(name, func(t *testing.T) {
			u := parseUnit(t, name, filepath.Join(unitDir, name))
			provideExecutables(t, tree, u)
			if isTemplate(name) {
				// A template is loaded through an instance, as systemd
				// does at runtime.
				inst := instance(name, "lint")
				if err := os.Symlink(name, filepath.Join(unitDir, inst)); err != nil {
					t.Fatal(err)
				}
				name = inst
			}
			verify(t, analyze, tree, name)
		})
	}
}

// TestVerifyCatchesAnUnknownKey proves the lint can fail: the same check
// on a unit with a typo.
func TestVerifyCatchesAnUnknownKey(t *testing.T) {
	analyze := requireSystemdAnalyze(t)
	tree := installTree(t, true)
	bad := "unbounded-lint-typo.target"
	copyFile(t, "unbounded-node.target", filepath.Join(hostpaths.New(tree).UnitDir(), bad), 0o644)
	f, err := os.OpenFile(filepath.Join(hostpaths.New(tree).UnitDir(), bad), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("Afterr=unbounded-mode-none.target\n")
	f.Close()
	cmd := exec.Command(analyze, "verify", "--root="+tree, "--recursive-errors=no", filepath.Join(hostpaths.New(tree).UnitDir(), bad))
	out, _ := cmd.CombinedOutput()
	if !strings.Contains(string(out), "Unknown key") {
		t.Fatalf("systemd-analyze verify did not report the typo; the lint would pass anything:\n%s", out)
	}
}
