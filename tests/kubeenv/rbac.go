package kubeenv

import (
	"context"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"unbounded-cloud.io/agent/lib/api/identity"
	"unbounded-cloud.io/agent/lib/api/manifests/objects"
	"unbounded-cloud.io/agent/lib/api/v1alpha3"
)

// GrantMachine creates the per-machine RBAC of machine whose Node is node
// (what `unbounded manifests --machine NAME` prints), removes it when the
// test ends, and returns once the authorizer honours it for both agent
// identities: RBAC learns of new bindings through an informer, a moment
// after the create.
func (e *Env) GrantMachine(t testing.TB, machine, node string) {
	t.Helper()
	objs, err := objects.ForMachine(machine, node)
	if err != nil {
		t.Fatalf("kubeenv: RBAC of machine %s: %v", machine, err)
	}
	kc := e.Client()
	rb := kc.RbacV1()
	ctx := context.Background()
	for _, o := range objs {
		switch o := o.(type) {
		case *rbacv1.ClusterRole:
			_, err = rb.ClusterRoles().Create(ctx, o, metav1.CreateOptions{})
			t.Cleanup(func() { rb.ClusterRoles().Delete(context.Background(), o.Name, metav1.DeleteOptions{}) })
		case *rbacv1.ClusterRoleBinding:
			_, err = rb.ClusterRoleBindings().Create(ctx, o, metav1.CreateOptions{})
			t.Cleanup(func() { rb.ClusterRoleBindings().Delete(context.Background(), o.Name, metav1.DeleteOptions{}) })
		default:
			t.Fatalf("kubeenv: GrantMachine: unexpected object %T", o)
		}
		if err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("kubeenv: RBAC of machine %s: %v", machine, err)
		}
	}
	for _, id := range []authorizationv1.SubjectAccessReviewSpec{
		{User: "system:bootstrap:probe", Groups: []string{identity.BootstrapGroup(machine)}},
		{User: identity.AgentUserName(machine), Groups: []string{identity.AgentGroup}},
	} {
		id.ResourceAttributes = &authorizationv1.ResourceAttributes{Group: v1alpha3.GroupName,
			Resource: v1alpha3.ResourceMachines, Verb: "get", Name: machine}
		err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
			r, err := kc.AuthorizationV1().SubjectAccessReviews().Create(ctx,
				&authorizationv1.SubjectAccessReview{Spec: id}, metav1.CreateOptions{})
			return err == nil && r.Status.Allowed, nil
		})
		if err != nil {
			t.Fatalf("kubeenv: RBAC of machine %s not effective for %s within 10s", machine, id.User)
		}
	}
}
