package artifacts

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"unbounded-cloud.io/agent/lib/config"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/state"
)

// Defaults of the Fetcher's tunables.
const (
	// DefaultAttempts bounds the tries per download in one run. The unit
	// retries the whole run after exit 75, so a few tries here only ride
	// out a blip (a mirror restarting) without a unit restart.
	DefaultAttempts = 4
	// DefaultBackoff is the delay before the second try; it doubles, up
	// to maxBackoff.
	DefaultBackoff = time.Second
	maxBackoff     = 30 * time.Second
	// DefaultStallTimeout ends a transfer that received nothing for this
	// long (a link that silently died). The whole transfer has no time
	// limit: a kubelet over a slow link may take minutes and be fine.
	DefaultStallTimeout = time.Minute
	// DefaultMaxSize bounds a file. kubelet, the largest, is about a
	// hundred megabytes; a body that goes past this is not an artifact
	// and would fill /var.
	DefaultMaxSize = 1 << 30
	// maxSumsSize bounds a sums file: one line per file of a mirror.
	maxSumsSize = 1 << 20
)

// Source of a Result.
const (
	SourceCache   = "cache"
	SourceOffline = "offline"
	SourceNetwork = "network"
)

// Result is a verified artifact in the cache.
type Result struct {
	Artifact
	// File is the verified file on disk (under the Fetcher's root).
	File string
	// SHA256 is its sum (hex, lower case).
	SHA256 string
	// Source is SourceCache, SourceOffline or SourceNetwork; From is the
	// offline file or URL it came from ("" for the cache).
	Source string
	From   string
}

// Fetcher fetches artifacts into the cache. The zero value of each field
// but Paths is the real thing; New fills the config's.
type Fetcher struct {
	// Paths locates the cache (hostpaths.ArtifactsDir).
	Paths hostpaths.Paths
	// BaseURL is the mirror ("" : offline only).
	BaseURL string
	// OfflineDir is the offline directory on disk (already resolved under
	// the root), "" for none.
	OfflineDir string
	// ChecksumsFile is the sums file's path under BaseURL and OfflineDir;
	// "" means only pinned sums are accepted.
	ChecksumsFile string

	// Client does the downloads. nil: a client with connect, TLS and
	// header timeouts and the proxy from the environment.
	Client *http.Client
	// Attempts, Backoff, StallTimeout and MaxSize: zero means the Default.
	Attempts     int
	Backoff      time.Duration
	StallTimeout time.Duration
	MaxSize      int64
	// Log gets one line per file fetched and per retry; nil: slog.Default.
	Log *slog.Logger

	sumsMu sync.Mutex
	sums   map[string]sumsResult // by "offline" / "network"
}

type sumsResult struct {
	sums map[string]string
	err  error
}

// New returns a Fetcher for cfg's [artifacts], with the cache under p.
func New(cfg *config.Config, p hostpaths.Paths) *Fetcher {
	f := &Fetcher{
		Paths:         p,
		BaseURL:       cfg.Artifacts.BaseURL,
		ChecksumsFile: cfg.Artifacts.ChecksumsFile,
	}
	if cfg.Artifacts.OfflineDir != "" {
		f.OfflineDir = cfg.Resolve(cfg.Artifacts.OfflineDir)
	}
	return f
}

// FetchConfig fetches and verifies every artifact cfg asks for on this
// CPU architecture into the cache under p (New, FromConfig, FetchAll): what
// bootstrap, the repave and an image's prepare fetch.
func FetchConfig(ctx context.Context, cfg *config.Config, p hostpaths.Paths, log *slog.Logger) ([]Result, error) {
	f := New(cfg, p)
	f.Log = log
	return f.FetchAll(ctx, FromConfig(cfg, runtime.GOARCH))
}

func (f *Fetcher) log() *slog.Logger {
	if f.Log != nil {
		return f.Log
	}
	return slog.Default()
}

func (f *Fetcher) client() *http.Client {
	if f.Client != nil {
		return f.Client
	}
	return defaultClient
}

// defaultClient bounds each phase that can hang on a dead peer; the body
// is bounded by the stall timeout instead of a total one.
var defaultClient = &http.Client{Transport: &http.Transport{
	Proxy:                 http.ProxyFromEnvironment,
	DialContext:           (&netDialer).DialContext,
	TLSHandshakeTimeout:   15 * time.Second,
	ResponseHeaderTimeout: 30 * time.Second,
	IdleConnTimeout:       30 * time.Second,
	ForceAttemptHTTP2:     true,
}}

// CachePath is where a's verified file lives (on disk).
func (f *Fetcher) CachePath(a Artifact) string {
	return filepath.Join(f.Paths.ArtifactsDir(), a.Name, a.Version, path.Base(a.Path))
}

// FetchAll fetches every artifact, in parallel, and returns their results
// in the order of as. When some fail, the error joins the failures,
// final ones only when there is any (a checksum mismatch is not made
// temporary by a mirror that also timed out): exit 1 wins over 75.
func (f *Fetcher) FetchAll(ctx context.Context, as []Artifact) ([]Result, error) {
	results := make([]Result, len(as))
	errs := make([]error, len(as))
	var wg sync.WaitGroup
	for i, a := range as {
		wg.Go(func() {
			r, err := f.Fetch(ctx, a)
			if err == nil {
				results[i] = *r
			}
			errs[i] = err
		})
	}
	wg.Wait()
	var final, temporary []error
	for _, err := range errs {
		switch {
		case err == nil:
		case isTemporary(err):
			temporary = append(temporary, err)
		default:
			final = append(final, err)
		}
	}
	if len(final) > 0 {
		return nil, joinDistinct(final)
	}
	if len(temporary) > 0 {
		return nil, joinDistinct(temporary)
	}
	return results, nil
}

// joinDistinct joins errs, each message once: every artifact reads the
// same sums file, and a mirror that is down fails them all with the same
// words.
func joinDistinct(errs []error) error {
	seen := map[string]bool{}
	var out []error
	for _, err := range errs {
		if !seen[err.Error()] {
			seen[err.Error()] = true
			out = append(out, err)
		}
	}
	return errors.Join(out...)
}

func isTemporary(err error) bool {
	var c *classified
	return errors.As(err, &c) && c.temporary
}

// Fetch returns a's verified file, from the first of:
//
//  1. the cache, CachePath(a), with a <file>.sha256 sidecar: a hit when the
//     file hashes to the sidecar's sum (re-verified on every hit) and that
//     sum is the expected one when an expected sum is known without the
//     network (a pin, or the offline sums file). An entry that does not
//     verify is fetched again, never an error.
//  2. the offline directory ([artifacts] offline-dir): offline-dir/<path>,
//     <path> being the artifact's [artifacts] <name>-path template expanded.
//  3. the network: the override URL ([artifacts.overrides.<name>] url), or
//     base-url/<path> (Download).
//
// The expected SHA-256 is a pinned sum ([artifacts.checksums.<name>], or
// the override's sha256), trusted as the config file is (root-owned, in
// /etc); else the sums file ([artifacts] checksums-file, ParseSums) beside
// the file: offline-dir/SHA256SUMS for an offline file, base-url/SHA256SUMS
// for a download. A sums file from the mirror proves the file is the one
// the mirror meant (no corruption, no truncation, no wrong version, no bad
// resume), not that the mirror is honest: that trust is the mirror's and
// the transport's (https://). So a file never has its sum from another
// source than the one it came from, except a pin, and a file without any
// expected sum is not used (ErrNoChecksum).
func (f *Fetcher) Fetch(ctx context.Context, a Artifact) (*Result, error) {
	if err := a.check(); err != nil {
		return nil, err
	}
	dest := f.CachePath(a)
	offline := ""
	if f.OfflineDir != "" {
		offline = filepath.Join(f.OfflineDir, filepath.FromSlash(a.Path))
		if !isFile(offline) {
			offline = ""
		}
	}
	// The expected sum as far as it is known without the network.
	local := a.Pinned
	if local == "" && offline != "" {
		sum, err := f.sumFor(ctx, "offline", a)
		if err != nil {
			return nil, err
		}
		local = sum
	}
	if r := f.cacheHit(a, dest, local); r != nil {
		return r, nil
	}
	if offline != "" {
		return f.fromOffline(a, offline, dest, local)
	}
	url := a.URL
	if url == "" {
		if f.BaseURL == "" {
			where := "no offline directory"
			if f.OfflineDir != "" {
				where = "not in the offline directory (" + filepath.Join(f.OfflineDir, filepath.FromSlash(a.Path)) + ")"
			}
			return nil, classify(ErrNotFound, nil, "artifact %s: %s, and [artifacts] base-url is empty", a, where)
		}
		url = strings.TrimSuffix(f.BaseURL, "/") + "/" + a.Path
	}
	expected := a.Pinned
	if expected == "" {
		sum, err := f.sumFor(ctx, "network", a)
		if err != nil {
			return nil, err
		}
		expected = sum
	}
	return f.Download(ctx, a, url, dest, expected)
}

// cacheHit returns the cache entry of a when it verifies, nil otherwise.
func (f *Fetcher) cacheHit(a Artifact, dest, expected string) *Result {
	side, err := os.ReadFile(hostpaths.Checksum(dest))
	if err != nil {
		return nil
	}
	fields := strings.Fields(string(side))
	if len(fields) == 0 || !isHexSum(fields[0]) {
		return nil
	}
	recorded := strings.ToLower(fields[0])
	if expected != "" && recorded != expected {
		f.log().Info("cached artifact is not the expected one; fetching it again", "artifact", a.Name, "version", a.Version, "cached", recorded, "expected", expected)
		return nil
	}
	actual, err := HashFile(dest)
	if err != nil {
		return nil
	}
	if actual != recorded {
		f.log().Warn("cached artifact does not match its recorded SHA-256; fetching it again", "artifact", a.Name, "version", a.Version, "file", dest, "recorded", recorded, "actual", actual)
		return nil
	}
	return &Result{Artifact: a, File: dest, SHA256: actual, Source: SourceCache}
}

// fromOffline copies the offline file into the cache, hashing it on the
// way: the cache is the one place the modes install from, and a copy
// cannot change under them when the offline medium does.
func (f *Fetcher) fromOffline(a Artifact, src, dest, expected string) (*Result, error) {
	if expected == "" {
		return nil, f.noChecksum(a, "offline", src)
	}
	in, err := openRegular(src)
	if err != nil {
		return nil, fmt.Errorf("artifact %s: offline file: %w", a, err)
	}
	defer in.Close()
	part := dest + ".part"
	if err := os.MkdirAll(filepath.Dir(dest), 0o755); err != nil {
		return nil, err
	}
	out, err := os.OpenFile(part, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, err
	}
	h := sha256.New()
	_, err = io.Copy(io.MultiWriter(out, h), in)
	if err == nil {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(part)
		return nil, fmt.Errorf("artifact %s: copy %s into the cache: %w", a, src, err)
	}
	actual := hex.EncodeToString(h.Sum(nil))
	if actual != expected {
		os.Remove(part)
		return nil, &MismatchError{Artifact: a.Name, Version: a.Version, Source: src, Expected: expected, Actual: actual}
	}
	if err := commit(part, dest, actual); err != nil {
		return nil, fmt.Errorf("artifact %s: %w", a, err)
	}
	f.log().Info("artifact from the offline directory", "artifact", a.Name, "version", a.Version, "file", src, "sha256", actual)
	return &Result{Artifact: a, File: dest, SHA256: actual, Source: SourceOffline, From: src}, nil
}

// commit moves a verified .part file to its final name: fsync of the file
// (done by the writer), rename, fsync of the directory; then the sidecar.
// A crash before the sidecar leaves a file the next run re-verifies (no
// sidecar: not a hit, fetched again); a crash before the rename leaves
// only the .part.
func commit(part, dest, sum string) error {
	if err := os.Rename(part, dest); err != nil {
		return err
	}
	if err := state.SyncDir(filepath.Dir(dest)); err != nil {
		return err
	}
	return state.WriteFileAtomic(hostpaths.Checksum(dest), []byte(sum+"  "+filepath.Base(dest)+"\n"), 0o644)
}

func (f *Fetcher) noChecksum(a Artifact, where, from string) error {
	if f.ChecksumsFile == "" {
		return classify(ErrNoChecksum, nil, "artifact %s (%s): no SHA-256 pinned in [artifacts.checksums] or its override, and checksums-file is empty", a, from)
	}
	base := f.OfflineDir
	if where == "network" {
		base = strings.TrimSuffix(f.BaseURL, "/")
	}
	// The usual cause is a version the mirror does not have (a typo in
	// kubernetes-version): say so, not only which line is missing.
	return classify(ErrNoChecksum, nil, "artifact %s (%s): no SHA-256: not pinned in [artifacts.checksums], and %s/%s has no line for %s (is %s %s on the mirror?)", a, from, base, f.ChecksumsFile, a.Path, a.Name, a.Version)
}

// HashFile returns the SHA-256 of a regular file (opened without
// blocking: a FIFO in its place fails, it does not hang).
func HashFile(file string) (string, error) {
	in, err := openRegular(file)
	if err != nil {
		return "", err
	}
	defer in.Close()
	h := sha256.New()
	if _, err := io.Copy(h, in); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// openRegular opens a regular file without blocking: a FIFO planted in
// the offline directory or the cache must not hang the bootstrap.
func openRegular(file string) (*os.File, error) {
	in, err := os.OpenFile(file, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	fi, err := in.Stat()
	if err != nil {
		in.Close()
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		in.Close()
		return nil, fmt.Errorf("%s is not a regular file (%s)", file, fi.Mode().Type())
	}
	return in, nil
}

func isFile(file string) bool {
	fi, err := os.Stat(file)
	return err == nil && !fi.IsDir()
}
