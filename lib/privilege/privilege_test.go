package privilege

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"testing"

	"unbounded-cloud.io/agent/lib/exitcode"
)

func asUser(t *testing.T, uid int) {
	t.Helper()
	old := euid
	euid = func() int { return uid }
	t.Cleanup(func() { euid = old })
}

func TestFromErrOnlyForAPermissionErrorWithoutRoot(t *testing.T) {
	denied := &fs.PathError{Op: "open", Path: "/var/lib/unbounded", Err: fs.ErrPermission}
	asUser(t, 1000)
	e := FromErr("/var/lib/unbounded", fmt.Errorf("read state: %w", denied))
	if e == nil {
		t.Fatal("permission denied without root is not a needs-root error")
	}
	if want := "needs root: /var/lib/unbounded is readable only by root (permission denied); run it as root"; e.Error() != want {
		t.Errorf("message %q, want %q", e.Error(), want)
	}
	if !errors.Is(e, exitcode.ErrNeedsRoot) || exitcode.For(e) != exitcode.NeedsRoot || !errors.Is(e, fs.ErrPermission) {
		t.Errorf("%v does not map to exit 4 or lost its cause", e)
	}
	if FromErr("x", &fs.PathError{Op: "open", Path: "x", Err: fs.ErrNotExist}) != nil || FromErr("x", nil) != nil {
		t.Error("an error other than permission denied is reported as needs root")
	}
	asUser(t, 0)
	if FromErr("/var/lib/unbounded", denied) != nil {
		t.Error("root is told it needs root")
	}
}

// Check as a user who may read the directories says nothing; a missing
// directory is no problem. (That it refuses what only root may read is
// shown by running the commands as nobody, in lib/cli and
// cmd/unbounded-agent.)
func TestCheckPassesReadableAndMissingDirectories(t *testing.T) {
	asUser(t, 1000)
	dir := t.TempDir()
	if err := Check(dir, dir+"/missing"); err != nil {
		t.Errorf("Check: %v", err)
	}
	if err := os.WriteFile(dir+"/f", nil, 0o600); err != nil {
		t.Fatal(err)
	}
	// A file where a directory is expected is for the reader to report.
	if err := Check(dir + "/f"); err != nil {
		t.Errorf("Check on a file: %v", err)
	}
}
