package unitjournal

import (
	"context"
	"fmt"
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

// fakeJournalctl puts a journalctl on PATH that records its arguments in
// the returned file and prints out (for -o json) or nothing (--sync).
func fakeJournalctl(t *testing.T, out string) string {
	t.Helper()
	dir := t.TempDir()
	args := filepath.Join(dir, "args")
	if err := os.WriteFile(filepath.Join(dir, "out"), []byte(out), 0o644); err != nil {
		t.Fatal(err)
	}
	script := "#!/bin/sh\n[ \"$1\" = --sync ] && exit 0\nfor a in \"$@\"; do echo \"$a\"; done > " + args + "\nwhile IFS= read -r l; do echo \"$l\"; done < " + filepath.Join(dir, "out") + "\n"
	if err := os.WriteFile(filepath.Join(dir, "journalctl"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir)
	return args
}

func jsonEntry(msg string, at time.Time, fields ...string) string {
	s := fmt.Sprintf(`{"__REALTIME_TIMESTAMP":"%d","MESSAGE":%q`, at.UnixMicro(), msg)
	for i := 0; i+1 < len(fields); i += 2 {
		s += fmt.Sprintf(`,%q:%q`, fields[i], fields[i+1])
	}
	return s + "}\n"
}

// A finished run is read by its unit from a little before its start and
// kept by what each line carries, not by a journalctl match on the
// invocation ID: journald leaves _SYSTEMD_INVOCATION_ID off the stdout
// lines of a process whose cgroup is already gone, and may stamp a
// process's first lines before PID 1's InactiveExitTimestamp (PID 1 takes
// it after the fork; here 0.3 ms before). Lines of the run before, in the
// same window, stay out.
func TestJournalQueryOfARunKeepsItsOwnLinesAndNoOtherRuns(t *testing.T) {
	started := time.Unix(1700000000, 125_000_000)
	const unit, inv, prev = "unbounded-test-fails.service", "0123456789abcdef0123456789abcdef", "ffffffffffffffffffffffffffffffff"
	out := jsonEntry("previous run: the disk was fine", started.Add(-time.Second), "_SYSTEMD_UNIT", unit, "_SYSTEMD_INVOCATION_ID", prev, "_PID", "40") +
		jsonEntry("Failed with result 'exit-code' (previous run)", started.Add(-900*time.Millisecond), "UNIT", unit, "INVOCATION_ID", prev, "_PID", "1") +
		jsonEntry("an older line without invocation", started.Add(-500*time.Millisecond), "_SYSTEMD_UNIT", unit, "_PID", "41") +
		jsonEntry("step 1 done", started.Add(-300*time.Microsecond), "_SYSTEMD_UNIT", unit, "_PID", "249") +
		jsonEntry("the disk is on fire (exit 1)", started.Add(-300*time.Microsecond), "_PID", "249") +
		jsonEntry("Starting the unit", started.Add(100*time.Microsecond), "UNIT", unit, "INVOCATION_ID", inv, "_PID", "1") +
		`{"__REALTIME_TIMESTAMP":"1700000000125300","MESSAGE":[98,121,116,101,115],"_SYSTEMD_UNIT":"` + unit + `","_SYSTEMD_INVOCATION_ID":"` + inv + `","_PID":"249"}` + "\n" +
		jsonEntry("Failed with result 'exit-code'", started.Add(time.Millisecond), "UNIT", unit, "INVOCATION_ID", inv, "_PID", "1")
	argsFile := fakeJournalctl(t, out)
	lines, err := Read(context.Background(), Query{Unit: unit, Invocation: inv, StartedAt: started, PID: 249, Lines: 20})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"step 1 done", "the disk is on fire (exit 1)", "Starting the unit", "bytes", "Failed with result 'exit-code'"}
	if strings.Join(lines, "|") != strings.Join(want, "|") {
		t.Errorf("lines = %q,\nwant %q", lines, want)
	}
	a, err := os.ReadFile(argsFile)
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(strings.Fields(string(a)), " ")
	for _, w := range []string{"--since @1699999998.125000", "_SYSTEMD_UNIT=" + unit, "UNIT=" + unit, "_PID=249", "-o json"} {
		if !strings.Contains(got, w) {
			t.Errorf("journalctl %s: lacks %q", got, w)
		}
	}
	if strings.Contains(got, "INVOCATION_ID=") {
		t.Errorf("journalctl %s: matches the invocation ID, which the unit's own lines may lack", got)
	}

	// The last Lines of the run.
	lines, err = Read(context.Background(), Query{Unit: unit, Invocation: inv, StartedAt: started, PID: 249, Lines: 2})
	if err != nil || strings.Join(lines, "|") != "bytes|Failed with result 'exit-code'" {
		t.Errorf("last 2 lines = %q, %v", lines, err)
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
