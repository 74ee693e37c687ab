package lint

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"testing"
)

// tests/conformance builds upstream's e2e.test from a module of its own
// (so that its extra dependencies stay out of the test control plane's);
// it must be the same Kubernetes as the control plane's (tests/kube): the
// same k8s.io/kubernetes and the same staging replacements, and the same
// version stamped by build.sh.
func TestConformanceModuleIsTheTestControlPlanesKubernetes(t *testing.T) {
	if os.Getenv(envDir) != "" {
		t.Skip("the modules belong to this repository")
	}
	read := func(p string) string {
		b, err := os.ReadFile(filepath.Join(repo, p))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	k8s := regexp.MustCompile(`(?m)^\s*(?:require\s+)?k8s\.io/kubernetes (v\S+)`)
	replaces := regexp.MustCompile(`(?m)^replace (\S+) => (\S+) (\S+)$`)
	kube, conf := read("tests/kube/go.mod"), read("tests/conformance/go.mod")
	kv, cv := k8s.FindStringSubmatch(kube), k8s.FindStringSubmatch(conf)
	if kv == nil || cv == nil || kv[1] != cv[1] {
		t.Fatalf("k8s.io/kubernetes: tests/kube %v, tests/conformance %v: want the same version", kv, cv)
	}
	kr, cr := replaces.FindAllString(kube, -1), replaces.FindAllString(conf, -1)
	slices.Sort(kr)
	slices.Sort(cr)
	if !slices.Equal(kr, cr) {
		t.Errorf("the replace lines of tests/kube/go.mod and tests/conformance/go.mod differ:\n%v\n%v", kr, cr)
	}
	stamp := regexp.MustCompile(`(?m)^k8s_version=(\S+)$`)
	for _, f := range []string{"tests/kube/with-env.sh", "tests/conformance/build.sh"} {
		if m := stamp.FindStringSubmatch(read(f)); m == nil || m[1] != kv[1] {
			t.Errorf("%s: k8s_version %v, want %s", f, m, kv[1])
		}
	}
}
