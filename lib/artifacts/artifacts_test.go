package artifacts

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"unbounded-cloud.io/agent/lib/config"
	"unbounded-cloud.io/agent/lib/exitcode"
	"unbounded-cloud.io/agent/lib/hostpaths"
)

const testPath = "kubelet/v1.36.3/linux-amd64/kubelet"

func sumOf(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// payload is a file's content, large enough to be cut in the middle.
func payload(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i/251)
	}
	return b
}

// mirror is a loopback HTTP server holding files and a SHA256SUMS,
// recording every request. handle, when set, answers request number n
// (1-based) instead of the file server, returning false to fall through.
type mirror struct {
	t      *testing.T
	srv    *httptest.Server
	mu     sync.Mutex
	files  map[string][]byte
	reqs   []*http.Request
	handle func(n int, w http.ResponseWriter, r *http.Request) bool
}

func newMirror(t *testing.T, files map[string][]byte) *mirror {
	m := &mirror{t: t, files: files}
	m.srv = httptest.NewServer(http.HandlerFunc(m.serve))
	t.Cleanup(m.srv.Close)
	return m
}

func (m *mirror) serve(w http.ResponseWriter, r *http.Request) {
	m.mu.Lock()
	m.reqs = append(m.reqs, r)
	n := len(m.reqs)
	h := m.handle
	m.mu.Unlock()
	if h != nil && h(n, w, r) {
		return
	}
	name := strings.TrimPrefix(r.URL.Path, "/")
	if name == "SHA256SUMS" {
		var b strings.Builder
		for p, data := range m.files {
			fmt.Fprintf(&b, "%s  %s\n", sumOf(data), p)
		}
		io.WriteString(w, b.String())
		return
	}
	data, ok := m.files[name]
	if !ok {
		http.NotFound(w, r)
		return
	}
	// ServeContent answers Range requests with 206 and Content-Range.
	http.ServeContent(w, r, name, time.Unix(0, 0), bytes.NewReader(data))
}

// setHandle sets handle under the lock the server reads it with.
func (m *mirror) setHandle(h func(n int, w http.ResponseWriter, r *http.Request) bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.handle = h
}

// requests returns the requests for path p (not the sums file).
func (m *mirror) requests(p string) []*http.Request {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []*http.Request
	for _, r := range m.reqs {
		if r.URL.Path == "/"+p {
			out = append(out, r)
		}
	}
	return out
}

func (m *mirror) count() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.reqs)
}

// fetcher returns a Fetcher over a temporary root, with tries and delays
// small enough for a test.
func fetcher(t *testing.T, base string) *Fetcher {
	root := t.TempDir()
	return &Fetcher{
		Paths:         hostpaths.New(root),
		BaseURL:       base,
		OfflineDir:    filepath.Join(root, "var/lib/unbounded/offline"),
		ChecksumsFile: "SHA256SUMS",
		Attempts:      3,
		Backoff:       time.Millisecond,
		Log:           slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
}

func kubelet() Artifact { return Artifact{Name: "kubelet", Version: "1.36.3", Path: testPath} }

// cutAfter answers with the whole Content-Length but sends only n bytes of
// data, then closes the connection: a body cut by the network.
func cutAfter(w http.ResponseWriter, data []byte, n int) {
	conn, buf, err := w.(http.Hijacker).Hijack()
	if err != nil {
		panic(err)
	}
	fmt.Fprintf(buf, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\nContent-Type: application/octet-stream\r\n\r\n", len(data))
	buf.Write(data[:n])
	buf.Flush()
	conn.Close()
}

func assertFile(t *testing.T, file string, want []byte) {
	t.Helper()
	got, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("read %s: %v", file, err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s: %d bytes, not the %d expected (or different content)", file, len(got), len(want))
	}
}

func TestFetchResumesACutDownloadWithARangeRequest(t *testing.T) {
	data := payload(1 << 20)
	m := newMirror(t, map[string][]byte{testPath: data})
	const cut = 300_000
	m.setHandle(func(n int, w http.ResponseWriter, r *http.Request) bool {
		if r.URL.Path == "/"+testPath && len(m.requests(testPath)) == 1 {
			cutAfter(w, data, cut)
			return true
		}
		return false
	})
	f := fetcher(t, m.srv.URL)
	res, err := f.Fetch(context.Background(), kubelet())
	if err != nil {
		t.Fatalf("fetch after a cut body: %v", err)
	}
	assertFile(t, res.File, data)
	if res.SHA256 != sumOf(data) || res.Source != SourceNetwork {
		t.Errorf("result = %+v", res)
	}
	reqs := m.requests(testPath)
	if len(reqs) != 2 {
		t.Fatalf("want 2 requests for the file (cut, resume), got %d", len(reqs))
	}
	if got, want := reqs[1].Header.Get("Range"), fmt.Sprintf("bytes=%d-", cut); got != want {
		t.Errorf("second request's Range = %q, want %q: the download restarted instead of resuming", got, want)
	}
	if _, err := os.Stat(res.File + ".part"); !os.IsNotExist(err) {
		t.Errorf(".part file left behind: %v", err)
	}
}

func TestFetchRetriesA500AndSucceeds(t *testing.T) {
	data := payload(4096)
	m := newMirror(t, map[string][]byte{testPath: data})
	m.setHandle(func(n int, w http.ResponseWriter, r *http.Request) bool {
		if r.URL.Path == "/"+testPath && len(m.requests(testPath)) == 1 {
			http.Error(w, "mirror restarting", http.StatusInternalServerError)
			return true
		}
		return false
	})
	res, err := fetcher(t, m.srv.URL).Fetch(context.Background(), kubelet())
	if err != nil {
		t.Fatalf("a 500 then the file: %v", err)
	}
	assertFile(t, res.File, data)
	if n := len(m.requests(testPath)); n != 2 {
		t.Errorf("want 2 requests (500, 200), got %d", n)
	}
}

func TestFetchGivesUpAfterBoundedTriesWithExit75(t *testing.T) {
	m := newMirror(t, map[string][]byte{testPath: payload(10)})
	m.setHandle(func(n int, w http.ResponseWriter, r *http.Request) bool {
		if r.URL.Path == "/"+testPath {
			http.Error(w, "overloaded", http.StatusServiceUnavailable)
			return true
		}
		return false
	})
	f := fetcher(t, m.srv.URL)
	_, err := f.Fetch(context.Background(), kubelet())
	if !errors.Is(err, ErrUnavailable) || exitcode.For(err) != exitcode.TempFail {
		t.Fatalf("503 forever: want ErrUnavailable and exit 75, got exit %d: %v", exitcode.For(err), err)
	}
	if n := len(m.requests(testPath)); n != f.Attempts {
		t.Errorf("tries = %d, want Attempts = %d", n, f.Attempts)
	}
	if !strings.Contains(err.Error(), "503") || !strings.Contains(err.Error(), "kubelet 1.36.3") {
		t.Errorf("error does not say what and why: %v", err)
	}
}

func TestFetchMismatchNamesArtifactAndBothSumsAndExits1(t *testing.T) {
	data := payload(5000)
	bad := append([]byte{}, data...)
	bad[100] ^= 0xff
	m := newMirror(t, map[string][]byte{testPath: bad})
	f := fetcher(t, m.srv.URL)
	a := kubelet()
	a.Pinned = sumOf(data)
	_, err := f.Fetch(context.Background(), a)
	var me *MismatchError
	if !errors.As(err, &me) || !errors.Is(err, ErrChecksumMismatch) {
		t.Fatalf("want a *MismatchError, got %v", err)
	}
	if exitcode.For(err) != exitcode.Failed {
		t.Errorf("exit = %d, want 1", exitcode.For(err))
	}
	for _, s := range []string{"kubelet", "1.36.3", sumOf(data), sumOf(bad), m.srv.URL} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("message %q does not name %s", err, s)
		}
	}
	dest := f.CachePath(a)
	for _, p := range []string{dest, dest + ".part", hostpaths.Checksum(dest)} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s exists after a mismatch", p)
		}
	}
}

func TestFetchFromOfflineDirNeverDials(t *testing.T) {
	data := payload(3000)
	f := fetcher(t, "http://mirror.invalid")
	var dials atomic.Int32
	f.Client = &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		return nil, errors.New("test: the network must not be used")
	}}}
	off := filepath.Join(f.OfflineDir, filepath.FromSlash(testPath))
	os.MkdirAll(filepath.Dir(off), 0o755)
	os.WriteFile(off, data, 0o644)
	os.WriteFile(filepath.Join(f.OfflineDir, "SHA256SUMS"), []byte(sumOf(data)+"  ./"+testPath+"\n"), 0o644)

	res, err := f.Fetch(context.Background(), kubelet())
	if err != nil {
		t.Fatalf("offline fetch: %v", err)
	}
	if dials.Load() != 0 {
		t.Errorf("dialled %d times with the file in the offline directory", dials.Load())
	}
	assertFile(t, res.File, data)
	if res.Source != SourceOffline || res.From != off {
		t.Errorf("result = %+v", res)
	}
	// The cache entry is a copy: the offline medium can go away.
	os.Remove(off)
	res2, err := f.Fetch(context.Background(), kubelet())
	if err != nil || res2.Source != SourceCache {
		t.Fatalf("second fetch after the offline file is gone: %+v, %v", res2, err)
	}
}

func TestFetchOfflineMismatchIsFinalAndDoesNotFallBackToTheNetwork(t *testing.T) {
	data := payload(3000)
	m := newMirror(t, map[string][]byte{testPath: data})
	f := fetcher(t, m.srv.URL)
	off := filepath.Join(f.OfflineDir, filepath.FromSlash(testPath))
	os.MkdirAll(filepath.Dir(off), 0o755)
	os.WriteFile(off, []byte("not kubelet"), 0o644)
	os.WriteFile(filepath.Join(f.OfflineDir, "SHA256SUMS"), []byte(sumOf(data)+"  "+testPath+"\n"), 0o644)
	_, err := f.Fetch(context.Background(), kubelet())
	if !errors.Is(err, ErrChecksumMismatch) || !strings.Contains(err.Error(), off) {
		t.Fatalf("want a mismatch naming %s, got %v", off, err)
	}
	if m.count() != 0 {
		t.Errorf("a wrong staged file was papered over by %d download(s)", m.count())
	}
}

func TestFetchOfflineWithoutChecksumIsRefused(t *testing.T) {
	f := fetcher(t, "")
	off := filepath.Join(f.OfflineDir, filepath.FromSlash(testPath))
	os.MkdirAll(filepath.Dir(off), 0o755)
	os.WriteFile(off, []byte("kubelet"), 0o644)
	_, err := f.Fetch(context.Background(), kubelet())
	if !errors.Is(err, ErrNoChecksum) || exitcode.For(err) != exitcode.Failed {
		t.Fatalf("offline file without any sum: want ErrNoChecksum (exit 1), got %v", err)
	}
	if !strings.Contains(err.Error(), "SHA256SUMS") {
		t.Errorf("error does not say where a sum was looked for: %v", err)
	}
}

func TestFetchWithNeitherOfflineFileNorBaseURLIsNotFound(t *testing.T) {
	_, err := fetcher(t, "").Fetch(context.Background(), kubelet())
	if !errors.Is(err, ErrNotFound) || exitcode.For(err) != exitcode.Failed || !strings.Contains(err.Error(), "base-url is empty") {
		t.Fatalf("want ErrNotFound saying base-url is empty, got %v", err)
	}
}

func TestFetchUnreachablePortIsTemporary(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens: connection refused
	f := fetcher(t, "http://"+addr)
	a := kubelet()
	a.Pinned = sumOf([]byte("x"))
	_, err = f.Fetch(context.Background(), a)
	if !errors.Is(err, ErrUnavailable) || !errors.Is(err, exitcode.ErrTemporary) || exitcode.For(err) != exitcode.TempFail {
		t.Fatalf("closed port: want ErrUnavailable, exit 75; got exit %d: %v", exitcode.For(err), err)
	}
	if !strings.Contains(err.Error(), "refused") {
		t.Errorf("error does not say the connection was refused: %v", err)
	}
}

func TestFetchSumsFileUnreachableIsTemporary(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	_, err = fetcher(t, "http://"+addr).Fetch(context.Background(), kubelet())
	if exitcode.For(err) != exitcode.TempFail || !strings.Contains(err.Error(), "SHA256SUMS") {
		t.Fatalf("sums file unreachable: want exit 75 naming it, got exit %d: %v", exitcode.For(err), err)
	}
}

func TestFetchClassifiesFinalHTTPAnswers(t *testing.T) {
	for _, tc := range []struct {
		status int
		class  error
	}{
		{http.StatusNotFound, ErrNotFound},
		{http.StatusGone, ErrNotFound},
		{http.StatusForbidden, ErrRejected},
		{http.StatusUnauthorized, ErrRejected},
	} {
		t.Run(http.StatusText(tc.status), func(t *testing.T) {
			m := newMirror(t, nil)
			m.setHandle(func(n int, w http.ResponseWriter, r *http.Request) bool {
				w.WriteHeader(tc.status)
				return true
			})
			f := fetcher(t, m.srv.URL)
			a := kubelet()
			a.Pinned = sumOf([]byte("x"))
			_, err := f.Fetch(context.Background(), a)
			if !errors.Is(err, tc.class) || exitcode.For(err) != exitcode.Failed {
				t.Fatalf("want %v (exit 1), got exit %d: %v", tc.class, exitcode.For(err), err)
			}
			if m.count() != 1 {
				t.Errorf("a final answer was retried: %d requests", m.count())
			}
		})
	}
}

func TestFetchRetriesTimeoutAndTooManyRequests(t *testing.T) {
	for _, status := range []int{http.StatusRequestTimeout, http.StatusTooManyRequests, http.StatusBadGateway} {
		t.Run(http.StatusText(status), func(t *testing.T) {
			data := payload(100)
			m := newMirror(t, map[string][]byte{testPath: data})
			m.setHandle(func(n int, w http.ResponseWriter, r *http.Request) bool {
				if n == 1 {
					w.WriteHeader(status)
					return true
				}
				return false
			})
			a := kubelet()
			a.Pinned = sumOf(data)
			if _, err := fetcher(t, m.srv.URL).Fetch(context.Background(), a); err != nil {
				t.Fatalf("%d then the file: %v", status, err)
			}
		})
	}
}

func TestFetchUntrustedCertificateIsFinal(t *testing.T) {
	srv := httptest.NewTLSServer(http.NotFoundHandler())
	defer srv.Close()
	f := fetcher(t, srv.URL)
	f.Client = &http.Client{} // the system's roots: the test CA is not among them
	a := kubelet()
	a.Pinned = sumOf([]byte("x"))
	_, err := f.Fetch(context.Background(), a)
	if !errors.Is(err, ErrRejected) || exitcode.For(err) != exitcode.Failed || !strings.Contains(err.Error(), "not trusted") {
		t.Fatalf("self-signed server: want ErrRejected (exit 1) saying the certificate is not trusted, got %v", err)
	}
}

func TestFetchCacheHitReverifiesAndRefetchesACorruptEntry(t *testing.T) {
	data := payload(8000)
	m := newMirror(t, map[string][]byte{testPath: data})
	f := fetcher(t, m.srv.URL)
	a := kubelet()
	a.Pinned = sumOf(data)
	res, err := f.Fetch(context.Background(), a)
	if err != nil {
		t.Fatal(err)
	}
	before := m.count()
	res2, err := f.Fetch(context.Background(), a)
	if err != nil || res2.Source != SourceCache || m.count() != before {
		t.Fatalf("second fetch: source %q, %d new requests, err %v; want a cache hit without the network", res2.Source, m.count()-before, err)
	}
	// Corrupt the cached file (same size): the hit re-verifies and
	// downloads it again.
	b, _ := os.ReadFile(res.File)
	b[10] ^= 1
	os.WriteFile(res.File, b, 0o644)
	res3, err := f.Fetch(context.Background(), a)
	if err != nil || res3.Source != SourceNetwork {
		t.Fatalf("corrupt cache entry: source %q, err %v; want a new download", res3.Source, err)
	}
	assertFile(t, res3.File, data)
}

func TestFetchCacheEntryOfAnotherPinIsReplaced(t *testing.T) {
	old, cur := payload(100), payload(200)
	m := newMirror(t, map[string][]byte{testPath: old})
	f := fetcher(t, m.srv.URL)
	a := kubelet()
	a.Pinned = sumOf(old)
	if _, err := f.Fetch(context.Background(), a); err != nil {
		t.Fatal(err)
	}
	m.mu.Lock()
	m.files[testPath] = cur
	m.mu.Unlock()
	a.Pinned = sumOf(cur)
	res, err := f.Fetch(context.Background(), a)
	if err != nil || res.Source != SourceNetwork {
		t.Fatalf("new pin: %+v %v", res, err)
	}
	assertFile(t, res.File, cur)
}

func TestFetchCompletesAWholePartLeftBeforeTheRename(t *testing.T) {
	data := payload(2048)
	m := newMirror(t, map[string][]byte{testPath: data})
	f := fetcher(t, m.srv.URL)
	a := kubelet()
	a.Pinned = sumOf(data)
	dest := f.CachePath(a)
	os.MkdirAll(filepath.Dir(dest), 0o755)
	os.WriteFile(dest+".part", data, 0o644)
	res, err := f.Fetch(context.Background(), a)
	if err != nil {
		t.Fatal(err)
	}
	assertFile(t, res.File, data)
	if m.count() != 0 {
		t.Errorf("a whole verified part was downloaded again (%d requests)", m.count())
	}
}

func TestFetchDownloadsWholeWhenAResumedPartIsOfAnotherFile(t *testing.T) {
	data := payload(4000)
	m := newMirror(t, map[string][]byte{testPath: data})
	f := fetcher(t, m.srv.URL)
	a := kubelet()
	a.Pinned = sumOf(data)
	dest := f.CachePath(a)
	os.MkdirAll(filepath.Dir(dest), 0o755)
	os.WriteFile(dest+".part", []byte("start of an older build"), 0o644)
	res, err := f.Fetch(context.Background(), a)
	if err != nil {
		t.Fatalf("stale part: %v", err)
	}
	assertFile(t, res.File, data)
	reqs := m.requests(testPath)
	if len(reqs) != 2 || reqs[0].Header.Get("Range") == "" || reqs[1].Header.Get("Range") != "" {
		t.Errorf("want a resume then a whole download, got %d requests", len(reqs))
	}
}

func TestFetchServerIgnoringRangeRewritesThePart(t *testing.T) {
	data := payload(50_000)
	m := newMirror(t, map[string][]byte{testPath: data})
	m.setHandle(func(n int, w http.ResponseWriter, r *http.Request) bool {
		if r.URL.Path != "/"+testPath {
			return false
		}
		if len(m.requests(testPath)) == 1 {
			cutAfter(w, data, 1000)
			return true
		}
		w.Write(data) // 200 with everything, whatever the Range
		return true
	})
	res, err := fetcher(t, m.srv.URL).Fetch(context.Background(), kubelet())
	if err != nil {
		t.Fatal(err)
	}
	assertFile(t, res.File, data)
}

func TestFetchStalledTransferIsCutAndResumed(t *testing.T) {
	data := payload(100_000)
	m := newMirror(t, map[string][]byte{testPath: data})
	release := make(chan struct{})
	defer close(release)
	m.setHandle(func(n int, w http.ResponseWriter, r *http.Request) bool {
		if r.URL.Path == "/"+testPath && len(m.requests(testPath)) == 1 {
			w.Header().Set("Content-Length", fmt.Sprint(len(data)))
			w.Write(data[:5000])
			w.(http.Flusher).Flush()
			select { // a link that died silently
			case <-release:
			case <-r.Context().Done():
			}
			return true
		}
		return false
	})
	f := fetcher(t, m.srv.URL)
	f.StallTimeout = 200 * time.Millisecond
	res, err := f.Fetch(context.Background(), kubelet())
	if err != nil {
		t.Fatalf("stalled then resumed: %v", err)
	}
	assertFile(t, res.File, data)
	if reqs := m.requests(testPath); len(reqs) != 2 || reqs[1].Header.Get("Range") != "bytes=5000-" {
		t.Errorf("want the second request to resume at 5000, got %d requests", len(reqs))
	}
}

func TestFetchStopsAtOnceWhenTheContextEnds(t *testing.T) {
	m := newMirror(t, nil)
	m.setHandle(func(n int, w http.ResponseWriter, r *http.Request) bool {
		w.WriteHeader(http.StatusServiceUnavailable)
		return true
	})
	f := fetcher(t, m.srv.URL)
	f.Attempts = 100
	f.Backoff = time.Hour
	ctx, cancel := context.WithCancel(context.Background())
	a := kubelet()
	a.Pinned = sumOf([]byte("x"))
	done := make(chan error, 1)
	go func() { _, err := f.Fetch(ctx, a); done <- err }()
	for m.count() == 0 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) || exitcode.For(err) != exitcode.TempFail {
			t.Errorf("cancelled: want context.Canceled as exit 75, got exit %d: %v", exitcode.For(err), err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Fetch kept waiting for its hour-long backoff after the context ended")
	}
}

func TestFetchRefusesAnOversizedBody(t *testing.T) {
	data := payload(10_000)
	m := newMirror(t, map[string][]byte{testPath: data})
	f := fetcher(t, m.srv.URL)
	f.MaxSize = 4096
	_, err := f.Fetch(context.Background(), kubelet())
	if !errors.Is(err, ErrRejected) || !strings.Contains(err.Error(), "larger than 4096") {
		t.Fatalf("want ErrRejected for a body over MaxSize, got %v", err)
	}
}

func TestFetchWithoutASumLineIsRefusedBeforeDownloading(t *testing.T) {
	m := newMirror(t, map[string][]byte{"other/file": []byte("x")})
	_, err := fetcher(t, m.srv.URL).Fetch(context.Background(), kubelet())
	if !errors.Is(err, ErrNoChecksum) || !strings.Contains(err.Error(), testPath) || !strings.Contains(err.Error(), "is kubelet 1.36.3 on the mirror?") {
		t.Fatalf("want ErrNoChecksum naming %s, got %v", testPath, err)
	}
	if n := len(m.requests(testPath)); n != 0 {
		t.Errorf("downloaded %d times a file it could not verify", n)
	}
}

func TestFetchOverrideURLWithItsPinNeedsNoSumsFile(t *testing.T) {
	data := payload(700)
	m := newMirror(t, map[string][]byte{"elsewhere/kubelet-custom": data})
	m.setHandle(func(n int, w http.ResponseWriter, r *http.Request) bool {
		if r.URL.Path == "/SHA256SUMS" {
			t.Errorf("the sums file was read for a pinned override")
		}
		return false
	})
	f := fetcher(t, "https://mirror.invalid")
	a := kubelet()
	a.URL = m.srv.URL + "/elsewhere/kubelet-custom"
	a.Pinned = sumOf(data)
	res, err := f.Fetch(context.Background(), a)
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Base(res.File) != "kubelet" || res.From != a.URL {
		t.Errorf("override: file %s from %s; want the template's name, from the override URL", res.File, res.From)
	}
}

func TestFetchAllPrefersAFinalErrorOverATemporaryOne(t *testing.T) {
	good := payload(100)
	m := newMirror(t, map[string][]byte{testPath: append([]byte("tampered"), good...)})
	m.setHandle(func(n int, w http.ResponseWriter, r *http.Request) bool {
		if strings.HasPrefix(r.URL.Path, "/runc/") {
			w.WriteHeader(http.StatusServiceUnavailable)
			return true
		}
		return false
	})
	f := fetcher(t, m.srv.URL)
	k := kubelet()
	k.Pinned = sumOf(good)
	runc := Artifact{Name: "runc", Version: "1.1.5", Path: "runc/v1.1.5/runc.amd64", Pinned: sumOf(good)}
	_, err := f.FetchAll(context.Background(), []Artifact{k, runc})
	if exitcode.For(err) != exitcode.Failed || !errors.Is(err, ErrChecksumMismatch) {
		t.Fatalf("mismatch + unavailable: want exit 1 for the mismatch, got exit %d: %v", exitcode.For(err), err)
	}
}

func TestFetchAllReturnsResultsInOrder(t *testing.T) {
	files := map[string][]byte{}
	var as []Artifact
	for i, name := range []string{"kubelet", "containerd", "runc", "cni-plugins"} {
		p := fmt.Sprintf("%s/v1.0.%d/%s.bin", name, i, name)
		files[p] = payload(1000 + i)
		as = append(as, Artifact{Name: name, Version: fmt.Sprintf("1.0.%d", i), Path: p})
	}
	m := newMirror(t, files)
	res, err := fetcher(t, m.srv.URL).FetchAll(context.Background(), as)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.Name != as[i].Name {
			t.Errorf("result %d is %s, want %s", i, r.Name, as[i].Name)
		}
		assertFile(t, r.File, files[as[i].Path])
	}
}

func TestFetchRefusesAnArtifactThatWouldEscapeTheCache(t *testing.T) {
	for _, a := range []Artifact{
		{Name: "kubelet", Version: "../../etc", Path: "k"},
		{Name: "kubelet", Version: "1", Path: "../../etc/passwd"},
		{Name: "kubelet", Version: "1", Path: "/etc/passwd"},
	} {
		if _, err := fetcher(t, "").Fetch(context.Background(), a); err == nil {
			t.Errorf("%+v accepted", a)
		}
	}
}

func TestParseSumsRefusesAMalformedLine(t *testing.T) {
	sums, err := ParseSums([]byte("# comment\n\n" + sumOf(nil) + " *a/b\n" + sumOf([]byte("x")) + "  ./c\n"))
	if err != nil || sums["a/b"] != sumOf(nil) || sums["c"] != sumOf([]byte("x")) {
		t.Fatalf("sha256sum's binary and text forms: %v %v", sums, err)
	}
	if _, err := ParseSums([]byte(sumOf(nil) + "  a\nnot a line\n")); err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Errorf("malformed line: %v", err)
	}
	if _, err := ParseSums([]byte(sumOf(nil) + "  a\n" + sumOf([]byte("y")) + "  a\n")); err == nil {
		t.Errorf("a file listed twice with two sums was accepted")
	}
}

func TestFromConfigExpandsTemplatesAndAppliesPinsAndOverrides(t *testing.T) {
	cfg := &config.Config{}
	cfg.Cluster.KubernetesVersion = "v1.36.3"
	cfg.Artifacts = config.Artifacts{
		ContainerdVersion: "1.6.20", RuncVersion: "1.1.5", CNIPluginsVersion: "1.1.1",
		Checksums:   map[string]string{"runc": strings.ToUpper(sumOf([]byte("r")))},
		Overrides:   map[string]config.Override{"containerd": {URL: "https://m.example/c.tgz", SHA256: sumOf([]byte("c"))}},
		KubeletPath: "kubelet/v{version}/linux-{arch}/kubelet", ContainerdPath: "containerd/{name}-{version}.tgz",
		RuncPath: "runc/runc.{arch}", CNIPluginsPath: "cni/{version}.tgz", CrictlPath: "crictl/{version}",
	}
	as := FromConfig(cfg, "arm64")
	want := []Artifact{
		{Name: "kubelet", Version: "1.36.3", Path: "kubelet/v1.36.3/linux-arm64/kubelet"},
		{Name: "containerd", Version: "1.6.20", Path: "containerd/containerd-1.6.20.tgz", URL: "https://m.example/c.tgz", Pinned: sumOf([]byte("c"))},
		{Name: "runc", Version: "1.1.5", Path: "runc/runc.arm64", Pinned: sumOf([]byte("r"))},
		{Name: "cni-plugins", Version: "1.1.1", Path: "cni/1.1.1.tgz"},
	}
	if fmt.Sprint(as) != fmt.Sprint(want) || len(as) != len(want) {
		t.Fatalf("FromConfig =\n%+v\nwant\n%+v", as, want)
	}
	for i := range want {
		if as[i] != want[i] {
			t.Errorf("artifact %d = %+v, want %+v", i, as[i], want[i])
		}
	}
}

// A mirror that is down fails every artifact on the same sums file: the
// operator reads that once, and the error is still worth a retry (75).
func TestFetchAllSaysEachFailureOnce(t *testing.T) {
	m := newMirror(t, map[string][]byte{})
	m.setHandle(func(n int, w http.ResponseWriter, r *http.Request) bool {
		w.WriteHeader(http.StatusServiceUnavailable)
		return true
	})
	f := fetcher(t, m.srv.URL)
	f.Attempts = 1
	var as []Artifact
	for _, name := range []string{"kubelet", "containerd", "runc", "cni-plugins"} {
		as = append(as, Artifact{Name: name, Version: "1.0.0", Path: name + "/v1.0.0/" + name})
	}
	_, err := f.FetchAll(context.Background(), as)
	if exitcode.For(err) != exitcode.TempFail {
		t.Fatalf("mirror down: exit %d, want 75: %v", exitcode.For(err), err)
	}
	if n := strings.Count(err.Error(), "SHA256SUMS"); n != 1 {
		t.Errorf("the sums file's failure is said %d times, want once:\n%v", n, err)
	}
}
