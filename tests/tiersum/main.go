// Command tiersum reads `go test -json` streams, one per test tier, and
// prints what `make test` promises: for every tier, how many tests passed,
// failed and skipped, and why each skip happened. A tier that skipped is
// never reported as passed. The last line is the plain
// "N passed, N failed, N skipped" total; the exit status is 1 if any test or
// package failed.
//
// Usage: tiersum TIER=FILE.json [TIER=FILE.json ...]
//
// A test that used the shared Kubernetes test environment logs a line
// starting "kubeenv:"; such tests are counted in the "kubernetes" tier
// whatever package they live in.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
)

type event struct {
	Action  string
	Package string
	Test    string
	Output  string
}

type tally struct {
	passed, failed, skipped int
	reasons                 map[string]int
	failures                []string
	ran                     bool
}

func newTally() *tally { return &tally{reasons: map[string]int{}} }

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: tiersum TIER=FILE.json ...")
		os.Exit(2)
	}
	var order []string
	tiers := map[string]*tally{}
	get := func(name string) *tally {
		if t, ok := tiers[name]; ok {
			return t
		}
		t := newTally()
		tiers[name] = t
		order = append(order, name)
		return t
	}
	for _, arg := range os.Args[1:] {
		name, file, ok := strings.Cut(arg, "=")
		if !ok {
			fmt.Fprintf(os.Stderr, "tiersum: %q is not TIER=FILE\n", arg)
			os.Exit(2)
		}
		get(name)
		if err := read(file, name, get); err != nil {
			fmt.Fprintf(os.Stderr, "tiersum: %s: %v\n", file, err)
			get(name).failures = append(get(name).failures, "(test output unreadable: "+err.Error()+")")
			get(name).failed++
		}
	}
	var p, f, s int
	fmt.Println()
	fmt.Println("== test tiers ==")
	for _, name := range order {
		t := tiers[name]
		status := "ran"
		switch {
		case t.failed > 0:
			status = "FAILED"
		case t.passed == 0 && t.skipped > 0:
			status = "SKIPPED"
		case t.passed == 0:
			status = "NO TESTS"
		case t.skipped > 0:
			status = "ran (some skipped)"
		}
		fmt.Printf("%-12s %-20s %d passed, %d failed, %d skipped\n", name, status, t.passed, t.failed, t.skipped)
		for _, fl := range t.failures {
			fmt.Printf("    FAIL %s\n", fl)
		}
		reasons := make([]string, 0, len(t.reasons))
		for r := range t.reasons {
			reasons = append(reasons, r)
		}
		sort.Strings(reasons)
		for _, r := range reasons {
			fmt.Printf("    skip x%d: %s\n", t.reasons[r], r)
		}
		p, f, s = p+t.passed, f+t.failed, s+t.skipped
	}
	fmt.Printf("%d passed, %d failed, %d skipped\n", p, f, s)
	if f > 0 {
		os.Exit(1)
	}
}

// read tallies one go test -json stream into tier (or "kubernetes" for
// tests that used the API server).
func read(file, tier string, get func(string) *tally) error {
	fh, err := os.Open(file)
	if err != nil {
		return err
	}
	defer fh.Close()
	out := map[string][]string{} // package/test -> output lines
	kube := map[string]bool{}
	testFailed := map[string]bool{} // package -> a test in it failed
	sc := bufio.NewScanner(fh)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if json.Unmarshal(line, &e) != nil {
			continue // go test prints build errors as plain text
		}
		key := e.Package + "." + e.Test
		switch e.Action {
		case "output":
			out[key] = append(out[key], e.Output)
			if e.Test != "" {
				if strings.Contains(e.Output, "kubeenv:") {
					kube[key] = true
				}
			}
		case "pass", "fail", "skip":
			if e.Test == "" {
				if e.Action == "fail" && !testFailed[e.Package] {
					printFailure(e.Package, out[e.Package+"."])
					// A package that failed without a failing test: a
					// build error, a panic in TestMain or a timeout.
					get(tier).failed++
					get(tier).failures = append(get(tier).failures, e.Package+" (package failed)")
				}
				continue
			}
			if strings.Contains(e.Test, "/") {
				continue // subtests count through their parent
			}
			t := get(tier)
			if kube[key] {
				t = get("kubernetes")
			}
			switch e.Action {
			case "pass":
				t.passed++
			case "fail":
				testFailed[e.Package] = true
				printFailure(e.Package+" "+e.Test, out[key])
				t.failed++
				t.failures = append(t.failures, e.Package+" "+e.Test)
			case "skip":
				t.skipped++
				t.reasons[skipReason(out[key])]++
			}
		}
	}
	return sc.Err()
}

// skipReason picks the message a test gave to t.Skip.
func skipReason(lines []string) string {
	for i := len(lines) - 1; i >= 0; i-- {
		l := strings.TrimSpace(lines[i])
		if l == "" || strings.HasPrefix(l, "--- SKIP") || strings.HasPrefix(l, "=== ") {
			continue
		}
		if _, after, ok := strings.Cut(l, ".go:"); ok {
			if _, msg, ok := strings.Cut(after, ": "); ok {
				return msg
			}
		}
		return l
	}
	return "(no reason given)"
}

// printFailure shows the end of a failed test's output, so that a CI log
// says why without the raw JSON.
func printFailure(name string, lines []string) {
	const keep = 80
	fmt.Printf("\n--- FAIL: %s\n", name)
	if len(lines) > keep {
		fmt.Printf("    ... (%d lines cut)\n", len(lines)-keep)
		lines = lines[len(lines)-keep:]
	}
	for _, l := range lines {
		fmt.Print("    ", l)
	}
}
