package cli

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"io/fs"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"unbounded-cloud.io/agent/tests/fixtures"

	"github.com/BurntSushi/toml"

	"unbounded-cloud.io/agent/lib/exitcode"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/modes"
	"unbounded-cloud.io/agent/lib/state"
	"unbounded-cloud.io/agent/tests/tiers"
)

// token is the fixture's bootstrap token; no output may ever contain it.
const token = "q1w2e3.r4t5y6u7i8o9p0a1"

const agentTOML = `machine = "site-w1"
[cluster]
api-server = "https://127.0.0.1:1"
kubernetes-version = "1.36.3"
`

// newRoot is a host root with a valid configuration.
func newRoot(t *testing.T) (string, hostpaths.Paths) {
	t.Helper()
	root := t.TempDir()
	p := hostpaths.New(root)
	write(t, p.ConfigFile(), agentTOML, 0o644)
	write(t, p.Join("/etc/unbounded/ca.crt"), string(fixtures.CA(t)), 0o644)
	write(t, p.Join("/etc/unbounded/bootstrap-token"), token+"\n", 0o600)
	return root, p
}

func write(t *testing.T, file, content string, perm os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, []byte(content), perm); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(file, perm); err != nil {
		t.Fatal(err)
	}
}

type result struct {
	code           int
	stdout, stderr string
}

func run(t *testing.T, env Env, args ...string) result {
	t.Helper()
	var out, errb bytes.Buffer
	env.Stdout, env.Stderr = &out, &errb
	code := Main(args, env)
	r := result{code, out.String(), errb.String()}
	if strings.Contains(r.stdout+r.stderr, token) || strings.Contains(r.stdout+r.stderr, "r4t5y6u7i8o9p0a1") {
		t.Errorf("unbounded %v leaked the bootstrap token:\n%s\n%s", args, r.stdout, r.stderr)
	}
	return r
}

func TestConfigCheckPrintsTheEffectiveConfigWithTheTokenPathNotTheToken(t *testing.T) {
	root, p := newRoot(t)
	write(t, p.Join("/etc/unbounded/agent.toml.d/50-mode.toml"), "mode = \"none\"\n", 0o644)
	r := run(t, Env{}, "config", "check", "--root", root)
	if r.code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", r.code, r.stderr)
	}
	var got map[string]any
	if _, err := toml.Decode(r.stdout, &got); err != nil {
		t.Fatalf("output is not TOML: %v\n%s", err, r.stdout)
	}
	cluster := got["cluster"].(map[string]any)
	if got["mode"] != "none" || got["machine"] != "site-w1" || cluster["bootstrap-token-file"] != "/etc/unbounded/bootstrap-token" {
		t.Errorf("effective config wrong:\n%s", r.stdout)
	}
	if fence := got["fence"].(map[string]any); fence["retry-budget"] != "2m0s" {
		t.Errorf("default fence.retry-budget not shown: %v", fence)
	}
	if !strings.Contains(r.stdout, p.Join("/etc/unbounded/agent.toml.d/50-mode.toml")) {
		t.Errorf("header does not name the drop-in:\n%s", r.stdout)
	}
}

func TestConfigCheckExits78WithEveryErrorAndNeverTheToken(t *testing.T) {
	root, p := newRoot(t)
	os.Chmod(p.Join("/etc/unbounded/bootstrap-token"), 0o644)
	write(t, p.ConfigFile(), strings.Replace(agentTOML, "https://127.0.0.1:1", "http://x", 1), 0o644)
	r := run(t, Env{}, "config", "check", "--root", root)
	if r.code != 78 {
		t.Fatalf("exit %d, want 78; stderr:\n%s", r.code, r.stderr)
	}
	for _, want := range []string{
		p.ConfigFile() + `:3: cluster.api-server: must be an https:// URL, got "http://x"`,
		p.ConfigFile() + ": cluster.bootstrap-token-file: bootstrap token file /etc/unbounded/bootstrap-token (under root " + root + ") has mode 0644",
		"configuration invalid (2 problems)",
	} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, r.stderr)
		}
	}
	if r.stdout != "" {
		t.Errorf("invalid config printed on stdout:\n%s", r.stdout)
	}
}

func TestConfigCheckWithFileReadsThatFileAndItsDropins(t *testing.T) {
	root, _ := newRoot(t)
	other := filepath.Join(t.TempDir(), "candidate.toml")
	write(t, other, agentTOML, 0o644)
	write(t, other+".d/10.toml", "mode = \"bogus\"\n", 0o644)
	r := run(t, Env{}, "config", "check", "--root", root, "--file", other)
	if r.code != 78 || !strings.Contains(r.stderr, other+".d/10.toml:1: mode: must be one of nspawn, container, none") {
		t.Errorf("exit %d, stderr:\n%s", r.code, r.stderr)
	}
}

func TestConfigCheckWithoutConfigExits78(t *testing.T) {
	r := run(t, Env{}, "config", "check", "--root", t.TempDir())
	if r.code != 78 || !strings.Contains(r.stderr, "no such file") {
		t.Errorf("exit %d, stderr:\n%s", r.code, r.stderr)
	}
}

func TestConfigCheckReferencePrintsTheEmbeddedReference(t *testing.T) {
	r := run(t, Env{}, "config", "check", "--reference")
	if r.code != 0 || !strings.Contains(r.stdout, "retry-budget = \"2m\"") || !strings.Contains(r.stdout, "# REQUIRED") {
		t.Errorf("exit %d, stdout:\n%s", r.code, r.stdout)
	}
}

func TestVersionPrintsTextAndJSON(t *testing.T) {
	if r := run(t, Env{}, "version"); r.code != 0 || !strings.HasPrefix(r.stdout, "unbounded ") {
		t.Errorf("version: %+v", r)
	}
	// --version says the same as the command, and exits 0.
	if r, v := run(t, Env{}, "--version"), run(t, Env{}, "version"); r.code != 0 || r.stdout != v.stdout {
		t.Errorf("--version: %+v, want %q", r, v.stdout)
	}
	r := run(t, Env{}, "version", "--json")
	var v map[string]string
	if err := json.Unmarshal([]byte(r.stdout), &v); err != nil || v["version"] == "" {
		t.Errorf("version --json: %v %q", err, r.stdout)
	}
}

func TestUnknownCommandOrModeIsAUsageError(t *testing.T) {
	for _, args := range [][]string{{"frobnicate"}, {"supports-isolation", "vm"}, {"status", "--bogus"}} {
		if r := run(t, Env{}, args...); r.code != Usage || r.stderr == "" {
			t.Errorf("%v: exit %d, stderr %q", args, r.code, r.stderr)
		}
	}
}

func TestParseRefusesWhatMainRefusesAndRunsNothing(t *testing.T) {
	for _, args := range [][]string{{"frobnicate"}, {"supports-isolation", "vm"}, {"status", "--bogus"}, {"logs", "etcd"}} {
		if err := Parse(args); err == nil {
			t.Errorf("Parse(%q) = nil, want the usage error Main prints", args)
		}
	}
	// reset --yes would reset this host if it ran.
	for _, args := range [][]string{{"reset", "--yes"}, {"status", "--follow"}, {"exec", "--", "crictl", "ps"}, {"--help"}, {"--version"}} {
		if err := Parse(args); err != nil {
			t.Errorf("Parse(%q): %v", args, err)
		}
	}
}

func TestHelpExitsZero(t *testing.T) {
	if r := run(t, Env{}, "--help"); r.code != 0 || !strings.Contains(r.stdout, "supports-isolation") {
		t.Errorf("--help: %+v", r)
	}
}

func fakeHost(bins []string, booted bool) modes.Host {
	files := fstest.MapFS{"proc/self/mountinfo": {Data: []byte(
		"32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n" +
			"35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n" +
			"39 31 0:36 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\n" +
			"40 31 0:37 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,name=systemd\n")}}
	if booted {
		files["run/systemd/system"] = &fstest.MapFile{Mode: fs.ModeDir | 0o755}
	}
	return modes.Host{
		LookPath: func(n string) (string, error) {
			if slices.Contains(bins, n) {
				return "/usr/bin/" + n, nil
			}
			return "", errors.New("not found")
		},
		Stat:     func(p string) (fs.FileInfo, error) { return fs.Stat(files, strings.TrimPrefix(p, "/")) },
		ReadFile: func(p string) ([]byte, error) { return fs.ReadFile(files, strings.TrimPrefix(p, "/")) },
	}
}

func TestSupportsIsolationExitCodeAndReason(t *testing.T) {
	ok := Env{Host: fakeHost([]string{"systemd-nspawn", "runc"}, true)}
	if r := run(t, ok, "supports-isolation", "nspawn"); r.code != 0 || !strings.Contains(r.stdout, "nspawn: supported (cgroup hierarchy: legacy)") {
		t.Errorf("nspawn on a capable host: %+v", r)
	}
	if r := run(t, ok, "supports-isolation", "container"); r.code != 0 || !strings.Contains(r.stdout, "experimental") {
		t.Errorf("container: %+v", r)
	}
	bare := Env{Host: fakeHost(nil, false)}
	r := run(t, bare, "supports-isolation", "nspawn")
	if r.code != 1 || !strings.Contains(r.stderr, "systemd-nspawn is not installed") || !strings.Contains(r.stderr, "systemd is not the init system") {
		t.Errorf("nspawn on a bare host: %+v", r)
	}
	r = run(t, bare, "supports-isolation", "none", "--json")
	var got map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil || r.code != 1 || got["supported"] != false || got["mode"] != "none" {
		t.Errorf("none --json on a bare host: %v %+v", err, r)
	}
}

// status fixtures

func bootstrap(t *testing.T, p hostpaths.Paths, slot, mode string) {
	t.Helper()
	if err := state.WriteApplied(p, &state.AppliedConfig{Slot: slot, Mode: mode, KubernetesVersion: "1.36.3", AgentVersion: "0.1.0", AppliedAt: time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)}); err != nil {
		t.Fatal(err)
	}
}

func statusJSON(t *testing.T, root string) (map[string]any, result) {
	t.Helper()
	r := run(t, Env{}, "status", "--json", "--root", root)
	var got map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
		t.Fatalf("status --json is not JSON: %v\n%s\n%s", err, r.stdout, r.stderr)
	}
	keys := slices.Sorted(func(yield func(string) bool) {
		for k := range got {
			if !yield(k) {
				return
			}
		}
	})
	for _, k := range []string{"applied", "journals", "legacy", "message", "ownership", "state"} {
		if !slices.Contains(keys, k) {
			t.Errorf("status --json lacks %q: %v", k, keys)
		}
	}
	return got, r
}

func TestStatusOnAFreshHost(t *testing.T) {
	root := t.TempDir()
	got, r := statusJSON(t, root)
	if r.code != 0 || got["state"] != "not-bootstrapped" || got["message"] != "not bootstrapped" || got["ownership"] != nil {
		t.Errorf("fresh host: %+v", got)
	}
	if a := got["applied"].([]any); len(a) != 0 {
		t.Errorf("applied on a fresh host: %v", a)
	}
	if c := got["config"].(map[string]any); c["present"] != false || c["file"] != "/etc/unbounded/agent.toml" {
		t.Errorf("config on a fresh host: %v", c)
	}
	if nb := got["next-boot"].(map[string]any); nb["action"] != "nothing" {
		t.Errorf("next boot on a fresh host without config: %v", nb)
	}
	text := run(t, Env{}, "status", "--root", root)
	for _, want := range []string{
		"state:       not bootstrapped",
		"config:      none: no /etc/unbounded/agent.toml",
		"next boot:   nothing starts: no /etc/unbounded/agent.toml; the package stays idle until one is in place",
	} {
		if !strings.Contains(text.stdout, want) {
			t.Errorf("text lacks %q:\n%s", want, text.stdout)
		}
	}
}

// With a config in place, a fresh host says the next boot bootstraps, and
// whether the config would load.
func TestStatusOnAFreshHostWithAConfigSaysBootstrap(t *testing.T) {
	root, p := newRoot(t)
	got, r := statusJSON(t, root)
	c := got["config"].(map[string]any)
	nb := got["next-boot"].(map[string]any)
	if r.code != 0 || c["present"] != true || c["valid"] != true || nb["action"] != "bootstrap" ||
		!reflect.DeepEqual(nb["units"], []any{"unbounded-bootstrap.service"}) {
		t.Errorf("fresh host with config: exit %d, config %v, next boot %v", r.code, c, nb)
	}
	write(t, p.ConfigFile(), agentTOML+"colour = 1\n", 0o644)
	text := run(t, Env{}, "status", "--root", root)
	for _, want := range []string{
		"config:      /etc/unbounded/agent.toml (invalid, 1 problem: see unbounded config check)",
		"next boot:   bootstrap: /etc/unbounded/agent.toml is in place",
	} {
		if !strings.Contains(text.stdout, want) {
			t.Errorf("text lacks %q:\n%s", want, text.stdout)
		}
	}
}

// A bootstrapped host starts its slot's node only when the fence and the
// mode's node unit are installed; otherwise status says it gets the safe
// state, as the generator decides.
func TestStatusSaysWhichNodeTheNextBootStarts(t *testing.T) {
	root, p := newRoot(t)
	bootstrap(t, p, "kube2", "nspawn")
	got, _ := statusJSON(t, root)
	if nb := got["next-boot"].(map[string]any); nb["action"] != "safe-state" || !strings.Contains(nb["reason"].(string), "unfenced") {
		t.Errorf("without units: next boot %v", nb)
	}
	for _, u := range []string{"unbounded-fence.service", "systemd-nspawn@.service"} {
		write(t, p.Join("/usr/lib/systemd/system/"+u), "[Unit]\n", 0o644)
	}
	got, _ = statusJSON(t, root)
	if nb := got["next-boot"].(map[string]any); nb["action"] != "start-node" ||
		!reflect.DeepEqual(nb["units"], []any{"unbounded-node.target", "unbounded-daemon.service"}) {
		t.Errorf("with units: next boot %v", nb)
	}
	text := run(t, Env{}, "status", "--root", root)
	if want := "next boot:   start the node: mode nspawn in slot kube2, behind the allocation fence, and the daemon"; !strings.Contains(text.stdout, want) {
		t.Errorf("text lacks %q:\n%s", want, text.stdout)
	}
}

type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, errors.New("no space left on device") }

// A status that did not reach its reader does not exit 0.
func TestStatusFailsWhenItCannotWriteItsOutput(t *testing.T) {
	root := t.TempDir()
	for _, args := range [][]string{{"status", "--root", root}, {"status", "--json", "--root", root}} {
		var errb bytes.Buffer
		code := Main(args, Env{Stdout: failingWriter{}, Stderr: &errb})
		if code == 0 || !strings.Contains(errb.String(), "writing the status: no space left on device") {
			t.Errorf("%v: exit %d, stderr %q", args, code, errb.String())
		}
	}
}

func TestStatusOnABootstrappedHostWithAJournal(t *testing.T) {
	root, p := newRoot(t)
	bootstrap(t, p, "kube2", "nspawn")
	write(t, p.Journal("repave"), `{"step":"after-old-stopped","undo":[]}`, 0o600)
	write(t, p.Journal("upgrade"), `not json`, 0o600)
	got, r := statusJSON(t, root)
	if r.code != 0 || got["state"] != "bootstrapped" || got["mode"] != "nspawn" || got["active-slot"] != "kube2" {
		t.Errorf("bootstrapped host: %+v", got)
	}
	applied := got["applied"].([]any)
	if len(applied) != 1 {
		t.Fatalf("applied = %v", applied)
	}
	a := applied[0].(map[string]any)
	if a["slot"] != "kube2" || a["active"] != true || a["kubernetes-version"] != "1.36.3" || a["agent-version"] != "0.1.0" {
		t.Errorf("applied record: %v", a)
	}
	journals := got["journals"].([]any)
	if len(journals) != 2 {
		t.Fatalf("journals = %v", journals)
	}
	if j := journals[0].(map[string]any); j["operation"] != "repave" || j["step"] != "after-old-stopped" {
		t.Errorf("repave journal: %v", j)
	}
	if j := journals[1].(map[string]any); j["operation"] != "upgrade" || !strings.Contains(j["error"].(string), "not a JSON object") {
		t.Errorf("garbage journal: %v", j)
	}
	text := run(t, Env{}, "status", "--root", root)
	for _, want := range []string{"active slot: kube2", "kube2 (active): mode nspawn, kubernetes 1.36.3, agent 0.1.0", "repave: step after-old-stopped"} {
		if !strings.Contains(text.stdout, want) {
			t.Errorf("text lacks %q:\n%s", want, text.stdout)
		}
	}
}

func TestStatusOnACorruptHostSaysSoAndExits1(t *testing.T) {
	root, p := newRoot(t)
	bootstrap(t, p, "kube1", "none")
	write(t, hostpaths.Checksum(p.AppliedConfig("kube1")), strings.Repeat("0", 64)+"\n", 0o600)
	got, r := statusJSON(t, root)
	if r.code != 1 || got["state"] != "corrupt" || !strings.HasPrefix(got["message"].(string), "state corrupt: ") {
		t.Errorf("corrupt host: exit %d, %+v", r.code, got)
	}
	a := got["applied"].([]any)[0].(map[string]any)
	if !strings.Contains(a["error"].(string), "SHA-256 does not match") {
		t.Errorf("applied record error: %v", a)
	}
}

func TestStatusOnAnOwnedHostNamesTheOwner(t *testing.T) {
	root, p := newRoot(t)
	since := time.Date(2025, 5, 6, 7, 8, 9, 0, time.UTC)
	data, _ := json.Marshal(state.Ownership{Owner: "reprovision", Unit: "unbounded-reprovision.service", PID: 4242, Since: since})
	if err := state.WriteFileAtomic(p.Ownership(), data, 0o644); err != nil {
		t.Fatal(err)
	}
	write(t, p.Join(hostpaths.LegacyBinaryHost), "#!/bin/sh\n", 0o755)
	got, r := statusJSON(t, root)
	o, _ := got["ownership"].(map[string]any)
	if r.code != 0 || o["owner"] != "reprovision" || o["unit"] != "unbounded-reprovision.service" || o["pid"] != float64(4242) {
		t.Errorf("owned host: %+v", got)
	}
	if l := got["legacy"].(map[string]any); l["detected"] != true || l["binary"] != true {
		t.Errorf("legacy: %v", l)
	}
	// A garbled record still reads as owned (fail closed) and says why.
	write(t, p.Ownership(), "{garbage", 0o644)
	got, _ = statusJSON(t, root)
	o, _ = got["ownership"].(map[string]any)
	if o["owner"] != "unknown" || !strings.Contains(o["error"].(string), "corrupt") {
		t.Errorf("garbled ownership: %v", o)
	}
}

func TestStatusNeverChangesTheHost(t *testing.T) {
	root, p := newRoot(t)
	bootstrap(t, p, "kube1", "nspawn")
	before := tree(t, root)
	run(t, Env{}, "status", "--root", root)
	run(t, Env{}, "status", "--json", "--root", root)
	run(t, Env{}, "config", "check", "--root", root)
	if after := tree(t, root); !reflect.DeepEqual(before, after) {
		t.Errorf("host changed:\n%v\n%v", before, after)
	}
}

func tree(t *testing.T, root string) map[string]string {
	out := map[string]string{}
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, _ := os.Lstat(p)
		data, _ := os.ReadFile(p)
		out[p] = fi.Mode().String() + fi.ModTime().String() + string(data)
		return nil
	})
	return out
}

func TestManifestsPrintsTheCRDsAndTheConstantRBAC(t *testing.T) {
	r := run(t, Env{}, "manifests")
	if r.code != 0 || !strings.Contains(r.stdout, "kind: CustomResourceDefinition") || !strings.Contains(r.stdout, "kind: ValidatingAdmissionPolicy") {
		t.Errorf("manifests: exit %d, stderr %s", r.code, r.stderr)
	}
	// Nothing is per machine any more: the flag is gone, and says so
	// rather than printing the fleet-wide set under a machine's name.
	r = run(t, Env{}, "manifests", "--machine", "site-w1")
	if r.code == 0 || !strings.Contains(r.stderr, "--machine") {
		t.Errorf("manifests --machine: exit %d, stderr %s; want a usage error naming the flag", r.code, r.stderr)
	}
}

// The real binary, built with the Makefile's flags: exit codes reach the
// shell and the version stamp works.
func TestBuiltBinaryExitCodesAndVersionStamp(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary; skipped with -short")
	}
	gobin, err := exec.LookPath("go")
	if err != nil {
		tiers.Skip(t, tiers.Unit, "no go toolchain on PATH to build cmd/unbounded")
	}
	bin := filepath.Join(t.TempDir(), "unbounded")
	build := exec.Command(gobin, "build", "-trimpath", "-ldflags", "-s -w -X unbounded-cloud.io/agent/lib/version.Version=9.8.7-test", "-o", bin, "unbounded-cloud.io/agent/cmd/unbounded")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	root, p := newRoot(t)
	exit := func(args ...string) (int, string) {
		cmd := exec.Command(bin, args...)
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode(), string(out)
		}
		if err != nil {
			t.Fatal(err)
		}
		return 0, string(out)
	}
	for _, arg := range []string{"version", "--version"} {
		if code, out := exit(arg); code != 0 || out != "unbounded 9.8.7-test\n" {
			t.Errorf("%s: %d %q", arg, code, out)
		}
	}
	if code, out := exit("config", "check", "--root", root); code != 0 || strings.Contains(out, token) {
		t.Errorf("config check: %d\n%s", code, out)
	}
	write(t, p.Join("/etc/unbounded/bootstrap-token"), "not-a-token\n", 0o600)
	if code, out := exit("config", "check", "--root", root); code != 78 || strings.Contains(out, "not-a-token") {
		t.Errorf("config check invalid: %d\n%s", code, out)
	}
	if code, _ := exit("supports-isolation", "vm"); code != Usage {
		t.Errorf("usage error: %d", code)
	}
	// Output to a full disk: the write error reaches the exit code.
	if full, err := os.OpenFile("/dev/full", os.O_WRONLY, 0); err == nil {
		cmd := exec.Command(bin, "status", "--root", root)
		cmd.Stdout = full
		err := cmd.Run()
		full.Close()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 {
			t.Errorf("status > /dev/full: %v, want exit 1", err)
		}
	} else {
		t.Logf("no /dev/full (%v): the write failure is checked in-process only", err)
	}
}

// BenchmarkConfigCheck is `unbounded config check` in-process on a valid
// host root (reference + agent.toml + one drop-in, CA and token checked),
// printing the effective config. The process start of the real binary is
// on top of this (measured in the report with hyperfine).
func BenchmarkConfigCheck(b *testing.B) {
	root := b.TempDir()
	p := hostpaths.New(root)
	for file, content := range map[string]string{
		p.ConfigFile(): agentTOML,
		p.Join("/etc/unbounded/agent.toml.d/50-mode.toml"): "mode = \"none\"\n",
	} {
		os.MkdirAll(filepath.Dir(file), 0o755)
		os.WriteFile(file, []byte(content), 0o644)
	}
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, _ := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	os.WriteFile(p.Join("/etc/unbounded/ca.crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
	os.WriteFile(p.Join("/etc/unbounded/bootstrap-token"), []byte(token), 0o600)
	var out bytes.Buffer
	for b.Loop() {
		out.Reset()
		if code := Main([]string{"config", "check", "--root", root}, Env{Stdout: &out, Stderr: &out}); code != 0 {
			b.Fatalf("exit %d: %s", code, out.String())
		}
	}
}

// The operator CLI must stay free of a Kubernetes client and of the API
// types (size budget, ARCHITECTURE section 3): printing manifests renders
// embedded YAML; linking k8s.io/api for it would multiply the CLI's size
// (`make bench`, "binary sizes", shows bin/unbounded as it is).
func TestCLILinksNoKubernetesClientOrAPITypes(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		tiers.Skip(t, tiers.Unit, "no go toolchain on PATH to list dependencies")
	}
	out, err := exec.Command(gobin, "list", "-deps", "unbounded-cloud.io/agent/cmd/unbounded").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		if strings.HasPrefix(dep, "k8s.io/client-go") || strings.HasPrefix(dep, "k8s.io/api/") ||
			strings.HasPrefix(dep, "k8s.io/apimachinery/pkg/apis/meta") {
			t.Errorf("cmd/unbounded links %s", dep)
		}
	}
}

// asNobody runs bin with args as the unprivileged user nobody (65534) and
// returns its exit code, stdout and stderr. It skips when the test does not
// run as root (only root can switch users) or setpriv is missing.
func asNobody(t *testing.T, bin string, args ...string) (int, string, string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to run the commands as nobody with setpriv")
	}
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skip("setpriv (util-linux) is not installed")
	}
	cmd := exec.Command(setpriv, append([]string{"--reuid=65534", "--regid=65534", "--clear-groups", "--", bin}, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err = cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		return ee.ExitCode(), out.String(), errb.String()
	case err != nil:
		t.Fatalf("setpriv %s: %v", bin, err)
	}
	return 0, out.String(), errb.String()
}

// openUp makes dir and its parents up to (not including) /tmp traversable
// by every user: t.TempDir makes them 0700.
func openUp(t *testing.T, dir string) {
	t.Helper()
	if fi, err := os.Stat(os.TempDir()); err != nil || fi.Mode().Perm()&0o001 == 0 {
		t.Skipf("the temporary directory %s is not open to other users (TMPDIR): nobody could not reach the test files", os.TempDir())
	}
	for d := dir; d != "/" && d != os.TempDir() && d != "."; d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

// Without root, every command that reads what only root may read says so
// in one line and exits 4; those that do not need root work. The host tree
// is what the package and bootstrap leave: /var/lib/unbounded 0700 with an
// applied config, the token 0600, both owned by root.
func TestCommandsRunWithoutRootSayTheyNeedRoot(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary; skipped with -short")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root to run the commands as nobody with setpriv")
	}
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go toolchain on PATH to build cmd/unbounded")
	}
	binDir := t.TempDir()
	bin := filepath.Join(binDir, "unbounded")
	build := exec.Command(gobin, "build", "-trimpath", "-o", bin, "unbounded-cloud.io/agent/cmd/unbounded")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	openUp(t, binDir)
	root, p := newRoot(t)
	bootstrap(t, p, "kube1", "nspawn")
	if err := os.Chmod(p.HostRoot(), 0o700); err != nil {
		t.Fatal(err)
	}
	openUp(t, root)
	for _, d := range []string{"/etc", "/etc/unbounded", "/var", "/var/lib"} {
		os.Chmod(p.Join(d), 0o755)
	}

	for _, args := range [][]string{{"status"}, {"status", "--json"}, {"config", "check"}} {
		args = append(args, "--root", root)
		// As root: no "needs root" (the fixture is a sound host).
		if r := run(t, Env{}, args...); r.code == exitcode.NeedsRoot || strings.Contains(r.stderr, "needs root") {
			t.Fatalf("as root, %v: exit %d, %s", args, r.code, r.stderr)
		}
		code, stdout, stderr := asNobody(t, bin, args...)
		if code != exitcode.NeedsRoot || strings.Count(stderr, "\n") != 1 || !strings.HasPrefix(stderr, "unbounded: needs root: ") ||
			!strings.HasSuffix(stderr, "; run it as root\n") || stdout != "" {
			t.Errorf("as nobody, %v: exit %d, want %d and one line; stdout %q, stderr %q", args, code, exitcode.NeedsRoot, stdout, stderr)
		}
		for _, false_ := range []string{"corrupt", "owned by uid", "unknown", "invalid"} {
			if strings.Contains(stdout+stderr, false_) {
				t.Errorf("as nobody, %v says %q: %s%s", args, false_, stdout, stderr)
			}
		}
	}
	// Next to a real problem the token is listed as unchecked, and the
	// configuration is invalid whoever checks it.
	write(t, p.ConfigFile(), agentTOML+"colour = 1\n", 0o644)
	code, _, stderr := asNobody(t, bin, "config", "check", "--root", root)
	if code != exitcode.ConfigInvalid || !strings.Contains(stderr, "colour: unknown key") ||
		!strings.Contains(stderr, "/etc/unbounded/bootstrap-token (under root "+root+"): not checked: only root may read it (run the check as root)") ||
		strings.Contains(stderr, "owned by uid") {
		t.Errorf("as nobody, invalid config: exit %d, stderr %s", code, stderr)
	}
	write(t, p.ConfigFile(), agentTOML, 0o644)
	// A host without a host root yet (a fresh install) still has a
	// token only root may read: status says it needs root rather than
	// call the configuration invalid.
	if err := os.RemoveAll(p.HostRoot()); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := asNobody(t, bin, "status", "--root", root)
	if code != exitcode.NeedsRoot || stdout != "" || !strings.Contains(stderr, "unbounded: needs root: /etc/unbounded/bootstrap-token (under root "+root+") is readable only by root") {
		t.Errorf("as nobody, status on a fresh host: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	// Commands that need no root work without it.
	for _, args := range [][]string{{"--version"}, {"version"}, {"manifests"}, {"config", "check", "--reference"}, {"--help"}} {
		if code, _, stderr := asNobody(t, bin, args...); code != 0 {
			t.Errorf("as nobody, %v: exit %d, %s", args, code, stderr)
		}
	}
	// A tree the user owns is checked without root, token included.
	own, _ := newRoot(t)
	openUp(t, own)
	if err := filepath.WalkDir(own, func(path string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(path, 65534, 65534)
	}); err != nil {
		t.Fatal(err)
	}
	if code, _, stderr := asNobody(t, bin, "config", "check", "-q", "--root", own); code != 0 {
		t.Errorf("as nobody on its own tree: exit %d, %s", code, stderr)
	}
}

// concernCall is one run of a concern by the CLI.
type concernCall struct {
	path string
	args []string
}

func resetEnv(stdin string, code int, calls *[]concernCall) Env {
	return Env{
		Stdin: strings.NewReader(stdin),
		RunConcern: func(path string, args []string, stdout, stderr io.Writer) (int, error) {
			*calls = append(*calls, concernCall{path, args})
			return code, nil
		},
	}
}

func TestResetRunsNothingUnlessConfirmed(t *testing.T) {
	for _, answer := range []string{"", "no\n", "y\n", "YES please\n"} {
		var calls []concernCall
		r := run(t, resetEnv(answer, 0, &calls), "reset")
		if r.code != exitcode.Failed || len(calls) != 0 || !strings.Contains(r.stderr, "Type yes") || !strings.Contains(r.stderr, "not confirmed") {
			t.Errorf("answer %q: exit %d, calls %v, stderr %q", answer, r.code, calls, r.stderr)
		}
	}
}

func TestResetRunsTheResetConcernOnceConfirmed(t *testing.T) {
	root := t.TempDir()
	var calls []concernCall
	r := run(t, resetEnv("yes\n", 0, &calls), "reset", "--root", root, "--keep-handoff")
	want := concernCall{hostpaths.New(root).Libexec("reset"), []string{"--root", root, "--keep-handoff"}}
	if r.code != 0 || len(calls) != 1 || calls[0].path != want.path || !slices.Equal(calls[0].args, want.args) {
		t.Errorf("exit %d, calls %+v, want %+v; stderr %q", r.code, calls, want, r.stderr)
	}
	calls = nil
	if r := run(t, resetEnv("", 0, &calls), "reset", "--yes"); r.code != 0 || len(calls) != 1 || strings.Contains(r.stderr, "Type yes") {
		t.Errorf("--yes: exit %d, calls %v, stderr %q", r.code, calls, r.stderr)
	}
	// The concern's exit code is the CLI's, 69 included (an installation
	// owns the host).
	for _, code := range []int{exitcode.Failed, exitcode.Deferred} {
		calls = nil
		if r := run(t, resetEnv("", code, &calls), "reset", "-y"); r.code != code {
			t.Errorf("concern exit %d: CLI exit %d", code, r.code)
		}
	}
}

// `unbounded prepare --root DIR` runs the image's own prepare concern
// (DIR/usr/libexec/unbounded/prepare) and exits with its code; without
// --root it runs nothing.
func TestPrepareRunsTheImagesPrepareConcern(t *testing.T) {
	root := t.TempDir()
	var calls []concernCall
	r := run(t, resetEnv("", 0, &calls), "prepare", "--root", root)
	want := concernCall{hostpaths.New(root).Libexec("prepare"), []string{"--root", root}}
	if r.code != 0 || len(calls) != 1 || calls[0].path != want.path || !slices.Equal(calls[0].args, want.args) {
		t.Errorf("exit %d, calls %+v, want %+v; stderr %q", r.code, calls, want, r.stderr)
	}
	for _, code := range []int{exitcode.Failed, exitcode.TempFail, exitcode.ConfigInvalid} {
		calls = nil
		if r := run(t, resetEnv("", code, &calls), "prepare", "--root", root); r.code != code {
			t.Errorf("concern exit %d: CLI exit %d", code, r.code)
		}
	}
	calls = nil
	if r := run(t, resetEnv("", 0, &calls), "prepare"); r.code == 0 || len(calls) != 0 {
		t.Errorf("without --root: exit %d, calls %v", r.code, calls)
	}
}
