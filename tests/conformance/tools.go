//go:build tools

// make conformance builds, besides the node e2e binary (./nodee2e, whose
// imports go.mod keeps by themselves), the agnhost and nonewprivs test
// images' binaries and the Ginkgo CLI from this module: these imports keep
// what they need in go.mod and go.sum. The tools tag is never set.
package tools

import (
	_ "github.com/onsi/ginkgo/v2/ginkgo"
	_ "k8s.io/kubernetes/test/images/agnhost"
	_ "k8s.io/kubernetes/test/images/nonewprivs"
)
