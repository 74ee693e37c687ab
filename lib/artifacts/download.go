package artifacts

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"unbounded-cloud.io/agent/lib/backoff"
)

var netDialer = net.Dialer{Timeout: 15 * time.Second, KeepAlive: 30 * time.Second}

// errStalled is the cause of a transfer ended by the stall timeout.
var errStalled = errors.New("no data received within the stall timeout")

// retry runs try until it succeeds, fails finally, or Attempts tries
// failed temporarily, waiting Backoff (doubling) between tries. It stops
// at once when ctx ends.
func (f *Fetcher) retry(ctx context.Context, what string, try func(context.Context) error) error {
	attempts := f.Attempts
	if attempts <= 0 {
		attempts = DefaultAttempts
	}
	first := f.Backoff
	if first <= 0 {
		first = DefaultBackoff
	}
	var err error
	for i := 1; ; i++ {
		if cerr := ctx.Err(); cerr != nil {
			return &classified{temporary: true, msg: fmt.Sprintf("%s: interrupted: %v", what, cerr), cause: cerr}
		}
		err = try(ctx)
		if err == nil || !isTemporary(err) || i >= attempts {
			return err
		}
		delay := backoff.Doubling(first, max(first, maxBackoff), i)
		f.log().Warn("artifact source unavailable; retrying", "what", what, "attempt", i, "of", attempts, "in", delay, "error", err)
		if backoff.Sleep(ctx, delay) != nil {
			return &classified{temporary: true, msg: fmt.Sprintf("%s: interrupted while waiting to retry: %v (last error: %v)", what, ctx.Err(), err), cause: ctx.Err()}
		}
	}
}

// transportError classifies an error of the HTTP transport (no status).
func transportError(ctx context.Context, what string, err error) error {
	if ctx.Err() != nil {
		return &classified{temporary: true, msg: fmt.Sprintf("%s: interrupted: %v", what, ctx.Err()), cause: ctx.Err()}
	}
	var unknown x509.UnknownAuthorityError
	var hostname x509.HostnameError
	var invalid x509.CertificateInvalidError
	switch {
	case errors.As(err, &invalid) && invalid.Reason == x509.Expired:
		// At first boot the clock may not be set yet (no RTC, NTP not
		// synced): "expired" or "not yet valid" can fix itself.
		return classify(ErrUnavailable, err, "%s: certificate not valid at the current time (%s; is the clock set?)", what, time.Now().UTC().Format(time.RFC3339))
	case errors.As(err, &unknown), errors.As(err, &hostname), errors.As(err, &invalid):
		return classify(ErrRejected, err, "%s: the server's certificate is not trusted", what)
	}
	return classify(ErrUnavailable, err, "%s", what)
}

// statusError classifies a response status; nil for 200 and 206.
func statusError(resp *http.Response, what string) error {
	switch c := resp.StatusCode; {
	case c == http.StatusOK || c == http.StatusPartialContent:
		return nil
	case c == http.StatusNotFound || c == http.StatusGone:
		return classify(ErrNotFound, nil, "%s: %s", what, resp.Status)
	case c == http.StatusRequestTimeout || c == http.StatusTooManyRequests || c >= 500:
		return classify(ErrUnavailable, nil, "%s: %s", what, resp.Status)
	default:
		return classify(ErrRejected, nil, "%s: %s", what, resp.Status)
	}
}

// Download downloads url into dest.part, resuming with an HTTP Range
// request what an earlier try or run left there (after a cut, a crash or an
// exit 75), verifies it against expected and commits it: the final name
// only ever holds a verified file. Each try is one attempt, under retry;
// at most MaxSize bytes. Fetch uses it for the mirror's artifacts, and the
// agent's self-upgrade (lib/upgrade) for its own package.
func (f *Fetcher) Download(ctx context.Context, a Artifact, url, dest, expected string) (*Result, error) {
	if err := os.MkdirAll(filepath.Dir(dest), 0o755); err != nil {
		return nil, err
	}
	part := dest + ".part"
	what := fmt.Sprintf("artifact %s from %s", a, url)
	// A run that died between the last byte and the rename left a whole,
	// verifiable part: commit it without asking the server again.
	if sum, err := HashFile(part); err == nil && sum == expected {
		if err := commit(part, dest, sum); err != nil {
			return nil, fmt.Errorf("artifact %s: %w", a, err)
		}
		f.log().Info("artifact completed from an earlier run's download", "artifact", a.Name, "version", a.Version, "url", url, "sha256", sum)
		return &Result{Artifact: a, File: dest, SHA256: sum, Source: SourceNetwork, From: url}, nil
	}
	for fresh := false; ; fresh = true {
		resumedFrom := int64(0)
		if fi, err := os.Stat(part); err == nil {
			resumedFrom = fi.Size()
		}
		if fresh {
			if err := os.Remove(part); err != nil && !os.IsNotExist(err) {
				return nil, err
			}
			resumedFrom = 0
		}
		start := time.Now()
		// resumed: the part was assembled from more than one response.
		resumed := false
		err := f.retry(ctx, what, func(ctx context.Context) error {
			if fi, err := os.Stat(part); err == nil && fi.Size() > 0 {
				resumed = true
			}
			return f.attempt(ctx, what, url, part)
		})
		if err != nil {
			return nil, err
		}
		actual, err := HashFile(part)
		if err != nil {
			return nil, err
		}
		if actual != expected {
			if resumed && !fresh {
				// The part may hold the start of another file (the mirror
				// replaced it between tries or runs); a whole download
				// decides.
				f.log().Warn("resumed download does not verify; downloading it whole", "artifact", a.Name, "version", a.Version, "resumed-from", resumedFrom)
				continue
			}
			os.Remove(part)
			return nil, &MismatchError{Artifact: a.Name, Version: a.Version, Source: url, Expected: expected, Actual: actual}
		}
		if err := commit(part, dest, actual); err != nil {
			return nil, fmt.Errorf("artifact %s: %w", a, err)
		}
		f.log().Info("artifact downloaded", "artifact", a.Name, "version", a.Version, "url", url, "sha256", actual, "resumed-from", resumedFrom, "duration", time.Since(start).Round(time.Millisecond))
		return &Result{Artifact: a, File: dest, SHA256: actual, Source: SourceNetwork, From: url}, nil
	}
}

// attempt is one HTTP request for url, appending to part from its current
// size (Range) or rewriting it when the server sends the whole file.
func (f *Fetcher) attempt(ctx context.Context, what, url, part string) error {
	out, err := os.OpenFile(part, os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer out.Close()
	offset, err := out.Seek(0, io.SeekEnd)
	if err != nil {
		return err
	}

	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stall := f.StallTimeout
	if stall <= 0 {
		stall = DefaultStallTimeout
	}
	watchdog := time.AfterFunc(stall, func() { cancel(errStalled) })
	defer watchdog.Stop()

	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return classify(ErrRejected, err, "%s", what)
	}
	if offset > 0 {
		req.Header.Set("Range", fmt.Sprintf("bytes=%d-", offset))
	}
	resp, err := f.client().Do(req)
	if err != nil {
		return f.bodyError(ctx, what, err)
	}
	defer resp.Body.Close()

	switch resp.StatusCode {
	case http.StatusRequestedRangeNotSatisfiable:
		// The part is as long as the file or longer: an earlier run got
		// it all and died before the rename, or the file shrank. Start
		// over; a part that was whole costs one more download, which is
		// rarer than a wrong one.
		if err := out.Truncate(0); err != nil {
			return err
		}
		return classify(ErrUnavailable, nil, "%s: range from %d not satisfiable; starting over", what, offset)
	case http.StatusOK:
		// A whole file: the server ignored the Range, or there was none.
		if offset > 0 {
			if err := out.Truncate(0); err != nil {
				return err
			}
			if _, err := out.Seek(0, io.SeekStart); err != nil {
				return err
			}
			offset = 0
		}
	case http.StatusPartialContent:
		if start, ok := contentRangeStart(resp.Header.Get("Content-Range")); !ok || start != offset {
			if err := out.Truncate(0); err != nil {
				return err
			}
			return classify(ErrUnavailable, nil, "%s: asked for bytes from %d, got Content-Range %q; starting over", what, offset, resp.Header.Get("Content-Range"))
		}
	default:
		return statusError(resp, what)
	}

	maxSize := f.MaxSize
	if maxSize <= 0 {
		maxSize = DefaultMaxSize
	}
	body := &progressReader{r: resp.Body, onRead: func() { watchdog.Reset(stall) }}
	n, err := io.Copy(out, io.LimitReader(body, maxSize-offset+1))
	if err == nil && offset+n > maxSize {
		out.Truncate(0)
		return classify(ErrRejected, nil, "%s: larger than %d bytes, not an artifact", what, maxSize)
	}
	if serr := out.Sync(); err == nil && serr != nil {
		return serr
	}
	if err != nil {
		return f.bodyError(ctx, what, err)
	}
	return nil
}

// bodyError classifies an error while receiving: the stall watchdog, the
// caller's context, or the transport.
func (f *Fetcher) bodyError(ctx context.Context, what string, err error) error {
	if cause := context.Cause(ctx); errors.Is(cause, errStalled) {
		return classify(ErrUnavailable, errStalled, "%s", what)
	}
	return transportError(ctx, what, err)
}

// contentRangeStart parses the first byte of "bytes START-END/TOTAL".
func contentRangeStart(h string) (int64, bool) {
	rest, ok := strings.CutPrefix(h, "bytes ")
	if !ok {
		return 0, false
	}
	start, _, ok := strings.Cut(rest, "-")
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(start, 10, 64)
	return n, err == nil
}

// progressReader calls onRead after every read that returned data, to
// keep the stall watchdog from firing while bytes arrive.
type progressReader struct {
	r      io.Reader
	onRead func()
}

func (p *progressReader) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	if n > 0 {
		p.onRead()
	}
	return n, err
}
