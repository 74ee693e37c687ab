package nodestack_test

import (
	"archive/tar"
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"unbounded-cloud.io/agent/tests/system/nodestack"
)

func get(t *testing.T, url string, hdr ...string) (*http.Response, []byte, error) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp, body, err
}

func TestMirrorServesEveryArtifactWithItsSumAndFailsOnDemand(t *testing.T) {
	s := nodestack.Require(t)
	mirror := s.Mirror(t)
	srv := nodestack.ServeArtifacts(t, mirror)

	sums, err := os.ReadFile(filepath.Join(mirror, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range nodestack.Artifacts {
		p := s.Path(a)
		want, err := nodestack.FileSHA256(filepath.Join(mirror, p))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(sums), want+"  "+p+"\n") {
			t.Errorf("SHA256SUMS has no line %q:\n%s", want+"  "+p, sums)
		}
		resp, body, err := get(t, srv.URL+"/"+p)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("GET %s: %v %v", p, resp, err)
		}
		if fi, _ := os.Stat(filepath.Join(mirror, p)); int64(len(body)) != fi.Size() {
			t.Errorf("GET %s: %d bytes, want %d", p, len(body), fi.Size())
		}
	}
	runc := srv.URL + "/" + s.Path("runc")

	// A resumed download.
	resp, body, err := get(t, runc, "Range", "bytes=100-")
	if err != nil || resp.StatusCode != http.StatusPartialContent {
		t.Fatalf("range GET: %v %v", resp, err)
	}
	fi, _ := os.Stat(filepath.Join(mirror, s.Path("runc")))
	if int64(len(body)) != fi.Size()-100 {
		t.Errorf("range GET: %d bytes, want %d", len(body), fi.Size()-100)
	}

	srv.SetFault(nodestack.Fault{Status: 503})
	if resp, _, err := get(t, runc); err != nil || resp.StatusCode != 503 {
		t.Errorf("Status fault: %v %v, want 503", resp, err)
	}
	srv.SetFault(nodestack.Fault{Garbage: 1000})
	if resp, body, err := get(t, runc); err != nil || resp.StatusCode != 200 || len(body) != 1000 {
		t.Errorf("Garbage fault: %v %d bytes %v, want 200 and 1000 bytes", resp, len(body), err)
	}
	srv.SetFault(nodestack.Fault{CutAfter: 4096})
	if _, body, err := get(t, runc); !errors.Is(err, io.ErrUnexpectedEOF) || len(body) != 4096 {
		t.Errorf("CutAfter fault: %d bytes, %v; want 4096 and an unexpected EOF", len(body), err)
	}
	srv.SetFault(nodestack.Fault{Delay: 300 * time.Millisecond})
	start := time.Now()
	if resp, _, err := get(t, runc); err != nil || resp.StatusCode != 200 || time.Since(start) < 300*time.Millisecond {
		t.Errorf("Delay fault: %v %v after %v", resp, err, time.Since(start))
	}
	srv.SetFault(nodestack.Fault{})

	srv.Close()
	if _, _, err := get(t, runc); err == nil || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("closed server: %v, want connection refused", err)
	}
	srv.Reopen(t)
	if resp, _, err := get(t, runc); err != nil || resp.StatusCode != 200 {
		t.Errorf("reopened server: %v %v", resp, err)
	}
	if n := len(srv.Requests()); n < 10 {
		t.Errorf("%d requests recorded, want every one", n)
	}
}

func TestRegistryServesThePushedImagesAndGarbageOnDemand(t *testing.T) {
	s := nodestack.Require(t)
	reg := nodestack.StartRegistry(t)
	pause := reg.Push(t, "pause:3.10", s.PauseImage(t))
	app := reg.Push(t, "busybox:1.35", s.BusyboxImage(t))
	for _, r := range []string{pause, app} {
		ref, err := name.ParseReference(r, name.Insecure)
		if err != nil {
			t.Fatal(err)
		}
		img, err := remote.Image(ref, remote.WithContext(context.Background()))
		if err != nil {
			t.Fatalf("pull %s: %v", r, err)
		}
		cf, err := img.ConfigFile()
		if err != nil || cf.OS != "linux" {
			t.Errorf("%s config: %+v %v", r, cf, err)
		}
		layers, err := img.Layers()
		if err != nil || len(layers) != 1 {
			t.Errorf("%s: %d layers %v, want 1", r, len(layers), err)
		}
	}
	reg.SetGarbage(true)
	ref, _ := name.ParseReference(pause, name.Insecure)
	img, err := remote.Image(ref)
	if err == nil {
		// The manifest is parsed when first used.
		_, err = img.ConfigFile()
	}
	if err == nil {
		t.Error("pull from a registry answering garbage succeeded")
	} else {
		t.Logf("garbage registry: %v", err)
	}
}

func TestWriteLayoutKeepsEveryImageByName(t *testing.T) {
	s := nodestack.Require(t)
	dir := filepath.Join(t.TempDir(), "oci")
	nodestack.WriteLayout(t, dir, "pause:3.10", s.PauseImage(t))
	nodestack.WriteLayout(t, dir, "busybox:1.35", s.BusyboxImage(t))
	p, err := layout.FromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, d := range m.Manifests {
		names = append(names, d.Annotations["org.opencontainers.image.ref.name"])
		img, err := idx.Image(d.Digest)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := img.Layers(); err != nil {
			t.Fatal(err)
		}
	}
	if strings.Join(names, ",") != "pause:3.10,busybox:1.35" {
		t.Errorf("layout holds %v, want pause:3.10 and busybox:1.35", names)
	}
}

func TestNodeImageIsTheRootfsAndPushes(t *testing.T) {
	s := nodestack.Require(t)
	reg := nodestack.StartRegistry(t)
	r := reg.Push(t, "unbounded/node:bookworm", s.NodeImage(t))
	ref, err := name.ParseReference(r, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	img, err := remote.Image(ref)
	if err != nil {
		t.Fatal(err)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 2 {
		t.Fatalf("%d layers, %v; want 2 (the rootfs, iptables)", len(layers), err)
	}
	rootfs := layerEntries(t, layers[0])
	for _, n := range []string{"usr/lib/systemd/systemd", "etc/machine-id"} {
		if _, ok := rootfs[n]; !ok {
			t.Errorf("layer of the node image lacks %s", n)
		}
	}
	for n := range rootfs {
		if strings.HasPrefix(n, "dev/") && n != "dev/" {
			t.Errorf("layer holds %s: device nodes are the runtime's", n)
		}
	}

	// The second layer: iptables on the legacy backend.
	links := layerEntries(t, layers[1])
	if links["usr/sbin/iptables"] != "iptables-legacy" {
		t.Errorf("iptables layer: usr/sbin/iptables -> %q, want iptables-legacy", links["usr/sbin/iptables"])
	}
	if _, ok := links["usr/sbin/xtables-legacy-multi"]; !ok {
		t.Error("iptables layer lacks usr/sbin/xtables-legacy-multi")
	}
}

// layerEntries maps each path of a layer (without "./") to its link
// target ("" for anything but a link).
func layerEntries(t *testing.T, l v1.Layer) map[string]string {
	t.Helper()
	rc, err := l.Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	out := map[string]string{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out[strings.TrimPrefix(h.Name, "./")] = h.Linkname
	}
}
