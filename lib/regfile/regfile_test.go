package regfile

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"unbounded-cloud.io/agent/tests/tiers"
)

// hangDetector bounds each Read in these tests. It detects a Read that
// blocks (which would block forever), not a slow one: on a loaded 2-core
// machine a single read of a small file still finishes far inside it.
const hangDetector = 2 * time.Second

// read runs Read with the hang detector; the goroutine of a Read that
// hangs is leaked, and the test fails.
func read(t *testing.T, path string, limit int64) ([]byte, error) {
	t.Helper()
	type result struct {
		data []byte
		err  error
	}
	ctx, cancel := context.WithTimeout(context.Background(), hangDetector)
	defer cancel()
	ch := make(chan result, 1)
	go func() {
		d, err := Read(path, limit)
		ch <- result{d, err}
	}()
	select {
	case r := <-ch:
		return r.data, r.err
	case <-ctx.Done():
		t.Fatalf("Read(%s) did not return within %v: it blocks", path, hangDetector)
		return nil, nil
	}
}

func TestReadReturnsARegularFileAndFollowsSymlinksToOne(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "record.json")
	os.WriteFile(f, []byte(`{"slot":"kube1"}`), 0o600)
	link := filepath.Join(dir, "link.json")
	os.Symlink(f, link)
	empty := filepath.Join(dir, "empty")
	os.WriteFile(empty, nil, 0o600)
	for _, p := range []string{f, link} {
		if got, err := read(t, p, 1<<10); err != nil || string(got) != `{"slot":"kube1"}` {
			t.Errorf("%s: %q, %v", p, got, err)
		}
	}
	if got, err := read(t, empty, 1<<10); err != nil || len(got) != 0 {
		t.Errorf("empty file: %q, %v", got, err)
	}
}

func TestReadOfAMissingFileOrDanglingLinkIsNotExist(t *testing.T) {
	dir := t.TempDir()
	dangling := filepath.Join(dir, "dangling")
	os.Symlink(filepath.Join(dir, "nowhere"), dangling)
	for _, p := range []string{filepath.Join(dir, "missing"), dangling} {
		_, err := read(t, p, 1<<10)
		if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), p) {
			t.Errorf("%s: %v, want not-exist naming the file", p, err)
		}
	}
}

// TestReadRefusesEveryOtherKindWithoutBlocking is the reason for the
// package: none of these may block, and each error says what the file is.
func TestReadRefusesEveryOtherKindWithoutBlocking(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	fifoLink := filepath.Join(dir, "fifo-link")
	os.Symlink(fifo, fifoLink)
	zero := filepath.Join(dir, "zero")
	os.Symlink("/dev/zero", zero)
	sub := filepath.Join(dir, "dir")
	os.Mkdir(sub, 0o755)
	// mknod of a socket needs no privilege, and no path length limit
	// applies as it would to bind(2).
	sock := filepath.Join(dir, "sock")
	if err := unix.Mknod(sock, unix.S_IFSOCK|0o600, 0); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ path, kind string }{
		{fifo, "a named pipe (FIFO)"},
		{fifoLink, "a named pipe (FIFO)"},
		{zero, "a character device"},
		{sub, "a directory"},
		{sock, "a socket"},
	} {
		_, err := read(t, tc.path, 1<<20)
		if !errors.Is(err, ErrNotRegular) || !strings.Contains(err.Error(), tc.path) || !strings.Contains(err.Error(), "is "+tc.kind) {
			t.Errorf("%s: %v, want ErrNotRegular naming the file and %q", tc.path, err, tc.kind)
		}
	}
}

func TestReadEnforcesTheLimit(t *testing.T) {
	dir := t.TempDir()
	at := filepath.Join(dir, "at-limit")
	os.WriteFile(at, bytes.Repeat([]byte("x"), 100), 0o600)
	if got, err := read(t, at, 100); err != nil || len(got) != 100 {
		t.Errorf("a file of exactly the limit: %d bytes, %v", len(got), err)
	}
	over := filepath.Join(dir, "over")
	os.WriteFile(over, bytes.Repeat([]byte("x"), 101), 0o600)
	if _, err := read(t, over, 100); !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), over) {
		t.Errorf("one byte over: %v, want ErrTooLarge naming the file", err)
	}
	// A sparse file claims a terabyte and costs nothing on disk: refused
	// on its size, before a byte is read.
	sparse := filepath.Join(dir, "sparse")
	f, err := os.Create(sparse)
	if err != nil {
		t.Fatal(err)
	}
	f.Truncate(1 << 40)
	f.Close()
	if _, err := read(t, sparse, 1<<20); !errors.Is(err, ErrTooLarge) {
		t.Errorf("sparse terabyte: %v, want ErrTooLarge", err)
	}
}

// TestReadEnforcesTheLimitOnWhatIsRead covers files whose size says
// nothing: /proc reports 0 for files that hold content.
func TestReadEnforcesTheLimitOnWhatIsRead(t *testing.T) {
	const proc = "/proc/self/status"
	full, err := read(t, proc, 1<<20)
	if err != nil {
		tiers.Skip(t, tiers.Unit, "no %s to read (no /proc mounted?): %v", proc, err)
	}
	if !bytes.Contains(full, []byte("Pid:")) {
		t.Fatalf("%s read as %q", proc, full)
	}
	if _, err := read(t, proc, 16); !errors.Is(err, ErrTooLarge) {
		t.Errorf("%s with a 16-byte limit: %v, want ErrTooLarge", proc, err)
	}
}

func TestReadDirListsADirectoryAndRefusesAFIFOWithoutBlocking(t *testing.T) {
	dir := t.TempDir()
	d := filepath.Join(dir, "agent.toml.d")
	os.Mkdir(d, 0o755)
	for _, n := range []string{"20-b.toml", "10-a.toml"} {
		os.WriteFile(filepath.Join(d, n), nil, 0o644)
	}
	link := filepath.Join(dir, "link.d")
	os.Symlink(d, link)
	for _, p := range []string{d, link} {
		ents, err := ReadDir(p)
		if err != nil || len(ents) != 2 || ents[0].Name() != "10-a.toml" || ents[1].Name() != "20-b.toml" {
			t.Errorf("%s: %v, %v", p, ents, err)
		}
	}
	if _, err := ReadDir(filepath.Join(dir, "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing: %v", err)
	}
	fifo := filepath.Join(dir, "fifo.d")
	unix.Mkfifo(fifo, 0o600)
	done := make(chan error, 1)
	go func() { _, err := ReadDir(fifo); done <- err }()
	select {
	case err := <-done:
		if !errors.Is(err, unix.ENOTDIR) || !strings.Contains(err.Error(), fifo) {
			t.Errorf("FIFO: %v, want ENOTDIR naming it", err)
		}
	case <-time.After(hangDetector):
		t.Fatalf("ReadDir of a FIFO did not return within %v", hangDetector)
	}
}
