package nodestack

import (
	"archive/tar"
	"bytes"
	"io"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// NeverHealthyNodeImage is base (the node image) with one more layer: a
// drop-in that keeps the kubelet from ever running (it sleeps instead;
// the mode writes kubelet.service, not its drop-ins), so a node from it
// never gets healthy: what a repave's rollback is tested and measured
// with.
func NeverHealthyNodeImage(t testing.TB, base v1.Image) v1.Image {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	body := []byte("# A node that never gets healthy (tests).\n[Service]\nExecStart=\nExecStart=/bin/sleep infinity\n")
	for _, d := range []string{"etc/", "etc/systemd/", "etc/systemd/system/", "etc/systemd/system/kubelet.service.d/"} {
		if err := tw.WriteHeader(&tar.Header{Name: d, Typeflag: tar.TypeDir, Mode: 0o755}); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.WriteHeader(&tar.Header{Name: "etc/systemd/system/kubelet.service.d/99-never.conf", Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(body))}); err != nil {
		t.Fatal(err)
	}
	tw.Write(body)
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	data := buf.Bytes()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(base, layer)
	if err != nil {
		t.Fatal(err)
	}
	return img
}
