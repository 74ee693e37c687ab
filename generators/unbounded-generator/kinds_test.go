package main

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/regfile/regfiletest"
	"unbounded-cloud.io/agent/lib/state"
)

// TestGeneratorReturnsOnEveryStateFileThatIsNotARegularFile puts each kind
// of non-regular file, and an oversized one, where each state file the
// generator reads belongs, and runs the built binary within
// generatorBudget (runInto): it must return, write the safe state
// (recovery only) and say on one kmsg line which file is what. Before
// lib/regfile, a FIFO as the ownership record and a symlink to /dev/zero
// as an applied config made it never return.
func TestGeneratorReturnsOnEveryStateFileThatIsNotARegularFile(t *testing.T) {
	t.Parallel()
	files := []struct {
		name  string
		setup func(h *host)
		file  func(p hostpaths.Paths) string
		kmsg  string
	}{
		{"ownership record", func(h *host) { h.applied("kube1", "nspawn") },
			func(p hostpaths.Paths) string { return p.Ownership() }, "ownership record unreadable"},
		{"applied config", func(h *host) { h.applied("kube1", "nspawn") },
			func(p hostpaths.Paths) string { return p.AppliedConfig("kube1") }, "applied state not trusted"},
		{"checksum sidecar", func(h *host) { h.applied("kube2", "container") },
			func(p hostpaths.Paths) string { return hostpaths.Checksum(p.AppliedConfig("kube2")) }, "applied state not trusted"},
		{"in-place journal", func(h *host) { h.applied("kube1", "nspawn"); h.applied("kube2", "none") },
			func(p hostpaths.Paths) string { return p.Journal("isolation") }, "applied state not trusted"},
	}
	type kind struct {
		name, says string
		make       func(t testing.TB, file string)
	}
	var kinds []kind
	for _, k := range regfiletest.Kinds {
		kinds = append(kinds, kind{k.String(), k.Describes(), func(t testing.TB, f string) { regfiletest.Make(t, f, k) }})
	}
	// Over every state file's limit; sparse, so it costs no disk.
	kinds = append(kinds, kind{"oversized file", "more than the limit", func(t testing.TB, f string) { regfiletest.Sparse(t, f, state.MaxRecordSize+1) }})
	for _, f := range files {
		for _, k := range kinds {
			t.Run(f.name+" is a "+k.name, func(t *testing.T) {
				t.Parallel()
				h := newHost(t)
				h.config()
				f.setup(h)
				file := f.file(h.p)
				k.make(t, file)
				_, got, kmsg, stderr := h.run()
				if !reflect.DeepEqual(got, recoverOnly) {
					t.Errorf("output %q, want the safe state %q", got, recoverOnly)
				}
				checkKmsg(t, kmsg, []string{f.kmsg, h.p.Rel(file), k.says})
				if stderr != "" {
					t.Errorf("stderr %q", stderr)
				}
			})
		}
	}
}

// TestGeneratorFollowsSymlinksToRegularStateFiles keeps the host-root
// migration's adoption working: it links the legacy agent's applied
// config and sidecar into the host root.
func TestGeneratorFollowsSymlinksToRegularStateFiles(t *testing.T) {
	t.Parallel()
	h := newHost(t)
	h.applied("kube1", "nspawn")
	legacy := h.p.Join(hostpaths.LegacyStateDirHost)
	os.MkdirAll(legacy, 0o755)
	for _, f := range []string{h.p.AppliedConfig("kube1"), hostpaths.Checksum(h.p.AppliedConfig("kube1"))} {
		moved := filepath.Join(legacy, filepath.Base(f))
		if err := os.Rename(f, moved); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(moved, f); err != nil {
			t.Fatal(err)
		}
	}
	_, got, kmsg, _ := h.run()
	if want := nodeOutput("nspawn", "systemd-nspawn@kube1.service", "systemd-nspawn@.service"); !reflect.DeepEqual(got, want) || kmsg != "" {
		t.Errorf("output %q (kmsg %q), want the node's %q", got, kmsg, want)
	}
}

// TestGeneratorNeverOpensTheConfig: only the config's existence matters
// to the generator, so a FIFO there is "a config exists" (bootstrap then
// fails with 78 naming it), and the generator does not block on it.
func TestGeneratorNeverOpensTheConfig(t *testing.T) {
	t.Parallel()
	h := newHost(t)
	regfiletest.Make(t, h.p.ConfigFile(), regfiletest.FIFO)
	_, got, kmsg, _ := h.run()
	if want := []string{wants("multi-user.target", "unbounded-bootstrap.service", "unbounded-bootstrap.service")}; !reflect.DeepEqual(got, want) || kmsg != "" {
		t.Errorf("output %q (kmsg %q), want %q", got, kmsg, want)
	}
}

// TestGeneratorReportsOnStderrWhenKmsgIsAFIFO: opening a FIFO for writing
// blocks until a reader comes; the generator must report elsewhere and
// return instead.
func TestGeneratorReportsOnStderrWhenKmsgIsAFIFO(t *testing.T) {
	t.Parallel()
	h := newHost(t)
	regfiletest.Make(t, h.p.Kmsg(), regfiletest.FIFO)
	h.raw("kube1", "garbage")
	_, got, _, stderr := h.run()
	if !reflect.DeepEqual(got, recoverOnly) {
		t.Errorf("output %q", got)
	}
	if !strings.HasPrefix(stderr, "unbounded-generator: ") || !strings.Contains(stderr, "kube1-applied-config.json") {
		t.Errorf("stderr %q", stderr)
	}
}
