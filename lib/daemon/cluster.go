package daemon

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/kube"
)

// The daemon's cluster clients: lib/kube's Machines client and two plain
// REST clients, one for MachineOperations, one for Nodes and Events. Not
// client-go's typed core/v1 client: it imports client-go's scheme, which
// registers every API group at start (binary size, and memory at idle).
var (
	opScheme         = runtime.NewScheme()
	opCodecs         = serializer.NewCodecFactory(opScheme)
	opParameterCodec = runtime.NewParameterCodec(opScheme)

	coreScheme         = runtime.NewScheme()
	coreCodecs         = serializer.NewCodecFactory(coreScheme)
	coreParameterCodec = runtime.NewParameterCodec(coreScheme)
)

func init() {
	if err := v1alpha3.AddToScheme(opScheme); err != nil {
		panic(err)
	}
	if err := corev1.AddToScheme(coreScheme); err != nil {
		panic(err)
	}
}

type cluster struct {
	machines *kube.Machines
	ops      rest.Interface // unbounded-cloud.io/v1alpha3
	core     rest.Interface // core/v1
}

func newCluster(cfg *rest.Config) (*cluster, error) {
	// Watches outlive any per-request timeout: rest.Config.Timeout would
	// cut every watch after it and turn an idle daemon into a busy one.
	cfg = rest.CopyConfig(cfg)
	cfg.Timeout = 0
	m, err := kube.NewMachines(cfg)
	if err != nil {
		return nil, err
	}
	oc := rest.CopyConfig(cfg)
	oc.GroupVersion = &v1alpha3.SchemeGroupVersion
	oc.APIPath = "/apis"
	oc.NegotiatedSerializer = opCodecs.WithoutConversion()
	oc.ContentType = runtime.ContentTypeJSON
	ops, err := rest.RESTClientFor(oc)
	if err != nil {
		return nil, fmt.Errorf("machineoperations client: %w", err)
	}
	cc := rest.CopyConfig(cfg)
	cc.GroupVersion = &corev1.SchemeGroupVersion
	cc.APIPath = "/api"
	cc.NegotiatedSerializer = coreCodecs.WithoutConversion()
	cc.ContentType = runtime.ContentTypeJSON
	core, err := rest.RESTClientFor(cc)
	if err != nil {
		return nil, fmt.Errorf("core client: %w", err)
	}
	return &cluster{machines: m, ops: ops, core: core}, nil
}

func opSelector(machine string) string {
	return labels.SelectorFromSet(labels.Set{v1alpha3.MachineLabel: machine}).String()
}

func (c *cluster) listOps(ctx context.Context, machine string) (*v1alpha3.MachineOperationList, error) {
	out := &v1alpha3.MachineOperationList{}
	opts := metav1.ListOptions{LabelSelector: opSelector(machine)}
	err := c.ops.Get().Resource(v1alpha3.ResourceMachineOperations).
		VersionedParams(&opts, opParameterCodec).Do(ctx).Into(out)
	return out, err
}

func (c *cluster) watchOps(ctx context.Context, machine, rv string) (watch.Interface, error) {
	opts := metav1.ListOptions{
		LabelSelector:       opSelector(machine),
		ResourceVersion:     rv,
		AllowWatchBookmarks: true,
		Watch:               true,
	}
	return c.ops.Get().Resource(v1alpha3.ResourceMachineOperations).
		VersionedParams(&opts, opParameterCodec).Watch(ctx)
}

func (c *cluster) getOp(ctx context.Context, name string) (*v1alpha3.MachineOperation, error) {
	out := &v1alpha3.MachineOperation{}
	err := c.ops.Get().Resource(v1alpha3.ResourceMachineOperations).Name(name).Do(ctx).Into(out)
	return out, err
}

func (c *cluster) updateOpStatus(ctx context.Context, op *v1alpha3.MachineOperation) (*v1alpha3.MachineOperation, error) {
	out := &v1alpha3.MachineOperation{}
	err := c.ops.Put().Resource(v1alpha3.ResourceMachineOperations).Name(op.Name).
		SubResource("status").Body(op).Do(ctx).Into(out)
	return out, err
}

func nodeSelector(node string) string {
	return fields.OneTermEqualSelector("metadata.name", node).String()
}

func (c *cluster) listNodes(ctx context.Context, node string) (*corev1.NodeList, error) {
	out := &corev1.NodeList{}
	opts := metav1.ListOptions{FieldSelector: nodeSelector(node)}
	err := c.core.Get().Resource("nodes").VersionedParams(&opts, coreParameterCodec).Do(ctx).Into(out)
	return out, err
}

func (c *cluster) watchNodes(ctx context.Context, node, rv string) (watch.Interface, error) {
	opts := metav1.ListOptions{
		FieldSelector:       nodeSelector(node),
		ResourceVersion:     rv,
		AllowWatchBookmarks: true,
		Watch:               true,
	}
	return c.core.Get().Resource("nodes").VersionedParams(&opts, coreParameterCodec).Watch(ctx)
}

// recordEvent records an Event about the Machine in namespace "default",
// where the events of cluster-scoped objects go (kubectl describe machine
// finds them there). Best effort: an event that cannot be written is
// logged, never a reason to fail an operation.
func (d *daemon) recordEvent(ctx context.Context, eventType, reason, message string) {
	ev := kube.MachineEvent(d.machine, d.machineUIDValue(), "unbounded-daemon", eventType, reason, message, d.host.now())
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err := d.cluster.core.Post().Namespace(metav1.NamespaceDefault).Resource("events").Body(ev).Do(ctx).Error()
	if err != nil {
		d.log.Warn("cannot record event on the Machine", "reason", reason, "error", err)
	}
}

func truncate(s string, n int) string { return kube.Truncate(s, n) }
