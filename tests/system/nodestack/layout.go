package nodestack

import (
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
)

// WriteLayout writes img as an OCI image layout in dir (created if needed,
// appended to if it is one already), the image's index entry annotated
// with org.opencontainers.image.ref.name=refName: the offline form of an
// image, for a host without a registry.
func WriteLayout(t testing.TB, dir, refName string, img v1.Image) {
	t.Helper()
	p, err := layout.FromPath(dir)
	if err != nil {
		if p, err = layout.Write(dir, empty.Index); err != nil {
			t.Fatalf("nodestack: OCI layout %s: %v", dir, err)
		}
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": refName})); err != nil {
		t.Fatalf("nodestack: write %s into %s: %v", refName, dir, err)
	}
}
