package tree

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"unbounded-cloud.io/agent/lib/exitcode"
	"unbounded-cloud.io/agent/lib/modes"
)

// Image reference prefixes of local sources (lib/modes.Image.Ref).
const (
	ociLayoutPrefix     = "oci-layout:"
	dockerArchivePrefix = "docker-archive:"
)

// ErrImageNotFound means the image reference names nothing: no such
// image in the registry, layout or archive. Final (exit 1).
var ErrImageNotFound = errors.New("node image not found")

// platform is the only one a machine on this host can run.
var platform = v1.Platform{OS: "linux", Architecture: runtime.GOARCH}

// splitLocal splits "PATH[:TAG]" of a local image source. A tag may hold
// ':' itself ("node.tar:unbounded/node:1.36.3"), and so may a path: the
// path is the whole string when it exists, else the shortest prefix
// before a ':' that exists.
func splitLocal(s string) (p, tag string) {
	if _, err := os.Stat(s); err == nil {
		return s, ""
	}
	for i := 0; i < len(s); i++ {
		if s[i] != ':' {
			continue
		}
		if _, err := os.Stat(s[:i]); err == nil {
			return s[:i], s[i+1:]
		}
	}
	return s, ""
}

// resolveImage finds the image img names. It returns the image and where
// it came from, for messages and the record. Registry errors that a retry
// may cure (no route, refused, 5xx, 429) wrap exitcode.ErrTemporary; a
// reference that names nothing wraps ErrImageNotFound.
func (b *Builder) resolveImage(ctx context.Context, img modes.Image) (v1.Image, string, error) {
	ref := img.Ref
	switch {
	case ref == "":
		return nil, "", fmt.Errorf("%w: no node image: nspawn.image is not set (mode nspawn needs it)", exitcode.ErrConfigInvalid)
	case strings.HasPrefix(ref, ociLayoutPrefix):
		dir, tag := splitLocal(strings.TrimPrefix(ref, ociLayoutPrefix))
		i, err := fromLayout(dir, func(ann map[string]string) bool { return tag == "" || matches(ann, tag, tag) })
		if err != nil {
			return nil, ref, fmt.Errorf("%s: %w", ref, err)
		}
		return i, ref, nil
	case strings.HasPrefix(ref, dockerArchivePrefix):
		file, tag := splitLocal(strings.TrimPrefix(ref, dockerArchivePrefix))
		var t *name.Tag
		if tag != "" {
			nt, err := name.NewTag(tag)
			if err != nil {
				return nil, ref, fmt.Errorf("node image %s: %w", ref, err)
			}
			t = &nt
		}
		i, err := tarball.ImageFromPath(file, t)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				err = fmt.Errorf("%w: %w", ErrImageNotFound, err)
			}
			return nil, ref, fmt.Errorf("node image %s: %w", ref, err)
		}
		return i, ref, nil
	}
	r, err := name.ParseReference(ref)
	if err != nil {
		return nil, ref, fmt.Errorf("node image %q: %w", ref, err)
	}
	if img.OfflineDir != "" {
		dir := filepath.Join(img.OfflineDir, "images")
		if _, err := os.Stat(filepath.Join(dir, "index.json")); err == nil {
			full, short := r.Name(), r.Identifier()
			i, err := fromLayout(dir, func(ann map[string]string) bool { return matches(ann, full, short) })
			if err == nil {
				return i, ociLayoutPrefix + dir + " (offline copy of " + ref + ")", nil
			}
			if !errors.Is(err, ErrImageNotFound) {
				return nil, ref, err
			}
		}
	}
	opts := append([]remote.Option{remote.WithContext(ctx), remote.WithPlatform(platform)}, b.RemoteOptions...)
	desc, err := remote.Get(r, opts...)
	if err != nil {
		return nil, ref, fmt.Errorf("node image %s: %w", ref, classify(err))
	}
	// A 200 whose body is no manifest at all (a captive portal, a proxy
	// answering for the registry, a web server at that address) would
	// otherwise surface later as a JSON syntax error from deep inside the
	// unpack. Final (exit 1): the same question gets the same answer until
	// someone fixes the registry or the path to it.
	if !json.Valid(desc.Manifest) {
		return nil, ref, fmt.Errorf("node image %s: %s answered with something that is not an image manifest (Content-Type %q, %d bytes: %q): is a proxy or a web page answering in place of the registry?",
			ref, r.Context().RegistryStr(), desc.MediaType, len(desc.Manifest), snippet(desc.Manifest, 64))
	}
	i, err := desc.Image()
	if err != nil {
		return nil, ref, fmt.Errorf("node image %s: %w", ref, classify(err))
	}
	return i, ref, nil
}

// snippet is the start of a body, at most n bytes, for a message.
func snippet(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "..."
	}
	return string(b)
}

// matches reports whether an index entry's annotations name the image:
// the full reference, or the tag alone (what `skopeo copy oci:DIR:TAG`
// writes).
func matches(ann map[string]string, full, short string) bool {
	for _, k := range []string{"org.opencontainers.image.ref.name", "io.containerd.image.name"} {
		if v := ann[k]; v != "" && (v == full || v == short) {
			return true
		}
	}
	return false
}

// fromLayout picks, in the OCI layout dir, the image for this platform
// whose index entry want accepts (descending into nested indexes).
func fromLayout(dir string, want func(map[string]string) bool) (v1.Image, error) {
	p, err := layout.FromPath(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: no OCI layout at %s: %w", ErrImageNotFound, dir, err)
	} else if err != nil {
		return nil, fmt.Errorf("node image: OCI layout %s: %w", dir, err)
	}
	ii, err := p.ImageIndex()
	if err != nil {
		return nil, fmt.Errorf("node image: OCI layout %s: %w", dir, err)
	}
	im, err := ii.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("node image: OCI layout %s: %w", dir, err)
	}
	for _, d := range im.Manifests {
		if !want(d.Annotations) {
			continue
		}
		switch {
		case d.MediaType.IsImage():
			if d.Platform != nil && !d.Platform.Satisfies(platform) {
				continue
			}
			return ii.Image(d.Digest)
		case d.MediaType.IsIndex():
			sub, err := ii.ImageIndex(d.Digest)
			if err != nil {
				return nil, err
			}
			sm, err := sub.IndexManifest()
			if err != nil {
				return nil, err
			}
			for _, sd := range sm.Manifests {
				if sd.MediaType.IsImage() && (sd.Platform == nil || sd.Platform.Satisfies(platform)) {
					return sub.Image(sd.Digest)
				}
			}
		}
	}
	return nil, fmt.Errorf("%w: OCI layout %s has no matching %s image", ErrImageNotFound, dir, platform)
}

// classify marks registry errors: temporary when a retry may cure them,
// not-found when the registry says the name or manifest does not exist.
// Anything else (a registry answering garbage, a refused credential) is
// final as it is.
func classify(err error) error {
	var te *transport.Error
	if errors.As(err, &te) {
		switch {
		case te.Temporary():
			return fmt.Errorf("%w: %w", exitcode.ErrTemporary, err)
		case te.StatusCode == 404:
			return fmt.Errorf("%w: %w", ErrImageNotFound, err)
		}
		for _, d := range te.Errors {
			if d.Code == transport.ManifestUnknownErrorCode || d.Code == transport.NameUnknownErrorCode {
				return fmt.Errorf("%w: %w", ErrImageNotFound, err)
			}
		}
		return err
	}
	var ne net.Error
	var ue *url.Error
	var oe *net.OpError
	switch {
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH),
		errors.Is(err, context.DeadlineExceeded), errors.As(err, &oe):
		return fmt.Errorf("%w: %w", exitcode.ErrTemporary, err)
	case errors.As(err, &ne) && ne.Timeout(), errors.As(err, &ue) && ue.Timeout():
		return fmt.Errorf("%w: %w", exitcode.ErrTemporary, err)
	}
	return err
}
