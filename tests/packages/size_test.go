package packages_test

import (
	"archive/tar"
	"bytes"
	"io"
	"os/exec"
	"strings"
	"testing"
)

// The hosts' size budget (ARCHITECTURE section 3), read from what the
// package installs: all installed binaries together at most 40 MiB (the
// operator's workstation plugin is not in the package), restart and health
// under 5 MB each, the generator under 3 MiB.
func TestDebInstalledBinariesFitTheSizeBudget(t *testing.T) {
	deb := packageFile(t, "UNBOUNDED_TEST_DEB")
	requireTools(t, "dpkg-deb")
	out, err := exec.Command("dpkg-deb", "--fsys-tarfile", deb).Output()
	if err != nil {
		t.Fatalf("dpkg-deb --fsys-tarfile %s: %v", deb, err)
	}
	sizes := map[string]int64{}
	var total int64
	tr := tar.NewReader(bytes.NewReader(out))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("reading the data archive of %s: %v", deb, err)
		}
		p := "/" + strings.Trim(strings.TrimPrefix(h.Name, "."), "/")
		if h.Typeflag != tar.TypeReg || h.Mode&0o111 == 0 {
			continue
		}
		if strings.HasPrefix(p, "/usr/libexec/unbounded/") || strings.HasPrefix(p, "/usr/bin/") || strings.HasPrefix(p, "/usr/lib/systemd/system-generators/") {
			sizes[p] = h.Size
			total += h.Size
		}
	}
	for _, want := range []string{"/usr/libexec/unbounded/unbounded-agent", "/usr/bin/unbounded", "/usr/libexec/unbounded/restart",
		"/usr/libexec/unbounded/health", "/usr/lib/systemd/system-generators/unbounded-generator"} {
		if _, ok := sizes[want]; !ok {
			t.Fatalf("%s: no %s among its executables %v", deb, want, sizes)
		}
	}
	t.Logf("installed binaries: %d bytes (%.2f MiB) %v", total, float64(total)/(1<<20), sizes)
	if total > 40<<20 {
		t.Errorf("the installed binaries take %d bytes (%.2f MiB), over the hosts' 40 MiB budget: %v", total, float64(total)/(1<<20), sizes)
	}
	for _, small := range []string{"/usr/libexec/unbounded/restart", "/usr/libexec/unbounded/health"} {
		if sizes[small] >= 5_000_000 {
			t.Errorf("%s is %d bytes, want under 5 MB", small, sizes[small])
		}
	}
	if g := sizes["/usr/lib/systemd/system-generators/unbounded-generator"]; g >= 3<<20 {
		t.Errorf("the generator is %d bytes, want under 3 MiB", g)
	}
}
