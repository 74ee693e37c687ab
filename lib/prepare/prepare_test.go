package prepare_test

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"unbounded-cloud.io/agent/lib/artifacts"
	"unbounded-cloud.io/agent/lib/config"
	"unbounded-cloud.io/agent/lib/exitcode"
	"unbounded-cloud.io/agent/lib/modes/bluegreen/tree/treetest"
	"unbounded-cloud.io/agent/lib/modes/modestest"
	"unbounded-cloud.io/agent/lib/prepare"
	"unbounded-cloud.io/agent/lib/testhost"
)

// imageConfig is an image's agent.toml: no machine, no token (each
// host's, at its first boot).
const imageConfig = `mode = "%MODE%"

[cluster]
api-server = "https://127.0.0.1:6443"
kubernetes-version = "1.36.3"

[nspawn]
image = "%IMAGE%"
`

type image struct {
	root string
	logs *bytes.Buffer
	p    *prepare.Prepare
}

// newImage is an OS image's root with the agent's config baked in, its
// artifacts served by a fake fetch (lib/artifacts is tested on its own).
func newImage(t *testing.T, mode, ref string) *image {
	t.Helper()
	root := t.TempDir()
	w, err := testhost.New(root)
	if err != nil {
		t.Fatal(err)
	}
	// An image, not a host: no token, no host root yet, a /usr.
	os.Remove(w.P.Join("/etc/unbounded/bootstrap-token"))
	os.RemoveAll(w.P.HostRoot())
	os.MkdirAll(w.P.Join("/usr/bin"), 0o755)
	cfg := strings.NewReplacer("%MODE%", mode, "%IMAGE%", ref).Replace(imageConfig)
	if err := os.WriteFile(w.P.ConfigFile(), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	a := modestest.Artifacts(t)
	logs := &bytes.Buffer{}
	return &image{root: root, logs: logs, p: &prepare.Prepare{
		Paths: w.P,
		Log:   slog.New(slog.NewTextHandler(logs, nil)),
		Fetch: func(ctx context.Context, cfg *config.Config) ([]artifacts.Result, error) {
			var out []artifacts.Result
			for name, f := range map[string]string{"kubelet": a.Kubelet, "containerd": a.Containerd, "runc": a.Runc, "cni-plugins": a.CNIPlugins} {
				out = append(out, artifacts.Result{Artifact: artifacts.Artifact{Name: name}, File: f, SHA256: "0"})
			}
			return out, nil
		},
	}}
}

func TestPrepareBakesTheNodeImageAndNothingOfAHost(t *testing.T) {
	treetest.RequireRoot(t)
	ref := treetest.ServeRegistry(t, "unbounded/node:1.36.3", treetest.NodeImage(t))
	for _, mode := range []string{"nspawn", "container"} {
		t.Run(mode, func(t *testing.T) {
			img := newImage(t, mode, ref)
			res, err := img.p.Run(context.Background())
			if err != nil {
				t.Fatalf("%v\n%s", err, img.logs)
			}
			if res.Mode != mode || res.Tree == nil || res.Tree.Image != ref || !strings.HasPrefix(res.Tree.Digest, "sha256:") {
				t.Fatalf("result %+v", res)
			}
			p := img.p.Paths
			if fi, err := os.Stat(p.HostRoot()); err != nil || fi.Mode().Perm() != 0o700 {
				t.Errorf("host root %v %v: want it made 0700, as bootstrap makes it", fi, err)
			}
			tree := filepath.Join(p.PreparedDir(), "tree")
			for _, f := range []string{"usr/bin/sh", "usr/local/bin/kubelet"} {
				if _, err := os.Stat(filepath.Join(tree, f)); err != nil {
					t.Errorf("prepared tree: %v", err)
				}
			}
			if _, err := os.Stat(filepath.Join(p.PreparedDir(), "stamp.json")); err != nil {
				t.Errorf("no stamp: %v", err)
			}
			// Nothing of a host: no node name, no kubeconfig, no slot,
			// no machine directory.
			for _, f := range []string{filepath.Join(tree, "etc/hostname"), filepath.Join(tree, "var/lib/kubelet"), p.MachineDir("kube1"), p.SlotDir("kube1")} {
				if _, err := os.Stat(f); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("%s exists after prepare (%v): nothing host-specific may be baked", f, err)
				}
			}
			// Again: the same result.
			if _, err := img.p.Run(context.Background()); err != nil {
				t.Fatal(err)
			}
			ents, _ := os.ReadDir(p.PreparedDir())
			if len(ents) != 2 {
				t.Errorf("prepared/ after a second run: %v, want tree and stamp.json only", ents)
			}
		})
	}
}

func TestPrepareOfModeNoneBakesTheArtifactsOnly(t *testing.T) {
	img := newImage(t, "none", "")
	res, err := img.p.Run(context.Background())
	if err != nil || res.Tree != nil || len(res.Artifacts) != 4 {
		t.Fatalf("Run = %+v, %v", res, err)
	}
	if _, err := os.Stat(img.p.Paths.PreparedDir()); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("mode none has no node image to prepare, but prepared/ is there: %v", err)
	}
}

// A bad config or a root that is no OS tree: exit 78, nothing written.
func TestPrepareRefusesABadConfigOrARootWithoutAnOSAndChangesNothing(t *testing.T) {
	img := newImage(t, "nspawn", "registry.example/node:1.36.3")
	os.WriteFile(img.p.Paths.ConfigFile(), []byte("mode = \"vm\"\n"), 0o644)
	_, err := img.p.Run(context.Background())
	if exitcode.For(err) != exitcode.ConfigInvalid || !strings.Contains(err.Error(), "agent.toml") || !strings.Contains(err.Error(), "mode") {
		t.Errorf("bad config: %v (exit %d), want 78 naming the file and the key", err, exitcode.For(err))
	}
	if _, err := os.Stat(img.p.Paths.HostRoot()); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a refused config made the host root (%v)", err)
	}

	img = newImage(t, "nspawn", "registry.example/node:1.36.3")
	os.RemoveAll(img.p.Paths.Join("/usr"))
	_, err = img.p.Run(context.Background())
	if !errors.Is(err, prepare.ErrNotAnOSTree) || exitcode.For(err) != exitcode.ConfigInvalid {
		t.Errorf("no /usr: %v, want ErrNotAnOSTree, exit 78", err)
	}
	if _, err := os.Stat(img.p.Paths.HostRoot()); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a refused root got a host root (%v)", err)
	}
}
