//go:build tools

// The node-stack tests' kubelet is built from this module (kubelet.sh), so
// that it is the same Kubernetes as the test API server: this import keeps
// its dependencies in go.mod and go.sum. The tools tag is never set.
package tools

import _ "k8s.io/kubernetes/cmd/kubelet"
