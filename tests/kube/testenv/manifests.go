package testenv

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
)

// fieldManager is the owner of every field the environment applies, so a
// test can tell the environment's objects from its own.
const fieldManager = "kube-testenv"

// manifestObject is one document of a manifests file, with where it came from
// for error messages.
type manifestObject struct {
	obj  *unstructured.Unstructured
	file string
	line int // first line of the document
}

func (m manifestObject) String() string {
	return fmt.Sprintf("%s:%d: %s %q", m.file, m.line, m.obj.GetKind(), m.obj.GetName())
}

// readManifests reads multi-document YAML (or JSON) files. Empty documents
// are skipped; a document without apiVersion, kind or metadata.name is an
// error naming the file and line.
func readManifests(files []string) ([]manifestObject, error) {
	var out []manifestObject
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("manifests: %w", err)
		}
		for _, d := range splitDocuments(data) {
			doc, start := d.body, d.line
			jsonDoc, err := utilyaml.ToJSON(doc)
			if err != nil {
				return nil, fmt.Errorf("%s:%d: %w", file, start, err)
			}
			obj := &unstructured.Unstructured{}
			if err := json.Unmarshal(jsonDoc, &obj.Object); err != nil {
				return nil, fmt.Errorf("%s:%d: not an object: %w", file, start, err)
			}
			if obj.Object == nil {
				continue
			}
			for _, k := range []struct{ key, val string }{{"apiVersion", obj.GetAPIVersion()}, {"kind", obj.GetKind()}, {"metadata.name", obj.GetName()}} {
				if k.val == "" {
					return nil, fmt.Errorf("%s:%d: key %s is missing", file, start, k.key)
				}
			}
			if strings.HasSuffix(obj.GetKind(), "List") {
				return nil, fmt.Errorf("%s:%d: key kind: %s is not supported, write one document per object", file, start, obj.GetKind())
			}
			out = append(out, manifestObject{obj: obj, file: file, line: start})
		}
	}
	return out, nil
}

type document struct {
	body []byte
	line int // the document's first line that is not blank or a comment
}

// splitDocuments splits YAML at "---" lines and keeps, for each document
// that has content, the line its content starts on, so an error can point
// at the object in the file.
func splitDocuments(data []byte) []document {
	var docs []document
	var cur document
	flush := func() {
		if cur.line > 0 {
			docs = append(docs, cur)
		}
		cur = document{}
	}
	for i, l := range bytes.SplitAfter(data, []byte("\n")) {
		t := bytes.TrimSpace(l)
		if bytes.HasPrefix(l, []byte("---")) && (len(t) == 3 || t[3] == ' ' || t[3] == '\t' || t[3] == '#') {
			flush()
			continue
		}
		if cur.line == 0 && len(t) > 0 && t[0] != '#' {
			cur.line = i + 1
		}
		cur.body = append(cur.body, l...)
	}
	flush()
	return docs
}

var crdGVK = apiextensionsv1.SchemeGroupVersion.WithKind("CustomResourceDefinition")

// applyManifests applies CRDs first and waits until each is Established, then
// warms each new resource up, then applies everything else in file order
// (a ClusterRole before the binding that names it, as kubectl would).
func applyManifests(ctx context.Context, cfg *rest.Config, objs []manifestObject, warm bool) error {
	if len(objs) == 0 {
		return nil
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	disco, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return err
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disco))

	crdGVR := apiextensionsv1.SchemeGroupVersion.WithResource("customresourcedefinitions")
	var crds []*apiextensionsv1.CustomResourceDefinition
	for _, m := range objs {
		if m.obj.GroupVersionKind() != crdGVK {
			continue
		}
		if err := apply(ctx, dyn.Resource(crdGVR), m.obj); err != nil {
			return fmt.Errorf("%s: %w", m, err)
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(m.obj.Object, crd); err != nil {
			return fmt.Errorf("%s: %w", m, err)
		}
		crds = append(crds, crd)
	}
	for _, crd := range crds {
		if err := waitEstablished(ctx, dyn.Resource(crdGVR), crd.Name); err != nil {
			return err
		}
	}
	mapper.Reset()
	if warm {
		if err := warmUp(ctx, dyn, crds); err != nil {
			return err
		}
	}

	for _, m := range objs {
		if m.obj.GroupVersionKind() == crdGVK {
			continue
		}
		gvk := m.obj.GroupVersionKind()
		mapping, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if meta.IsNoMatchError(err) {
			mapper.Reset()
			mapping, err = mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", m, err)
		}
		var ri dynamic.ResourceInterface = dyn.Resource(mapping.Resource)
		if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
			ns := m.obj.GetNamespace()
			if ns == "" {
				ns = "default"
			}
			ri = dyn.Resource(mapping.Resource).Namespace(ns)
		}
		if err := apply(ctx, ri, m.obj); err != nil {
			return fmt.Errorf("%s: %w", m, err)
		}
	}
	return nil
}

func apply(ctx context.Context, ri dynamic.ResourceInterface, obj *unstructured.Unstructured) error {
	data, err := json.Marshal(obj.Object)
	if err != nil {
		return err
	}
	force := true
	_, err = ri.Patch(ctx, obj.GetName(), types.ApplyPatchType, data, metav1.PatchOptions{FieldManager: fieldManager, Force: &force})
	return err
}

func waitEstablished(ctx context.Context, ri dynamic.ResourceInterface, name string) error {
	var last string
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		u, err := ri.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, crd); err != nil {
			return false, err
		}
		for _, c := range crd.Status.Conditions {
			switch {
			case c.Type == apiextensionsv1.NamesAccepted && c.Status == apiextensionsv1.ConditionFalse:
				return false, fmt.Errorf("CRD %s: names not accepted: %s", name, c.Message)
			case c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue:
				return true, nil
			case c.Type == apiextensionsv1.Established:
				last = c.Message
			}
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("CRD %s not established: %w (last: %s)", name, err, last)
	}
	return nil
}

// warmUp pays, once, what the API server charges the first client of a CRD
// that was just established: the first list or watch is answered 429 while
// the resource's storage starts, and the first write waits for it. Without
// this, whichever test runs first would see it, and only sometimes.
func warmUp(ctx context.Context, dyn dynamic.Interface, crds []*apiextensionsv1.CustomResourceDefinition) error {
	for _, crd := range crds {
		for _, v := range crd.Spec.Versions {
			if !v.Served {
				continue
			}
			gvr := schema.GroupVersionResource{Group: crd.Spec.Group, Version: v.Name, Resource: crd.Spec.Names.Plural}
			ri := dyn.Resource(gvr)
			var last error
			err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
				list, err := ri.List(ctx, metav1.ListOptions{Limit: 1})
				if err != nil {
					last = err
					return false, nil
				}
				w, err := ri.Watch(ctx, metav1.ListOptions{ResourceVersion: list.GetResourceVersion()})
				if err != nil {
					last = err
					return false, nil
				}
				w.Stop()
				// A server-side dry-run create goes through the same
				// storage path as a real one, without leaving anything
				// behind. The object may well be invalid for the
				// schema: only a "not ready" answer is worth retrying.
				probe := &unstructured.Unstructured{}
				probe.SetAPIVersion(gvr.GroupVersion().String())
				probe.SetKind(crd.Spec.Names.Kind)
				probe.SetName("kube-testenv-warm-up")
				var cri dynamic.ResourceInterface = ri
				if crd.Spec.Scope == apiextensionsv1.NamespaceScoped {
					probe.SetNamespace("default")
					cri = ri.Namespace("default")
				}
				_, err = cri.Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}, FieldManager: fieldManager})
				if apierrors.IsTooManyRequests(err) || apierrors.IsServiceUnavailable(err) || apierrors.IsNotFound(err) {
					last = err
					return false, nil
				}
				return true, nil
			})
			if err != nil {
				return fmt.Errorf("warm up %s: %w (last: %v)", gvr, err, last)
			}
		}
	}
	return nil
}
