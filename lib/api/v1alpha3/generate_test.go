package v1alpha3

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"unbounded-cloud.io/agent/tests/tiers"
)

// generateArgs returns the controller-gen arguments of this package's
// //go:generate line, with the output directories redirected to dir, so that
// the test checks exactly what `go generate` writes.
func generateArgs(t *testing.T, dir string) (modfile string, args []string) {
	t.Helper()
	f, err := os.Open("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "//go:generate ")
		if !ok {
			continue
		}
		fields := strings.Fields(line)
		// go tool -modfile=X controller-gen ARGS...
		if len(fields) < 5 || fields[0] != "go" || fields[1] != "tool" || !strings.HasPrefix(fields[2], "-modfile=") || fields[3] != "controller-gen" {
			t.Fatalf("doc.go: unexpected //go:generate line %q", line)
		}
		modfile = strings.TrimPrefix(fields[2], "-modfile=")
		for _, a := range fields[4:] {
			if strings.HasPrefix(a, "output:crd:dir=") {
				a = "output:crd:dir=" + filepath.Join(dir, "crds")
			}
			args = append(args, a)
		}
		return modfile, append(args, "output:object:dir="+dir)
	}
	t.Fatal("doc.go: no //go:generate line")
	return "", nil
}

// offlineMarkers are what `go` prints when it cannot fetch a module; only then
// is a failure to build controller-gen a reason to skip rather than fail.
var offlineMarkers = []string{"dial tcp", "no such host", "GOPROXY=off", "module lookup disabled", "connection refused", "i/o timeout", "GOFLAGS=-mod=vendor"}

func TestGeneratedFilesAreCurrent(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		tiers.Skip(t, tiers.Unit, "no go command on PATH: cannot run controller-gen")
	}
	dir := t.TempDir()
	modfile, args := generateArgs(t, dir)
	cmd := exec.Command("go", append([]string{"tool", "-modfile=" + modfile, "controller-gen"}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		for _, m := range offlineMarkers {
			if bytes.Contains(out, []byte(m)) {
				tiers.Skip(t, tiers.Unit, "controller-gen cannot be built offline (%s): %s", m, out)
			}
		}
		t.Fatalf("controller-gen %s: %v\n%s", strings.Join(args, " "), err, out)
	}

	compare := func(generated, committed string) {
		want, err := os.ReadFile(generated)
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(committed)
		if err != nil {
			t.Errorf("%s: %v (run `go generate ./lib/api/...` and commit the result)", committed, err)
			return
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s is stale: run `go generate ./lib/api/...` and commit the result", committed)
		}
	}
	compare(filepath.Join(dir, "zz_generated.deepcopy.go"), "zz_generated.deepcopy.go")

	committedDir := "../manifests/crds"
	names := func(d string) []string {
		ents, err := os.ReadDir(d)
		if err != nil {
			t.Fatal(err)
		}
		var n []string
		for _, e := range ents {
			n = append(n, e.Name())
		}
		slices.Sort(n)
		return n
	}
	gen, committed := names(filepath.Join(dir, "crds")), names(committedDir)
	if !slices.Equal(gen, committed) {
		t.Errorf("CRD files differ: controller-gen writes %v, %s holds %v", gen, committedDir, committed)
	}
	for _, n := range gen {
		compare(filepath.Join(dir, "crds", n), filepath.Join(committedDir, n))
	}
}
