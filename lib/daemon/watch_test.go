package daemon

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/watch"
)

// A watch that the server answers with an error event (other than 410)
// every time is retried with the growing delay, not in a tight loop: the
// error event is not progress.
func TestWatchEndedByAnErrorEventIsRetriedWithBackoff(t *testing.T) {
	d := &daemon{log: slog.New(slog.NewTextHandler(io.Discard, nil)), updates: make(chan update)}
	ctx, cancel := context.WithTimeout(context.Background(), 1200*time.Millisecond)
	defer cancel()
	go func() {
		for {
			select {
			case <-d.updates:
			case <-ctx.Done():
				return
			}
		}
	}()
	var watches atomic.Int64
	list := func(context.Context) ([]any, string, error) { return nil, "1", nil }
	watchFn := func(context.Context, string) (watch.Interface, error) {
		watches.Add(1)
		status := apierrors.NewInternalError(io.ErrUnexpectedEOF).ErrStatus
		status.Code = http.StatusInternalServerError
		ch := make(chan watch.Event, 1)
		ch <- watch.Event{Type: watch.Error, Object: &status}
		close(ch)
		return watch.NewProxyWatcher(ch), nil
	}
	d.watchLoop(ctx, kindOps, list, watchFn)
	// 0 s, then 0.5 s and 1 s of backoff: three watches in 1.2 s.
	if n := watches.Load(); n > 4 {
		t.Fatalf("%d watches in 1.2s after error events, want at most 4 (backoff 0.5s, 1s)", n)
	}
}
