// Package prepare bakes into an OS image's root what every host booted
// from the image would otherwise build identically at its first boot:
// `unbounded prepare --root DIR` (the prepare concern), run by an image
// builder after it installed the agent's package into DIR, with no
// systemd running, no cluster and no machine identity.
//
// It reads the config baked into the image (config.LoadImage: the
// machine's name and the bootstrap token are each host's), fetches and
// verifies the artifacts into the image's verified cache, and, for a mode
// whose node boots from the node image (nspawn, container), builds the
// host-independent part of a slot's tree into the image's prepared/
// (tree.Builder.Prepare: the node image unpacked, the artifacts, the
// offline pod images) with the stamp of its input. The first boot of a
// host from the image takes that tree when its config still matches the
// stamp, and builds as without it (saying which input differed) when it
// does not. Nothing host-specific is written: the node's name, its
// token, certificates, IPs, resolv.conf, machine-id and devices are the
// first boot's.
package prepare

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"unbounded-cloud.io/agent/lib/artifacts"
	"unbounded-cloud.io/agent/lib/config"
	"unbounded-cloud.io/agent/lib/exitcode"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/modes"
	"unbounded-cloud.io/agent/lib/modes/bluegreen/tree"
	"unbounded-cloud.io/agent/lib/modes/facts"
)

// Prepare is one run.
type Prepare struct {
	// Paths is the image's root (hostpaths.New(DIR)).
	Paths hostpaths.Paths
	// Fetch fetches the verified artifacts; nil: lib/artifacts into the
	// image's cache.
	Fetch func(ctx context.Context, cfg *config.Config) ([]artifacts.Result, error)
	// Log receives progress lines; nil is slog.Default().
	Log *slog.Logger
}

// Result is what a run prepared.
type Result struct {
	Mode      string
	Artifacts []artifacts.Result
	// Tree is the prepared tree's stamp, nil for a mode that boots no
	// node image (none: the artifacts only).
	Tree *tree.Stamp
}

// ErrNotAnOSTree: the root is not an OS tree an image builder made.
var ErrNotAnOSTree = errors.New("not an OS tree")

func (p *Prepare) log() *slog.Logger {
	if p.Log != nil {
		return p.Log
	}
	return slog.Default()
}

// Run prepares the image. A config that is not valid is
// exitcode.ErrConfigInvalid (78) and changes nothing; an artifact or an
// image that cannot be had now is temporary (75).
func (p *Prepare) Run(ctx context.Context) (*Result, error) {
	if fi, err := os.Stat(p.Paths.Join("/usr")); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("%w: %s has no /usr: run prepare with --root at the image's root, after the agent's package is installed into it: %w",
			exitcode.ErrConfigInvalid, p.Paths.Join("/"), ErrNotAnOSTree)
	}
	cfg, err := config.LoadImage(p.Paths)
	if err != nil {
		return nil, err
	}
	// The host root, as bootstrap makes it (0700): the verified cache
	// and the prepared tree go into it.
	if err := os.MkdirAll(filepath.Dir(p.Paths.HostRoot()), 0o755); err != nil {
		return nil, err
	}
	if err := os.Mkdir(p.Paths.HostRoot(), 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, err
	}
	res := &Result{Mode: cfg.Mode}
	if res.Artifacts, err = p.fetch(ctx, cfg); err != nil {
		return res, fmt.Errorf("artifacts: %w", err)
	}
	for _, r := range res.Artifacts {
		p.log().Info("artifact verified into the image's cache", "artifact", r.Name, "version", r.Version, "sha256", r.SHA256, "source", r.Source)
	}
	if !facts.FromNodeImage(cfg.Mode) {
		p.log().Info("mode boots no node image: the artifacts are what is prepared", "mode", cfg.Mode)
		return res, nil
	}
	files := map[string]string{}
	for _, r := range res.Artifacts {
		files[r.Name] = r.File
	}
	a, err := modes.ArtifactsByName(files)
	if err != nil {
		return res, err
	}
	s := modes.Slot{Name: "prepared", Artifacts: a, Image: modes.Image{Ref: cfg.Nspawn.Image}}
	if cfg.Artifacts.OfflineDir != "" {
		s.Image.OfflineDir = cfg.Resolve(cfg.Artifacts.OfflineDir)
	}
	b := &tree.Builder{Paths: p.Paths, Log: p.log()}
	st, err := b.Prepare(ctx, s)
	if err != nil {
		return res, fmt.Errorf("node image: %w", err)
	}
	res.Tree = &st
	p.log().Info("node image and artifacts prepared for the first boot", "mode", cfg.Mode, "image", st.Image, "digest", st.Digest,
		"dir", p.Paths.Rel(p.Paths.PreparedDir()))
	return res, nil
}

func (p *Prepare) fetch(ctx context.Context, cfg *config.Config) ([]artifacts.Result, error) {
	if p.Fetch != nil {
		return p.Fetch(ctx, cfg)
	}
	return artifacts.FetchConfig(ctx, cfg, p.Paths, p.log())
}
