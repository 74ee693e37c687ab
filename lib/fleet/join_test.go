package fleet

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"unbounded-cloud.io/agent/lib/api/identity"
	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/config"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/tests/fixtures"
)

func joinOptions(t *testing.T) JoinOptions {
	return JoinOptions{Machine: "site-w1", TTL: 2 * time.Hour, Mode: "nspawn", Image: "registry.example.internal/unbounded/node:1.36.3",
		APIServer: "https://127.0.0.1:1", KubernetesVersion: "1.36.3", CA: fixtures.CA(t),
		Now: func() time.Time { return time.Date(2026, 12, 3, 8, 0, 0, 0, time.UTC) }}
}

// join makes a bootstrap token Secret the API server's authenticator and
// the manifests' bindings accept (the groups, the TTL, authentication
// only), and host files that the agent's own configuration loader accepts
// as they are, the token 0600.
func TestJoinCreatesTheTokenAndFilesTheAgentAccepts(t *testing.T) {
	kube := fake.NewClientset()
	j, err := Join(context.Background(), kube, joinOptions(t))
	if err != nil {
		t.Fatal(err)
	}
	s, err := kube.CoreV1().Secrets(metav1.NamespaceSystem).Get(context.Background(), "bootstrap-token-"+j.TokenID, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	id, secret, _ := strings.Cut(j.Token, ".")
	if s.Type != corev1.SecretTypeBootstrapToken || s.StringData["token-id"] != id || s.StringData["token-secret"] != secret ||
		s.StringData["usage-bootstrap-authentication"] != "true" || s.StringData["usage-bootstrap-signing"] != "" ||
		s.StringData["auth-extra-groups"] != identity.BootstrapExtraGroups("site-w1") ||
		s.StringData["expiration"] != "2026-12-03T10:00:00Z" || s.Labels[JoinLabel] != "site-w1" {
		t.Errorf("token Secret: %+v", s)
	}
	if len(id) != 6 || len(secret) != 16 || strings.Trim(j.Token, tokenChars+".") != "" {
		t.Errorf("token %q: want [a-z0-9]{6}.[a-z0-9]{16}", j.Token)
	}

	dir := filepath.Join(t.TempDir(), "host")
	if err := j.WriteFiles(dir); err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	for _, f := range j.Files() {
		fi, err := os.Stat(filepath.Join(dir, f.Name))
		if err != nil || fi.Mode().Perm() != f.Mode {
			t.Errorf("%s: %v %v, want mode %04o", f.Name, fi, err, f.Mode)
		}
		// As the operator copies them onto the host.
		data, _ := os.ReadFile(filepath.Join(dir, f.Name))
		os.MkdirAll(filepath.Join(root, filepath.Dir(f.Host)), 0o755)
		os.WriteFile(filepath.Join(root, f.Host), data, f.Mode)
	}
	if fi, _ := os.Stat(filepath.Join(dir, "bootstrap-token")); fi.Mode().Perm() != 0o600 {
		t.Errorf("the token file is %04o, want 0600", fi.Mode().Perm())
	}
	cfg, err := config.Load(hostpaths.New(root))
	if err != nil {
		t.Fatalf("the agent refuses the files join wrote: %v\n%s", err, j.AgentTOML)
	}
	if cfg.Machine != "site-w1" || cfg.Mode != "nspawn" || cfg.Cluster.APIServer != "https://127.0.0.1:1" || cfg.Nspawn.Image != joinOptions(t).Image || cfg.Cluster.KubernetesVersion != "1.36.3" {
		t.Errorf("config from join's files: %+v", cfg)
	}
	if tok, err := cfg.ReadBootstrapToken(); err != nil || tok.Reveal() != j.Token {
		t.Errorf("token file: %v", err)
	}
}

// A host of mode container gets the node image too: its bundle's rootfs
// is built from it (the same [nspawn] image as mode nspawn); a host of
// mode none gets none.
func TestJoinWritesTheNodeImageForTheModesThatBuildFromIt(t *testing.T) {
	for mode, want := range map[string]string{"container": joinOptions(t).Image, "none": ""} {
		o := joinOptions(t)
		o.Mode = mode
		if mode == "none" {
			o.Image = ""
		}
		j, err := Join(context.Background(), fake.NewClientset(), o)
		if err != nil {
			t.Fatalf("mode %s: %v", mode, err)
		}
		root := t.TempDir()
		for _, f := range j.Files() {
			os.MkdirAll(filepath.Join(root, filepath.Dir(f.Host)), 0o755)
			os.WriteFile(filepath.Join(root, f.Host), f.Data, f.Mode)
		}
		cfg, err := config.Load(hostpaths.New(root))
		if err != nil {
			t.Fatalf("mode %s: the agent refuses the files join wrote: %v\n%s", mode, err, j.AgentTOML)
		}
		if cfg.Mode != mode || cfg.Nspawn.Image != want {
			t.Errorf("mode %s: config mode %q, image %q; want image %q", mode, cfg.Mode, cfg.Nspawn.Image, want)
		}
	}
	o := joinOptions(t)
	o.Mode, o.Image = "container", ""
	if _, err := Join(context.Background(), fake.NewClientset(), o); err == nil || !strings.Contains(err.Error(), "mode container needs the node image") {
		t.Errorf("mode container without an image: %v", err)
	}
}

// Bad input is refused before anything is created.
func TestJoinRefusesBadInputAndCreatesNothing(t *testing.T) {
	for name, mutate := range map[string]func(*JoinOptions){
		"a name with a dot":       func(o *JoinOptions) { o.Machine = "site.w1" },
		"an upper-case name":      func(o *JoinOptions) { o.Machine = "Site-W1" },
		"nspawn without an image": func(o *JoinOptions) { o.Image = "" },
		"an unknown mode":         func(o *JoinOptions) { o.Mode = "docker" },
		"a TTL under a minute":    func(o *JoinOptions) { o.TTL = time.Second },
		"an http API server":      func(o *JoinOptions) { o.APIServer = "http://127.0.0.1:1" },
		"no CA":                   func(o *JoinOptions) { o.CA = nil },
	} {
		kube := fake.NewClientset()
		o := joinOptions(t)
		mutate(&o)
		if _, err := Join(context.Background(), kube, o); err == nil {
			t.Errorf("%s: joined", name)
		}
		if l, _ := kube.CoreV1().Secrets(metav1.NamespaceSystem).List(context.Background(), metav1.ListOptions{}); len(l.Items) != 0 {
			t.Errorf("%s: a Secret was created", name)
		}
	}
}

// --list shows the tokens join made (not the cluster's others); --revoke
// deletes one machine's and no other's.
func TestListAndRevokeOnlyTouchJoinsTokens(t *testing.T) {
	other := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "bootstrap-token-abcdef", Namespace: metav1.NamespaceSystem}, Type: corev1.SecretTypeBootstrapToken}
	kube := fake.NewClientset(other)
	ctx := context.Background()
	for _, m := range []string{"site-w1", "site-w2", "site-w1"} {
		o := joinOptions(t)
		o.Machine = m
		if _, err := Join(ctx, kube, o); err != nil {
			t.Fatal(err)
		}
	}
	ts, err := ListJoins(ctx, kube)
	if err != nil || len(ts) != 3 || ts[0].Machine != "site-w1" || ts[2].Machine != "site-w2" {
		t.Fatalf("list: %+v %v", ts, err)
	}
	if n, err := Revoke(ctx, kube, "site-w1"); err != nil || n != 2 {
		t.Errorf("revoke site-w1: %d %v, want 2", n, err)
	}
	l, _ := kube.CoreV1().Secrets(metav1.NamespaceSystem).List(ctx, metav1.ListOptions{})
	if len(l.Items) != 2 {
		t.Errorf("after the revoke: %d Secrets, want site-w2's and the cluster's other one", len(l.Items))
	}
	if _, err := Revoke(ctx, kube, "bad.name"); err == nil {
		t.Error("revoke of a name that is no machine's")
	}
}

// A cluster without the agent's CRDs or bindings is said in so many
// words, naming what to apply.
func TestCheckInstalledNamesWhatIsMissing(t *testing.T) {
	kube := fake.NewClientset()
	if err := CheckInstalled(context.Background(), kube.Discovery(), kube); !errors.Is(err, ErrNotInstalled) || !strings.Contains(err.Error(), "unbounded manifests") {
		t.Errorf("an empty cluster: %v", err)
	}
	kube.Resources = []*metav1.APIResourceList{{GroupVersion: v1alpha3.SchemeGroupVersion.String(), APIResources: []metav1.APIResource{{Name: v1alpha3.ResourceMachines}}}}
	if err := CheckInstalled(context.Background(), kube.Discovery(), kube); !errors.Is(err, ErrNotInstalled) || !strings.Contains(err.Error(), BootstrapRoleBinding) {
		t.Errorf("CRDs without the bindings: %v", err)
	}
	kube.RbacV1().ClusterRoleBindings().Create(context.Background(), &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: BootstrapRoleBinding}}, metav1.CreateOptions{})
	if err := CheckInstalled(context.Background(), kube.Discovery(), kube); err != nil {
		t.Errorf("installed: %v", err)
	}
}
