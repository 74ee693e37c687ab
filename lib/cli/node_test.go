package cli

import (
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"unbounded-cloud.io/agent/lib/hostpaths"
)

// logs and exec find the active node from the applied records and run the
// tool for its mode and slot; the tool's exit status is the command's.
func TestLogsAndExecRunTheToolOfTheActiveNode(t *testing.T) {
	var got, gotEnv []string
	code := 0
	env := Env{Stdin: strings.NewReader(""), RunTool: func(argv, environ []string, _ io.Reader, _, _ io.Writer) (int, error) {
		got, gotEnv = argv, environ
		return code, nil
	}}
	root, p := newRoot(t)
	bootstrap(t, p, "kube2", "nspawn")
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"logs"}, []string{"journalctl", "--no-pager", "-u", "kubelet.service", "-n", "100", "-M", "kube2"}},
		{[]string{"logs", "containerd", "-f", "-n", "5"}, []string{"journalctl", "--no-pager", "-u", "containerd.service", "-n", "5", "-M", "kube2", "-f"}},
		{[]string{"exec", "--", "cat", "/etc/hostname"}, []string{"systemd-run", "-M", "kube2", "--wait", "--collect", "--quiet", "--pipe", "--", "cat", "/etc/hostname"}},
	} {
		got = nil
		args := append([]string{tc.args[0], "--root", root}, tc.args[1:]...) // flags before exec's --
		if r := run(t, env, args...); r.code != 0 || !slices.Equal(got, tc.want) {
			t.Errorf("%v: exit %d (%s), ran %q, want %q", tc.args, r.code, r.stderr, got, tc.want)
		}
	}
	code = 3
	if r := run(t, env, "exec", "--root", root, "--", "false"); r.code != 3 {
		t.Errorf("exec of a command that exits 3: exit %d, want 3", r.code)
	}
	code = 0

	root, p = newRoot(t)
	bootstrap(t, p, "kube1", "none")
	if r := run(t, env, "logs", "--root", root); r.code != 0 || !slices.Equal(got, []string{"journalctl", "--no-pager", "-u", "unbounded-kubelet.service", "-n", "100"}) {
		t.Errorf("logs in mode none: exit %d, ran %q", r.code, got)
	}
	// The running version's tools come first, for the command and for
	// what it runs; a command found nowhere there is the host's.
	bin := filepath.Join(p.Join(hostpaths.VersionsCurrentHost), "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bin, "crictl"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	path := func() string {
		for _, kv := range gotEnv {
			if v, ok := strings.CutPrefix(kv, "PATH="); ok {
				return v
			}
		}
		return ""
	}
	if r := run(t, env, "exec", "--root", root, "--", "crictl", "ps"); r.code != 0 || !slices.Equal(got, []string{filepath.Join(bin, "crictl"), "ps"}) ||
		!strings.HasPrefix(path(), bin+":") {
		t.Errorf("exec in mode none: exit %d, ran %q with PATH %q", r.code, got, path())
	}
	if r := run(t, env, "exec", "--root", root, "--", "sh", "-c", "exit 0"); r.code != 0 || len(got) != 3 || filepath.Base(got[0]) != "sh" ||
		strings.HasPrefix(got[0], bin) || !slices.Equal(got[1:], []string{"-c", "exit 0"}) {
		t.Errorf("exec in mode none of a host command: exit %d, ran %q", r.code, got)
	}
}

// Without a node, or with two records and no journal saying which runs,
// they refuse and run nothing.
func TestLogsAndExecRefuseWithoutOneActiveNode(t *testing.T) {
	ran := false
	env := Env{RunTool: func(_, _ []string, _ io.Reader, _, _ io.Writer) (int, error) { ran = true; return 0, nil }}
	root, _ := newRoot(t)
	if r := run(t, env, "logs", "--root", root); r.code != 1 || !strings.Contains(r.stderr, "not bootstrapped") {
		t.Errorf("no node: exit %d: %s", r.code, r.stderr)
	}
	root, p := newRoot(t)
	bootstrap(t, p, "kube1", "nspawn")
	bootstrap(t, p, "kube2", "nspawn")
	if r := run(t, env, "exec", "--root", root, "--", "true"); r.code == 0 || !strings.Contains(r.stderr, "which node runs is not known") {
		t.Errorf("two records: exit %d: %s", r.code, r.stderr)
	}
	if r := run(t, env, "exec", "--root", root); r.code == 0 {
		t.Errorf("exec without a command: exit %d", r.code)
	}
	if ran {
		t.Error("a tool ran without one active node")
	}
}
