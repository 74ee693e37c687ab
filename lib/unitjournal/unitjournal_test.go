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
	args, err := Read(context.Background(), Query{Unit: "unbounded-restart.service", Since: since, Lines: 1})
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
