package daemon

import (
	"context"
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/watch"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/kube"
)

// The daemon's cluster clients: lib/kube's Machines client, a plain REST
// client for MachineOperations, and the core/v1 typed client (Nodes,
// Events) rather than a full clientset, which would link every API group.
var (
	opScheme         = runtime.NewScheme()
	opCodecs         = serializer.NewCodecFactory(opScheme)
	opParameterCodec = runtime.NewParameterCodec(opScheme)
)

func init() {
	if err := v1alpha3.AddToScheme(opScheme); err != nil {
		panic(err)
	}
}

type cluster struct {
	machines *kube.Machines
	ops      rest.Interface
	core     corev1client.CoreV1Interface
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
	core, err := corev1client.NewForConfig(cfg)
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

// recordEvent records an Event about the Machine in namespace "default",
// where the events of cluster-scoped objects go (kubectl describe machine
// finds them there). Best effort: an event that cannot be written is
// logged, never a reason to fail an operation.
func (d *daemon) recordEvent(ctx context.Context, eventType, reason, message string) {
	now := metav1.NewTime(d.host.now())
	ev := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{
			Name:      d.machine + "." + strconv.FormatInt(now.UnixNano(), 16),
			Namespace: metav1.NamespaceDefault,
		},
		InvolvedObject: corev1.ObjectReference{
			APIVersion: v1alpha3.SchemeGroupVersion.String(),
			Kind:       "Machine",
			Name:       d.machine,
			UID:        d.machineUIDValue(),
		},
		Reason:              reason,
		Message:             truncate(message, 1024),
		Type:                eventType,
		Source:              corev1.EventSource{Component: "unbounded-daemon", Host: d.machine},
		FirstTimestamp:      now,
		LastTimestamp:       now,
		EventTime:           metav1.NewMicroTime(now.Time),
		Count:               1,
		Action:              reason,
		ReportingController: "unbounded-cloud.io/daemon",
		ReportingInstance:   d.machine,
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := d.cluster.core.Events(metav1.NamespaceDefault).Create(ctx, ev, metav1.CreateOptions{}); err != nil {
		d.log.Warn("cannot record event on the Machine", "reason", reason, "error", err)
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-3] + "..."
}

func isGone(err error) bool {
	return apierrors.IsGone(err) || apierrors.IsResourceExpired(err)
}
