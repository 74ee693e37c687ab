// Package tiers says which test tiers must run here, so that a tier which
// cannot run fails instead of skipping where it is required (on CI).
//
// UNBOUNDED_TEST_REQUIRED is a comma-separated list of tier names (see
// Names). A test helper that finds its tier cannot run here (no root, no
// rootfs, no package, no API server, no systemd-analyze) calls Skip: it skips
// with the reason, or, when the tier is required, fails with the same reason.
// The tier runner (tests/run-tiers.sh and tests/tiersum) reads the same
// variable and fails a required tier that skipped or ran no test.
//
// UNBOUNDED_TEST_KUBE_REQUIRED=1, the older switch of tests/kube/with-env.sh,
// still means "kube" is required.
package tiers

import (
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"
)

const (
	// EnvRequired lists the tiers that must run.
	EnvRequired = "UNBOUNDED_TEST_REQUIRED"
	// EnvKubeRequired=1 is the older spelling of "kube" in EnvRequired.
	EnvKubeRequired = "UNBOUNDED_TEST_KUBE_REQUIRED"
)

// The tiers of ARCHITECTURE section 9 that `make test` runs, by the names
// EnvRequired and tests/tiersum use.
const (
	Unit     = "unit"     // tier 1: go test of every package (root, go on PATH)
	Lint     = "lint"     // tier 2: systemd-analyze over the units
	Static   = "static"   // gofmt, go vet, staticcheck, govulncheck (tests/lint)
	Packages = "packages" // tier 3: .deb and .rpm into scratch roots
	Kube     = "kube"     // tier 4: the real API server of tests/kube
	System   = "system"   // tier 5: real systemd in systemd-nspawn
	Fuzz     = "fuzz"     // tier 7: a short fuzz run per target
)

// Names are the tier names EnvRequired accepts.
var Names = []string{Unit, Lint, Static, Packages, Kube, System, Fuzz}

// Parse reads a value of EnvRequired (and of EnvKubeRequired): the set of
// required tiers. An unknown name is an error, not ignored: a misspelt
// "sytem" must not quietly let the system tier skip.
func Parse(required, kubeRequired string) (map[string]bool, error) {
	set := map[string]bool{}
	var unknown []string
	for _, n := range strings.Split(required, ",") {
		n = strings.TrimSpace(n)
		switch {
		case n == "":
		case n == "kubernetes": // the name tiersum prints
			set[Kube] = true
		case slices.Contains(Names, n):
			set[n] = true
		default:
			unknown = append(unknown, n)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return nil, fmt.Errorf("%s=%q: unknown tier %s (known: %s)", EnvRequired, required,
			strings.Join(unknown, ", "), strings.Join(Names, ", "))
	}
	switch kubeRequired {
	case "", "0":
	case "1":
		set[Kube] = true
	default:
		return nil, fmt.Errorf("%s=%q: want 1 (or unset)", EnvKubeRequired, kubeRequired)
	}
	return set, nil
}

// FromEnv is Parse of this process's environment.
func FromEnv() (map[string]bool, error) {
	return Parse(os.Getenv(EnvRequired), os.Getenv(EnvKubeRequired))
}

// Required reports whether tier must run here. A malformed EnvRequired
// counts as "required": it must fail loudly, not let tests skip.
func Required(tier string) (bool, error) {
	set, err := FromEnv()
	if err != nil {
		return true, err
	}
	return set[tier], nil
}

// Skip skips t because tier cannot run here, for the reason given; when
// the tier is required it fails t with that reason instead.
func Skip(t testing.TB, tier, format string, args ...any) {
	t.Helper()
	reason := fmt.Sprintf(format, args...)
	req, err := Required(tier)
	if err != nil {
		t.Fatalf("%s (and the %s tier cannot run here: %s)", err, tier, reason)
	}
	if req {
		by := fmt.Sprintf("%s=%q", EnvRequired, os.Getenv(EnvRequired))
		if tier == Kube && os.Getenv(EnvKubeRequired) == "1" {
			by = EnvKubeRequired + "=1"
		}
		t.Fatalf("the %s tier is required (%s) but cannot run here: %s", tier, by, reason)
	}
	t.Skip(reason)
}
