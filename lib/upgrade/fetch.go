package upgrade

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"unbounded-cloud.io/agent/lib/artifacts"
	"unbounded-cloud.io/agent/lib/state"
)

// MaxPackage bounds a fetched package: the agent's is about 12 MB; a
// source that sends more is not sending it.
const MaxPackage = 256 << 20

// ErrChecksum is a package whose SHA-256 is not the one asked for.
var ErrChecksum = errors.New("checksum mismatch")

// fetch puts the package at source into dst (a file in the staging
// directory). An https URL goes through lib/artifacts' downloader, as the
// node stack's artifacts do: retried, resumed from dst+".part" with a range
// request, at most MaxPackage bytes, verified before it is renamed. A
// local file (a path, or a file: URL) is copied, then verified. Nothing is
// at dst unless its SHA-256 is want.
func fetch(ctx context.Context, client *http.Client, log *slog.Logger, version, source, want, dst string) error {
	u, err := url.Parse(source)
	if err != nil {
		return fmt.Errorf("package URL %q: %w", source, err)
	}
	switch {
	case u.Scheme == "https":
		f := &artifacts.Fetcher{Client: client, MaxSize: MaxPackage, Log: log}
		_, err := f.Download(ctx, artifacts.Artifact{Name: Package, Version: version}, source, dst, want)
		if errors.Is(err, artifacts.ErrChecksumMismatch) {
			return fmt.Errorf("%w: %w", ErrChecksum, err)
		}
		return err
	case u.Scheme == "file" || (u.Scheme == "" && filepath.IsAbs(source)):
		path := source
		if u.Scheme == "file" {
			path = u.Path
		}
		part := dst + ".part"
		if err := copyCapped(path, part); err != nil {
			return err
		}
		got, err := artifacts.HashFile(part)
		if err != nil {
			return err
		}
		if got != want {
			os.Remove(part)
			return fmt.Errorf("package from %s: %w: want sha256 %s, got %s", source, ErrChecksum, want, got)
		}
		return os.Rename(part, dst)
	}
	return fmt.Errorf("package URL %q: only https URLs and local files are fetched (the SHA-256 says what the package is; https says who sent it)", source)
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

// validSHA256 says whether s is 64 lower-case hex digits.
func validSHA256(s string) bool {
	if len(s) != 64 {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil && strings.ToLower(s) == s
}
