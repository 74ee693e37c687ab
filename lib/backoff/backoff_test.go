package backoff

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestDoublingDoublesUpToItsCap(t *testing.T) {
	want := []time.Duration{30 * time.Second, time.Minute, 2 * time.Minute, 4 * time.Minute, 8 * time.Minute, 10 * time.Minute, 10 * time.Minute}
	for i, w := range want {
		if d := Doubling(30*time.Second, 10*time.Minute, i+1); d != w {
			t.Errorf("Doubling(30s, 10m, %d) = %v, want %v", i+1, d, w)
		}
	}
}

func TestSleepEndsWithItsContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	begin := time.Now()
	if err := Sleep(ctx, time.Hour); !errors.Is(err, context.Canceled) || time.Since(begin) > time.Second {
		t.Errorf("Sleep on a cancelled context: %v after %v", err, time.Since(begin))
	}
	if err := Sleep(context.Background(), time.Millisecond); err != nil {
		t.Errorf("Sleep 1ms: %v", err)
	}
}
