package artifacts

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"unbounded-cloud.io/agent/lib/hostpaths"
)

// The crash test runs a download in a child process (this test binary,
// re-executed with helperEnv set) and kills it with SIGKILL mid-body: no
// deferred cleanup, no close, as after a power cut or kill -9.
const helperEnv = "ARTIFACTS_TEST_CRASH_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		crashHelper()
		return
	}
	os.Exit(m.Run())
}

// crashHelper fetches kubelet from the URL and root in the environment;
// the test kills it before it can finish.
func crashHelper() {
	f := &Fetcher{
		Paths:   hostpaths.New(os.Getenv("HELPER_ROOT")),
		BaseURL: os.Getenv("HELPER_URL"),
		Log:     slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	a := kubelet()
	a.Pinned = os.Getenv("HELPER_SUM")
	_, err := f.Fetch(context.Background(), a)
	fmt.Fprintln(os.Stderr, "helper: fetch returned, which the test never lets happen:", err)
	os.Exit(3)
}

func TestDownloadKilledMidBodyLeavesNoFileUnderTheFinalNameAndResumes(t *testing.T) {
	data := payload(2 << 20)
	const half = 1 << 20
	m := newMirror(t, map[string][]byte{testPath: data})
	sent := make(chan struct{})
	release := make(chan struct{})
	defer close(release)
	m.setHandle(func(n int, w http.ResponseWriter, r *http.Request) bool {
		if len(m.requests(testPath)) != 1 {
			return false // the resume, in this process
		}
		w.Header().Set("Content-Length", fmt.Sprint(len(data)))
		w.Write(data[:half])
		w.(http.Flusher).Flush()
		close(sent)
		select {
		case <-release:
		case <-r.Context().Done():
		}
		return true
	})
	root := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=1", "HELPER_ROOT="+root, "HELPER_URL="+m.srv.URL, "HELPER_SUM="+sumOf(data))
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()

	f := &Fetcher{Paths: hostpaths.New(root), BaseURL: m.srv.URL, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	a := kubelet()
	a.Pinned = sumOf(data)
	dest := f.CachePath(a)
	select {
	case <-sent:
	case <-time.After(30 * time.Second):
		t.Fatal("the child never requested the file")
	}
	// Wait (bounded) until the child wrote what it received, then kill it.
	deadline := time.Now().Add(30 * time.Second)
	for {
		if fi, err := os.Stat(dest + ".part"); err == nil && fi.Size() == half {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the child's .part never reached the bytes sent")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()

	if _, err := os.Stat(dest); !os.IsNotExist(err) {
		t.Fatalf("after a kill mid-download the final name %s exists (%v)", dest, err)
	}
	if _, err := os.Stat(hostpaths.Checksum(dest)); !os.IsNotExist(err) {
		t.Fatalf("after a kill mid-download the sidecar exists")
	}
	entries, _ := os.ReadDir(filepath.Dir(dest))
	if len(entries) != 1 || entries[0].Name() != "kubelet.part" {
		t.Errorf("cache dir after the kill holds %v, want only kubelet.part", entries)
	}

	// The next run resumes where the killed one stopped.
	res, err := f.Fetch(context.Background(), a)
	if err != nil {
		t.Fatalf("run after the kill: %v", err)
	}
	assertFile(t, res.File, data)
	reqs := m.requests(testPath)
	if len(reqs) != 2 || reqs[1].Header.Get("Range") != fmt.Sprintf("bytes=%d-", half) {
		t.Errorf("the run after the kill did not resume at %d (%d requests)", half, len(reqs))
	}
}
