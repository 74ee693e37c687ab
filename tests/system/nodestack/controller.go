package nodestack

import (
	"os"
	"os/exec"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"

	"unbounded-cloud.io/agent/tests/tiers"
)

// EnvControllerImage names the cluster side's image as `make images` writes
// it (dist/unbounded-controller_VERSION_linux_ARCH.oci.tar, an OCI layout
// in a tar); tests/run-tiers.sh sets it.
const EnvControllerImage = "UNBOUNDED_TEST_CONTROLLER_IMAGE"

// ControllerImage is the image of `make images` (EnvControllerImage), read
// from its archive as a registry receives it: the one image of the
// layout's index. It skips the test (fails where the system tier is
// required) when the variable is not set.
func ControllerImage(t testing.TB) v1.Image {
	t.Helper()
	archive := os.Getenv(EnvControllerImage)
	if archive == "" {
		tiers.Skip(t, tiers.System, "nodestack: %s is not set: make images, then export %s=dist/unbounded-controller_*.oci.tar", EnvControllerImage, EnvControllerImage)
	}
	dir := t.TempDir()
	if out, err := exec.Command("tar", "-C", dir, "-xf", archive).CombinedOutput(); err != nil {
		t.Fatalf("nodestack: unpack %s: %v\n%s", archive, err, out)
	}
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatalf("nodestack: %s: %v", archive, err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatalf("nodestack: %s: %v", archive, err)
	}
	if len(m.Manifests) != 1 {
		t.Fatalf("nodestack: %s holds %d images, want the one of make images", archive, len(m.Manifests))
	}
	img, err := idx.Image(m.Manifests[0].Digest)
	if err != nil {
		t.Fatalf("nodestack: %s: %v", archive, err)
	}
	return img
}
