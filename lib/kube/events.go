package kube

import (
	"context"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
)

// MachineEvent is a core/v1 Event about the Machine machine (uid may be
// empty when unknown), recorded in namespace "default", where the events
// of cluster-scoped objects go (kubectl describe machine finds them there).
// component names the agent's part that reports ("unbounded-daemon",
// "unbounded-recover"); the message is cut to 1 KiB.
func MachineEvent(machine string, uid types.UID, component, eventType, reason, message string, now time.Time) *corev1.Event {
	t := metav1.NewTime(now)
	return &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{
			Name:      machine + "." + strconv.FormatInt(now.UnixNano(), 16),
			Namespace: metav1.NamespaceDefault,
		},
		InvolvedObject: corev1.ObjectReference{
			APIVersion: v1alpha3.SchemeGroupVersion.String(),
			Kind:       "Machine",
			Name:       machine,
			UID:        uid,
		},
		Reason:              reason,
		Message:             Truncate(message, 1024),
		Type:                eventType,
		Source:              corev1.EventSource{Component: component, Host: machine},
		FirstTimestamp:      t,
		LastTimestamp:       t,
		EventTime:           metav1.NewMicroTime(now),
		Count:               1,
		Action:              reason,
		ReportingController: "unbounded-cloud.io/" + trimUnbounded(component),
		ReportingInstance:   machine,
	}
}

func trimUnbounded(component string) string {
	const p = "unbounded-"
	if len(component) > len(p) && component[:len(p)] == p {
		return component[len(p):]
	}
	return component
}

// Truncate cuts s to at most n bytes, ending in "..." when cut.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-3] + "..."
}

// coreClient is a plain REST client for core/v1, for Events only: not
// client-go's typed clientset, which registers every API group at start.
func coreClient(cfg *rest.Config) (rest.Interface, error) {
	s := runtime.NewScheme()
	if err := corev1.AddToScheme(s); err != nil {
		return nil, err
	}
	c := rest.CopyConfig(cfg)
	c.GroupVersion = &corev1.SchemeGroupVersion
	c.APIPath = "/api"
	c.NegotiatedSerializer = serializer.NewCodecFactory(s).WithoutConversion()
	c.ContentType = runtime.ContentTypeJSON
	return rest.RESTClientFor(c)
}

// PostEvent records ev with cfg's credential.
func PostEvent(ctx context.Context, cfg *rest.Config, ev *corev1.Event) error {
	rc, err := coreClient(cfg)
	if err != nil {
		return err
	}
	return Retry(ctx, until(ctx), nil, "post Event "+ev.Reason, NoAnswer, func(ctx context.Context) error {
		return rc.Post().Namespace(ev.Namespace).Resource("events").Body(ev).Do(ctx).Error()
	})
}
