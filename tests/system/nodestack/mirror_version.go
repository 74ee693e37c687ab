package nodestack

import (
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"testing"
)

// ServeAsVersion adds file to the mirror directory dir (made by Mirror)
// as artifact's release version: a hard link (or copy) at the artifact's
// path for that version, and its line in SHA256SUMS, rewritten
// atomically (the server may be reading it). A config naming that
// version then downloads file: the staged kubelet under a second
// Kubernetes version name (a repave to "another version" with the one
// kubelet the tests have), or a broken one.
func (s *Stage) ServeAsVersion(t testing.TB, dir, artifact, version, file string) {
	t.Helper()
	r := strings.NewReplacer("{name}", artifact, "{version}", strings.TrimPrefix(version, "v"), "{arch}", runtime.GOARCH)
	rel := r.Replace(urlTemplates[artifact])
	dst := filepath.Join(dir, rel)
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		t.Fatal(err)
	}
	os.Remove(dst)
	if err := linkOrCopy(file, dst); err != nil {
		t.Fatalf("nodestack: mirror %s %s: %v", artifact, version, err)
	}
	sum, err := FileSHA256(dst)
	if err != nil {
		t.Fatal(err)
	}
	sumsFile := filepath.Join(dir, "SHA256SUMS")
	data, err := os.ReadFile(sumsFile)
	if err != nil {
		t.Fatal(err)
	}
	var sums []string
	for _, l := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if l != "" && !strings.HasSuffix(l, "  "+rel) {
			sums = append(sums, l)
		}
	}
	sums = append(sums, sum+"  "+rel)
	sort.Strings(sums)
	tmp := sumsFile + ".tmp"
	if err := os.WriteFile(tmp, []byte(strings.Join(sums, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, sumsFile); err != nil {
		t.Fatal(err)
	}
}
