// Package all is the table of the isolation modes this build carries: a
// new mode is one entry here (and its units in lib/unitnames).
package all

import (
	"fmt"
	"log/slog"

	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/modes"
	"unbounded-cloud.io/agent/lib/modes/container"
	"unbounded-cloud.io/agent/lib/modes/facts"
	"unbounded-cloud.io/agent/lib/modes/none"
	"unbounded-cloud.io/agent/lib/modes/nspawn"
)

var table = []struct {
	name string
	new  func(p hostpaths.Paths, log *slog.Logger) modes.Mode
}{
	{"nspawn", func(p hostpaths.Paths, log *slog.Logger) modes.Mode { return &nspawn.Mode{Paths: p, Log: log} }},
	{"container", func(p hostpaths.Paths, log *slog.Logger) modes.Mode { return &container.Mode{Paths: p, Log: log} }},
	{"none", func(p hostpaths.Paths, log *slog.Logger) modes.Mode { return &none.Mode{Paths: p, Log: log} }},
}

// Names are the modes this build carries: the facts table's, each of
// which has an implementation here (a test holds them together).
func Names() []string { return facts.Names() }

// For returns the real mode of name on the host root p.
func For(name string, p hostpaths.Paths, log *slog.Logger) (modes.Mode, error) {
	for _, m := range table {
		if m.name == name {
			return m.new(p, log), nil
		}
	}
	return nil, fmt.Errorf("isolation mode %q is not in this release (%v are; `unbounded supports-isolation %s` says no)", name, Names(), name)
}

// Func is For on p as the Mode field of the operations takes it.
func Func(p hostpaths.Paths, log *slog.Logger) func(name string) (modes.Mode, error) {
	return func(name string) (modes.Mode, error) { return For(name, p, log) }
}
