// Package objects decodes the manifests of lib/api/manifests into typed
// Kubernetes objects, for callers that create them with a client (tests,
// and later the cluster-side tooling) rather than with `kubectl apply`.
// It is apart from package manifests so that the operator CLI, which only
// prints YAML, does not link the API machinery.
package objects

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"unbounded-cloud.io/agent/lib/api/manifests"
)

var codecs = func() serializer.CodecFactory {
	s := runtime.NewScheme()
	if err := rbacv1.AddToScheme(s); err != nil {
		panic(err)
	}
	return serializer.NewCodecFactory(s, serializer.EnableStrict)
}()

// ForMachine returns the per-machine RBAC objects of
// manifests.ForMachineNode (ClusterRoles, then ClusterRoleBindings), typed.
func ForMachine(machine, node string) ([]runtime.Object, error) {
	y, err := manifests.ForMachineNode(machine, node)
	if err != nil {
		return nil, err
	}
	return Decode(y)
}

// Decode splits a multi-document YAML stream of RBAC objects and decodes
// each document strictly (an unknown field is an error).
func Decode(stream []byte) ([]runtime.Object, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(stream)))
	dec := codecs.UniversalDeserializer()
	var objs []runtime.Object
	for i := 1; ; i++ {
		doc, err := r.Read()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return objs, nil
			}
			return nil, err
		}
		if len(bytes.TrimSpace(stripComments(doc))) == 0 {
			continue
		}
		o, _, err := dec.Decode(doc, nil, nil)
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		objs = append(objs, o)
	}
}

// stripComments drops YAML comment lines, so that a document holding only
// comments counts as empty.
func stripComments(doc []byte) []byte {
	var out []byte
	for _, l := range bytes.Split(doc, []byte("\n")) {
		if !bytes.HasPrefix(bytes.TrimSpace(l), []byte("#")) {
			out = append(append(out, l...), '\n')
		}
	}
	return out
}
