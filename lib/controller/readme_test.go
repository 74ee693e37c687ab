package controller

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/kube/clustertest"
	"unbounded-cloud.io/agent/lib/rollout"
)

// The README's MachineRollout is one the API server accepts (its CRD's
// schema, dry run) and the controller can act on (its window and
// budgets), field by field: no field the type lacks.
func TestTheREADMEsMachineRolloutIsValid(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	const start = "apiVersion: unbounded-cloud.io/v1alpha3\nkind: MachineRollout\n"
	i := strings.Index(string(b), start)
	if i < 0 {
		t.Fatal("README.md shows no MachineRollout")
	}
	doc, _, ok := strings.Cut(string(b[i:]), "\n```")
	if !ok {
		t.Fatal("README.md: the MachineRollout's block does not end")
	}
	var ro v1alpha3.MachineRollout
	if err := yaml.UnmarshalStrict([]byte(doc), &ro); err != nil {
		t.Fatalf("README.md's MachineRollout: %v\n%s", err, doc)
	}
	if _, _, err := rollout.Open(ro.Spec.Window, time.Now()); err != nil {
		t.Errorf("its window: %v", err)
	}
	if _, err := rollout.Budget(ro.Spec.MaxUnavailable, 10); err != nil {
		t.Errorf("its maxUnavailable: %v", err)
	}
	e := clustertest.Get(t)
	if err := clientFor(t, e).Create(context.Background(), &ro, &client.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
		t.Errorf("the API server refuses README.md's MachineRollout: %v", err)
	}
}

// An AgentUpgrade rollout without its package (version, url, sha256) is
// refused by the API server, before any host is touched; with them it is
// accepted (dry run).
func TestAnAgentUpgradeRolloutNeedsItsPackage(t *testing.T) {
	e := clustertest.Get(t)
	c := clientFor(t, e)
	sum := strings.Repeat("ab", 32)
	for _, tc := range []struct {
		params map[string]string
		ok     bool
	}{
		{map[string]string{"version": "0.2.0", "url": "https://artifacts.example.internal/a.deb", "sha256": sum}, true},
		{map[string]string{"version": "0.2.0", "url": "file:///srv/a.deb", "sha256": sum}, true},
		{nil, false},
		{map[string]string{"version": "0.2.0", "url": "https://artifacts.example.internal/a.deb"}, false},
		{map[string]string{"version": "0.2.0", "url": "http://artifacts.example.internal/a.deb", "sha256": sum}, false},
		{map[string]string{"version": "0.2.0", "url": "https://user:pw@artifacts.example.internal/a.deb", "sha256": sum}, false},
		{map[string]string{"version": "0.2.0", "url": "https://artifacts.example.internal/a.deb", "sha256": "abc"}, false},
	} {
		ro := &v1alpha3.MachineRollout{ObjectMeta: metav1.ObjectMeta{Name: "upgrade-check"}, Spec: v1alpha3.MachineRolloutSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"pool": "edge"}}, Operation: v1alpha3.OperationAgentUpgrade, Parameters: tc.params}}
		err := c.Create(context.Background(), ro, &client.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if (err == nil) != tc.ok {
			t.Errorf("parameters %v: error %v, want accepted=%v", tc.params, err, tc.ok)
		} else if err != nil && !strings.Contains(err.Error(), "needs parameters version, url") {
			t.Errorf("parameters %v: refused without saying why: %v", tc.params, err)
		}
	}
}
