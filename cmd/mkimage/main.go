// Command mkimage builds the cluster side's OCI image (`make images`,
// ARCHITECTURE section 3): unbounded-controller, static, on an empty base,
// as user nonroot with the CA certificates, written reproducibly to
// dist/unbounded-controller_VERSION_linux_ARCH.oci.tar with its digest
// beside it (.digest). It is a build tool, never installed anywhere.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/alecthomas/kong"

	"unbounded-cloud.io/agent/lib/ociimage"
	"unbounded-cloud.io/agent/lib/state"
)

type cli struct {
	Binary  string `required:"" type:"existingfile" help:"The static executable (bin/unbounded-controller)."`
	Version string `required:"" help:"The version the image says it is (make's VERSION)."`
	Arch    string `default:"amd64" help:"The architecture the binary was built for (GOARCH)."`
	Out     string `default:"dist" type:"path" help:"The directory the archive and its digest are written to."`
	Name    string `default:"unbounded-controller" help:"The image's name: the archive's file name, the title, the path of the executable in the image (/NAME)."`
	Created string `env:"SOURCE_DATE_EPOCH" help:"The image's time, seconds since the epoch (default: the last commit's time, as for the packages)."`
}

func main() {
	var c cli
	kctx := kong.Parse(&c, kong.Name("mkimage"), kong.Description("Build the cluster side's OCI image reproducibly (make images)."))
	kctx.FatalIfErrorf(c.run())
}

func (c *cli) run() error {
	created, err := c.created()
	if err != nil {
		return err
	}
	img, err := ociimage.Build(ociimage.Spec{Binary: c.Binary, Path: "/" + c.Name, Title: c.Name, Version: c.Version, Arch: c.Arch, Created: created})
	if err != nil {
		return err
	}
	if err := os.MkdirAll(c.Out, 0o755); err != nil {
		return err
	}
	archive := filepath.Join(c.Out, fmt.Sprintf("%s_%s_linux_%s.oci.tar", c.Name, c.Version, c.Arch))
	digest, err := ociimage.WriteArchive(archive, img, c.Version)
	if err != nil {
		return err
	}
	if err := state.WriteFileAtomic(archive+".digest", []byte(digest.String()+"\n"), 0o644); err != nil {
		return err
	}
	fmt.Printf("image: %s\ndigest: %s\n", archive, digest)
	return nil
}

// created is SOURCE_DATE_EPOCH, else the last commit's time (git), as
// deb/build-packages.sh takes it: the same commit gives the same image.
func (c *cli) created() (time.Time, error) {
	if c.Created == "" {
		out, err := gitCommitTime()
		if err != nil {
			return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH is not set and the last commit's time is unknown: %w", err)
		}
		c.Created = out
	}
	secs, err := strconv.ParseInt(c.Created, 10, 64)
	if err != nil || secs < 0 {
		return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH=%q is not a number of seconds", c.Created)
	}
	return time.Unix(secs, 0).UTC(), nil
}
