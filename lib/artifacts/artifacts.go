// Package artifacts delivers the node stack's files (kubelet, containerd,
// runc, cni-plugins, optionally crictl) at the versions of [artifacts] in
// lib/config, verified against a SHA-256, into the cache under the host root
// (hostpaths.ArtifactsDir); the mode (lib/modes/<mode>) installs them from
// there. Fetcher.Fetch says where a file and its expected sum come from, and
// the Err* values which failures are retried. It links no Kubernetes client:
// it goes into every binary that bootstraps, and stays small.
package artifacts

import (
	"errors"
	"fmt"
	"path"
	"strings"

	"unbounded-cloud.io/agent/lib/config"
	"unbounded-cloud.io/agent/lib/exitcode"
)

// Errors, for lib/exitcode with errors.Is: ErrUnavailable also matches
// exitcode.ErrTemporary (exit 75, the unit retries); the others are final
// (exit 1).
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
	// broke (connection refused, a timeout, a stalled or cut body, 408,
	// 429, 5xx, DNS; an expired certificate too, as at first boot before
	// the clock is set). Also matches exitcode.ErrTemporary: exit 75,
	// retried.
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
