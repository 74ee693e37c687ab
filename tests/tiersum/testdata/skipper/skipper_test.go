// Package skipper is a system-tier test whose tier cannot run: tiersum's
// tests run it with plain `go test -json`, with and without the tier
// required, and summarize what it printed.
package skipper

import (
	"testing"

	"unbounded-cloud.io/agent/tests/tiers"
)

func TestScenario(t *testing.T) {
	t.Run("boot", func(t *testing.T) {
		tiers.Skip(t, tiers.System, "no rootfs: tiersum's fixture")
	})
	t.Run("install", func(t *testing.T) {
		tiers.Skip(t, tiers.System, "no rootfs: tiersum's fixture")
	})
}
