#!/usr/bin/env bash
# kubelet.sh: builds the kubelet of the node-stack tests from this module's
# k8s.io/kubernetes (the same version as the test API server) into
# <repo>/bin/kubelet, and prints its path on stdout (progress on stderr):
#
#   UNBOUNDED_TEST_KUBELET=$(tests/kube/kubelet.sh)
#
# Static (CGO_ENABLED=0: the kubelet runs in whatever rootfs the test
# gives it), stripped, with the version stamped as a release's is: the
# kubelet reports it on its Node, and the API server's version skew checks
# read it. `go build` relinks only when a source changed: about 1 s when
# nothing did.
#
# Input: KUBELET_BIN  output path (default <repo>/bin/kubelet)
set -euo pipefail
# The patched Go toolchain of the Makefile (tests/lint checks they agree).
export GOTOOLCHAIN=go1.27.3
# The one build configuration of every build and test (the Makefile says
# why; tests/lint checks they agree).
export CGO_ENABLED=0
export GOEXPERIMENT=nojsonv2

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
bin=${KUBELET_BIN:-$repo/bin/kubelet}
k8s_version=v1.36.3

ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$k8s_version"
ldflags+=" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=36"
ldflags+=" -X k8s.io/component-base/version.gitTreeState=clean"
mkdir -p "$(dirname "$bin")"
[ -x "$bin" ] || echo "kubelet.sh: building $bin (a cold build takes minutes)" >&2
start=$(date +%s)
(cd "$here" && CGO_ENABLED=0 GOFLAGS=-buildvcs=false go build -trimpath -ldflags "$ldflags" -o "$bin" k8s.io/kubernetes/cmd/kubelet) >&2
secs=$(($(date +%s) - start))
[ "$secs" -gt 5 ] && echo "kubelet.sh: built in ${secs}s" >&2
echo "$bin"
