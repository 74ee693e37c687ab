package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"unbounded-cloud.io/agent/tests/tiers"
)

// stream builds a synthetic `go test -json` stream, event by event.
type stream struct{ lines []string }

func (s *stream) ev(action, pkg, test, output string) *stream {
	b, _ := json.Marshal(event{Action: action, Package: pkg, Test: test, Output: output})
	s.lines = append(s.lines, string(b))
	return s
}

// test adds a test that logs out (if any) and ends with action.
func (s *stream) test(pkg, name, action, out string) *stream {
	s.ev("run", pkg, name, "")
	s.ev("output", pkg, name, "=== RUN   "+name+"\n")
	if out != "" {
		s.ev("output", pkg, name, "    x_test.go:12: "+out+"\n")
	}
	s.ev("output", pkg, name, "--- "+strings.ToUpper(action)+": "+name+" (0.00s)\n")
	return s.ev(action, pkg, name, "")
}

func (s *stream) file(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "tier.json")
	if err := os.WriteFile(p, []byte(strings.Join(s.lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func summarize(t *testing.T, required map[string]bool, args ...string) (string, int) {
	t.Helper()
	var out, errOut bytes.Buffer
	rc := run(args, required, &out, &errOut)
	return out.String() + errOut.String(), rc
}

func mustContain(t *testing.T, out string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("summary lacks %q:\n%s", w, out)
		}
	}
}

// The system scenarios all skipped (no rootfs): fine on a laptop, a failed
// run where the system tier is required.
func TestARequiredTierThatSkippedFailsTheRun(t *testing.T) {
	sys := (&stream{}).
		test("x/tests/system", "TestDaemonStarts", "skip", "UNBOUNDED_TEST_ROOTFS is not set").
		test("x/tests/system", "TestFenceRefuses", "skip", "UNBOUNDED_TEST_ROOTFS is not set").
		ev("pass", "x/tests/system", "", "").file(t)
	unit := (&stream{}).test("x/lib/config", "TestLoad", "pass", "").ev("pass", "x/lib/config", "", "").file(t)

	out, rc := summarize(t, nil, "unit="+unit, "system="+sys)
	if rc != 0 {
		t.Errorf("not required: exit %d, want 0\n%s", rc, out)
	}
	mustContain(t, out, "system       SKIPPED ", "skip x2: UNBOUNDED_TEST_ROOTFS is not set")

	out, rc = summarize(t, map[string]bool{tiers.System: true}, "unit="+unit, "system="+sys)
	if rc != 1 {
		t.Errorf("system required: exit %d, want 1\n%s", rc, out)
	}
	mustContain(t, out, "SKIPPED (REQUIRED)", "required tiers that did not run (UNBOUNDED_TEST_REQUIRED): system (skipped)")
}

func TestARequiredTierThatRanNoTestFailsTheRun(t *testing.T) {
	empty := (&stream{}).file(t)
	unit := (&stream{}).test("x/lib/config", "TestLoad", "pass", "").file(t)
	req := map[string]bool{tiers.Packages: true, tiers.Fuzz: true, tiers.Unit: true}
	// packages: an empty stream (go test never ran); fuzz: no stream at all.
	out, rc := summarize(t, req, "unit="+unit, "packages="+empty)
	if rc != 1 {
		t.Errorf("exit %d, want 1\n%s", rc, out)
	}
	mustContain(t, out, "packages     NO TESTS (REQUIRED)", "fuzz         NO TESTS (REQUIRED)",
		"did not run (UNBOUNDED_TEST_REQUIRED): packages (no tests), fuzz (no tests)")
	if strings.Contains(out, "unit         NO TESTS") {
		t.Errorf("the unit tier ran:\n%s", out)
	}
}

// Kubernetes tests live in many packages; they count in the kubernetes tier
// by their "kubeenv:" line, and "kube" in UNBOUNDED_TEST_REQUIRED is that
// tier.
func TestARequiredKubeTierCountsTheTestsThatUsedTheAPIServer(t *testing.T) {
	ran := (&stream{}).
		test("x/lib/fence", "TestFenceRefuses", "pass", "kubeenv: API server https://127.0.0.1:1").
		test("x/lib/config", "TestLoad", "pass", "").file(t)
	skipped := (&stream{}).
		test("x/lib/fence", "TestFenceRefuses", "skip", "kubeenv: no test API server: boom").
		test("x/lib/config", "TestLoad", "pass", "").file(t)
	req := map[string]bool{tiers.Kube: true}
	if out, rc := summarize(t, req, "unit="+ran); rc != 0 {
		t.Errorf("kube ran: exit %d, want 0\n%s", rc, out)
	} else {
		mustContain(t, out, "kubernetes   ran                  1 passed", "unit         ran                  1 passed")
	}
	out, rc := summarize(t, req, "unit="+skipped)
	if rc != 1 {
		t.Errorf("kube skipped: exit %d, want 1\n%s", rc, out)
	}
	mustContain(t, out, "kubernetes   SKIPPED (REQUIRED)", "skip x1: kubeenv: no test API server: boom")
}

func TestSubtestsThatAllSkippedAreSkipsWithTheirReasonsNotAPass(t *testing.T) {
	const pkg = "x/tests/packages"
	s := (&stream{}).ev("run", pkg, "TestInstall", "").
		test(pkg, "TestInstall/deb", "skip", "dpkg is not installed").
		test(pkg, "TestInstall/rpm", "skip", "rpm is not installed")
	s.ev("output", pkg, "TestInstall", "--- PASS: TestInstall (0.00s)\n").ev("pass", pkg, "TestInstall", "")
	out, rc := summarize(t, nil, "packages="+s.file(t))
	if rc != 0 {
		t.Errorf("exit %d, want 0 (nothing failed)\n%s", rc, out)
	}
	mustContain(t, out, "packages     SKIPPED              0 passed, 0 failed, 2 skipped",
		"skip x1: dpkg is not installed", "skip x1: rpm is not installed")
}

func TestSubtestsCountOneByOne(t *testing.T) {
	const pkg = "x/lib/config"
	s := (&stream{}).ev("run", pkg, "TestErrors", "").
		test(pkg, "TestErrors/unknown_key", "pass", "").
		test(pkg, "TestErrors/bad_mode", "fail", "got exit 0, want 78").
		test(pkg, "TestErrors/token_owner", "skip", "needs root").
		ev("fail", pkg, "TestErrors", "")
	// A parent that fails on its own, after subtests that passed.
	s.ev("run", pkg, "TestLoad", "").test(pkg, "TestLoad/a", "pass", "").
		ev("output", pkg, "TestLoad", "    x_test.go:40: cleanup left files\n").ev("fail", pkg, "TestLoad", "").
		ev("fail", pkg, "", "")
	out, rc := summarize(t, nil, "unit="+s.file(t))
	if rc != 1 {
		t.Errorf("exit %d, want 1\n%s", rc, out)
	}
	mustContain(t, out, "unit         FAILED               2 passed, 2 failed, 1 skipped",
		"FAIL x/lib/config TestErrors/bad_mode", "FAIL x/lib/config TestLoad\n", "skip x1: needs root",
		"got exit 0, want 78", "cleanup left files")
	if strings.Contains(out, "(package failed)") {
		t.Errorf("a package whose tests failed is also counted as a package failure:\n%s", out)
	}
}

func TestSubtestsOfAKubeParentCountInTheKubernetesTier(t *testing.T) {
	const pkg = "x/lib/report"
	s := (&stream{}).ev("run", pkg, "TestReport", "").
		ev("output", pkg, "TestReport", "    report_test.go:20: kubeenv: API server https://127.0.0.1:1\n").
		test(pkg, "TestReport/refused", "pass", "").
		test(pkg, "TestReport/allowed", "pass", "").
		ev("pass", pkg, "TestReport", "")
	out, rc := summarize(t, nil, "unit="+s.file(t))
	if rc != 0 {
		t.Errorf("exit %d\n%s", rc, out)
	}
	mustContain(t, out, "kubernetes   ran                  2 passed", "unit         NO TESTS")
}

func TestAPackageThatFailedWithoutAFailingTestIsAFailure(t *testing.T) {
	const pkg = "x/lib/state"
	s := (&stream{}).ev("output", pkg, "", "# x/lib/state\nstate.go:3:1: syntax error\n").ev("fail", pkg, "", "")
	out, rc := summarize(t, nil, "unit="+s.file(t))
	if rc != 1 {
		t.Errorf("exit %d, want 1\n%s", rc, out)
	}
	mustContain(t, out, "FAIL x/lib/state (package failed)", "syntax error")
}

// The whole path, for real: plain `go test -json` of a package whose tier
// cannot run here, with and without the tier required, summarized.
func TestPlainGoTestOfARequiredTierThatCannotRunFailsAndTheSummarySaysWhy(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH to run the fixture package")
	}
	goTest := func(required string) string {
		cmd := exec.Command(goBin, "test", "-count=1", "-json", "./testdata/skipper")
		cmd.Env = append(os.Environ(), tiers.EnvRequired+"="+required, tiers.EnvKubeRequired+"=")
		var errOut bytes.Buffer
		cmd.Stderr = &errOut
		out, _ := cmd.Output() // its exit status is what the summary must reproduce
		p := filepath.Join(t.TempDir(), "system.json")
		if err := os.WriteFile(p, out, 0o644); err != nil {
			t.Fatal(err)
		}
		if len(out) == 0 {
			t.Fatalf("go test printed nothing: %s", errOut.String())
		}
		return p
	}

	skipped := goTest("")
	if out, rc := summarize(t, nil, "system="+skipped); rc != 0 {
		t.Errorf("not required anywhere: exit %d, want 0\n%s", rc, out)
	} else {
		mustContain(t, out, "system       SKIPPED              0 passed, 0 failed, 2 skipped", "skip x2: no rootfs: tiersum's fixture")
	}
	// A stream from a run that did not require the tier, summarized where
	// it is: the summary alone catches it.
	out, rc := summarize(t, map[string]bool{tiers.System: true}, "system="+skipped)
	if rc != 1 {
		t.Errorf("required by the summary: exit %d, want 1\n%s", rc, out)
	}
	mustContain(t, out, "system       SKIPPED (REQUIRED)")

	// go test itself under UNBOUNDED_TEST_REQUIRED=system: the helper fails
	// the tests instead of skipping them.
	failed := goTest("system")
	out, rc = summarize(t, map[string]bool{tiers.System: true}, "system="+failed)
	if rc != 1 {
		t.Errorf("required by go test: exit %d, want 1\n%s", rc, out)
	}
	mustContain(t, out, "system       FAILED               0 passed, 2 failed, 0 skipped",
		"FAIL unbounded-cloud.io/agent/tests/tiersum/testdata/skipper TestScenario/boot",
		`the system tier is required (UNBOUNDED_TEST_REQUIRED="system") but cannot run here: no rootfs: tiersum's fixture`)
}

// A scenario that failed early and then dumped a journal in its cleanups:
// the summary shows the failure's own lines, not only the dump's end.
func TestAFailedTestsOwnMessagesArePrintedAboveItsLogDumps(t *testing.T) {
	const pkg, name = "x/tests/system", "TestRestart"
	s := &stream{}
	s.ev("run", pkg, name, "")
	mark := func(out, typ string) {
		b, _ := json.Marshal(event{Action: "output", Package: pkg, Test: name, Output: out, OutputType: typ})
		s.lines = append(s.lines, string(b))
	}
	mark("=== RUN   "+name+"\n", "frame")
	mark("    restart_test.go:40: starting the restart\n", "")
	mark("    restart_test.go:122: no Ready heartbeat after the restart\n", "error")
	mark("        last condition: KubeletReady\n", "error-continue")
	for i := 0; i < 500; i++ {
		mark(fmt.Sprintf("    machine.go:99: journal line %d\n", i), "")
	}
	mark("--- FAIL: "+name+" (1.00s)\n", "frame")
	s.ev("fail", pkg, name, "")
	out, rc := summarize(t, nil, "system="+s.file(t))
	if rc != 1 {
		t.Errorf("exit %d, want 1\n%s", rc, out)
	}
	mustContain(t, out, "restart_test.go:122: no Ready heartbeat after the restart", "last condition: KubeletReady",
		"journal line 499", "lines cut")
	if strings.Contains(out, "journal line 100\n") {
		t.Errorf("the dump was not cut:\n%s", out)
	}
	if strings.Index(out, "no Ready heartbeat") > strings.Index(out, "journal line 499") {
		t.Errorf("the failure message is not above the dump:\n%s", out)
	}
}

// A stream from a toolchain that does not mark errors: the last message
// of the test's own before its end frame, with its continuation lines.
func TestAFailureWithoutErrorMarksShowsTheLastTestMessage(t *testing.T) {
	const pkg, name = "x/lib/state", "TestWrite"
	s := &stream{}
	s.ev("run", pkg, name, "").ev("output", pkg, name, "=== RUN   "+name+"\n")
	s.ev("output", pkg, name, "    state_test.go:30: wrote the record\n")
	s.ev("output", pkg, name, "    state_test.go:31: read back: wrong sum\n")
	s.ev("output", pkg, name, "        want abc\n")
	for i := 0; i < 100; i++ {
		s.ev("output", pkg, name, fmt.Sprintf("dump %d\n", i))
	}
	s.ev("output", pkg, name, "--- FAIL: "+name+" (0.00s)\n").ev("fail", pkg, name, "")
	out, _ := summarize(t, nil, "unit="+s.file(t))
	mustContain(t, out, "state_test.go:31: read back: wrong sum", "want abc")
	if strings.Contains(out, "state_test.go:30") {
		t.Errorf("an earlier log line was shown as the failure:\n%s", out)
	}
}

// A tier's summary names its slowest top-level tests, slowest first (a
// parent with subtests by its own time, never a subtest or a skip), so
// that a CI log says where the time went.
func TestSummaryNamesTheSlowestTestsOfATier(t *testing.T) {
	var s stream
	end := func(name, action string, secs float64) {
		s.ev("run", "p", name, "")
		b, _ := json.Marshal(event{Action: action, Package: "p", Test: name, Elapsed: secs})
		s.lines = append(s.lines, string(b))
	}
	for i := range 7 {
		end(fmt.Sprintf("TestT%d", i), "pass", float64(10*i))
	}
	end("TestParent/sub", "pass", 500)
	end("TestParent", "pass", 600)
	end("TestSkipped", "skip", 900)
	out, rc := summarize(t, nil, "lint="+s.file(t))
	if rc != 0 {
		t.Fatalf("rc %d:\n%s", rc, out)
	}
	want := "     600.0s TestParent\n      60.0s TestT6\n      50.0s TestT5\n      40.0s TestT4\n      30.0s TestT3\n"
	if !strings.Contains(out, want) {
		t.Errorf("summary does not name the 5 slowest, slowest first; want\n%s\ngot:\n%s", want, out)
	}
	for _, no := range []string{"TestParent/sub", "TestSkipped", "TestT2"} {
		if strings.Contains(out, no) {
			t.Errorf("summary names %s:\n%s", no, out)
		}
	}
}

// The system tier names every scenario, slowest first, with what its
// "timing:" lines add up to (boots, first boots, waits on the cluster, the
// CPU its hosts used, summed over its subtests), its time counted from its
// place on (not its wait for one, "timing: queued"); its scenarios stay
// under "system" though they use the API server; the tier's line says how
// many scenarios ran and how long its step took.
func TestSystemTierNamesEveryScenarioWithItsBootsAndWaits(t *testing.T) {
	const pkg = "x/tests/system"
	var s stream
	at := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	ev := func(action, test, output string, secs float64) {
		b, _ := json.Marshal(event{Action: action, Package: pkg, Test: test, Output: output, Elapsed: secs, Time: at})
		s.lines = append(s.lines, string(b))
		at = at.Add(10 * time.Second)
	}
	ev("run", "TestRepave", "", 0)
	ev("output", "TestRepave", "    schedule_test.go:1: timing: queued 150.00s\n", 0)
	ev("output", "TestRepave", "    daemon_test.go:1: kubeenv: API server https://127.0.0.1:1\n", 0)
	ev("output", "TestRepave", "    machine.go:1: timing: first-boot 30.5s (machine ubt-1)\n", 0)
	ev("run", "TestRepave/crash", "", 0)
	ev("output", "TestRepave/crash", "    machine.go:1: timing: boot 2.0s (machine ubt-1)\n", 0)
	ev("output", "TestRepave/crash", "    machine.go:1: timing: boot 3.0s (machine ubt-1)\n", 0)
	ev("output", "TestRepave/crash", "    firstboot_test.go:1: timing: wait 12.25s (Node Ready)\n", 0)
	ev("pass", "TestRepave/crash", "", 100)
	ev("output", "TestRepave", "    machine.go:1: timing: cpu 40.75s (machine ubt-1)\n", 0)
	ev("pass", "TestRepave", "", 200)
	for i := range 7 {
		ev("run", fmt.Sprintf("TestS%d", i), "", 0)
		ev("pass", fmt.Sprintf("TestS%d", i), "", float64(i))
	}
	ev("pass", "", "", 0)
	out, rc := summarize(t, nil, "system="+s.file(t))
	if rc != 0 {
		t.Fatalf("rc %d:\n%s", rc, out)
	}
	mustContain(t, out,
		"system       ran                  8 passed, 0 failed, 0 skipped (8 scenarios; step 4m10s)",
		"      50.0s TestRepave (first-boot 1 x 30s, boot 2 x 5s, wait 1 x 12s, cpu 1 x 41s)\n",
		"       0.0s TestS0\n")
	if strings.Contains(out, "kubernetes") {
		t.Errorf("a system scenario that used the API server is counted in the kubernetes tier:\n%s", out)
	}
}
