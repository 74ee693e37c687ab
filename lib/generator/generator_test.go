package generator

import (
	"bytes"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/state"
)

// linkSet renders a plan's links as "path -> target" lines, sorted.
func linkSet(p Plan) []string {
	var s []string
	for _, l := range p.Links {
		s = append(s, l.Path+" -> "+l.Target)
	}
	sort.Strings(s)
	return s
}

func TestDecideFollowsTheContractRulesInOrder(t *testing.T) {
	nspawn2 := &state.AppliedConfig{Slot: "kube2", Mode: "nspawn"}
	corrupt := errors.New("checksum mismatch")
	const u = "/usr/lib/systemd/system/"
	for _, tc := range []struct {
		name     string
		in       Input
		links    []string
		dropIns  []string
		problem  string
		noIssues bool
	}{
		{name: "fresh host without config writes nothing", in: Input{}},
		{name: "fresh host with config pulls in bootstrap", in: Input{ConfigExists: true},
			links: []string{"multi-user.target.wants/unbounded-bootstrap.service -> " + u + "unbounded-bootstrap.service"}},
		{name: "config that cannot be stat'ed starts nothing and reports", in: Input{ConfigErr: fs.ErrPermission},
			problem: "cannot tell whether the config exists"},
		{name: "ownership wins over an applied config and a config file",
			in:    Input{Ownership: &state.Ownership{Owner: "reprovision", Unit: "unbounded-reprovision.service"}, Active: nspawn2, ConfigExists: true},
			links: []string{"multi-user.target.wants/unbounded-reprovision.service -> " + u + "unbounded-reprovision.service"}},
		{name: "ownership of a template instance links the template",
			in:    Input{Ownership: &state.Ownership{Owner: "reset", Unit: "unbounded-reset@keep.service"}},
			links: []string{"multi-user.target.wants/unbounded-reset@keep.service -> " + u + "unbounded-reset@.service"}},
		{name: "ownership without unit starts nothing", in: Input{Ownership: &state.Ownership{Owner: "bootstrap"}}},
		{name: "ownership naming a foreign unit is not resumed",
			in: Input{Ownership: &state.Ownership{Owner: "bootstrap", Unit: "sshd.service"}}, problem: `"sshd.service"`},
		{name: "ownership naming the daemon does not start it",
			in: Input{Ownership: &state.Ownership{Owner: "bootstrap", Unit: "unbounded-daemon.service"}}, problem: "part of the node or the daemon"},
		{name: "ownership naming a node unit does not start it",
			in: Input{Ownership: &state.Ownership{Owner: "bootstrap", Unit: "unbounded-container@kube9.service"}}, problem: "part of the node or the daemon"},
		{name: "ownership naming a target is not resumed",
			in: Input{Ownership: &state.Ownership{Owner: "bootstrap", Unit: "unbounded-node.target"}}, problem: "not an unbounded-* service"},
		{name: "ownership naming a path is not resumed",
			in: Input{Ownership: &state.Ownership{Owner: "bootstrap", Unit: "unbounded-../../etc/x.service"}}, problem: "not an unbounded-* service"},
		{name: "unreadable ownership record fails closed",
			in: Input{Ownership: &state.Ownership{Owner: "unknown"}, OwnershipErr: state.ErrCorrupt, Active: nspawn2}, problem: "ownership record unreadable"},
		{name: "corrupt applied state pulls in recovery only",
			in:      Input{ActiveErr: corrupt, ConfigExists: true},
			links:   []string{"multi-user.target.wants/unbounded-recover@generator.service -> " + u + "unbounded-recover@.service"},
			problem: "checksum mismatch"},
		{name: "nspawn kube2 wants node target, daemon, mode target and the fenced machine",
			in: Input{Active: nspawn2, ConfigExists: true},
			links: []string{
				"multi-user.target.wants/unbounded-daemon.service -> " + u + "unbounded-daemon.service",
				"multi-user.target.wants/unbounded-node.target -> " + u + "unbounded-node.target",
				"unbounded-mode-nspawn.target.wants/systemd-nspawn@kube2.service -> " + u + "systemd-nspawn@.service",
				"unbounded-node.target.wants/unbounded-mode-nspawn.target -> " + u + "unbounded-mode-nspawn.target",
			},
			dropIns: []string{"systemd-nspawn@kube2.service.d/50-unbounded-fence.conf"}},
		{name: "none mode fences both runtime units",
			in: Input{Active: &state.AppliedConfig{Slot: "kube1", Mode: "none"}},
			links: []string{
				"multi-user.target.wants/unbounded-daemon.service -> " + u + "unbounded-daemon.service",
				"multi-user.target.wants/unbounded-node.target -> " + u + "unbounded-node.target",
				"unbounded-mode-none.target.wants/unbounded-containerd.service -> " + u + "unbounded-containerd.service",
				"unbounded-mode-none.target.wants/unbounded-kubelet.service -> " + u + "unbounded-kubelet.service",
				"unbounded-node.target.wants/unbounded-mode-none.target -> " + u + "unbounded-mode-none.target",
			},
			dropIns: []string{"unbounded-containerd.service.d/50-unbounded-fence.conf", "unbounded-kubelet.service.d/50-unbounded-fence.conf"}},
		{name: "a mode lib/state should have rejected still pulls in recovery",
			in:      Input{Active: &state.AppliedConfig{Slot: "kube1", Mode: "vm"}},
			links:   []string{"multi-user.target.wants/unbounded-recover@generator.service -> " + u + "unbounded-recover@.service"},
			problem: `mode "vm"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := Decide(tc.in)
			if got := linkSet(p); !reflect.DeepEqual(got, tc.links) && (len(got) != 0 || len(tc.links) != 0) {
				t.Errorf("links:\n got %q\nwant %q", got, tc.links)
			}
			var files []string
			for _, f := range p.Files {
				files = append(files, f.Path)
				if !strings.HasSuffix(f.Content, "[Unit]\nRequires=unbounded-fence.service\nAfter=unbounded-fence.service\n") {
					t.Errorf("drop-in %s content %q", f.Path, f.Content)
				}
			}
			sort.Strings(files)
			if !reflect.DeepEqual(files, tc.dropIns) && (len(files) != 0 || len(tc.dropIns) != 0) {
				t.Errorf("drop-ins: got %q want %q", files, tc.dropIns)
			}
			if (p.Problem == "") != (tc.problem == "") || !strings.Contains(p.Problem, tc.problem) {
				t.Errorf("problem %q, want one containing %q", p.Problem, tc.problem)
			}
		})
	}
}

func TestReadStopsAtOwnershipAndAtActiveState(t *testing.T) {
	var calls []string
	h := Host{
		ReadOwnership: func(hostpaths.Paths) (*state.Ownership, error) { calls = append(calls, "own"); return nil, nil },
		ReadActive: func(hostpaths.Paths) (*state.AppliedConfig, error) {
			calls = append(calls, "active")
			return &state.AppliedConfig{Slot: "kube1", Mode: "none"}, nil
		},
		Stat: func(string) (fs.FileInfo, error) { calls = append(calls, "stat"); return nil, nil },
	}
	in := h.Read(hostpaths.New("/x"))
	if in.Active == nil || !reflect.DeepEqual(calls, []string{"own", "active"}) {
		t.Fatalf("input %+v, calls %v: the config should not be looked at on a bootstrapped host", in, calls)
	}
}

func TestReadTreatsStatErrorOtherThanNotExistAsConfigError(t *testing.T) {
	h := Host{
		ReadOwnership: func(hostpaths.Paths) (*state.Ownership, error) { return nil, nil },
		ReadActive:    func(hostpaths.Paths) (*state.AppliedConfig, error) { return nil, nil },
		Stat:          func(string) (fs.FileInfo, error) { return nil, fs.ErrPermission },
	}
	if in := h.Read(hostpaths.New("/x")); in.ConfigExists || !errors.Is(in.ConfigErr, fs.ErrPermission) {
		t.Fatalf("got %+v", in)
	}
	h.Stat = func(string) (fs.FileInfo, error) { return nil, fs.ErrNotExist }
	if in := h.Read(hostpaths.New("/x")); in.ConfigExists || in.ConfigErr != nil {
		t.Fatalf("missing config: got %+v", in)
	}
}

type bufCloser struct {
	bytes.Buffer
	closeErr error
}

func (b *bufCloser) Close() error { return b.closeErr }

func TestReportWritesOneEscapedLineWithHostPathsToKmsg(t *testing.T) {
	var kmsg bufCloser
	var opened string
	h := Host{OpenKmsg: func(path string) (io.WriteCloser, error) { opened = path; return &kmsg, nil }}
	h.Report(hostpaths.New("/tmp/r"), "bad /tmp/r/var/lib/unbounded/kube1-applied-config.json: \x00\nx")
	if opened != "/tmp/r/dev/kmsg" {
		t.Errorf("opened %s", opened)
	}
	want := "<3>unbounded-generator: bad /var/lib/unbounded/kube1-applied-config.json: \\x00\\x0ax\n"
	if kmsg.String() != want {
		t.Errorf("got %q\nwant %q", kmsg.String(), want)
	}
}

func TestReportTruncatesToOneKmsgRecord(t *testing.T) {
	var kmsg bufCloser
	h := Host{OpenKmsg: func(string) (io.WriteCloser, error) { return &kmsg, nil }}
	h.Report(hostpaths.New(""), strings.Repeat("x", 5000))
	if n := len(kmsg.String()); n > 1000 || strings.Count(kmsg.String(), "\n") != 1 {
		t.Fatalf("line of %d bytes, %d newlines", n, strings.Count(kmsg.String(), "\n"))
	}
}

func TestReportFallsBackToStderrWhenKmsgCannotBeOpenedOrWritten(t *testing.T) {
	for name, open := range map[string]func(string) (io.WriteCloser, error){
		"open fails":  func(string) (io.WriteCloser, error) { return nil, fs.ErrNotExist },
		"close fails": func(string) (io.WriteCloser, error) { return &bufCloser{closeErr: fs.ErrClosed}, nil },
	} {
		var stderr bytes.Buffer
		Host{OpenKmsg: open, Stderr: &stderr}.Report(hostpaths.New(""), "boom")
		if stderr.String() != "unbounded-generator: boom\n" {
			t.Errorf("%s: stderr %q", name, stderr.String())
		}
	}
}

func TestRunTurnsAPanicIntoAReport(t *testing.T) {
	var kmsg bufCloser
	h := Host{
		ReadOwnership: func(hostpaths.Paths) (*state.Ownership, error) { panic("seam exploded") },
		OpenKmsg:      func(string) (io.WriteCloser, error) { return &kmsg, nil },
	}
	h.Run(hostpaths.New(t.TempDir()), t.TempDir())
	if !strings.Contains(kmsg.String(), "internal error: seam exploded") {
		t.Fatalf("kmsg %q", kmsg.String())
	}
}

func TestRunReportsUnwritableOutput(t *testing.T) {
	var kmsg bufCloser
	out := filepath.Join(t.TempDir(), "file")
	os.WriteFile(out, nil, 0o644) // the output "directory" is a file
	h := Host{
		ReadOwnership: func(hostpaths.Paths) (*state.Ownership, error) { return nil, nil },
		ReadActive:    func(hostpaths.Paths) (*state.AppliedConfig, error) { return nil, nil },
		Stat:          func(string) (fs.FileInfo, error) { return nil, nil },
		OpenKmsg:      func(string) (io.WriteCloser, error) { return &kmsg, nil },
	}
	h.Run(hostpaths.New(t.TempDir()), out)
	if !strings.Contains(kmsg.String(), "cannot write generator output") {
		t.Fatalf("kmsg %q", kmsg.String())
	}
}

// tree lists dir as "path -> target" for links and "path: content" for files.
func tree(t *testing.T, dir string) []string {
	t.Helper()
	var s []string
	filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		if d.Type()&fs.ModeSymlink != 0 {
			target, _ := os.Readlink(path)
			s = append(s, rel+" -> "+target)
		} else {
			data, _ := os.ReadFile(path)
			s = append(s, rel+": "+string(data))
		}
		return nil
	})
	sort.Strings(s)
	return s
}

func planTree(p Plan) []string {
	s := linkSet(p)
	for _, f := range p.Files {
		s = append(s, f.Path+": "+f.Content)
	}
	sort.Strings(s)
	return s
}

func TestWriteIsIdempotentAndConvergesAfterAStateChange(t *testing.T) {
	dir := t.TempDir()
	// Another generator's output shares multi-user.target.wants and a .d
	// directory: it must survive.
	os.MkdirAll(filepath.Join(dir, "multi-user.target.wants"), 0o755)
	os.Symlink("/usr/lib/systemd/system/other.service", filepath.Join(dir, "multi-user.target.wants/other.service"))
	os.MkdirAll(filepath.Join(dir, "systemd-nspawn@kube1.service.d"), 0o755)
	os.WriteFile(filepath.Join(dir, "systemd-nspawn@kube1.service.d/10-other.conf"), []byte("x"), 0o644)
	others := []string{"multi-user.target.wants/other.service -> /usr/lib/systemd/system/other.service", "systemd-nspawn@kube1.service.d/10-other.conf: x"}

	steps := []Input{
		{Active: &state.AppliedConfig{Slot: "kube1", Mode: "nspawn"}},
		{Active: &state.AppliedConfig{Slot: "kube1", Mode: "nspawn"}},
		{Active: &state.AppliedConfig{Slot: "kube2", Mode: "none"}},
		{ActiveErr: state.ErrCorrupt},
		{ConfigExists: true},
		{Active: &state.AppliedConfig{Slot: "kube2", Mode: "container"}},
		{},
	}
	for i, in := range steps {
		p := Decide(in)
		if err := Write(dir, p); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		want := append(planTree(p), others...)
		sort.Strings(want)
		if got := tree(t, dir); !reflect.DeepEqual(got, want) {
			t.Fatalf("step %d (%+v):\n got %q\nwant %q", i, in, got, want)
		}
	}
}

func TestWriteReplacesAStaleLinkAndDropIn(t *testing.T) {
	dir := t.TempDir()
	p := Decide(Input{Active: &state.AppliedConfig{Slot: "kube2", Mode: "nspawn"}})
	os.MkdirAll(filepath.Join(dir, "unbounded-node.target.wants"), 0o755)
	os.Symlink("/wrong", filepath.Join(dir, "unbounded-node.target.wants/unbounded-mode-nspawn.target"))
	os.MkdirAll(filepath.Join(dir, "systemd-nspawn@kube2.service.d"), 0o755)
	os.WriteFile(filepath.Join(dir, "systemd-nspawn@kube2.service.d", FenceDropIn), []byte("old"), 0o644)
	if err := Write(dir, p); err != nil {
		t.Fatal(err)
	}
	if got, want := tree(t, dir), planTree(p); !reflect.DeepEqual(got, want) {
		t.Fatalf("got %q\nwant %q", got, want)
	}
}

func TestValidUnitName(t *testing.T) {
	for name, want := range map[string]bool{
		"unbounded-bootstrap.service":         true,
		"unbounded-reset@keep.service":        true,
		"unbounded-x.target":                  false,
		"unbounded-x.socket":                  false,
		"unbounded-a/b.service":               false,
		"unbounded-..service":                 false,
		"unbounded-a@b@c.service":             false,
		"unbounded-a b.service":               false,
		strings.Repeat("a", 250) + ".service": false,
	} {
		if got := validUnitName(name); got != want {
			t.Errorf("validUnitName(%q) = %v, want %v", name, got, want)
		}
	}
}
