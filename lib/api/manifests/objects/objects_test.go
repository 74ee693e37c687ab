package objects

import (
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"

	"unbounded-cloud.io/agent/lib/api/identity"
)

func TestForMachineDecodesRolesThenBindingsForTheMachine(t *testing.T) {
	objs, err := ForMachine("site-w1", "node-w1")
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) != 4 {
		t.Fatalf("got %d objects, want 2 roles and 2 bindings", len(objs))
	}
	for i, o := range objs[:2] {
		if _, ok := o.(*rbacv1.ClusterRole); !ok {
			t.Errorf("object %d is %T, want a ClusterRole first", i, o)
		}
	}
	b, ok := objs[2].(*rbacv1.ClusterRoleBinding)
	if !ok {
		t.Fatalf("object 2 is %T", objs[2])
	}
	want := map[string]bool{identity.BootstrapGroup("site-w1"): true, identity.AgentUserName("site-w1"): true}
	for _, s := range b.Subjects {
		if !want[s.Name] {
			t.Errorf("unexpected subject %q", s.Name)
		}
		delete(want, s.Name)
	}
	if len(want) != 0 {
		t.Errorf("subjects missing: %v", want)
	}
	node := objs[1].(*rbacv1.ClusterRole)
	if got := node.Rules[0].ResourceNames; len(got) != 1 || got[0] != "node-w1" {
		t.Errorf("node role names %v, want [node-w1]", got)
	}
}

func TestDecodeRejectsUnknownFields(t *testing.T) {
	_, err := Decode([]byte("apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: x\nrulez: []\n"))
	if err == nil {
		t.Fatal("a misspelt field decoded")
	}
}
