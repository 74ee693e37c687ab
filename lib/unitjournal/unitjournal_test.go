package unitjournal

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// journalctl's --since is the request's time to the microsecond: whole
// seconds would take in the lines of a run that ended earlier in the same
// second, and call the operation's unit run when it never started.
func TestJournalQuerySinceKeepsSubSecondPrecision(t *testing.T) {
	dir := t.TempDir()
	script := "#!/bin/sh\nfor a in \"$@\"; do echo \"$a\"; done\n"
	if err := os.WriteFile(filepath.Join(dir, "journalctl"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir)
	since := time.Unix(1700000000, 250_000_000)
	args, err := Read(context.Background(), Query{Unit: "unbounded-restart.service", Since: since, Lines: 100})
	if err != nil {
		t.Fatal(err)
	}
	for i, a := range args {
		if a == "--since" && i+1 < len(args) {
			if got := args[i+1]; got != "@1700000000.250000" {
				t.Fatalf("--since %s, want @1700000000.250000", got)
			}
			return
		}
	}
	t.Fatalf("no --since in %q", args)
}

// A finished run is read by its unit and start time, not by its invocation
// ID: journald leaves _SYSTEMD_INVOCATION_ID off the stdout lines of a
// process whose cgroup is already gone, and the report would lose exactly
// the lines that say why the unit failed.
func TestJournalQueryOfARunSelectsTheUnitSinceItStarted(t *testing.T) {
	dir := t.TempDir()
	script := "#!/bin/sh\nfor a in \"$@\"; do echo \"$a\"; done\n"
	if err := os.WriteFile(filepath.Join(dir, "journalctl"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir)
	started := time.Unix(1700000000, 125_000_000)
	args, err := Read(context.Background(), Query{
		Unit: "unbounded-repave.service", Invocation: "0123456789abcdef0123456789abcdef",
		StartedAt: started, Lines: 20,
	})
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(args, " ")
	for _, want := range []string{"--since @1700000000.125000", "-u unbounded-repave.service"} {
		if !strings.Contains(got, want) {
			t.Errorf("journalctl %s: lacks %q", got, want)
		}
	}
	if strings.Contains(got, "INVOCATION_ID") {
		t.Errorf("journalctl %s: matches the invocation ID, which the unit's own lines may lack", got)
	}
}

// With a start time, journalctl is not given -n (with --since it would
// show the first lines of the run): the last Lines of its output are kept.
func TestJournalQuerySinceKeepsTheLastLinesOfTheRun(t *testing.T) {
	dir := t.TempDir()
	// A journalctl that refuses -n and prints 50 lines.
	script := "#!/bin/sh\nfor a in \"$@\"; do if [ \"$a\" = -n ]; then echo '-n given' >&2; exit 1; fi; done\ni=1\nwhile [ $i -le 50 ]; do echo \"line $i\"; i=$((i+1)); done\n"
	if err := os.WriteFile(filepath.Join(dir, "journalctl"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir)
	lines, err := Read(context.Background(), Query{Unit: "unbounded-repave.service", Since: time.Unix(1700000000, 0), Lines: 20})
	if err != nil {
		t.Fatal(err)
	}
	if len(lines) != 20 || lines[0] != "line 31" || lines[19] != "line 50" {
		t.Fatalf("lines = %q, want line 31 .. line 50", lines)
	}
}
