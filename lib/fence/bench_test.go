package fence_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"unbounded-cloud.io/agent/lib/exitcode"
)

// BenchmarkFenceAllowed is one fence check on the allowed path, the one
// every node start pays: certificate read from disk, TLS handshake and one
// GET of the Machine from the real test API server (goal < 100 ms); the
// bootstrap-token path sends a TokenReview before the same GET. Each
// iteration builds its clients from scratch, as the one-shot does.
func BenchmarkFenceAllowed(b *testing.B) {
	for _, via := range []string{"certificate", "bootstrap-token"} {
		b.Run(via, func(b *testing.B) {
			h := newHost(b, nil)
			if via == "certificate" {
				h.validCert(b)
			}
			c := h.check(10 * time.Second)
			c.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
			b.ResetTimer()
			start := time.Now()
			for b.Loop() {
				if err := c.Run(context.Background()); exitcode.For(err) != exitcode.OK {
					b.Fatalf("fence refused: %v", err)
				}
			}
			b.ReportMetric(float64(time.Since(start).Microseconds())/1000/float64(b.N), "ms/check")
		})
	}
}
