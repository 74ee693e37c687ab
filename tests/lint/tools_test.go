package lint

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"unbounded-cloud.io/agent/tests/tiers"
)

// envDir names the module the checks run on instead of this repository
// (TestTheTierFailsOnAFinding sets it to a module of testdata/).
const envDir = "UNBOUNDED_LINT_DIR"

// The tools' packages, from tools/lint/go.mod.
const (
	staticcheckPkg = "honnef.co/go/tools/cmd/staticcheck"
	govulncheckPkg = "golang.org/x/vuln/cmd/govulncheck"
	indexdbPkg     = "golang.org/x/vulndb/cmd/indexdb"
	vulndbModule   = "golang.org/x/vulndb"
)

var (
	repo     = mustAbs("../..")
	toolsMod = filepath.Join(repo, "tools", "lint")
	// binDir holds the tools built by this test process; removed by
	// TestMain.
	binDir string
	built  = map[string]*buildResult{}
	mu     sync.Mutex
)

type buildResult struct {
	once sync.Once
	path string
	err  error
}

func mustAbs(p string) string {
	a, err := filepath.Abs(p)
	if err != nil {
		panic(err)
	}
	return a
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// target is the module the checks run on.
func target() string {
	if d := os.Getenv(envDir); d != "" {
		return d
	}
	return repo
}

// goBin is the go command, or the tier skips (fails where required).
func goBin(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("go")
	if err != nil {
		tiers.Skip(t, tiers.Static, "go is not on PATH: %v", err)
	}
	return p
}

// command runs name with args in dir and returns its stdout; stderr is
// returned apart so that JSON on stdout stays parseable.
func command(dir string, env []string, name string, args ...string) (stdout, stderr []byte, err error) {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	// GOWORK=off: a go.work above the checkout must not change what is
	// checked.
	cmd.Env = append(append(os.Environ(), "GOWORK=off"), env...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err = cmd.Run()
	return o.Bytes(), e.Bytes(), err
}

// tool returns the path of the tool built from pkg at the version pinned
// in tools/lint/go.mod. The build is done once per test process (the go
// build cache makes later runs a relink at most). When it cannot be built
// (no module proxy and a cold module cache) the tier skips, or fails where
// it is required.
func tool(t *testing.T, pkg string) string {
	t.Helper()
	goBin(t)
	mu.Lock()
	if binDir == "" {
		d, err := os.MkdirTemp("", "unbounded-lint-tools.")
		if err != nil {
			mu.Unlock()
			t.Fatal(err)
		}
		binDir = d
	}
	r := built[pkg]
	if r == nil {
		r = &buildResult{}
		built[pkg] = r
	}
	dir := binDir
	mu.Unlock()
	r.once.Do(func() {
		r.path = filepath.Join(dir, filepath.Base(pkg))
		_, stderr, err := command(toolsMod, nil, "go", "build", "-o", r.path, pkg)
		if err != nil {
			r.err = fmt.Errorf("go build %s in tools/lint: %v\n%s", pkg, err, stderr)
		}
	})
	if r.err != nil {
		tiers.Skip(t, tiers.Static, "cannot build the pinned tool (module proxy unreachable and the module cache cold?): %v", r.err)
	}
	return r.path
}

// pseudoTime is the commit time in a pseudo-version
// (v0.0.0-20261105234957-e22db6528018): the date of the vulndb snapshot.
var pseudoTime = regexp.MustCompile(`-(\d{14})-[0-9a-f]{12}$`)

// vulnDB returns the offline database of the pinned golang.org/x/vulndb
// (a directory for -db file:///DIR) and its version and date, building it
// with cmd/indexdb on first use.
func vulnDB(t *testing.T) (dir, version string, date time.Time) {
	t.Helper()
	goBin(t)
	// go mod download of a path without a version: the version
	// tools/lint/go.mod selects, downloaded if the cache lacks it.
	out, stderr, err := command(toolsMod, nil, "go", "mod", "download", "-json", vulndbModule)
	var mod struct{ Version, Dir, Error string }
	if err == nil {
		err = json.Unmarshal(out, &mod)
	}
	if err != nil || mod.Error != "" || mod.Dir == "" {
		tiers.Skip(t, tiers.Static, "cannot download %s (pinned in tools/lint/go.mod): %v %s %s", vulndbModule, err, mod.Error, stderr)
	}
	version = mod.Version
	if m := pseudoTime.FindStringSubmatch(version); m != nil {
		date, _ = time.Parse("20060102150405", m[1])
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		t.Fatalf("no cache directory for the vulnerability database: %v", err)
	}
	dir = filepath.Join(cache, "unbounded-agent", "vulndb", version)
	if _, err := os.Stat(filepath.Join(dir, "index", "db.json")); err == nil {
		return dir, version, date
	}
	// Built aside and renamed into place: a run that stops half way
	// leaves no half database under the version's name.
	indexdb := tool(t, indexdbPkg)
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		t.Fatal(err)
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), version+".building.")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(tmp)
	start := time.Now()
	if _, stderr, err := command(toolsMod, nil, indexdb, "-vulns", filepath.Join(mod.Dir, "data", "osv"), "-out", tmp); err != nil {
		t.Fatalf("indexdb of %s@%s: %v\n%s", vulndbModule, version, err, stderr)
	}
	if err := os.Rename(tmp, dir); err != nil {
		// Another run built it at the same time: use that one.
		if _, serr := os.Stat(filepath.Join(dir, "index", "db.json")); serr != nil {
			t.Fatalf("install the vulnerability database: %v", err)
		}
	}
	t.Logf("built the vulnerability database of %s@%s in %s: %s", vulndbModule, version, time.Since(start).Round(time.Millisecond), dir)
	return dir, version, date
}

// goFiles lists the .go files of the module at dir, not those of nested
// modules (tests/kube, tools/...) or of testdata.
func goFiles(t *testing.T, dir string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p != dir {
				name := d.Name()
				if name == "testdata" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") {
					return filepath.SkipDir
				}
				if _, err := os.Stat(filepath.Join(p, "go.mod")); err == nil {
					return filepath.SkipDir
				}
			}
			return nil
		}
		if strings.HasSuffix(p, ".go") {
			files = append(files, p)
		}
		return nil
	})
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	return files
}
