package upgrade

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"unbounded-cloud.io/agent/lib/exitcode"
	"unbounded-cloud.io/agent/lib/state"
)

// MaxPackage bounds a fetched package: the agent's is about 12 MB; a
// source that sends more is not sending it.
const MaxPackage = 256 << 20

// ErrChecksum is a package whose SHA-256 is not the one asked for.
var ErrChecksum = errors.New("checksum mismatch")

// fetch puts the package at source into dst (a file in the staging
// directory), resumably: an https download continues a dst+".part" an
// earlier run left with a range request; a local file (a path, or a
// file: URL) is copied. Nothing is at dst unless its SHA-256 is want.
func fetch(ctx context.Context, client *http.Client, source, want, dst string) error {
	part := dst + ".part"
	u, err := url.Parse(source)
	if err != nil {
		return fmt.Errorf("package URL %q: %w", source, err)
	}
	switch {
	case u.Scheme == "https":
		if err := download(ctx, client, u, part); err != nil {
			return err
		}
	case u.Scheme == "file" || (u.Scheme == "" && filepath.IsAbs(source)):
		path := source
		if u.Scheme == "file" {
			path = u.Path
		}
		if err := copyCapped(path, part); err != nil {
			return err
		}
	default:
		return fmt.Errorf("package URL %q: only https URLs and local files are fetched (the SHA-256 says what the package is; https says who sent it)", source)
	}
	got, err := fileSHA256(part)
	if err != nil {
		return err
	}
	if got != want {
		os.Remove(part) // a resumed download must not build on it
		return fmt.Errorf("package from %s: %w: want sha256 %s, got %s", source, ErrChecksum, want, got)
	}
	return os.Rename(part, dst)
}

// download appends the rest of u to part (from its current size), at most
// MaxPackage bytes in all. No answer, 5xx and 429 are temporary (75); any
// other answer but 200 or 206 is an error naming it.
func download(ctx context.Context, client *http.Client, u *url.URL, part string) error {
	f, err := os.OpenFile(part, os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	have, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return err
	}
	if have > 0 {
		req.Header.Set("Range", fmt.Sprintf("bytes=%d-", have))
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("%w: fetch %s: %w", exitcode.ErrTemporary, redact(u), err)
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusPartialContent && have > 0:
	case resp.StatusCode == http.StatusOK:
		// The whole file (a server without ranges): start over.
		if err := f.Truncate(0); err != nil {
			return err
		}
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return err
		}
		have = 0
	case resp.StatusCode == http.StatusRequestedRangeNotSatisfiable && have > 0:
		return nil // all of it is here already; the sum decides
	case resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests:
		return fmt.Errorf("%w: fetch %s: %s", exitcode.ErrTemporary, redact(u), resp.Status)
	default:
		return fmt.Errorf("fetch %s: %s", redact(u), resp.Status)
	}
	n, err := io.Copy(f, io.LimitReader(resp.Body, MaxPackage-have+1))
	if err != nil {
		return fmt.Errorf("%w: fetch %s: %w", exitcode.ErrTemporary, redact(u), err)
	}
	if have+n > MaxPackage {
		f.Truncate(0)
		return fmt.Errorf("fetch %s: more than %d bytes: not the agent's package", redact(u), MaxPackage)
	}
	return f.Sync()
}

func copyCapped(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("package: %w", err)
	}
	defer in.Close()
	if fi, err := in.Stat(); err != nil {
		return err
	} else if !fi.Mode().IsRegular() {
		return fmt.Errorf("package %s is not a regular file", src)
	}
	data, err := io.ReadAll(io.LimitReader(in, MaxPackage+1))
	if err != nil {
		return err
	}
	if len(data) > MaxPackage {
		return fmt.Errorf("package %s: more than %d bytes: not the agent's package", src, MaxPackage)
	}
	return state.WriteFileAtomic(dst, data, 0o600)
}

func fileSHA256(file string) (string, error) {
	f, err := os.Open(file)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// httpClient trusts the system's roots and, when given, the cluster's CA
// (a package served from inside the cluster).
func httpClient(caFile string) (*http.Client, error) {
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, err
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s: no PEM certificate", caFile)
		}
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	tr.Proxy = nil // the host's proxy settings are the node's business
	return &http.Client{Transport: tr, Timeout: 10 * time.Minute}, nil
}

// redact drops userinfo and the query (a signed URL's signature) from u
// for messages.
func redact(u *url.URL) string {
	c := *u
	c.User = nil
	c.RawQuery = ""
	return strings.TrimSuffix(c.String(), "?")
}

// validSHA256 says whether s is 64 lower-case hex digits.
func validSHA256(s string) bool {
	if len(s) != 64 {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil && strings.ToLower(s) == s
}
