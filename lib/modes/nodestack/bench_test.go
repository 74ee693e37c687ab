package nodestack

import (
	"archive/tar"
	"compress/gzip"
	"os"
	"path/filepath"
	"testing"
)

// BenchmarkExtractExecutables is the CPU an artifact archive's install
// costs (decompression and writes), the part of a first boot that runs
// beside the node image's unpack on the other core in mode nspawn. The
// archive holds 4 copies of this test binary: real machine code, which
// compresses as the node stack's executables do (containerd's archive is
// about 30 MB of them). MB/s is of the uncompressed bytes written.
func BenchmarkExtractExecutables(b *testing.B) {
	self, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	bin, err := os.ReadFile(self)
	if err != nil {
		b.Fatal(err)
	}
	archive := filepath.Join(b.TempDir(), "stack.tar.gz")
	f, err := os.Create(archive)
	if err != nil {
		b.Fatal(err)
	}
	gz := gzip.NewWriter(f)
	tw := tar.NewWriter(gz)
	const copies = 4
	for i := range copies {
		if err := tw.WriteHeader(&tar.Header{Name: "bin/tool" + string(rune('a'+i)), Mode: 0o755, Size: int64(len(bin)), Typeflag: tar.TypeReg}); err != nil {
			b.Fatal(err)
		}
		if _, err := tw.Write(bin); err != nil {
			b.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		b.Fatal(err)
	}
	if err := gz.Close(); err != nil {
		b.Fatal(err)
	}
	if err := f.Close(); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(copies * len(bin)))
	for b.Loop() {
		dir := b.TempDir()
		names, err := extractExecutables(archive, dir)
		if err != nil || len(names) != copies {
			b.Fatalf("extract: %v %v", names, err)
		}
	}
}
