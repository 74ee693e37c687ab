// Package lint is the static tier of `make test` (tests/run-tiers.sh, tier
// name "static" in tests/tiers): gofmt, go vet, staticcheck and govulncheck
// over the main module, with tools nobody here wrote.
//
// The tools are pinned in their own module, tools/lint/go.mod (not the nfpm
// module of tools/go.mod: golang.org/x/vulndb would move nfpm's
// dependencies), and built from it once per test run. govulncheck reads an
// offline database: the golang.org/x/vulndb version pinned there is a Go
// module whose zip holds data/osv/*.json, and its cmd/indexdb lays those out
// as the database govulncheck reads with -db file:///DIR. The database is
// built once per vulndb version and kept in the user cache directory
// ($XDG_CACHE_HOME or ~/.cache)/unbounded-agent/vulndb/VERSION. A newer
// database is a deliberate commit: `go get golang.org/x/vulndb@VERSION` in
// tools/lint.
//
// A called vulnerability (govulncheck found a path from this module's code
// to the vulnerable function) fails the tier; one in a required module or an
// imported package that nothing calls is printed (go test -v, or the tier's
// log) and does not. Every staticcheck finding fails the tier.
//
// The tests run the checks on UNBOUNDED_LINT_DIR instead of the repository
// when it is set: TestTheTierFailsOnAFinding runs this package's own test
// binary on the planted findings of testdata/ and expects it to fail.
package lint
