package all

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/modes/facts"
)

func TestEveryModeIsFoundByItsOwnNameAndAnUnknownOneIsRefusedByName(t *testing.T) {
	p := hostpaths.New(t.TempDir())
	if len(table) != len(facts.Table) {
		t.Errorf("%d implementations for the %d modes of the facts table %v", len(table), len(facts.Table), facts.Names())
	}
	for _, name := range Names() {
		m, err := For(name, p, nil)
		if err != nil || m.Name() != name {
			t.Errorf("For(%q): %v, %v", name, m, err)
		}
	}
	if _, err := For("vm", p, nil); err == nil || !strings.Contains(err.Error(), `"vm"`) {
		t.Errorf("For(vm): %v, want a refusal naming it", err)
	}
}

// A fresh host holds nothing of any mode; each mode's own files make it
// installed, and only it.
func TestInstalledIsEachModesOwnFiles(t *testing.T) {
	own := map[string]func(p hostpaths.Paths) string{
		"nspawn": func(p hostpaths.Paths) string { return p.NspawnConfig("kube2") },
		"none":   func(p hostpaths.Paths) string { return p.VersionsDir() },
		"container": func(p hostpaths.Paths) string {
			return filepath.Join(p.SlotDir("kube1"), "bundle")
		},
	}
	for _, name := range Names() {
		p := hostpaths.New(t.TempDir())
		mk, ok := own[name]
		if !ok {
			t.Fatalf("mode %s: no file of its own in this test", name)
		}
		if err := os.MkdirAll(mk(p), 0o755); err != nil {
			t.Fatal(err)
		}
		for _, other := range Names() {
			m, _ := For(other, p, nil)
			if got := m.Installed(); got != (other == name) {
				t.Errorf("host with %s's files: %s.Installed() = %v", name, other, got)
			}
		}
		fresh, _ := For(name, hostpaths.New(t.TempDir()), nil)
		if fresh.Installed() {
			t.Errorf("fresh host: %s installed", name)
		}
	}
}
