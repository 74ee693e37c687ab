package artifacts

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"unbounded-cloud.io/agent/lib/hostpaths"
)

// BenchmarkCacheHitVerify100MB is what a cache hit costs: the whole file
// re-hashed against its sidecar and its pin, for a 100 MB artifact (a
// kubelet is about that size). MB/s is the hashing rate on this machine.
func BenchmarkCacheHitVerify100MB(b *testing.B) {
	const size = 100 << 20
	data := payload(size)
	f := &Fetcher{Paths: hostpaths.New(b.TempDir())}
	a := kubelet()
	a.Pinned = sumOf(data)
	dest := f.CachePath(a)
	if err := os.MkdirAll(filepath.Dir(dest), 0o755); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(dest+".part", data, 0o644); err != nil {
		b.Fatal(err)
	}
	if err := commit(dest+".part", dest, a.Pinned); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(size)
	for b.Loop() {
		r, err := f.Fetch(context.Background(), a)
		if err != nil || r.Source != SourceCache {
			b.Fatalf("not a cache hit: %v %v", r, err)
		}
	}
}
