package main

import (
	"os/exec"
	"strings"
	"testing"
)

// The cluster side's libraries stay off the hosts (ARCHITECTURE section
// 3: controller-runtime is the cluster side's only, and the hosts' 40 MiB
// budget has no room for it): no installed binary links controller-runtime
// or the Prometheus client it brings.
func TestNoHostBinaryLinksTheClusterSidesLibraries(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go tool in PATH")
	}
	for _, pkg := range []string{"cmd/unbounded-agent", "cmd/unbounded", "cmd/health", "cmd/restart", "generators/unbounded-generator"} {
		out, err := exec.Command(goTool, "list", "-deps", "unbounded-cloud.io/agent/"+pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
		}
		for _, dep := range strings.Fields(string(out)) {
			if strings.HasPrefix(dep, "sigs.k8s.io/controller-runtime") || strings.HasPrefix(dep, "github.com/prometheus/") ||
				dep == "unbounded-cloud.io/agent/lib/controller" {
				t.Errorf("%s links %s", pkg, dep)
			}
		}
	}
}

// A bad flag is refused before anything runs (exit 1, as every
// command of the project), --help exits 0.
func TestBadFlagIsRefusedAndHelpExits0(t *testing.T) {
	if code := run([]string{"--no-such-flag"}); code != 1 {
		t.Errorf("a bad flag: exit %d, want 1", code)
	}
	if code := run([]string{"--help"}); code != 0 {
		t.Errorf("--help: exit %d, want 0", code)
	}
}
