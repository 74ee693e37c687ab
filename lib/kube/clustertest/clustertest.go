// Package clustertest adds what the credentials, fence and reporter tests
// need about Machines to the shared test environment of tests/kubeenv (the
// real API server started by tests/kube/with-env.sh): Machine clients and
// deletion, bootstrap tokens carrying a machine's groups, and a few shorthands.
//
// Only tests import it. Without the environment, Get skips the test the
// way kubeenv does (a line starting "kubeenv:", counted by the tier summary).
package clustertest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"unbounded-cloud.io/agent/lib/api/identity"
	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/kube"
	"unbounded-cloud.io/agent/tests/kubeenv"
)

// Env is the running test cluster.
type Env struct {
	*kubeenv.Env
	// Admin authenticates as system:masters.
	Admin *rest.Config
}

// Get returns the environment, or skips the test when there is none.
func Get(t testing.TB) *Env {
	t.Helper()
	k := kubeenv.Get(t)
	return &Env{Env: k, Admin: k.RESTConfig()}
}

// Client is an admin clientset.
func (e *Env) Client(t testing.TB) kubernetes.Interface { return e.Env.Client() }

// Machines is an admin Machines client.
func (e *Env) Machines(t testing.TB) *kube.Machines {
	m, err := kube.NewMachines(e.Admin)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// DeleteMachine deletes a Machine as the cluster side would (the agent's
// client has no Delete: the agent never deletes its Machine).
func (e *Env) DeleteMachine(name string) error {
	kc := kubernetes.NewForConfigOrDie(e.Admin)
	return kc.Discovery().RESTClient().Delete().
		AbsPath("/apis", v1alpha3.GroupName, v1alpha3.Version, v1alpha3.ResourceMachines, name).
		Do(context.Background()).Error()
}

// CAFile is the cluster CA (it signs the API server's serving certificate).
func (e *Env) CAFile() string { return e.Env.CAFile }

// UniqueName returns prefix plus random hex: tests share one cluster.
func UniqueName(prefix string) string {
	b := make([]byte, 4)
	rand.Read(b)
	return prefix + "-" + hex.EncodeToString(b)
}

// BootstrapToken creates a bootstrap token for machine, with the extra
// groups the provisioning side gives it, and waits until the API server
// accepts it. It returns the token twice: as the credential, and as the
// handle RevokeToken takes. The Secret is deleted at the end of the test.
func (e *Env) BootstrapToken(t testing.TB, machine string) (token, handle string) {
	t.Helper()
	return e.BootstrapTokenWithGroups(t, identity.BootstrapAgentsGroup, identity.BootstrapGroup(machine))
}

// BootstrapTokenWithGroups is BootstrapToken with the given extra groups
// instead: without identity.BootstrapAgentsGroup, the token gets none of the
// agents' grants (a token issued wrongly, or a cluster without the
// manifests).
func (e *Env) BootstrapTokenWithGroups(t testing.TB, groups ...string) (token, handle string) {
	t.Helper()
	id, secret := kubeenv.RandomTokenID(t)
	token = e.CreateBootstrapToken(t, id, secret, groups...)
	return token, token
}

// RevokeToken deletes a bootstrap token's Secret, as fencing an allocation
// does, and waits until the API server rejects the token.
func (e *Env) RevokeToken(t testing.TB, handle string) {
	t.Helper()
	id, secret, _ := strings.Cut(handle, ".")
	e.DeleteBootstrapToken(t, id, secret)
}

// MintClientCert signs a client certificate for cn/orgs with the cluster CA
// directly, valid from notBefore to notAfter: the way to get an expired or
// nearly expired certificate, which no signer issues on request.
func (e *Env) MintClientCert(t testing.TB, cn string, orgs []string, notBefore, notAfter time.Time) (certPEM, keyPEM []byte) {
	t.Helper()
	return e.MintClientCertValid(t, notBefore, notAfter, cn, orgs...)
}

// NewUID returns a random UUID, the form of a MachineAllocation's UID (and
// of [allocation] uid, which the config loader checks).
func NewUID() string { return string(uuid.NewUUID()) }
