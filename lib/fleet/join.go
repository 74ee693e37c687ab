// Package fleet is the operator's workstation side of the agent
// (cmd/kubectl-unbounded): joining a host (a bootstrap token for its
// machine and the three files the host needs), and the fleet as a table.
// It links client-go's typed clients: it runs on workstations, never on
// hosts, so it is outside the hosts' size budget (ARCHITECTURE section 3).
package fleet

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes"

	"unbounded-cloud.io/agent/lib/api/identity"
	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/modes/facts"
	"unbounded-cloud.io/agent/lib/state"
)

// JoinLabel marks the bootstrap token Secrets join creates with the
// machine they are for (--list, --revoke).
const JoinLabel = v1alpha3.GroupName + "/join-machine"

// BootstrapRoleBinding is the binding `unbounded manifests` creates for
// every agent's bootstrap token: its absence means the manifests are not
// applied, and a joined host could not report or fence.
const BootstrapRoleBinding = "unbounded-agent:bootstrap"

// Host paths the written agent.toml names (where the host's files go).
const (
	HostConfig = "/etc/unbounded/agent.toml"
	HostCA     = "/etc/unbounded/ca.crt"
	HostToken  = "/etc/unbounded/bootstrap-token"
)

// JoinOptions are join's inputs.
type JoinOptions struct {
	Machine string
	// TTL is the token's life; the cluster's token cleaner deletes it
	// after.
	TTL time.Duration
	// Mode is the host's isolation mode; Image the node image (mode
	// nspawn).
	Mode, Image string
	// APIServer is the URL the host reaches the API server at;
	// KubernetesVersion the kubelet's version ("" is the server's).
	APIServer, KubernetesVersion string
	// CA is the cluster CA's PEM.
	CA []byte
	// ArtifactsURL is [artifacts] base-url ("": offline-dir only).
	ArtifactsURL string
	Now          func() time.Time
}

// Joined is what join made: the token Secret and the host's three files.
type Joined struct {
	Machine   string
	TokenID   string
	Token     string // id.secret: the content of the token file (0600)
	Expires   time.Time
	AgentTOML []byte
	CA        []byte
}

// Files are the host files of j, by their names in -o DIR, with their
// modes: the token file 0600 (a secret), the others 0644.
func (j *Joined) Files() []File {
	return []File{
		{Name: "agent.toml", Host: HostConfig, Mode: 0o644, Data: j.AgentTOML},
		{Name: "ca.crt", Host: HostCA, Mode: 0o644, Data: j.CA},
		{Name: "bootstrap-token", Host: HostToken, Mode: 0o600, Data: []byte(j.Token + "\n")},
	}
}

// File is one host file join writes.
type File struct {
	Name, Host string
	Mode       os.FileMode
	Data       []byte
}

// WriteFiles writes j's files into dir (created 0700), each atomically
// with its mode; an existing file of the same name is replaced.
func (j *Joined) WriteFiles(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	for _, f := range j.Files() {
		if err := state.WriteFileAtomic(filepath.Join(dir, f.Name), f.Data, f.Mode); err != nil {
			return err
		}
	}
	return nil
}

// ErrNotInstalled is a cluster without the agent's CRDs or RBAC.
var ErrNotInstalled = errors.New("the cluster lacks the agent's manifests: apply them first with `unbounded manifests | kubectl apply -f -`")

// CheckInstalled says whether the cluster has the Machine CRD and the
// bootstrap binding `unbounded manifests` creates.
func CheckInstalled(ctx context.Context, d discovery.DiscoveryInterface, kube kubernetes.Interface) error {
	rl, err := d.ServerResourcesForGroupVersion(v1alpha3.SchemeGroupVersion.String())
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("%w (no API group %s)", ErrNotInstalled, v1alpha3.SchemeGroupVersion)
	}
	if err != nil {
		return fmt.Errorf("discovery of %s: %w", v1alpha3.SchemeGroupVersion, err)
	}
	found := false
	for _, r := range rl.APIResources {
		found = found || r.Name == v1alpha3.ResourceMachines
	}
	if !found {
		return fmt.Errorf("%w (no resource %s in %s)", ErrNotInstalled, v1alpha3.ResourceMachines, v1alpha3.SchemeGroupVersion)
	}
	if _, err := kube.RbacV1().ClusterRoleBindings().Get(ctx, BootstrapRoleBinding, metav1.GetOptions{}); apierrors.IsNotFound(err) {
		return fmt.Errorf("%w (no ClusterRoleBinding %s)", ErrNotInstalled, BootstrapRoleBinding)
	} else if err != nil {
		return fmt.Errorf("read ClusterRoleBinding %s: %w", BootstrapRoleBinding, err)
	}
	return nil
}

const tokenChars = "abcdefghijklmnopqrstuvwxyz0123456789"

// randomString is n characters of tokenChars from crypto/rand, without
// modulo bias (bytes of 252 and up, 7×36, are drawn again).
func randomString(n int) string {
	out := make([]byte, 0, n)
	b := make([]byte, 1)
	for len(out) < n {
		rand.Read(b) // never fails (crypto/rand, Go 1.24+)
		if b[0] < 252 {
			out = append(out, tokenChars[int(b[0])%len(tokenChars)])
		}
	}
	return string(out)
}

// Join creates a bootstrap token Secret for o.Machine (kube-system,
// bootstrap.kubernetes.io/token, authentication only, the groups the
// manifests bind: identity.BootstrapExtraGroups, expiring after o.TTL) and
// returns the host's files. A machine name that is not a DNS label is
// refused before anything is created.
func Join(ctx context.Context, kube kubernetes.Interface, o JoinOptions) (*Joined, error) {
	if err := identity.ValidateMachineName(o.Machine); err != nil {
		return nil, err
	}
	switch {
	case facts.FromNodeImage(o.Mode):
		if o.Image == "" {
			return nil, fmt.Errorf("mode %s needs the node image (--image REF): the host builds its node from it", o.Mode)
		}
	case facts.Valid(o.Mode):
	default:
		return nil, fmt.Errorf("mode %q: one of %s", o.Mode, strings.Join(facts.Names(), ", "))
	}
	if o.TTL < time.Minute || o.TTL > 365*24*time.Hour {
		return nil, fmt.Errorf("ttl %s: between 1m and 8760h", o.TTL)
	}
	if !strings.HasPrefix(o.APIServer, "https://") {
		return nil, fmt.Errorf("API server %q: an https:// URL the host reaches", o.APIServer)
	}
	if len(o.CA) == 0 {
		return nil, errors.New("no cluster CA: the kubeconfig names none (give --ca-file)")
	}
	now := time.Now
	if o.Now != nil {
		now = o.Now
	}
	id, secret := randomString(6), randomString(16)
	expires := now().Add(o.TTL).UTC().Truncate(time.Second)
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name: "bootstrap-token-" + id, Namespace: metav1.NamespaceSystem,
			Labels: map[string]string{JoinLabel: o.Machine},
		},
		Type: corev1.SecretTypeBootstrapToken,
		StringData: map[string]string{
			"token-id":                       id,
			"token-secret":                   secret,
			"usage-bootstrap-authentication": "true",
			"auth-extra-groups":              identity.BootstrapExtraGroups(o.Machine),
			"expiration":                     expires.Format(time.RFC3339),
			"description":                    "unbounded-agent: join of machine " + o.Machine,
		},
	}
	if _, err := kube.CoreV1().Secrets(metav1.NamespaceSystem).Create(ctx, s, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("create the bootstrap token Secret: %w", err)
	}
	j := &Joined{Machine: o.Machine, TokenID: id, Token: id + "." + secret, Expires: expires, CA: o.CA}
	j.AgentTOML = agentTOML(o)
	return j, nil
}

func agentTOML(o JoinOptions) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "# Written by kubectl unbounded join for machine %s; copy to %s.\n", o.Machine, HostConfig)
	fmt.Fprintf(&b, "machine = %q\nmode = %q\n\n[cluster]\napi-server = %q\nca-file = %q\nbootstrap-token-file = %q\n",
		o.Machine, o.Mode, o.APIServer, HostCA, HostToken)
	if o.KubernetesVersion != "" {
		fmt.Fprintf(&b, "kubernetes-version = %q\n", o.KubernetesVersion)
	}
	if o.ArtifactsURL != "" {
		fmt.Fprintf(&b, "\n[artifacts]\nbase-url = %q\n", o.ArtifactsURL)
	}
	if facts.FromNodeImage(o.Mode) {
		fmt.Fprintf(&b, "\n[nspawn]\nimage = %q\n", o.Image)
	}
	return []byte(b.String())
}

// JoinToken is one token join created.
type JoinToken struct {
	Machine, TokenID string
	Expires          time.Time
	Created          time.Time
}

// ListJoins lists the tokens join created, by machine and expiry.
func ListJoins(ctx context.Context, kube kubernetes.Interface) ([]JoinToken, error) {
	l, err := kube.CoreV1().Secrets(metav1.NamespaceSystem).List(ctx, metav1.ListOptions{LabelSelector: JoinLabel})
	if err != nil {
		return nil, err
	}
	var out []JoinToken
	for _, s := range l.Items {
		exp, _ := time.Parse(time.RFC3339, string(s.Data["expiration"]))
		out = append(out, JoinToken{Machine: s.Labels[JoinLabel], TokenID: string(s.Data["token-id"]), Expires: exp, Created: s.CreationTimestamp.Time})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Machine != out[j].Machine {
			return out[i].Machine < out[j].Machine
		}
		return out[i].Expires.Before(out[j].Expires)
	})
	return out, nil
}

// Revoke deletes every token join created for machine and returns how
// many: a host that has not bootstrapped yet can no longer join, and the
// fence of one that has refuses its next start on the token path.
func Revoke(ctx context.Context, kube kubernetes.Interface, machine string) (int, error) {
	if err := identity.ValidateMachineName(machine); err != nil {
		return 0, err
	}
	l, err := kube.CoreV1().Secrets(metav1.NamespaceSystem).List(ctx, metav1.ListOptions{LabelSelector: JoinLabel + "=" + machine})
	if err != nil {
		return 0, err
	}
	n := 0
	for _, s := range l.Items {
		if err := kube.CoreV1().Secrets(metav1.NamespaceSystem).Delete(ctx, s.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return n, fmt.Errorf("delete %s: %w", s.Name, err)
		}
		n++
	}
	return n, nil
}
