// Package backoff is the one growing delay and the one cancellable wait
// of the agent's retries (bootstrap's after an exit 75, the reprovision
// handoff's between attempts, the fence's between tries). It imports
// nothing of the agent, so that any layer can use it.
package backoff

import (
	"context"
	"time"
)

// Doubling is the wait before try n+1 after n failed ones: first,
// doubling with each further failure, at most max.
func Doubling(first, max time.Duration, n int) time.Duration {
	d := first
	for i := 1; i < n && d < max; i++ {
		d *= 2
	}
	return min(d, max)
}

// Sleep waits d, or until ctx ends (its error).
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
