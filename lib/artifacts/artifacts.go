// Package artifacts delivers the node stack's files (kubelet, containerd,
// runc, cni-plugins, optionally crictl) at the configured versions,
// verified against a SHA-256, into a cache under the host root. The mode
// (lib/modes/<mode>) installs them from there.
//
// Use:
//
//	f := artifacts.New(cfg, paths)                 // [artifacts] of lib/config
//	res, err := f.FetchAll(ctx, artifacts.FromConfig(cfg, runtime.GOARCH))
//	// res[i].File is the verified file on disk, res[i].SHA256 its sum.
//	// exitcode.For(err) is 75 for ErrUnavailable (retry), else 1.
//
// Where each file comes from, in order:
//
//  1. the cache, /var/lib/unbounded/artifacts/<name>/<version>/<file>
//     with a <file>.sha256 sidecar: a hit when the file hashes to the
//     sidecar's sum (re-verified on every hit) and that sum is the
//     expected one when an expected sum is known without the network (a
//     pin, or the offline sums file). A cache entry that does not verify
//     is fetched again, never an error.
//  2. the offline directory ([artifacts] offline-dir): offline-dir/<path>,
//     where <path> is the artifact's [artifacts] <name>-path template
//     expanded.
//  3. the network: the override URL ([artifacts.overrides.<name>] url), or
//     base-url/<path>.
//
// Where each expected SHA-256 comes from, and what that trust means: a
// pinned sum ([artifacts.checksums.<name>], or the override's sha256) is
// trusted as the config file is (root-owned, in /etc); without one, the
// sums file ([artifacts] checksums-file, sha256sum's format, paths as the
// <name>-path keys give them) next to the files: offline-dir/SHA256SUMS for an
// offline file, base-url/SHA256SUMS for a download. A sums file from the
// mirror proves the file is the one the mirror meant (no corruption, no
// truncation, no wrong version, no bad resume), not that the mirror is
// honest: that trust is the mirror's and the transport's (https://). A
// file never has its sum from another source than the one it came from,
// except a pin. A file without any expected sum is not used (ErrNoChecksum).
//
// Downloads go to <file>.part beside the cache entry and resume with an
// HTTP Range request after a cut (also in the next run, after a crash or
// an exit 75); the file is verified, fsynced and renamed into place, so
// the final name only ever holds a verified file. Each download is tried
// a bounded number of times with a doubling delay, stopping at once when
// the context ends.
//
// Errors are classified for lib/exitcode with errors.Is: ErrUnavailable
// (connection refused, timeouts, a stalled or cut body, 408, 429, 5xx,
// DNS, an expired certificate at first boot before the clock is set)
// also matches exitcode.ErrTemporary (exit 75, the unit retries);
// ErrChecksumMismatch (a *MismatchError naming the artifact, the expected
// and the actual sum), ErrNoChecksum, ErrNotFound (404, or neither offline
// nor a base-url) and ErrRejected (401, 403, other 4xx, an untrusted
// certificate, an oversized file) are final (exit 1).
//
// The package links no Kubernetes client: it goes into every binary that
// bootstraps, and stays small.
package artifacts

import (
	"errors"
	"fmt"
	"path"
	"strings"

	"unbounded-cloud.io/agent/lib/config"
	"unbounded-cloud.io/agent/lib/exitcode"
)

var (
	// ErrChecksumMismatch: a file's SHA-256 is not the expected one. The
	// error is a *MismatchError. Final: exit 1.
	ErrChecksumMismatch = errors.New("SHA-256 mismatch")
	// ErrNoChecksum: no expected SHA-256 for a file (not pinned, not in
	// the sums file beside it, or that sums file missing). Final: exit 1.
	ErrNoChecksum = errors.New("no expected SHA-256")
	// ErrNotFound: the source does not have the file (HTTP 404/410), or
	// the file is not in the offline directory and base-url is empty.
	// Final: exit 1 (a wrong version in the config is the usual cause).
	ErrNotFound = errors.New("artifact not found")
	// ErrRejected: the source answered but will not give the file (401,
	// 403, another 4xx, a certificate not trusted, a file over MaxSize).
	// Final: exit 1.
	ErrRejected = errors.New("artifact source rejected the request")
	// ErrUnavailable: the source could not be reached or the transfer
	// broke. Also matches exitcode.ErrTemporary: exit 75, retried.
	ErrUnavailable = errors.New("artifact source unavailable")
)

// MismatchError is a file whose SHA-256 is not the expected one.
type MismatchError struct {
	Artifact string // kubelet, containerd, ...
	Version  string
	Source   string // the URL or the offline file it came from
	Expected string // hex
	Actual   string // hex
}

func (e *MismatchError) Error() string {
	return fmt.Sprintf("artifact %s %s from %s: SHA-256 mismatch: expected %s, got %s", e.Artifact, e.Version, e.Source, e.Expected, e.Actual)
}

// Is makes a *MismatchError match ErrChecksumMismatch.
func (e *MismatchError) Is(target error) bool { return target == ErrChecksumMismatch }

// classified is an error with its class (one of the sentinels above) and,
// for ErrUnavailable and an interrupted run, exitcode.ErrTemporary.
type classified struct {
	class     error // nil for an interrupted run
	temporary bool
	msg       string
	cause     error
}

func (e *classified) Error() string { return e.msg }

func (e *classified) Unwrap() []error {
	var errs []error
	if e.class != nil {
		errs = append(errs, e.class)
	}
	if e.temporary {
		errs = append(errs, exitcode.ErrTemporary)
	}
	if e.cause != nil {
		errs = append(errs, e.cause)
	}
	return errs
}

func classify(class, cause error, format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	if cause != nil {
		msg += ": " + cause.Error()
	}
	return &classified{class: class, temporary: class == ErrUnavailable, msg: msg, cause: cause}
}

// Artifact is one file to fetch.
type Artifact struct {
	Name    string // kubelet, containerd, runc, cni-plugins, crictl
	Version string // without a leading "v"
	// Path is the file's path under base-url and offline-dir (its
	// [artifacts] <name>-path template expanded), slash-separated, relative.
	// Its last element names the file in the cache.
	Path string
	// URL, when set, is where it is downloaded from instead of
	// base-url/Path (an override).
	URL string
	// Pinned, when set, is the expected SHA-256 (hex), and no sums file is
	// consulted.
	Pinned string
}

func (a Artifact) String() string { return a.Name + " " + a.Version }

// check refuses an Artifact that would put a file outside the cache or the
// offline directory. lib/config validates what the operator writes; this
// guards callers that build an Artifact themselves.
func (a Artifact) check() error {
	for _, s := range []string{a.Name, a.Version} {
		if s == "" || s == "." || s == ".." || strings.ContainsAny(s, "/\\") {
			return fmt.Errorf("artifact %q version %q: not a valid name and version", a.Name, a.Version)
		}
	}
	if a.Path == "" || path.IsAbs(a.Path) || path.Clean(a.Path) != a.Path || a.Path == ".." || strings.HasPrefix(a.Path, "../") || strings.Contains(a.Path, "\\") {
		return fmt.Errorf("artifact %s: path %q must be a clean relative path", a, a.Path)
	}
	if a.Pinned != "" && !isHexSum(a.Pinned) {
		return fmt.Errorf("artifact %s: pinned SHA-256 %q is not 64 hex digits", a, a.Pinned)
	}
	return nil
}

func isHexSum(s string) bool {
	if len(s) != 64 {
		return false
	}
	for _, c := range s {
		if !strings.ContainsRune("0123456789abcdefABCDEF", c) {
			return false
		}
	}
	return true
}

// FromConfig lists the artifacts cfg asks for on a CPU architecture arch
// (Go's name: runtime.GOARCH), in config.ArtifactNames order.
func FromConfig(cfg *config.Config, arch string) []Artifact {
	var out []Artifact
	for _, name := range cfg.ArtifactsWanted() {
		v := cfg.ArtifactVersion(name)
		a := Artifact{
			Name:    name,
			Version: v,
			Path:    config.ExpandArtifactURL(cfg.ArtifactURLTemplate(name), name, v, arch),
			Pinned:  strings.ToLower(cfg.Artifacts.Checksums[name]),
		}
		if o, ok := cfg.Artifacts.Overrides[name]; ok {
			a.URL = o.URL
			a.Pinned = strings.ToLower(o.SHA256)
		}
		out = append(out, a)
	}
	return out
}
