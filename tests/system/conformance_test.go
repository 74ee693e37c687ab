package system_test

import (
	"encoding/xml"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"sigs.k8s.io/yaml"

	"unbounded-cloud.io/agent/lib/bootstrap"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/modes/facts"
	"unbounded-cloud.io/agent/tests/kubeenv"
	"unbounded-cloud.io/agent/tests/system/nodestack"
	"unbounded-cloud.io/agent/tests/tiers"
)

// Upstream conformance of the node the agent makes: Kubernetes' own
// end-to-end binary (e2e.test, built from the test control plane's module
// by tests/conformance/build.sh) runs [NodeConformance] specs against a
// node that the agent's first boot (offline: artifacts, node image and
// the e2e images from the offline directory) made in a control plane of
// its own (the specs schedule pods on any Node and want every
// Node Ready; other tests' Nodes come and go).
//
// What runs (UNBOUNDED_TEST_CONFORMANCE_FOCUS):
//   - unset or "ci": the pinned CI subset, tests/conformance/ci-subset.txt;
//   - "all": every [NodeConformance] spec (`make conformance`);
//   - anything else: a Ginkgo focus regexp.
//
// On which modes (UNBOUNDED_TEST_CONFORMANCE_MODES, a list): the CI
// subset on a node of mode nspawn and one of mode container, each with a
// control plane of its own, side by side; any other focus on nspawn. A
// run of several modes writes each report in a directory named after its
// mode.
//
// Either way the specs of tests/conformance/skips.yaml are skipped, each
// with its reason, and the test fails if a spec failed, or if a spec was
// skipped that the file does not list (a spec upstream skips by itself
// needs an entry too). The report (passed, failed, skipped with reasons,
// time) is logged and written to UNBOUNDED_TEST_CONFORMANCE_REPORT when
// set.
const (
	envConformance       = "UNBOUNDED_TEST_CONFORMANCE"
	envConformanceFocus  = "UNBOUNDED_TEST_CONFORMANCE_FOCUS"
	envConformanceReport = "UNBOUNDED_TEST_CONFORMANCE_REPORT"
	envConformanceProcs  = "UNBOUNDED_TEST_CONFORMANCE_PROCS"
	envConformanceSeed   = "UNBOUNDED_TEST_CONFORMANCE_SEED"
	envConformanceModes  = "UNBOUNDED_TEST_CONFORMANCE_MODES"
	envConformanceBuild  = "UNBOUNDED_TEST_CONFORMANCE_BUILD"
)

const (
	conformanceDir = "../conformance"
	skipsFile      = conformanceDir + "/skips.yaml"
	ciSubsetFile   = conformanceDir + "/ci-subset.txt"
)

// skipEntry is one spec of skips.yaml.
type skipEntry struct {
	Spec   string `json:"spec"`
	Reason string `json:"reason"`
}

func readSkips(t *testing.T) []skipEntry {
	t.Helper()
	data, err := os.ReadFile(skipsFile)
	if err != nil {
		t.Fatal(err)
	}
	var skips []skipEntry
	if err := yaml.UnmarshalStrict(data, &skips); err != nil {
		t.Fatalf("%s: %v", skipsFile, err)
	}
	seen := map[string]bool{}
	for i, s := range skips {
		if s.Spec == "" || strings.TrimSpace(s.Reason) == "" {
			t.Fatalf("%s: entry %d (%q): every skipped spec needs its name and a reason", skipsFile, i+1, s.Spec)
		}
		if seen[s.Spec] {
			t.Fatalf("%s: entry %d: %q is listed twice", skipsFile, i+1, s.Spec)
		}
		seen[s.Spec] = true
	}
	return skips
}

func readCISubset(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile(ciSubsetFile)
	if err != nil {
		t.Fatal(err)
	}
	var specs []string
	for _, l := range strings.Split(string(data), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			specs = append(specs, l)
		}
	}
	return specs
}

// anyOf is a regexp matching exactly the given spec texts. Ginkgo matches
// a focus or skip regexp against the suite's description, a space and the
// spec's full text, so a text starts after a space, not at ^.
func anyOf(specs []string) string {
	q := make([]string, len(specs))
	for i, s := range specs {
		q[i] = regexp.QuoteMeta(s)
	}
	return `(?:^|\s)(?:` + strings.Join(q, "|") + ")$"
}

// awaitConformanceBuild waits until the build of the conformance binaries
// that tests/run-tiers.sh runs beside the system tier has ended: it holds
// an exclusive lock on the file envConformanceBuild names while it builds
// (a cold build compiles minutes of Kubernetes; no other scenario waits
// for it), and writes its outcome to the same path with ".result" added.
// Without the variable (a run by hand) there is nothing to wait for.
func awaitConformanceBuild(t *testing.T) {
	t.Helper()
	lock := os.Getenv(envConformanceBuild)
	if lock == "" {
		return
	}
	f, err := os.Open(lock)
	if err != nil {
		t.Fatalf("conformance build lock: %v", err)
	}
	defer f.Close()
	begin := time.Now()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_SH); err != nil {
		t.Fatalf("wait for the conformance build (%s): %v", lock, err)
	}
	if w := time.Since(begin); w >= time.Second {
		t.Logf("waited %.1fs for the conformance build", w.Seconds())
	}
	result, err := os.ReadFile(lock + ".result")
	switch {
	case err != nil:
		tiers.Skip(t, tiers.System, "conformance: the build of the conformance binaries left no outcome: %v", err)
	case strings.TrimSpace(string(result)) != "ok":
		tiers.Skip(t, tiers.System, "conformance: the build of the conformance binaries failed: %s", strings.TrimSpace(string(result)))
	}
}

// conformanceBin returns the directory of tests/conformance/build.sh's
// output, or skips (fails, where the system tier is required).
func conformanceBin(t *testing.T) string {
	t.Helper()
	bin := os.Getenv(envConformance)
	if bin == "" {
		tiers.Skip(t, tiers.System, "conformance: %s is not set: export %s=$(tests/conformance/build.sh)", envConformance, envConformance)
	}
	for _, f := range []string{"e2e.test", "ginkgo", "agnhost", "nnp", "localhost.crt", "localhost.key", "bash-static"} {
		if _, err := os.Stat(filepath.Join(bin, f)); err != nil {
			tiers.Skip(t, tiers.System, "conformance: %v (run tests/conformance/build.sh)", err)
		}
	}
	return bin
}

// e2eSpecs lists the specs e2e.test would run with focus and skip (a dry
// run: nothing is contacted).
func e2eSpecs(t *testing.T, bin, focus, skip string) []string {
	t.Helper()
	dir := t.TempDir()
	args := []string{"--ginkgo.dry-run", "--ginkgo.focus=" + focus, "--report-dir=" + dir}
	if skip != "" {
		args = append(args, "--ginkgo.skip="+skip)
	}
	cmd := exec.Command(filepath.Join(bin, "e2e.test"), args...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("e2e.test dry run: %v\n%s", err, tail(string(out), 30))
	}
	r := readJUnit(t, filepath.Join(dir, "junit_01.xml"))
	var names []string
	for _, c := range r {
		if c.status == "passed" {
			names = append(names, c.name)
		}
	}
	sort.Strings(names)
	return names
}

// suiteNode is the JUnit name of a suite-level node ("[SynchronizedBeforeSuite]",
// "[ReportAfterSuite] Kubernetes e2e suite report", "[DeferCleanup (Suite)]"),
// not a spec.
var suiteNode = regexp.MustCompile(`^\[(SynchronizedBeforeSuite|SynchronizedAfterSuite|BeforeSuite|AfterSuite|ReportBeforeSuite|ReportAfterSuite|DeferCleanup \(Suite\))\]( |$)`)

// specResult is one spec of a JUnit report.
type specResult struct {
	name, status, message string
	secs                  float64
}

func readJUnit(t *testing.T, path string) []specResult {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Suites []struct {
			Cases []struct {
				Name    string  `xml:"name,attr"`
				Status  string  `xml:"status,attr"`
				Time    float64 `xml:"time,attr"`
				Skipped *struct {
					Message string `xml:"message,attr"`
				} `xml:"skipped"`
				Failure *struct {
					Message string `xml:"message,attr"`
					Text    string `xml:",chardata"`
				} `xml:"failure"`
				Error *struct {
					Message string `xml:"message,attr"`
				} `xml:"error"`
			} `xml:"testcase"`
		} `xml:"testsuite"`
	}
	if err := xml.Unmarshal(data, &doc); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	var r []specResult
	for _, s := range doc.Suites {
		for _, c := range s.Cases {
			name := strings.TrimPrefix(c.Name, "[It] ")
			if suiteNode.MatchString(name) {
				if c.Status == "failed" {
					r = append(r, specResult{name: name, status: "failed", message: c.Failure.Message})
				}
				continue
			}
			res := specResult{name: name, status: c.Status, secs: c.Time}
			switch {
			case c.Failure != nil:
				res.message = c.Failure.Message
			case c.Error != nil:
				res.message = c.Error.Message
			case c.Skipped != nil:
				res.message = c.Skipped.Message
			}
			r = append(r, res)
		}
	}
	return r
}

func tail(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}

// TestConformanceSkipListIsCurrent: every spec of skips.yaml and of the CI
// subset is a [NodeConformance] spec of this e2e.test, and no spec is both
// in the CI subset and skipped. Needs only the binary (a dry run).
func TestConformanceSkipListIsCurrent(t *testing.T) {
	defer scenarioAfter(t, awaitConformanceBuild)()
	bin := conformanceBin(t)
	all := e2eSpecs(t, bin, `\[NodeConformance\]`, "")
	known := map[string]bool{}
	for _, s := range all {
		known[s] = true
	}
	skipped := map[string]bool{}
	for _, s := range readSkips(t) {
		skipped[s.Spec] = true
		if !known[s.Spec] {
			t.Errorf("%s lists %q, which is not a [NodeConformance] spec of this e2e.test: remove it", skipsFile, s.Spec)
		}
	}
	for _, s := range readCISubset(t) {
		if !known[s] {
			t.Errorf("%s lists %q, which is not a [NodeConformance] spec of this e2e.test", ciSubsetFile, s)
		}
		if skipped[s] {
			t.Errorf("%s lists %q, which %s skips", ciSubsetFile, s, skipsFile)
		}
	}
	t.Logf("%d [NodeConformance] specs, %d skipped with a reason, %d to run", len(all), len(skipped), len(all)-len(skipped))
}

func TestConformance(t *testing.T) {
	// In parallel with the tier's other scenarios: it waits on the node
	// far more than it computes.
	defer scenarioAfter(t, awaitConformanceBuild)()
	bin := conformanceBin(t)
	skips := readSkips(t)
	reason := map[string]string{}
	var skipNames []string
	for _, s := range skips {
		reason[s.Spec] = s.Reason
		skipNames = append(skipNames, s.Spec)
	}
	// The CI subset runs in the system tier beside the other scenarios:
	// two processes and a bound well inside the tier's. A whole run gets
	// twelve (the specs wait far more than they compute: 190 minutes of
	// specs ran in 28 on two cores) and hours.
	focus := os.Getenv(envConformanceFocus)
	procs, timeout := 12, "3h"
	switch focus {
	case "", "ci":
		focus = anyOf(readCISubset(t))
		procs, timeout = 2, "15m"
	case "all":
		focus = `\[NodeConformance\]`
	}
	skip := anyOf(skipNames)
	specs := e2eSpecs(t, bin, focus, skip)
	if len(specs) == 0 {
		t.Fatalf("the focus %q selects no spec", focus)
	}
	t.Logf("%d specs to run", len(specs))

	// The images the specs use, built offline under their upstream names.
	out, err := exec.Command(filepath.Join(bin, "e2e.test"), "--list-images").Output()
	if err != nil {
		t.Fatalf("e2e.test --list-images: %v", err)
	}
	refs := strings.Fields(string(out))
	manifests := os.Getenv("UNBOUNDED_TEST_MANIFESTS")
	if manifests == "" {
		tiers.Skip(t, tiers.System, "conformance: UNBOUNDED_TEST_MANIFESTS is not set (run under tests/run-tiers.sh or /work/dev.sh)")
	}
	if p, err := strconv.Atoi(os.Getenv(envConformanceProcs)); err == nil && p > 0 {
		procs = p
	}
	report := os.Getenv(envConformanceReport)
	if report == "" {
		report = t.TempDir()
	}
	// Each mode's node in a cluster of its own, side by side: the CI
	// subset on both blue/green modes; a whole run (hours of specs) on
	// nspawn unless asked.
	modes := strings.Fields(strings.ReplaceAll(os.Getenv(envConformanceModes), ",", " "))
	if len(modes) == 0 {
		modes = []string{"nspawn"}
		if os.Getenv(envConformanceFocus) == "" || os.Getenv(envConformanceFocus) == "ci" {
			modes = append(modes, "container")
		}
	}
	for _, mode := range modes {
		c := conformanceRun{mode: mode, bin: bin, refs: refs, manifests: manifests, focus: focus, skip: skip,
			skips: skips, reason: reason, procs: procs, timeout: timeout, report: report}
		if len(modes) > 1 {
			c.report = filepath.Join(report, mode)
		}
		t.Run(mode, func(t *testing.T) {
			defer scenario(t)()
			c.run(t)
		})
	}
}

// conformanceRun is one mode's run of the specs on a node of its own.
type conformanceRun struct {
	mode, bin, manifests, focus, skip, timeout, report string
	refs                                               []string
	skips                                              []skipEntry
	reason                                             map[string]string
	procs                                              int
}

// run boots an offline first-boot host of c.mode into a private control
// plane, runs e2e.test against it and writes the report.
func (c conformanceRun) run(t *testing.T) {
	bin, refs, focus, skip, skips, reason, procs, timeout, report := c.bin, c.refs, c.focus, c.skip, c.skips, c.reason, c.procs, c.timeout, c.report
	begin := time.Now()
	env := kubeEnvOf(t, kubeenv.StartPrivate(t, c.manifests))
	f := newFirstBoot(t, firstBootOptions{offline: true, env: env, mode: c.mode})
	f.mirror.Close()
	offline := filepath.Join(f.m.Root(), hostpaths.HostRootHost, "offline")
	if err := os.MkdirAll(offline, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("cp", "-a", "--", f.stage.Mirror(t)+"/.", offline+"/").CombinedOutput(); err != nil {
		t.Fatalf("stage the offline directory: %v\n%s", err, out)
	}
	images := filepath.Join(offline, "images")
	nodestack.WriteLayout(t, images, f.nodeRef, f.stage.NodeImage(t))
	nodestack.WriteLayout(t, images, f.pause, f.stage.PauseImage(t))
	e2eImages, missing := f.stage.E2EImages(t, refs, bin)
	var loaded []string
	for ref, img := range e2eImages {
		nodestack.WriteLayout(t, images, ref, img)
		loaded = append(loaded, ref)
	}
	sort.Strings(loaded)
	t.Logf("offline directory staged in %v; e2e images loaded: %v; not buildable offline: %d", time.Since(begin).Round(time.Millisecond), loaded, len(missing))

	begin = time.Now()
	f.m.Start()
	f.wantBootstrapped(t, c.mode, facts.KubeletHost(c.mode, bootstrap.FirstSlot))
	if t.Failed() {
		return
	}
	t.Logf("node %s (mode %s) Ready %v after the boot began", f.name, c.mode, time.Since(begin).Round(time.Millisecond))

	// e2e.test, in parallel processes (ginkgo -p): the specs wait far more
	// than they compute. [Serial] specs run alone at the end.
	if err := os.MkdirAll(report, 0o755); err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(env.Dir, "kubeconfig")
	args := []string{
		"--procs=" + strconv.Itoa(procs), "--no-color", "--focus=" + focus, "--skip=" + skip,
		"--timeout=" + timeout, "--poll-progress-after=5m",
	}
	// The order Ginkgo hands specs to the processes: a given seed repeats
	// a run's (one whose longest specs start first is shortest).
	if seed := os.Getenv(envConformanceSeed); seed != "" {
		args = append(args, "--seed="+seed)
	}
	args = append(args, filepath.Join(bin, "e2e.test"), "--",
		"--kubeconfig="+kubeconfig, "--report-dir="+report, "--e2e-output-dir="+report)
	log, err := os.Create(filepath.Join(report, "e2e.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	cmd := exec.Command(filepath.Join(bin, "ginkgo"), args...)
	cmd.Dir = report
	cmd.Stdout, cmd.Stderr = log, log
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig)
	begin = time.Now()
	runErr := cmd.Run()
	took := time.Since(begin).Round(time.Second)
	t.Logf("e2e.test (%d processes) ran in %v: %v; log %s", procs, took, runErr, log.Name())

	junit := filepath.Join(report, "junit_01.xml")
	if _, err := os.Stat(junit); err != nil {
		data, _ := os.ReadFile(log.Name())
		t.Fatalf("no JUnit report (%v); e2e log:\n%s", err, tail(string(data), 80))
	}
	results := readJUnit(t, junit)
	var passed, failed, skippedListed, skippedUnlisted []specResult
	for _, r := range results {
		switch r.status {
		case "passed":
			passed = append(passed, r)
		case "failed", "panicked", "interrupted", "timedout", "aborted":
			failed = append(failed, r)
		case "skipped", "pending":
			if _, ok := reason[r.name]; ok {
				skippedListed = append(skippedListed, r)
			} else if strings.Contains(r.name, "[NodeConformance]") && regexp.MustCompile(focus).MatchString(r.name) {
				// Focused, not listed, skipped anyway: upstream
				// skipped it itself (a provider, a feature).
				skippedUnlisted = append(skippedUnlisted, r)
			}
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# Node conformance report\n\nNode %s made by the agent's first boot (mode %s, offline), e2e.test %s, %d processes.\n\n",
		f.name, c.mode, "from tests/conformance (k8s.io/kubernetes of tests/kube)", procs)
	fmt.Fprintf(&b, "Passed: %d  Failed: %d  Skipped (listed in tests/conformance/skips.yaml): %d  Skipped by upstream, unlisted: %d  Time: %v (%s on %d CPUs)\n\n",
		len(passed), len(failed), len(skippedListed), len(skippedUnlisted), took, runtime.GOOS, runtime.NumCPU())
	if len(failed) > 0 {
		fmt.Fprintf(&b, "## Failed\n\n")
		for _, r := range failed {
			fmt.Fprintf(&b, "- %s (%.0fs)\n  %s\n", r.name, r.secs, strings.ReplaceAll(firstLine(r.message), "\n", " "))
		}
		b.WriteString("\n")
	}
	if len(skippedUnlisted) > 0 {
		fmt.Fprintf(&b, "## Skipped by upstream, not in skips.yaml\n\n")
		for _, r := range skippedUnlisted {
			fmt.Fprintf(&b, "- %s\n  %s\n", r.name, firstLine(r.message))
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "## Skipped, with reasons (tests/conformance/skips.yaml)\n\n")
	for _, s := range skips {
		fmt.Fprintf(&b, "- %s\n  %s\n", s.Spec, s.Reason)
	}
	fmt.Fprintf(&b, "\n## Passed\n\n")
	for _, r := range passed {
		fmt.Fprintf(&b, "- %s (%.0fs)\n", r.name, r.secs)
	}
	if err := os.WriteFile(filepath.Join(report, "report.md"), []byte(b.String()), 0o644); err != nil {
		t.Error(err)
	}
	t.Logf("passed %d, failed %d, skipped with a reason %d, skipped by upstream without an entry %d, in %v; report %s",
		len(passed), len(failed), len(skippedListed), len(skippedUnlisted), took, filepath.Join(report, "report.md"))
	for _, r := range failed {
		t.Errorf("FAILED: %s\n    %s", r.name, firstLine(r.message))
	}
	for _, r := range skippedUnlisted {
		t.Errorf("skipped, but not listed in %s with a reason: %s\n    (%s)", skipsFile, r.name, firstLine(r.message))
	}
	if len(passed) == 0 {
		t.Errorf("no spec passed")
	}
	if runErr != nil && len(failed) == 0 {
		data, _ := os.ReadFile(log.Name())
		t.Errorf("ginkgo: %v, with no failed spec in the report; log:\n%s", runErr, tail(string(data), 60))
	}
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	if len(s) > 300 {
		s = s[:300] + "..."
	}
	return s
}
