package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/regfile"
	"unbounded-cloud.io/agent/lib/state"
)

// binary is the generator built as the Makefile builds it (static,
// stripped), so that the tests and the benchmark run what ships.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "unbounded-generator-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "unbounded-generator")
	build := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", binary, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building the generator: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

const unitDir = "/usr/lib/systemd/system/"

// fenceDropIn is the drop-in content the contract requires at its end.
const fenceTail = "[Unit]\nRequires=unbounded-fence.service\nAfter=unbounded-fence.service\n"

// host is a temporary root with a regular file standing in for /dev/kmsg,
// the package's fence unit and the supervising units of every mode
// installed, as on a host with the package (and systemd-container).
type host struct {
	t testing.TB
	p hostpaths.Paths
}

// fenceUnitHost is where the package installs the fence unit.
const fenceUnitHost = unitDir + "unbounded-fence.service"

func newHost(t testing.TB) *host {
	root := t.TempDir()
	h := &host{t: t, p: hostpaths.New(root)}
	h.write(hostpaths.KmsgHost, "")
	h.installFence()
	h.installNodeUnits()
	return h
}

// nodeUnitFiles are the supervising units of every mode as they are
// installed: systemd-nspawn@.service by systemd-container, the others by
// the package. The generator only looks for them, so stand-ins do.
var nodeUnitFiles = []string{
	unitDir + "systemd-nspawn@.service",
	unitDir + "unbounded-container@.service",
	unitDir + "unbounded-containerd.service",
	unitDir + "unbounded-kubelet.service",
}

func (h *host) installNodeUnits() {
	h.t.Helper()
	for _, f := range nodeUnitFiles {
		h.write(f, "[Unit]\nDescription=Stand-in for "+filepath.Base(f)+" (generator test)\n[Service]\nExecStart=/bin/true\n")
	}
}

// remove deletes an installed file under the root.
func (h *host) remove(hostPath string) {
	h.t.Helper()
	if err := os.Remove(h.p.Join(hostPath)); err != nil {
		h.t.Fatal(err)
	}
}

// mask masks unit as `systemctl mask` does: a link to /dev/null in
// /etc/systemd/system.
func (h *host) mask(unit string) {
	h.t.Helper()
	os.MkdirAll(h.p.Join(hostpaths.UnitDirEtcHost), 0o755)
	if err := os.Symlink("/dev/null", h.p.Join(hostpaths.UnitDirEtcHost+"/"+unit)); err != nil {
		h.t.Fatal(err)
	}
}

// installFence installs the shipped unit file (units/), so that the test
// breaks if the package stops shipping it.
func (h *host) installFence() {
	h.t.Helper()
	data, err := os.ReadFile("../../units/unbounded-fence.service")
	if err != nil {
		h.t.Fatalf("the shipped fence unit: %v", err)
	}
	h.write(fenceUnitHost, string(data))
}

func (h *host) removeFence() {
	h.t.Helper()
	if err := os.Remove(h.p.Join(fenceUnitHost)); err != nil {
		h.t.Fatal(err)
	}
}

func (h *host) write(hostPath, content string) {
	h.t.Helper()
	f := h.p.Join(hostPath)
	if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
		h.t.Fatal(err)
	}
	if err := os.WriteFile(f, []byte(content), 0o600); err != nil {
		h.t.Fatal(err)
	}
}

func (h *host) config() { h.write(hostpaths.ConfigFileHost, "machine = \"site-w1\"\n") }

// applied records a valid applied config through lib/state, as bootstrap
// and repave do.
func (h *host) applied(slot, mode string) {
	h.t.Helper()
	a := &state.AppliedConfig{Slot: slot, Mode: mode, Machine: "site-w1", AgentVersion: "0.1.0", AppliedAt: time.Unix(1e9, 0).UTC()}
	if err := state.WriteApplied(h.p, a); err != nil {
		h.t.Fatal(err)
	}
}

// raw writes an applied-config file of slot with the given bytes and a
// correct sidecar (so the content itself is what is judged).
func (h *host) raw(slot, content string) {
	file := h.p.Rel(h.p.AppliedConfig(slot))
	h.write(file, content)
	h.write(file+".sha256", string(state.ChecksumLine([]byte(content), filepath.Base(file))))
}

func (h *host) owned(o state.Ownership) {
	data, _ := json.Marshal(o)
	h.write(h.p.Rel(h.p.Ownership()), string(data))
}

func (h *host) journal(content string) { h.write(h.p.Rel(h.p.Journal("isolation")), content) }

// run runs the real binary and returns the output tree and kmsg content.
func (h *host) run(args ...string) (out string, tree []string, kmsg, stderr string) {
	h.t.Helper()
	dir := h.t.TempDir()
	out = filepath.Join(dir, "normal")
	for _, d := range []string{"normal", "early", "late"} {
		os.Mkdir(filepath.Join(dir, d), 0o755)
	}
	if args == nil {
		args = []string{"--root", h.p.Root, out, filepath.Join(dir, "early"), filepath.Join(dir, "late")}
	}
	tree, kmsg, stderr = h.runInto(out, args...)
	return out, tree, kmsg, stderr
}

// generatorBudget bounds every run of the binary in these tests: a run
// that takes longer was killed and fails its test. It detects a generator
// that blocks (systemd waits for it at boot and at every daemon-reload,
// and a FIFO or /dev/zero read as a state file blocks forever), not a slow
// one: BenchmarkGenerator (make bench) measures its speed, far inside this
// even on a loaded 2-core machine.
const generatorBudget = 2 * time.Second

// runInto runs the binary with args, within generatorBudget.
func (h *host) runInto(out string, args ...string) (tree []string, kmsg, stderr string) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), generatorBudget)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	var errb bytes.Buffer
	cmd.Stderr = &errb
	err := cmd.Run()
	if ctx.Err() != nil {
		h.t.Fatalf("generator %q did not return within %v: it would stall systemd", args, generatorBudget)
	}
	if err != nil {
		h.t.Fatalf("generator %q exited: %v (stderr %q); it must always exit 0", args, err, errb.String())
	}
	// Not os.ReadFile: a test may put a FIFO in kmsg's place.
	k, _ := regfile.Read(h.p.Kmsg(), 1<<20)
	return listTree(h.t, out), string(k), errb.String()
}

// listTree lists dir: "path -> target" for links, "path: content" for
// files, "path/" for empty directories.
func listTree(t testing.TB, dir string) []string {
	var s []string
	filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		rel, _ := filepath.Rel(dir, path)
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(path)
			s = append(s, rel+" -> "+target)
		case d.IsDir():
			if ents, _ := os.ReadDir(path); len(ents) == 0 && rel != "." {
				s = append(s, rel+"/")
			}
		default:
			data, _ := os.ReadFile(path)
			c := string(data)
			if strings.HasSuffix(rel, ".conf") && strings.HasSuffix(c, fenceTail) && strings.HasPrefix(c, "#") {
				c = "FENCE" // the contract: comment, then exactly these lines
			}
			s = append(s, rel+": "+c)
		}
		return nil
	})
	sort.Strings(s)
	return s
}

func wants(target, unit, tmpl string) string {
	return target + ".wants/" + unit + " -> " + unitDir + tmpl
}

func requires(target, unit, tmpl string) string {
	return target + ".requires/" + unit + " -> " + unitDir + tmpl
}

func fence(unit string) string { return unit + ".d/50-unbounded-fence.conf: FENCE" }

func nodeOutput(mode string, units ...string) []string {
	s := []string{
		wants("multi-user.target", "unbounded-node.target", "unbounded-node.target"),
		wants("multi-user.target", "unbounded-daemon.service", "unbounded-daemon.service"),
		requires("unbounded-node.target", "unbounded-mode-"+mode+".target", "unbounded-mode-"+mode+".target"),
	}
	for i := 0; i < len(units); i += 2 {
		s = append(s, requires("unbounded-mode-"+mode+".target", units[i], units[i+1]), fence(units[i]))
	}
	sort.Strings(s)
	return s
}

var recoverOnly = []string{wants("multi-user.target", "unbounded-recover@generator.service", "unbounded-recover@.service")}

// TestGeneratorContract is the table of the generator contract, run
// against the built binary: for each host state, the exact output, exit
// status 0, and the kmsg line (or none).
func TestGeneratorContract(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		setup func(h *host)
		want  []string
		// kmsg: substrings of the one kmsg line; nil means kmsg stays empty.
		kmsg []string
	}{
		{name: "fresh host with config pulls in bootstrap", setup: (*host).config,
			want: []string{wants("multi-user.target", "unbounded-bootstrap.service", "unbounded-bootstrap.service")}},
		{name: "fresh host without config writes nothing", setup: func(*host) {}},
		{name: "state directory without records or config writes nothing", setup: func(h *host) {
			os.MkdirAll(h.p.JournalDir(), 0o755)
		}},
		{name: "nspawn kube1", setup: func(h *host) { h.config(); h.applied("kube1", "nspawn") },
			want: nodeOutput("nspawn", "systemd-nspawn@kube1.service", "systemd-nspawn@.service")},
		{name: "nspawn kube2 without config file", setup: func(h *host) { h.applied("kube2", "nspawn") },
			want: nodeOutput("nspawn", "systemd-nspawn@kube2.service", "systemd-nspawn@.service")},
		{name: "container kube2", setup: func(h *host) { h.config(); h.applied("kube2", "container") },
			want: nodeOutput("container", "unbounded-container@kube2.service", "unbounded-container@.service")},
		{name: "none kube1", setup: func(h *host) { h.config(); h.applied("kube1", "none") },
			want: nodeOutput("none", "unbounded-containerd.service", "unbounded-containerd.service", "unbounded-kubelet.service", "unbounded-kubelet.service")},
		{name: "two records and a journal naming the running one", setup: func(h *host) {
			h.applied("kube1", "nspawn")
			h.applied("kube2", "none")
			h.journal(`{"running-slot":"kube2","step":"switched"}`)
		}, want: nodeOutput("none", "unbounded-containerd.service", "unbounded-containerd.service", "unbounded-kubelet.service", "unbounded-kubelet.service")},
		{name: "owned with unit resumes the installation", setup: func(h *host) {
			h.config()
			h.owned(state.Ownership{Owner: "bootstrap", Unit: "unbounded-bootstrap.service", PID: 123})
		}, want: []string{wants("multi-user.target", "unbounded-bootstrap.service", "unbounded-bootstrap.service")}},
		{name: "owned without unit starts nothing", setup: func(h *host) {
			h.config()
			h.owned(state.Ownership{Owner: "reset"})
		}},
		{name: "owned and applied starts no node and no daemon", setup: func(h *host) {
			h.config()
			h.applied("kube1", "nspawn")
			h.owned(state.Ownership{Owner: "reprovision", Unit: "unbounded-reprovision.service"})
		}, want: []string{wants("multi-user.target", "unbounded-reprovision.service", "unbounded-reprovision.service")}},
		{name: "owned with corrupt state is still only owned", setup: func(h *host) {
			h.raw("kube1", "garbage")
			h.owned(state.Ownership{Owner: "bootstrap", Unit: "unbounded-bootstrap.service"})
		}, want: []string{wants("multi-user.target", "unbounded-bootstrap.service", "unbounded-bootstrap.service")}},
		{name: "owned naming a foreign unit resumes nothing", setup: func(h *host) {
			h.owned(state.Ownership{Owner: "bootstrap", Unit: "sshd.service"})
		}, kmsg: []string{`"sshd.service"`, "not an unbounded-* service"}},
		{name: "owned naming the kubelet does not start it", setup: func(h *host) {
			h.applied("kube1", "none")
			h.owned(state.Ownership{Owner: "bootstrap", Unit: "unbounded-kubelet.service"})
		}, kmsg: []string{`"unbounded-kubelet.service"`, "part of the node or the daemon"}},
		{name: "garbage ownership record fails closed", setup: func(h *host) {
			h.applied("kube1", "nspawn")
			h.write(h.p.Rel(h.p.Ownership()), "\x00\x01not json")
		}, want: recoverOnly, kmsg: []string{"ownership record unreadable", "/var/lib/unbounded/ownership"}},
		{name: "corrupt: missing sidecar", setup: func(h *host) {
			h.config()
			h.applied("kube1", "nspawn")
			os.Remove(hostpaths.Checksum(h.p.AppliedConfig("kube1")))
		}, want: recoverOnly, kmsg: []string{"/var/lib/unbounded/kube1-applied-config.json", "sidecar", "is missing"}},
		{name: "corrupt: sidecar without record", setup: func(h *host) {
			h.applied("kube2", "nspawn")
			os.Remove(h.p.AppliedConfig("kube2"))
		}, want: recoverOnly, kmsg: []string{"kube2-applied-config.json is missing but its checksum sidecar exists"}},
		{name: "corrupt: garbage bytes", setup: func(h *host) { h.raw("kube1", "\xff\xfe\x00garbage\n") },
			want: recoverOnly, kmsg: []string{"kube1-applied-config.json", "invalid character"}},
		{name: "corrupt: garbage bytes and sidecar", setup: func(h *host) {
			h.write(h.p.Rel(h.p.AppliedConfig("kube2")), "\x89PNG\r\n")
			h.write(h.p.Rel(hostpaths.Checksum(h.p.AppliedConfig("kube2"))), "\x00\x00")
		}, want: recoverOnly, kmsg: []string{"kube2-applied-config.json", "SHA-256 does not match"}},
		{name: "corrupt: empty record and empty sidecar", setup: func(h *host) {
			h.write(h.p.Rel(h.p.AppliedConfig("kube1")), "")
			h.write(h.p.Rel(hostpaths.Checksum(h.p.AppliedConfig("kube1"))), "")
		}, want: recoverOnly, kmsg: []string{"kube1-applied-config.json", "empty checksum sidecar"}},
		{name: "corrupt: empty record with its checksum", setup: func(h *host) { h.raw("kube1", "") },
			want: recoverOnly, kmsg: []string{"kube1-applied-config.json", "EOF"}},
		{name: "corrupt: checksum mismatch", setup: func(h *host) {
			h.config()
			h.applied("kube2", "nspawn")
			h.write(h.p.Rel(h.p.AppliedConfig("kube2")), `{"slot":"kube2","mode":"none"}`)
		}, want: recoverOnly, kmsg: []string{"kube2-applied-config.json", "SHA-256 does not match its sidecar"}},
		{name: "corrupt: slot mismatch", setup: func(h *host) { h.raw("kube1", `{"slot":"kube2","mode":"nspawn"}`) },
			want: recoverOnly, kmsg: []string{`names slot "kube2" but is stored as kube1`}},
		{name: "corrupt: slot not kube1 or kube2", setup: func(h *host) { h.raw("kube2", `{"slot":"kube3","mode":"nspawn"}`) },
			want: recoverOnly, kmsg: []string{`slot "kube3" is not kube1 or kube2`}},
		{name: "corrupt: unknown mode", setup: func(h *host) { h.raw("kube1", `{"slot":"kube1","mode":"vm"}`) },
			want: recoverOnly, kmsg: []string{`mode "vm" is not nspawn, container or none`}},
		{name: "corrupt: trailing data after the record", setup: func(h *host) {
			h.raw("kube1", `{"slot":"kube1","mode":"nspawn"}{"slot":"kube2"}`)
		}, want: recoverOnly, kmsg: []string{"trailing data"}},
		{name: "corrupt: two records without journal", setup: func(h *host) {
			h.config()
			h.applied("kube1", "nspawn")
			h.applied("kube2", "nspawn")
		}, want: recoverOnly, kmsg: []string{"both slots have an applied config", "/var/lib/unbounded/journal/isolation.json"}},
		{name: "corrupt: journal naming a slot with no record", setup: func(h *host) {
			h.applied("kube1", "nspawn")
			h.applied("kube2", "container")
			h.journal(`{"running-slot":"kube3"}`)
		}, want: recoverOnly, kmsg: []string{`names running slot "kube3", which has no applied config`}},
		{name: "corrupt: journal naming no slot", setup: func(h *host) {
			h.applied("kube1", "nspawn")
			h.applied("kube2", "container")
			h.journal(`{}`)
		}, want: recoverOnly, kmsg: []string{`names running slot ""`}},
		{name: "corrupt: journal garbage", setup: func(h *host) {
			h.applied("kube1", "nspawn")
			h.applied("kube2", "nspawn")
			h.journal("\x00\x01\x02")
		}, want: recoverOnly, kmsg: []string{"isolation.json", "invalid character"}},
		{name: "corrupt: empty journal", setup: func(h *host) {
			h.applied("kube1", "nspawn")
			h.applied("kube2", "nspawn")
			h.journal("")
		}, want: recoverOnly, kmsg: []string{"isolation.json", "EOF"}},
		{name: "journal ignored with only one record", setup: func(h *host) {
			h.applied("kube2", "nspawn")
			h.journal("garbage")
		}, want: nodeOutput("nspawn", "systemd-nspawn@kube2.service", "systemd-nspawn@.service")},
		{name: "unreadable record", setup: func(h *host) {
			// Root reads through any mode bits; a directory where the
			// record should be is unreadable for root too.
			os.MkdirAll(h.p.AppliedConfig("kube1"), 0o755)
		}, want: recoverOnly, kmsg: []string{"kube1-applied-config.json", "is a directory"}},
		{name: "unreadable sidecar", setup: func(h *host) {
			h.applied("kube2", "nspawn")
			os.Remove(hostpaths.Checksum(h.p.AppliedConfig("kube2")))
			os.MkdirAll(hostpaths.Checksum(h.p.AppliedConfig("kube2")), 0o755)
		}, want: recoverOnly, kmsg: []string{"kube2-applied-config.json.sha256", "is a directory"}},
		{name: "unreadable journal", setup: func(h *host) {
			h.applied("kube1", "nspawn")
			h.applied("kube2", "nspawn")
			os.MkdirAll(h.p.Journal("isolation"), 0o755)
		}, want: recoverOnly, kmsg: []string{"isolation.json", "is a directory"}},
		{name: "corrupt state with a config does not bootstrap", setup: func(h *host) {
			h.config()
			h.raw("kube2", "{")
		}, want: recoverOnly, kmsg: []string{"kube2-applied-config.json"}},
		{name: "fence unit removed: no node, no daemon, recovery", setup: func(h *host) {
			h.config()
			h.applied("kube2", "nspawn")
			h.removeFence()
		}, want: recoverOnly, kmsg: []string{"unbounded-fence.service", "not in /etc/systemd/system, /run/systemd/system or /usr/lib/systemd/system", "node and daemon not started"}},
		{name: "fence unit only in /etc is enough", setup: func(h *host) {
			h.applied("kube1", "none")
			h.removeFence()
			h.write("/etc/systemd/system/unbounded-fence.service", "[Service]\nType=oneshot\nExecStart=/bin/true\n")
		}, want: nodeOutput("none", "unbounded-containerd.service", "unbounded-containerd.service", "unbounded-kubelet.service", "unbounded-kubelet.service")},
		{name: "fence masked by the operator: no node, no daemon, recovery", setup: func(h *host) {
			h.applied("kube1", "container")
			os.MkdirAll(h.p.Join("/etc/systemd/system"), 0o755)
			os.Symlink("/dev/null", h.p.Join("/etc/systemd/system/unbounded-fence.service"))
		}, want: recoverOnly, kmsg: []string{"masked by /etc/systemd/system/unbounded-fence.service"}},
		{name: "nspawn without systemd-nspawn@.service: no node, no daemon, recovery", setup: func(h *host) {
			h.config()
			h.applied("kube2", "nspawn")
			h.remove(unitDir + "systemd-nspawn@.service")
		}, want: recoverOnly, kmsg: []string{"mode nspawn", "systemd-nspawn@kube2.service (nor systemd-nspawn@.service) not in /etc/systemd/system, /run/systemd/system or /usr/lib/systemd/system", "node and daemon not started"}},
		{name: "none without the kubelet unit: no node, no daemon, recovery", setup: func(h *host) {
			h.applied("kube1", "none")
			h.remove(unitDir + "unbounded-kubelet.service")
		}, want: recoverOnly, kmsg: []string{"mode none", "no usable node unit: unbounded-kubelet.service not in /etc/systemd/system"}},
		{name: "node unit masked by the operator: no node, no daemon, recovery", setup: func(h *host) {
			h.applied("kube1", "container")
			h.mask("unbounded-container@kube1.service")
		}, want: recoverOnly, kmsg: []string{"mode container", "unbounded-container@kube1.service: masked by /etc/systemd/system/unbounded-container@kube1.service"}},
		{name: "an instance file without its template starts the node", setup: func(h *host) {
			h.applied("kube1", "nspawn")
			h.remove(unitDir + "systemd-nspawn@.service")
			h.write("/etc/systemd/system/systemd-nspawn@kube1.service", "[Service]\nExecStart=/bin/true\n")
		}, want: nodeOutput("nspawn", "systemd-nspawn@kube1.service", "systemd-nspawn@.service")},
		{name: "fence and node unit both missing: one line naming both", setup: func(h *host) {
			h.applied("kube2", "none")
			h.removeFence()
			h.remove(unitDir + "unbounded-containerd.service")
		}, want: recoverOnly, kmsg: []string{"no usable unbounded-fence.service", "mode none", "unbounded-containerd.service not in"}},
		{name: "node units missing on a fresh host do not matter", setup: func(h *host) {
			h.config()
			for _, f := range nodeUnitFiles {
				h.remove(f)
			}
		}, want: []string{wants("multi-user.target", "unbounded-bootstrap.service", "unbounded-bootstrap.service")}},
		{name: "fence missing on a fresh host does not matter", setup: func(h *host) {
			h.config()
			h.removeFence()
		}, want: []string{wants("multi-user.target", "unbounded-bootstrap.service", "unbounded-bootstrap.service")}},
		{name: "fence missing while owned does not matter", setup: func(h *host) {
			h.applied("kube1", "nspawn")
			h.owned(state.Ownership{Owner: "bootstrap", Unit: "unbounded-bootstrap.service"})
			h.removeFence()
		}, want: []string{wants("multi-user.target", "unbounded-bootstrap.service", "unbounded-bootstrap.service")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHost(t)
			tc.setup(h)
			_, got, kmsg, stderr := h.run()
			if !reflect.DeepEqual(got, tc.want) && (len(got) != 0 || len(tc.want) != 0) {
				t.Errorf("output:\n got %q\nwant %q", got, tc.want)
			}
			checkKmsg(t, kmsg, tc.kmsg)
			if stderr != "" {
				t.Errorf("stderr %q: kmsg was writable, nothing belongs on stderr", stderr)
			}
		})
	}
}

func checkKmsg(t *testing.T, kmsg string, want []string) {
	t.Helper()
	if want == nil {
		if kmsg != "" {
			t.Errorf("kmsg %q, want nothing", kmsg)
		}
		return
	}
	if !strings.HasPrefix(kmsg, "<3>unbounded-generator: ") || strings.Count(kmsg, "\n") != 1 || !strings.HasSuffix(kmsg, "\n") {
		t.Errorf("kmsg %q is not one line \"<3>unbounded-generator: ...\"", kmsg)
	}
	for _, w := range want {
		if !strings.Contains(kmsg, w) {
			t.Errorf("kmsg %q does not contain %q", kmsg, w)
		}
	}
}

func TestGeneratorExitsZeroOnWrongArguments(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{},
		{"a", "b"},
		{"a", "b", "c", "d"},
		{"--no-such-flag", "a", "b", "c"},
		{"--root"}, // a flag without its value
	} {
		h := newHost(t)
		h.config()
		out := t.TempDir()
		// --root comes first so that even a parse error reports into
		// the test root, not the real /dev/kmsg.
		full := append([]string{"--root", h.p.Root}, args...)
		cmd := exec.Command(binary, full...)
		cmd.Dir = out // relative "a" would land here
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Run(); err != nil {
			t.Errorf("%q: exit %v, want 0", full, err)
		}
		if got := listTree(t, out); len(got) != 0 {
			t.Errorf("%q: wrote %q", full, got)
		}
		k, _ := os.ReadFile(h.p.Kmsg())
		report := string(k) + stderr.String()
		if !strings.Contains(report, "unbounded-generator: bad arguments") {
			t.Errorf("%q: no report (kmsg %q, stderr %q)", full, k, stderr.String())
		}
	}
}

func TestGeneratorAcceptsASingleOutputDirectory(t *testing.T) {
	t.Parallel()
	h := newHost(t)
	h.config()
	out := t.TempDir()
	got, kmsg, _ := h.runInto(out, "--root", h.p.Root, out)
	want := []string{wants("multi-user.target", "unbounded-bootstrap.service", "unbounded-bootstrap.service")}
	if !reflect.DeepEqual(got, want) || kmsg != "" {
		t.Fatalf("got %q kmsg %q", got, kmsg)
	}
}

func TestGeneratorReportsOnStderrWhenKmsgIsMissing(t *testing.T) {
	t.Parallel()
	h := newHost(t)
	os.Remove(h.p.Kmsg())
	h.raw("kube1", "garbage")
	_, got, _, stderr := h.run()
	if !reflect.DeepEqual(got, recoverOnly) {
		t.Errorf("output %q", got)
	}
	if !strings.HasPrefix(stderr, "unbounded-generator: ") || !strings.Contains(stderr, "kube1-applied-config.json") || strings.Contains(stderr, "<3>") {
		t.Errorf("stderr %q", stderr)
	}
}

func TestGeneratorRerunConvergesWithoutEmptiedDirectories(t *testing.T) {
	t.Parallel()
	h := newHost(t)
	h.applied("kube1", "nspawn")
	out, first, _, _ := h.run()
	args := []string{"--root", h.p.Root, out, out, out}
	if again, _, _ := h.runInto(out, args...); !reflect.DeepEqual(again, first) {
		t.Fatalf("second run changed the output:\n%q\n%q", first, again)
	}
	// Repave to kube2 in none mode, then reload without systemd emptying
	// the directory: only the new slot's units remain.
	state.RemoveApplied(h.p, "kube1")
	h.applied("kube2", "none")
	got, kmsg, _ := h.runInto(out, args...)
	want := nodeOutput("none", "unbounded-containerd.service", "unbounded-containerd.service", "unbounded-kubelet.service", "unbounded-kubelet.service")
	if !reflect.DeepEqual(got, want) || kmsg != "" {
		t.Fatalf("after the state changed:\n got %q\nwant %q (kmsg %q)", got, want, kmsg)
	}
}

// TestGeneratorLinksNoKubernetesClientAndNoTOML keeps the generator small
// and fast: it needs neither the cluster nor the config's content.
func TestGeneratorLinksNoKubernetesClientAndNoTOML(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatal(err)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 10 {
		t.Fatalf("go list -deps gave %d packages; the check would prove nothing", len(deps))
	}
	for _, d := range deps {
		if strings.HasPrefix(d, "k8s.io/") || strings.HasPrefix(d, "github.com/BurntSushi/toml") || strings.HasPrefix(d, "net/http") {
			t.Errorf("the generator links %s", d)
		}
	}
}

// maxBinarySize is the generator's size budget (BenchmarkGenerator says
// why), well under the 5 MB of ARCHITECTURE section 3 for a binary without
// a Kubernetes client.
const maxBinarySize = 3 << 20

func TestGeneratorBinaryIsUnder3MB(t *testing.T) {
	fi, err := os.Stat(binary)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("binary size %d bytes (%.2f MB)", fi.Size(), float64(fi.Size())/(1<<20))
	if fi.Size() >= maxBinarySize {
		t.Fatalf("binary is %d bytes, budget %d", fi.Size(), maxBinarySize)
	}
}
