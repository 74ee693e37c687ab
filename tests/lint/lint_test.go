package lint

import (
	"bufio"
	"bytes"
	"debug/buildinfo"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"testing"
	"time"

	"unbounded-cloud.io/agent/tests/tiers"
)

func TestGofmt(t *testing.T) {
	goBin(t)
	// The gofmt of the toolchain that builds (GOTOOLCHAIN), not whichever
	// is first on PATH.
	root, _, err := command(repo, nil, "go", "env", "GOROOT")
	gofmt := filepath.Join(strings.TrimSpace(string(root)), "bin", "gofmt")
	if _, serr := os.Stat(gofmt); err != nil || serr != nil {
		tiers.Skip(t, tiers.Static, "no gofmt beside this toolchain: %v %v", err, serr)
	}
	files := goFiles(t, target())
	if len(files) == 0 {
		t.Fatalf("no .go files under %s", target())
	}
	out, stderr, err := command(target(), nil, gofmt, append([]string{"-l"}, files...)...)
	if err != nil || len(out) > 0 {
		t.Errorf("gofmt -l: %v; not gofmt'ed (run gofmt -w):\n%s%s", err, out, stderr)
	}
}

func TestGoVet(t *testing.T) {
	goBin(t)
	// -tags demo: the demo's files (tests/demo) build only with it, and
	// a demo that does not compile would otherwise pass this tier.
	if _, stderr, err := command(target(), nil, "go", "vet", "-tags", "demo", "./..."); err != nil {
		t.Errorf("go vet -tags demo ./... in %s: %v\n%s", target(), err, stderr)
	}
}

// staticFinding is one line of `staticcheck -f json`.
type staticFinding struct {
	Code     string `json:"code"`
	Severity string `json:"severity"`
	Location struct {
		File         string `json:"file"`
		Line, Column int
	} `json:"location"`
	Message string `json:"message"`
}

func TestStaticcheck(t *testing.T) {
	sc := tool(t, staticcheckPkg)
	version, _, _ := command(target(), nil, sc, "-version")
	t.Logf("%s on %s (%s)", strings.TrimSpace(string(version)), target(), runtime.Version())
	// Exit status 1 means findings; anything else with no JSON is the
	// tool's own failure (a package that does not build, say).
	out, stderr, err := command(target(), nil, sc, "-f", "json", "./...")
	var findings []staticFinding
	sc2 := bufio.NewScanner(bytes.NewReader(out))
	sc2.Buffer(make([]byte, 1<<20), 16<<20)
	for sc2.Scan() {
		var f staticFinding
		if e := json.Unmarshal(sc2.Bytes(), &f); e != nil {
			t.Fatalf("staticcheck printed a line that is not JSON (%v): %s", e, sc2.Bytes())
		}
		findings = append(findings, f)
	}
	if len(findings) == 0 && err != nil {
		t.Fatalf("staticcheck ./... in %s: %v\n%s", target(), err, stderr)
	}
	for _, f := range findings {
		file := f.Location.File
		if r, e := filepath.Rel(target(), file); e == nil {
			file = r
		}
		t.Errorf("staticcheck: %s:%d:%d: %s (%s, %s)", file, f.Location.Line, f.Location.Column, f.Message, f.Code, f.Severity)
	}
}

// govulncheck's -format json stream (golang.org/x/vuln/internal/govulncheck):
// a sequence of JSON objects, each with one of these fields set.
type vulnMessage struct {
	Config *struct {
		ScannerVersion string `json:"scanner_version"`
		DB             string `json:"db"`
		GoVersion      string `json:"go_version"`
		ScanLevel      string `json:"scan_level"`
		ScanMode       string `json:"scan_mode"`
	} `json:"config"`
	OSV *struct {
		ID      string `json:"id"`
		Summary string `json:"summary"`
	} `json:"osv"`
	Finding *struct {
		OSV          string      `json:"osv"`
		FixedVersion string      `json:"fixed_version"`
		Trace        []vulnFrame `json:"trace"`
	} `json:"finding"`
}

type vulnFrame struct {
	Module   string `json:"module"`
	Version  string `json:"version"`
	Package  string `json:"package"`
	Function string `json:"function"`
	Receiver string `json:"receiver"`
	Position *struct {
		Filename string `json:"filename"`
		Line     int    `json:"line"`
	} `json:"position"`
}

func (f vulnFrame) String() string {
	s := f.Package
	if s == "" {
		s = f.Module
	}
	if f.Receiver != "" {
		s += "." + strings.TrimPrefix(f.Receiver, "*")
	}
	if f.Function != "" {
		s += "." + f.Function
	}
	if f.Position != nil && f.Position.Filename != "" {
		s += fmt.Sprintf(" (%s:%d)", f.Position.Filename, f.Position.Line)
	}
	return s
}

// vuln is what govulncheck found about one OSV entry.
type vuln struct {
	id, summary      string
	module, version  string
	fixed            string
	called, imported bool
	trace            string // one call path, from this module's code to the vulnerable function
}

// govulncheck runs govulncheck against the offline database with args and
// returns its findings by OSV id, and the scan's configuration line.
func govulncheck(t *testing.T, dir string, args ...string) (map[string]*vuln, string) {
	t.Helper()
	gv := tool(t, govulncheckPkg)
	db, version, date := vulnDB(t)
	// CGO_ENABLED=0: the configuration the Makefile builds (files behind
	// cgo build tags are not part of the shipped binaries).
	out, stderr, err := command(dir, []string{"CGO_ENABLED=0"}, gv,
		append([]string{"-db", "file://" + db, "-format", "json"}, args...)...)
	if err != nil {
		t.Fatalf("govulncheck %s in %s: %v\n%s", strings.Join(args, " "), dir, err, stderr)
	}
	found := map[string]*vuln{}
	summaries := map[string]string{}
	config := ""
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var m vulnMessage
		if err := dec.Decode(&m); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("govulncheck -format json: %v\n%s", err, out)
		}
		switch {
		case m.Config != nil:
			// A binary scan reads the Go version from the binary.
			with := ""
			if m.Config.GoVersion != "" {
				with = " with " + m.Config.GoVersion
			}
			config = fmt.Sprintf("govulncheck %s, %s scan (%s level)%s, database %s@%s (%s)",
				m.Config.ScannerVersion, m.Config.ScanMode, m.Config.ScanLevel, with,
				vulndbModule, version, date.Format(time.DateOnly))
		case m.OSV != nil:
			summaries[m.OSV.ID] = m.OSV.Summary
		case m.Finding != nil && len(m.Finding.Trace) > 0:
			f := m.Finding
			v := found[f.OSV]
			if v == nil {
				v = &vuln{id: f.OSV, module: f.Trace[0].Module, version: f.Trace[0].Version, fixed: f.FixedVersion}
				found[f.OSV] = v
			}
			// Trace[0] is the vulnerable symbol (or package, or
			// module: the finding's level); the rest lead to it from
			// this module's code.
			if f.Trace[0].Function != "" && !v.called {
				v.called = true
				var path []string
				for i := len(f.Trace) - 1; i >= 0; i-- {
					path = append(path, f.Trace[i].String())
				}
				v.trace = strings.Join(path, " -> ")
			}
			if f.Trace[0].Package != "" {
				v.imported = true
			}
		}
	}
	for id, v := range found {
		v.summary = summaries[id]
	}
	return found, config
}

// judge fails t for every called vulnerability and logs the others.
func judge(t *testing.T, found map[string]*vuln) {
	t.Helper()
	ids := make([]string, 0, len(found))
	for id := range found {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	called := 0
	for _, id := range ids {
		v := found[id]
		fixed := v.fixed
		if fixed == "" {
			fixed = "no fixed version"
		}
		if v.called {
			called++
			t.Errorf("CALLED vulnerability %s in %s@%s (fixed in %s): %s\n    %s", id, v.module, v.version, fixed, v.summary, v.trace)
			continue
		}
		level := "required module"
		if v.imported {
			level = "imported package"
		}
		t.Logf("not called (%s): %s in %s@%s (fixed in %s): %s", level, id, v.module, v.version, fixed, v.summary)
	}
	t.Logf("%d called, %d not called", called, len(found)-called)
}

func TestGovulncheck(t *testing.T) {
	found, config := govulncheck(t, target(), "-mode", "source", "./...")
	t.Log(config)
	judge(t, found)
}

// The Makefile strips the shipped binaries (-s -w), and govulncheck's
// binary mode cannot see the symbols of a stripped binary. So the same
// main packages are built here the Makefile's way but unstripped, and each
// binary is checked at the symbol level: what the linker kept under the
// Makefile's build configuration (CGO_ENABLED=0, -trimpath), where the
// source scan above follows the call graph.
func TestGovulncheckBuiltBinaries(t *testing.T) {
	if os.Getenv(envDir) != "" {
		t.Skip("binaries are only built from this repository")
	}
	goBin(t)
	out, stderr, err := command(repo, nil, "go", "list", "-f", `{{if eq .Name "main"}}{{.ImportPath}}{{end}}`, "./cmd/...", "./generators/...")
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr)
	}
	mains := strings.Fields(string(out))
	if len(mains) == 0 {
		t.Fatal("no main package under cmd/ or generators/")
	}
	dir := t.TempDir()
	for _, pkg := range mains {
		t.Run(filepath.Base(pkg), func(t *testing.T) {
			bin := filepath.Join(dir, filepath.Base(pkg))
			if _, stderr, err := command(repo, []string{"CGO_ENABLED=0"}, "go", "build", "-trimpath", "-o", bin, pkg); err != nil {
				t.Fatalf("go build %s: %v\n%s", pkg, err, stderr)
			}
			found, config := govulncheck(t, repo, "-mode", "binary", bin)
			t.Log(config)
			judge(t, found)
		})
	}
}

// The shipped binaries (bin/, from `make build`, which `make test` runs
// first) carry the toolchain that built them: it must be the patched one
// this tier checked, not the machine's own go.
func TestBuiltBinariesUseThisToolchain(t *testing.T) {
	if os.Getenv(envDir) != "" {
		t.Skip("bin/ belongs to this repository")
	}
	bins, _ := filepath.Glob(filepath.Join(repo, "bin", "unbounded*"))
	if len(bins) == 0 {
		tiers.Skip(t, tiers.Static, "no bin/unbounded* here: run make build first (make test does)")
	}
	// The Makefile's GOEXPERIMENT is part of the version a
	// binary reports ("go1.27.3-X:nojsonv2"): the same toolchain, with
	// the experiments the Makefile chose.
	mk, err := os.ReadFile(filepath.Join(repo, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	want := toolchain()
	if m := goExperimentLine.FindSubmatch(mk); m != nil {
		want += "-X:" + string(m[1])
	}
	for _, b := range bins {
		bi, err := buildinfo.ReadFile(b)
		if err != nil {
			t.Errorf("%s: %v", b, err)
			continue
		}
		if bi.GoVersion != want {
			t.Errorf("%s was built with %s, want %s (the toolchain of the Makefile's GOTOOLCHAIN, with its GOEXPERIMENT): run make build", b, bi.GoVersion, want)
		}
	}
}

// toolchain is the Go release that built this test, without the
// experiments it was built with (runtime.Version's "-X:nojsonv2").
func toolchain() string {
	v, _, _ := strings.Cut(runtime.Version(), "-X:")
	return v
}

// goExperimentLine is the GOEXPERIMENT of every build (the Makefile's,
// each entry point's).
var goExperimentLine = regexp.MustCompile(`(?m)^export GOEXPERIMENT *:?= *(\S+)$`)

// toolchainLine is how each entry point selects the toolchain.
var toolchainLine = regexp.MustCompile(`(?m)^export GOTOOLCHAIN *:?= *(\S+)$`)

// cgoLine is each entry point's CGO_ENABLED.
var cgoLine = regexp.MustCompile(`(?m)^export CGO_ENABLED *:?= *(\S+)$`)

// Every entry point that builds or tests selects the same patched
// toolchain, and it is the one running this test: a machine's own go
// (GOTOOLCHAIN=local in its go.env) ignores go.mod's toolchain line. They
// also build in the one configuration (CGO_ENABLED, GOEXPERIMENT: the
// Makefile says why): a script that built in another compiled every
// package it links a second time, as a cold run did for client-go.
func TestEveryEntryPointSelectsTheSameToolchain(t *testing.T) {
	if os.Getenv(envDir) != "" {
		t.Skip("the entry points belong to this repository")
	}
	settings := []struct {
		name string
		line *regexp.Regexp
		seen map[string][]string
	}{
		{"GOTOOLCHAIN", toolchainLine, map[string][]string{}},
		{"CGO_ENABLED", cgoLine, map[string][]string{}},
		{"GOEXPERIMENT", goExperimentLine, map[string][]string{}},
	}
	for _, f := range []string{"Makefile", ".ci/run", "tests/run-tiers.sh", "tests/bench.sh", "tests/demo/demo.sh", "tests/kube/with-env.sh", "tests/kube/kubelet.sh", "tests/conformance/build.sh", "tests/conformance/run.sh", "tests/system/nodestack/stage.sh", "deb/build-packages.sh"} {
		b, err := os.ReadFile(filepath.Join(repo, f))
		if err != nil {
			t.Errorf("%s: %v", f, err)
			continue
		}
		for _, s := range settings {
			m := s.line.FindAllSubmatch(b, -1)
			if len(m) != 1 {
				t.Errorf("%s: %d lines 'export %s=...', want 1", f, len(m), s.name)
				continue
			}
			s.seen[string(m[0][1])] = append(s.seen[string(m[0][1])], f)
		}
	}
	// go.mod's toolchain line says the same, for a go whose GOTOOLCHAIN
	// is auto (the default of a go from go.dev).
	toolchains := settings[0].seen
	if b, err := os.ReadFile(filepath.Join(repo, "go.mod")); err != nil {
		t.Error(err)
	} else if m := regexp.MustCompile(`(?m)^toolchain (\S+)$`).FindSubmatch(b); m == nil {
		t.Error("go.mod: no toolchain line")
	} else {
		toolchains[string(m[1])] = append(toolchains[string(m[1])], "go.mod")
	}
	for _, s := range settings {
		if len(s.seen) > 1 {
			t.Errorf("the entry points disagree on %s: %v", s.name, s.seen)
		}
	}
	for v, files := range toolchains {
		if v != toolchain() {
			t.Errorf("%v select %s, but this test runs on %s (run it through make test, or export GOTOOLCHAIN=%s)", files, v, toolchain(), v)
		}
	}
	for v, files := range settings[1].seen {
		if v != "0" {
			t.Errorf("%v build with CGO_ENABLED=%s, want 0 (static binaries)", files, v)
		}
	}
}

// The tier fails when a finding appears: this package's own test binary,
// run on the planted findings of testdata/, must fail the check that
// catches each, and say what it found.
func TestTheTierFailsOnAFinding(t *testing.T) {
	if os.Getenv(envDir) != "" {
		t.Skip("already running on testdata")
	}
	for _, tc := range []struct {
		test, dir string
		fail      bool
		want      []string
	}{
		{"TestGoVet", "findings", true, []string{"findings.go:21:22: fmt.Sprintf format %d has arg n of wrong type string"}},
		{"TestStaticcheck", "findings", true, []string{
			"findings.go:13:9: should use time.Until instead of t.Sub(time.Now()) (S1024",
			"findings.go:17:6: func unused is unused (U1000",
		}},
		{"TestGovulncheck", "vulncalled", true, []string{
			"CALLED vulnerability GO-2022-1059 in golang.org/x/text@v0.3.7 (fixed in v0.3.8)",
			"example.com/vulncalled.main (main.go:14) -> golang.org/x/text/language.ParseAcceptLanguage",
			"not called (required module): GO-2026-5970 in golang.org/x/text@v0.3.7",
			"1 called, ",
		}},
		{"TestGovulncheck", "vulnuncalled", false, []string{
			"not called (required module): GO-2022-1059 in golang.org/x/text@v0.3.7 (fixed in v0.3.8)",
			"not called (required module): GO-2026-5970 in golang.org/x/text@v0.3.7",
			"0 called, 3 not called",
		}},
	} {
		t.Run(tc.test+"/"+tc.dir, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run", "^"+tc.test+"$", "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(), envDir+"="+filepath.Join(repo, "tests", "lint", "testdata", tc.dir))
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			if err != nil && !errors.As(err, &ee) {
				t.Fatalf("run %s: %v", os.Args[0], err)
			}
			if strings.Contains(string(out), "--- SKIP: "+tc.test) {
				// The child could not run the check (tools not built):
				// say so the way the parent tier would.
				tiers.Skip(t, tiers.Static, "%s skipped on testdata/%s:\n%s", tc.test, tc.dir, out)
			}
			verdict := "--- PASS: " + tc.test
			if tc.fail {
				verdict = "--- FAIL: " + tc.test
			}
			if (err != nil) != tc.fail || !strings.Contains(string(out), verdict) {
				t.Errorf("%s on testdata/%s: exit %v, want %q:\n%s", tc.test, tc.dir, err, verdict, out)
			}
			for _, w := range tc.want {
				if !strings.Contains(string(out), w) {
					t.Errorf("%s on testdata/%s: output lacks %q:\n%s", tc.test, tc.dir, w, out)
				}
			}
		})
	}
}
