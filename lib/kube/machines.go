package kube

import (
	"context"
	"fmt"

	authenticationv1 "k8s.io/api/authentication/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
)

// scheme knows the v1alpha3 types and nothing else: the Machines client is
// a plain REST client over them, not a generated clientset, so that the
// agent links one small client instead of another set of typed clients.
var (
	scheme         = runtime.NewScheme()
	codecs         = serializer.NewCodecFactory(scheme)
	parameterCodec = runtime.NewParameterCodec(scheme)
)

func init() {
	// Only the groups the agent speaks: its own, CSRs and TokenReviews.
	for _, add := range []func(*runtime.Scheme) error{v1alpha3.AddToScheme, certificatesv1.AddToScheme, authenticationv1.AddToScheme} {
		if err := add(scheme); err != nil {
			panic(err)
		}
	}
}

// groupClient is a REST client for one API group of the scheme above.
func groupClient(cfg *rest.Config, gv schema.GroupVersion) (rest.Interface, error) {
	c := rest.CopyConfig(cfg)
	c.GroupVersion = &gv
	c.APIPath = "/apis"
	c.NegotiatedSerializer = codecs.WithoutConversion()
	c.ContentType = runtime.ContentTypeJSON
	return rest.RESTClientFor(c)
}

// Machines reads and writes Machine objects (cluster-scoped) with the
// credential of the rest.Config it was made from.
type Machines struct {
	rc rest.Interface
}

// NewMachines returns a Machines client for cfg (a copy is changed, cfg is
// not).
func NewMachines(cfg *rest.Config) (*Machines, error) {
	rc, err := groupClient(cfg, v1alpha3.SchemeGroupVersion)
	if err != nil {
		return nil, fmt.Errorf("machines client: %w", err)
	}
	return &Machines{rc: rc}, nil
}

// Get reads the Machine name live (no cache).
func (m *Machines) Get(ctx context.Context, name string) (*v1alpha3.Machine, error) {
	out := &v1alpha3.Machine{}
	err := m.rc.Get().Resource(v1alpha3.ResourceMachines).Name(name).Do(ctx).Into(out)
	return out, err
}

// List lists every Machine (the operator's fleet view).
func (m *Machines) List(ctx context.Context) (*v1alpha3.MachineList, error) {
	out := &v1alpha3.MachineList{}
	err := m.rc.Get().Resource(v1alpha3.ResourceMachines).Do(ctx).Into(out)
	return out, err
}

// Operations lists the MachineOperations of machine (by their
// v1alpha3.MachineLabel), or of every machine when machine is "".
func (m *Machines) Operations(ctx context.Context, machine string) (*v1alpha3.MachineOperationList, error) {
	out := &v1alpha3.MachineOperationList{}
	req := m.rc.Get().Resource(v1alpha3.ResourceMachineOperations)
	if machine != "" {
		req = req.Param("labelSelector", v1alpha3.MachineLabel+"="+machine)
	}
	err := req.Do(ctx).Into(out)
	return out, err
}

// ListOperations lists the MachineOperations that match the label
// selector (kubectl unbounded's rolls find their own by their roll label).
func (m *Machines) ListOperations(ctx context.Context, selector string) (*v1alpha3.MachineOperationList, error) {
	out := &v1alpha3.MachineOperationList{}
	opts := metav1.ListOptions{LabelSelector: selector}
	err := m.rc.Get().Resource(v1alpha3.ResourceMachineOperations).
		VersionedParams(&opts, parameterCodec).Do(ctx).Into(out)
	return out, err
}

// WatchOperations watches the MachineOperations that match the label
// selector, from resourceVersion ("": from now, after a synthetic ADDED of
// each current one).
func (m *Machines) WatchOperations(ctx context.Context, selector, resourceVersion string) (watch.Interface, error) {
	opts := metav1.ListOptions{LabelSelector: selector, ResourceVersion: resourceVersion, AllowWatchBookmarks: true, Watch: true}
	return m.rc.Get().Resource(v1alpha3.ResourceMachineOperations).
		VersionedParams(&opts, parameterCodec).Watch(ctx)
}

// CreateOperation creates a MachineOperation (the operator's side: the
// agent never creates one).
func (m *Machines) CreateOperation(ctx context.Context, op *v1alpha3.MachineOperation) (*v1alpha3.MachineOperation, error) {
	out := &v1alpha3.MachineOperation{}
	err := m.rc.Post().Resource(v1alpha3.ResourceMachineOperations).Body(op).Do(ctx).Into(out)
	return out, err
}

// Create creates a Machine. The API server drops any status on create.
func (m *Machines) Create(ctx context.Context, machine *v1alpha3.Machine) (*v1alpha3.Machine, error) {
	out := &v1alpha3.Machine{}
	err := m.rc.Post().Resource(v1alpha3.ResourceMachines).Body(machine).Do(ctx).Into(out)
	return out, err
}

// UpdateStatus writes machine.Status through the status subresource; the
// object's resourceVersion makes it a compare-and-swap (a conflict is
// apierrors.IsConflict).
func (m *Machines) UpdateStatus(ctx context.Context, machine *v1alpha3.Machine) (*v1alpha3.Machine, error) {
	out := &v1alpha3.Machine{}
	err := m.rc.Put().Resource(v1alpha3.ResourceMachines).Name(machine.Name).
		SubResource("status").Body(machine).Do(ctx).Into(out)
	return out, err
}

// Update writes the Machine's metadata and spec (the status is ignored by
// the server).
func (m *Machines) Update(ctx context.Context, machine *v1alpha3.Machine) (*v1alpha3.Machine, error) {
	out := &v1alpha3.Machine{}
	err := m.rc.Put().Resource(v1alpha3.ResourceMachines).Name(machine.Name).Body(machine).Do(ctx).Into(out)
	return out, err
}

// Watch watches the one Machine name (field selector metadata.name), from
// resourceVersion ("" means from now, after a synthetic ADDED of the
// current object). Bookmarks are asked for, so that a restarted watch can
// resume without a list.
func (m *Machines) Watch(ctx context.Context, name, resourceVersion string) (watch.Interface, error) {
	opts := metav1.ListOptions{
		FieldSelector:       fields.OneTermEqualSelector("metadata.name", name).String(),
		ResourceVersion:     resourceVersion,
		AllowWatchBookmarks: true,
		Watch:               true,
	}
	return m.rc.Get().Resource(v1alpha3.ResourceMachines).
		VersionedParams(&opts, parameterCodec).Watch(ctx)
}

// MutateStatus reads the Machine, lets mutate change its status, and writes
// the status back when mutate reports a change; on a conflict (someone
// else wrote in between) it reads again and retries, a few times. It
// returns the Machine as last seen.
func (m *Machines) MutateStatus(ctx context.Context, name string, mutate func(*v1alpha3.Machine) bool) (*v1alpha3.Machine, error) {
	var out *v1alpha3.Machine
	conflicts := 0
	// A conflict is answered by reading again (five times at most); no
	// answer by trying again within ctx's deadline (Retry).
	retriable := func(err error) bool {
		if apierrors.IsConflict(err) {
			conflicts++
			return conflicts < 5
		}
		return NoAnswer(err)
	}
	err := Retry(ctx, until(ctx), nil, "update the status of Machine "+name, retriable, func(ctx context.Context) error {
		cur, err := m.Get(ctx, name)
		if err != nil {
			return err
		}
		if !mutate(cur) {
			out = cur
			return nil
		}
		out, err = m.UpdateStatus(ctx, cur)
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// ReviewOwnToken sends a TokenReview of the bearer token that cfg
// authenticates with, authenticated by that same token: the API server
// answers 401 if the token is revoked, else whether (and as whom) it
// authenticates. The fence's fallback read.
func ReviewOwnToken(ctx context.Context, cfg *rest.Config) (*authenticationv1.TokenReviewStatus, error) {
	rc, err := groupClient(cfg, authenticationv1.SchemeGroupVersion)
	if err != nil {
		return nil, err
	}
	in := &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: cfg.BearerToken}}
	out := &authenticationv1.TokenReview{}
	if err := rc.Post().Resource("tokenreviews").Body(in).Do(ctx).Into(out); err != nil {
		return nil, err
	}
	return &out.Status, nil
}
