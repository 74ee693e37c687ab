// Package manifests holds what a cluster needs before an unbounded agent can
// talk to it: the CRDs of lib/api/v1alpha3, RBAC for the agent's two
// identities (bootstrap token, daemon certificate) and the admission
// policies that narrow the agents' writes to their own objects. `unbounded
// manifests` prints them, ready for `kubectl apply -f -`.
//
// The set is constant: the same objects whatever the size of the fleet
// (rbac/base.yaml). RBAC grants the agents' groups what any agent may do;
// ValidatingAdmissionPolicies read the caller's machine from its identity
// and refuse every write to another machine's objects, to a Machine's spec
// and to the labels that decide ownership, as NodeRestriction does for
// kubelets. Per-machine RoleBindings would do the same for the writes, but
// the RBAC authorizer walks every binding on every request of every
// principal: at 10,000 machines the whole cluster would pay for them
// (BenchmarkAuthorizationAtFleetScale measures it).
package manifests

import (
	"bytes"
	"embed"
	"fmt"
	"io/fs"
	"regexp"
	"slices"
)

// This package renders YAML only and imports no Kubernetes package: the
// operator CLI prints these manifests, and the API machinery would
// multiply its size (`make bench`, "binary sizes", shows bin/unbounded as it
// is).

//go:embed crds/*.yaml rbac/base.yaml controller/controller.yaml
var files embed.FS

// PartOfLabel is set on every object these manifests create, so that an
// operator can find (and remove) them all with one label selector.
const PartOfLabel = "app.kubernetes.io/part-of"

// PartOfValue is the value of PartOfLabel.
const PartOfValue = "unbounded-agent"

// CRDs returns the CustomResourceDefinitions, one YAML document each, in a
// stable order.
func CRDs() ([]byte, error) {
	names, err := fs.Glob(files, "crds/*.yaml")
	if err != nil {
		return nil, err
	}
	slices.Sort(names)
	var out bytes.Buffer
	for _, n := range names {
		b, err := files.ReadFile(n)
		if err != nil {
			return nil, err
		}
		appendDocument(&out, b)
	}
	return out.Bytes(), nil
}

// All returns the CRDs followed by the cluster-wide RBAC and admission
// policies, as one multi-document YAML stream.
func All() ([]byte, error) {
	crds, err := CRDs()
	if err != nil {
		return nil, err
	}
	base, err := files.ReadFile("rbac/base.yaml")
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	out.Write(crds)
	appendDocument(&out, base)
	return out.Bytes(), nil
}

// controllerImage is an image reference pinned by its digest: what a
// Deployment of the cluster side must run (a tag can be moved under it).
var controllerImage = regexp.MustCompile(`^[a-z0-9][a-z0-9._/:-]*@sha256:[0-9a-f]{64}$`)

// Controller returns the cluster side's objects (controller/controller.yaml:
// its namespace unbounded-system, service account, least-privilege RBAC,
// a Deployment of two replicas running image, a PodDisruptionBudget and
// the metrics Service), for image REF@sha256:DIGEST.
func Controller(image string) ([]byte, error) {
	if !controllerImage.MatchString(image) {
		return nil, fmt.Errorf("controller image %q: want a reference pinned by its digest, REPOSITORY[:TAG]@sha256:<64 hex digits> (make images prints it)", image)
	}
	b, err := files.ReadFile("controller/controller.yaml")
	if err != nil {
		return nil, err
	}
	b = bytes.Replace(b, []byte("        image: IMAGE\n"), []byte("        image: "+image+"\n"), 1)
	var out bytes.Buffer
	appendDocument(&out, b)
	return out.Bytes(), nil
}

// appendDocument writes doc as one or more YAML documents, each started by
// "---", whether or not doc already starts with one.
func appendDocument(out *bytes.Buffer, doc []byte) {
	doc = bytes.TrimSpace(doc)
	if !bytes.HasPrefix(doc, []byte("---")) {
		out.WriteString("---\n")
	}
	out.Write(doc)
	out.WriteString("\n")
}
