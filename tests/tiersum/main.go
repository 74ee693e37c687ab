// Command tiersum reads `go test -json` streams, one per test tier, and
// prints what `make test` promises: for every tier, how many tests passed,
// failed and skipped, and why each skip happened. A tier that skipped is
// never reported as passed. It names each tier's slowest top-level tests
// (where a run's time went). The last line is the plain
// "N passed, N failed, N skipped" total.
//
// Usage: tiersum TIER=FILE.json [TIER=FILE.json ...]
//
//	tiersum -required   prints the required tiers, or fails on a bad switch
//
// Tests are counted where they end: a test with subtests counts as its
// subtests (a parent whose subtests all skipped is so many skips, not a
// pass), plus itself if it failed or skipped on its own.
//
// A test of the unit step that used the shared Kubernetes test environment
// logs a line starting "kubeenv:"; such tests are counted in the
// "kubernetes" tier whatever package they live in. Every other step's
// tests stay under the step that ran them (the system scenarios all use
// the API server and are counted under "system").
//
// What a tier's counts mean: tests and subtests that ended, a test with
// subtests counted as its subtests; the line also says how many top-level
// tests (for the system tier: scenarios) ran, and how long the tier's
// step took from its first event to its last (the kubernetes tier runs
// inside the unit step: its tests' own time is given).
//
// The system tier's scenarios log "timing: KIND SECONDS" lines
// (tests/system/harness: boot, first-boot and cpu; tests/system: wait, and
// queued: the wait for a place among the running scenarios); the summary
// lists every scenario with its wall time from its place on and the sums
// of the others.
//
// The tiers named in UNBOUNDED_TEST_REQUIRED (see tests/tiers; "kube" is
// the "kubernetes" tier) must run: one that skipped every test or ran none
// fails the summary.
//
// Exit status: 1 if any test or package failed or a required tier did not
// run, 2 for bad usage.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"unbounded-cloud.io/agent/tests/tiers"
)

// kubeTier is the tier that counts the tests which used the API server.
const kubeTier = "kubernetes"

type event struct {
	Action  string
	Package string
	Test    string
	Output  string
	Elapsed float64 // seconds, on a test's pass, fail or skip
	Time    time.Time
	// OutputType is "error" for the first line of a t.Error or t.Fatal
	// message and "error-continue" for its further lines (go1.27's
	// test2json; empty on older toolchains and for t.Log).
	OutputType string `json:",omitempty"`
}

// line is one output line of a test, marked when it is the test's own
// failure message.
type line struct {
	text  string
	isErr bool
}

type tally struct {
	passed, failed, skipped int
	reasons                 map[string]int
	failures                []string
	took                    []timed // its top-level tests that ran
	// first and last are the times of the step's first and last event
	// (zero for the kubernetes tier, which has no step of its own).
	first, last time.Time
}

// timed is a top-level test, how long it ran and, for a system scenario,
// what its "timing:" lines add up to by kind.
type timed struct {
	name    string
	seconds float64
	kinds   map[string]float64
	counts  map[string]int
}

// timingKinds are the kinds of "timing:" lines a scenario logs, in the
// order the summary prints them: every host start (boot), the first start
// of a host (first-boot: a host with agent.toml boots through its whole
// bootstrap), polls until a condition of the cluster or the host holds
// (wait), and the CPU time each of its hosts used over all its boots
// (cpu: the tier is bound by the machine's two cores, not by its waits).
var timingKinds = []string{"first-boot", "boot", "wait", "cpu"}

// queuedKind is the "timing:" line of a scenario's wait for a place
// (tests/system/schedule_test.go): its wall time is counted from the
// place on.
const queuedKind = "queued"

// timingLine is a scenario's "timing: KIND SECONDS" line.
var timingLine = regexp.MustCompile(`timing: ([a-z-]+) ([0-9.]+)s`)

// slowest is how many of a tier's slowest tests the summary names: where
// a CI run's time goes, without the raw JSON.
const slowest = 5

func newTally() *tally { return &tally{reasons: map[string]int{}} }

// status is what a tier did, as printed.
func (t *tally) status() string {
	switch {
	case t.failed > 0:
		return "FAILED"
	case t.passed == 0 && t.skipped > 0:
		return "SKIPPED"
	case t.passed == 0:
		return "NO TESTS"
	case t.skipped > 0:
		return "ran (some skipped)"
	}
	return "ran"
}

func main() {
	required, err := tiers.FromEnv()
	if err != nil {
		fmt.Fprintln(os.Stderr, "tiersum:", err)
		os.Exit(2)
	}
	if len(os.Args) == 2 && os.Args[1] == "-required" {
		// For tests/run-tiers.sh: check the switch before an hour of
		// tests, and say which tiers must run.
		names := make([]string, 0, len(required))
		for n := range required {
			names = append(names, n)
		}
		sort.Strings(names)
		fmt.Println(strings.Join(names, ","))
		return
	}
	os.Exit(run(os.Args[1:], required, os.Stdout, os.Stderr))
}

// requiredName maps a tier as tiersum names it to its name in
// UNBOUNDED_TEST_REQUIRED.
func requiredName(tier string) string {
	if tier == kubeTier {
		return tiers.Kube
	}
	return tier
}

// run summarizes the streams named by args (TIER=FILE) and returns the exit
// status.
func run(args []string, required map[string]bool, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, "usage: tiersum TIER=FILE.json ...")
		return 2
	}
	var order []string
	all := map[string]*tally{}
	get := func(name string) *tally {
		if name == tiers.Kube {
			name = kubeTier
		}
		if t, ok := all[name]; ok {
			return t
		}
		t := newTally()
		all[name] = t
		order = append(order, name)
		return t
	}
	for _, arg := range args {
		name, file, ok := strings.Cut(arg, "=")
		if !ok {
			fmt.Fprintf(stderr, "tiersum: %q is not TIER=FILE\n", arg)
			return 2
		}
		get(name)
		if err := read(stdout, file, name, get); err != nil {
			fmt.Fprintf(stderr, "tiersum: %s: %v\n", file, err)
			get(name).failures = append(get(name).failures, "(test output unreadable: "+err.Error()+")")
			get(name).failed++
		}
	}
	// A required tier with no stream and no test still gets a line: it
	// did not run.
	req := make([]string, 0, len(required))
	for r := range required {
		req = append(req, r)
	}
	sort.Strings(req)
	for _, r := range req {
		get(r)
	}

	var p, f, s int
	var missing []string
	fmt.Fprintln(stdout)
	fmt.Fprintln(stdout, "== test tiers ==")
	for _, name := range order {
		t := all[name]
		status := t.status()
		if required[requiredName(name)] && (status == "SKIPPED" || status == "NO TESTS") {
			missing = append(missing, fmt.Sprintf("%s (%s)", name, strings.ToLower(status)))
			status += " (REQUIRED)"
		}
		fmt.Fprintf(stdout, "%-12s %-20s %d passed, %d failed, %d skipped%s\n", name, status, t.passed, t.failed, t.skipped, t.extent(name))
		for _, fl := range t.failures {
			fmt.Fprintf(stdout, "    FAIL %s\n", fl)
		}
		reasons := make([]string, 0, len(t.reasons))
		for r := range t.reasons {
			reasons = append(reasons, r)
		}
		sort.Strings(reasons)
		for _, r := range reasons {
			fmt.Fprintf(stdout, "    skip x%d: %s\n", t.reasons[r], r)
		}
		sort.SliceStable(t.took, func(i, j int) bool { return t.took[i].seconds > t.took[j].seconds })
		n := min(slowest, len(t.took))
		if name == tiers.System {
			n = len(t.took) // every scenario, with its boots and waits
		}
		for _, tt := range t.took[:n] {
			fmt.Fprintf(stdout, "    %6.1fs %s%s\n", tt.seconds, tt.name, tt.breakdown())
		}
		p, f, s = p+t.passed, f+t.failed, s+t.skipped
	}
	fmt.Fprintln(stdout, "(counts: tests and subtests that ended, a test with subtests counted as its subtests; top-level: the tests the step ran, for the system tier its scenarios; step: the tier's wall time)")
	fmt.Fprintf(stdout, "%d passed, %d failed, %d skipped\n", p, f, s)
	rc := 0
	if f > 0 {
		rc = 1
	}
	if len(missing) > 0 {
		fmt.Fprintf(stdout, "required tiers that did not run (%s): %s\n", tiers.EnvRequired, strings.Join(missing, ", "))
		rc = 1
	}
	return rc
}

// extent says how many top-level tests the tier ran and how long its step
// took.
func (t *tally) extent(name string) string {
	out := fmt.Sprintf(" (%d top-level", len(t.took))
	if name == tiers.System {
		out = fmt.Sprintf(" (%d scenarios", len(t.took))
	}
	if !t.first.IsZero() && t.last.After(t.first) {
		out += fmt.Sprintf("; step %s", t.last.Sub(t.first).Round(time.Second))
	} else if name == kubeTier {
		var sum float64
		for _, tt := range t.took {
			sum += tt.seconds
		}
		out += fmt.Sprintf("; inside the unit step, its tests %.0fs in all", sum)
	}
	return out + ")"
}

// breakdown is a scenario's boots and waits, from its "timing:" lines.
func (tt timed) breakdown() string {
	var parts []string
	for _, k := range timingKinds {
		if tt.counts[k] > 0 {
			parts = append(parts, fmt.Sprintf("%s %d x %.0fs", k, tt.counts[k], tt.kinds[k]))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return " (" + strings.Join(parts, ", ") + ")"
}

// result is a test's end: its action (pass, fail, skip) and its output.
type result struct {
	test   string
	action string
	out    []line
	kube   bool // it logged "kubeenv:"
	secs   float64
	// kinds and counts add up its "timing:" lines by kind.
	kinds  map[string]float64
	counts map[string]int
	// queued is how long it waited for a place among the running
	// scenarios ("timing: queued"), not counted in secs.
	queued float64
}

// read tallies one go test -json stream into tier (or "kubernetes" for
// tests that used the API server).
func read(w io.Writer, file, tier string, get func(string) *tally) error {
	fh, err := os.Open(file)
	if err != nil {
		return err
	}
	defer fh.Close()
	type pkgState struct {
		tests  map[string]*result
		ended  []*result // in the order they ended
		out    []string  // the package's own output
		failed bool      // the package failed
	}
	var pkgOrder []string
	pkgs := map[string]*pkgState{}
	pkg := func(name string) *pkgState {
		ps, ok := pkgs[name]
		if !ok {
			ps = &pkgState{tests: map[string]*result{}}
			pkgs[name] = ps
			pkgOrder = append(pkgOrder, name)
		}
		return ps
	}
	sc := bufio.NewScanner(fh)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var e event
		if json.Unmarshal(sc.Bytes(), &e) != nil {
			continue // go test prints build errors as plain text
		}
		if !e.Time.IsZero() {
			t := get(tier)
			if t.first.IsZero() || e.Time.Before(t.first) {
				t.first = e.Time
			}
			if e.Time.After(t.last) {
				t.last = e.Time
			}
		}
		ps := pkg(e.Package)
		if e.Test == "" {
			switch e.Action {
			case "output":
				ps.out = append(ps.out, e.Output)
			case "fail":
				ps.failed = true
			}
			continue
		}
		r, ok := ps.tests[e.Test]
		if !ok {
			r = &result{test: e.Test}
			ps.tests[e.Test] = r
		}
		switch e.Action {
		case "output":
			r.out = append(r.out, line{text: e.Output, isErr: e.OutputType == "error" || e.OutputType == "error-continue"})
			if strings.Contains(e.Output, "kubeenv:") && tier == tiers.Unit {
				r.kube = true
			}
			if m := timingLine.FindStringSubmatch(e.Output); m != nil && m[1] == queuedKind {
				if secs, err := strconv.ParseFloat(m[2], 64); err == nil {
					r.queued += secs
				}
			} else if m != nil {
				if secs, err := strconv.ParseFloat(m[2], 64); err == nil {
					top := ps.tests[topLevel(e.Test)]
					if top == nil {
						top = &result{test: topLevel(e.Test)}
						ps.tests[top.test] = top
					}
					if top.kinds == nil {
						top.kinds, top.counts = map[string]float64{}, map[string]int{}
					}
					top.kinds[m[1]] += secs
					top.counts[m[1]]++
				}
			}
		case "pass", "fail", "skip":
			r.action, r.secs = e.Action, max(e.Elapsed-r.queued, 0)
			ps.ended = append(ps.ended, r)
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}

	for _, name := range pkgOrder {
		ps := pkgs[name]
		// ancestors and descendants of a test, by name.
		hasChild := map[string]bool{}
		childFailed := map[string]bool{}
		childKube := map[string]bool{}
		for t, r := range ps.tests {
			for i := strings.LastIndex(t, "/"); i > 0; i = strings.LastIndex(t[:i], "/") {
				hasChild[t[:i]] = true
				if r.action == "fail" {
					childFailed[t[:i]] = true
				}
				if r.kube {
					childKube[t[:i]] = true
				}
			}
		}
		ancestorKube := func(t string) bool {
			for i := strings.LastIndex(t, "/"); i > 0; i = strings.LastIndex(t[:i], "/") {
				if r := ps.tests[t[:i]]; r != nil && r.kube {
					return true
				}
			}
			return false
		}
		anyFailed := false
		for _, r := range ps.ended {
			parent := hasChild[r.test]
			t := get(tier)
			if r.kube || ancestorKube(r.test) || (parent && childKube[r.test]) {
				t = get(kubeTier)
			}
			if r.action != "skip" && !strings.Contains(r.test, "/") {
				t.took = append(t.took, timed{r.test, r.secs, r.kinds, r.counts})
			}
			if parent && (r.action == "pass" || (r.action == "fail" && childFailed[r.test])) {
				continue // its subtests are counted
			}
			full := name + " " + r.test
			switch r.action {
			case "pass":
				t.passed++
			case "fail":
				anyFailed = true
				printFailure(w, full, r.out)
				t.failed++
				t.failures = append(t.failures, full)
			case "skip":
				t.skipped++
				t.reasons[skipReason(r.out)]++
			}
		}
		if ps.failed && !anyFailed {
			// A package that failed without a failing test: a build
			// error, a panic in TestMain or a timeout.
			pl := make([]line, len(ps.out))
			for i, o := range ps.out {
				pl[i] = line{text: o}
			}
			printFailure(w, name, pl)
			get(tier).failed++
			get(tier).failures = append(get(tier).failures, name+" (package failed)")
		}
	}
	return nil
}

// topLevel is the top-level test of a test or subtest.
func topLevel(test string) string {
	top, _, _ := strings.Cut(test, "/")
	return top
}

// skipReason picks the message a test gave to t.Skip.
func skipReason(lines []line) string {
	for i := len(lines) - 1; i >= 0; i-- {
		l := strings.TrimSpace(lines[i].text)
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

// Bounds of a failure's report: the test's own failure messages are
// printed whole up to maxErrLines (a test that failed on every one of a
// thousand checks says enough in the first ones); of the rest of its
// output (t.Log lines, the journal and console dumps of its cleanups)
// only the last keepTail lines.
const (
	maxErrLines = 200
	keepTail    = 40
)

// printFailure shows why a test failed, so that a CI log says so without
// the raw JSON: first the test's own t.Error/t.Fatal lines, wherever they
// stand in its output (a scenario's cleanups dump hundreds of journal
// lines after them), then the end of its output, with what was cut
// counted.
func printFailure(w io.Writer, name string, lines []line) {
	fmt.Fprintf(w, "\n--- FAIL: %s\n", name)
	errs := failureLines(lines)
	if len(errs) > 0 {
		fmt.Fprintf(w, "    failure messages:\n")
		for i, l := range errs {
			if i == maxErrLines {
				fmt.Fprintf(w, "    ... (%d more lines of failure messages cut)\n", len(errs)-maxErrLines)
				break
			}
			fmt.Fprint(w, "    ", l)
		}
		fmt.Fprintf(w, "    output (end):\n")
	}
	if len(lines) > keepTail {
		fmt.Fprintf(w, "    ... (%d lines cut)\n", len(lines)-keepTail)
		lines = lines[len(lines)-keepTail:]
	}
	for _, l := range lines {
		fmt.Fprint(w, "    ", l.text)
	}
}

// failureLines is a failed test's own messages: the lines test2json
// marks as t.Error/t.Fatal output (go1.27); for a stream without those
// marks, the last "file_test.go:N: " line before the "--- FAIL" frame
// with the more deeply indented lines that continue it (t.Fatal is the
// last message a test prints itself; cleanups may log after it, so this
// is a guess, and it says so).
func failureLines(lines []line) []string {
	var errs []string
	for _, l := range lines {
		if l.isErr {
			errs = append(errs, l.text)
		}
	}
	if len(errs) > 0 {
		return errs
	}
	end := len(lines)
	for i, l := range lines {
		if strings.HasPrefix(strings.TrimSpace(l.text), "--- FAIL") {
			end = i
			break
		}
	}
	for i := end - 1; i >= 0; i-- {
		if !testLine.MatchString(lines[i].text) {
			continue
		}
		indent := len(lines[i].text) - len(strings.TrimLeft(lines[i].text, " \t"))
		errs = append(errs, "(the last message before the failure; this toolchain does not mark errors)\n", lines[i].text)
		for _, c := range lines[i+1 : end] {
			if len(c.text)-len(strings.TrimLeft(c.text, " \t")) <= indent {
				break
			}
			errs = append(errs, c.text)
		}
		return errs
	}
	return nil
}

// testLine is how the testing package starts a message: the file and
// line of the call.
var testLine = regexp.MustCompile(`^\s+[\w.-]+_test\.go:\d+: `)
