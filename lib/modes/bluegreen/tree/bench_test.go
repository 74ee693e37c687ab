package tree

import (
	"archive/tar"
	"fmt"
	"strings"
	"testing"

	"unbounded-cloud.io/agent/lib/modes/bluegreen/tree/treetest"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// BenchmarkUnpackNodeImage measures Unpack, the floor of a slot's
// preparation, on an image of 2000 files of 16 KiB (32 MiB) in two layers
// with whiteouts. It reports MB/s of file content written.
func BenchmarkUnpackNodeImage(b *testing.B) {
	treetest.RequireRoot(b)
	body := strings.Repeat("x", 16<<10)
	var lower, upper []treetest.Entry
	lower = append(lower, treetest.Entry{Name: "usr/", Typ: tar.TypeDir}, treetest.Entry{Name: "usr/lib/", Typ: tar.TypeDir})
	for i := range 1000 {
		lower = append(lower, treetest.Entry{Name: fmt.Sprintf("usr/lib/f%04d", i), Body: body})
	}
	upper = append(upper, treetest.Entry{Name: "usr/lib/.wh.f0000", Typ: tar.TypeReg}, treetest.Entry{Name: "usr/share/", Typ: tar.TypeDir})
	for i := range 1000 {
		upper = append(upper, treetest.Entry{Name: fmt.Sprintf("usr/share/g%04d", i), Body: body})
	}
	img := treetest.Image(b, []v1.Layer{treetest.Layer(b, lower...), treetest.Layer(b, upper...)}...)
	b.SetBytes(int64(1999 * len(body)))
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		dir := b.TempDir()
		b.StartTimer()
		if _, err := Unpack(img, dir); err != nil {
			b.Fatal(err)
		}
	}
}
