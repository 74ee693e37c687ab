package main

import (
	"os/exec"
	"strings"
	"testing"
)

// unbounded-health and unbounded-restart stay small (ARCHITECTURE section
// 3: under 5 MB, `make bench` prints their sizes): neither may link a
// Kubernetes package, net/http or kong, each of which alone would put it
// over.
func TestHealthAndRestartLinkNoKubernetesClientNorNetHTTP(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go tool in PATH")
	}
	for _, pkg := range []string{"unbounded-cloud.io/agent/cmd/health", "unbounded-cloud.io/agent/cmd/restart"} {
		out, err := exec.Command(goTool, "list", "-deps", pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
		}
		for _, dep := range strings.Fields(string(out)) {
			if strings.HasPrefix(dep, "k8s.io/") || dep == "net/http" || strings.HasPrefix(dep, "github.com/alecthomas/kong") {
				t.Errorf("%s links %s", pkg, dep)
			}
		}
	}
}
