// Package findings is a planted finding for each check of the static tier:
// tests/lint runs the tier's own tests on it and expects them to fail.
package findings

import (
	"fmt"
	"time"
)

// Left reports the time left before deadline. staticcheck S1024: it should
// be time.Until(deadline).
func Left(deadline time.Time) time.Duration {
	return deadline.Sub(time.Now())
}

// unused is never called: staticcheck U1000.
func unused() {}

// Count prints n. go vet (printf): %d with a string argument.
func Count(n string) string {
	return fmt.Sprintf("%d items", n)
}
