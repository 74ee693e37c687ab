package artifacts

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"unbounded-cloud.io/agent/lib/regfile"
)

// ParseSums reads a sums file in sha256sum's format: "<hex>  <path>" or
// "<hex> *<path>" per line, "./" before a path ignored, blank lines and
// "#" comments skipped. A malformed line is an error naming its number: a
// sums file that half parses is not trusted.
func ParseSums(data []byte) (map[string]string, error) {
	sums := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 4096), maxSumsSize)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		sum, file, ok := strings.Cut(line, " ")
		file = strings.TrimPrefix(strings.TrimLeft(file, " "), "*")
		file = strings.TrimPrefix(file, "./")
		if !ok || !isHexSum(sum) || file == "" {
			return nil, fmt.Errorf("line %d is not \"<sha256>  <path>\"", n)
		}
		sum = strings.ToLower(sum)
		if prev, dup := sums[file]; dup && prev != sum {
			return nil, fmt.Errorf("line %d: %s is listed twice with different sums", n, file)
		}
		sums[file] = sum
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return sums, nil
}

// sumFor returns a's expected sum from the sums file of where ("offline"
// or "network"), read once per Fetcher.
func (f *Fetcher) sumFor(ctx context.Context, where string, a Artifact) (string, error) {
	if f.ChecksumsFile == "" {
		return "", f.noChecksum(a, where, f.describeSource(where, a))
	}
	f.sumsMu.Lock()
	defer f.sumsMu.Unlock()
	if f.sums == nil {
		f.sums = map[string]sumsResult{}
	}
	r, ok := f.sums[where]
	if !ok || isTemporary(r.err) {
		if where == "offline" {
			r.sums, r.err = f.offlineSums()
		} else {
			r.sums, r.err = f.networkSums(ctx)
		}
		f.sums[where] = r
	}
	if r.err != nil {
		return "", r.err
	}
	sum, ok := r.sums[a.Path]
	if !ok {
		return "", f.noChecksum(a, where, f.describeSource(where, a))
	}
	return sum, nil
}

func (f *Fetcher) describeSource(where string, a Artifact) string {
	if where == "offline" {
		return filepath.Join(f.OfflineDir, filepath.FromSlash(a.Path))
	}
	if a.URL != "" {
		return a.URL
	}
	return strings.TrimSuffix(f.BaseURL, "/") + "/" + a.Path
}

func (f *Fetcher) offlineSums() (map[string]string, error) {
	file := filepath.Join(f.OfflineDir, filepath.FromSlash(f.ChecksumsFile))
	data, err := regfile.Read(file, maxSumsSize)
	if errors.Is(err, os.ErrNotExist) {
		return nil, classify(ErrNoChecksum, nil, "offline directory %s has no sums file %s (and the artifacts in it are not pinned in [artifacts.checksums])", f.OfflineDir, f.ChecksumsFile)
	}
	if err != nil {
		return nil, classify(ErrNoChecksum, err, "sums file %s", file)
	}
	sums, err := ParseSums(data)
	if err != nil {
		return nil, classify(ErrNoChecksum, err, "sums file %s", file)
	}
	return sums, nil
}

func (f *Fetcher) networkSums(ctx context.Context) (map[string]string, error) {
	url := strings.TrimSuffix(f.BaseURL, "/") + "/" + f.ChecksumsFile
	var data []byte
	err := f.retry(ctx, "sums file "+url, func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return classify(ErrRejected, err, "sums file %s", url)
		}
		resp, err := f.client().Do(req)
		if err != nil {
			return transportError(ctx, "sums file "+url, err)
		}
		defer resp.Body.Close()
		if err := statusError(resp, "sums file "+url); err != nil {
			return err
		}
		data, err = io.ReadAll(io.LimitReader(resp.Body, maxSumsSize+1))
		if err != nil {
			return transportError(ctx, "sums file "+url, err)
		}
		if len(data) > maxSumsSize {
			return classify(ErrRejected, nil, "sums file %s is larger than %d bytes", url, maxSumsSize)
		}
		return nil
	})
	if err != nil {
		if errors.Is(err, ErrNotFound) {
			// Say what is missing in terms of the config, not only
			// the URL.
			return nil, classify(ErrNoChecksum, err, "no sums file at base-url (checksums-file %q)", f.ChecksumsFile)
		}
		return nil, err
	}
	sums, err := ParseSums(data)
	if err != nil {
		return nil, classify(ErrRejected, err, "sums file %s", url)
	}
	return sums, nil
}
