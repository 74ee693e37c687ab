package nspawn

import (
	"archive/tar"
	"fmt"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// BenchmarkUnpackNodeImage measures Unpack, the floor of a slot's
// preparation, on an image of 2000 files of 16 KiB (32 MiB) in two layers
// with whiteouts. It reports MB/s of file content written.
func BenchmarkUnpackNodeImage(b *testing.B) {
	requireRoot(b)
	body := strings.Repeat("x", 16<<10)
	var lower, upper []entry
	lower = append(lower, entry{name: "usr/", typ: tar.TypeDir}, entry{name: "usr/lib/", typ: tar.TypeDir})
	for i := range 1000 {
		lower = append(lower, entry{name: fmt.Sprintf("usr/lib/f%04d", i), body: body})
	}
	upper = append(upper, entry{name: "usr/lib/.wh.f0000", typ: tar.TypeReg}, entry{name: "usr/share/", typ: tar.TypeDir})
	for i := range 1000 {
		upper = append(upper, entry{name: fmt.Sprintf("usr/share/g%04d", i), body: body})
	}
	img := image(b, []v1.Layer{layer(b, lower...), layer(b, upper...)}...)
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
