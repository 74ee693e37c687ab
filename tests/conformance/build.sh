#!/usr/bin/env bash
# build.sh: builds what `make conformance` runs, from this module's
# k8s.io/kubernetes (the same version as the test control plane,
# tests/kube), into <repo>/bin/conformance/:
#
#   e2e.test   the node e2e binary (go test -c ./nodee2e): upstream's e2e suite
#              with the node, storage and network specs of test/e2e/common,
#              where every [NodeConformance] spec lives (nodee2e says why)
#   agnhost    the agnhost test image's binary (static)
#   nnp        the nonewprivs test image's binary (static)
#   localhost.crt, localhost.key
#              the agnhost image's TLS pair (test/images/agnhost/porter),
#              which the https lifecycle hook specs serve with
#   bash-static
#              Debian's static bash (downloaded once with apt-get download):
#              the e2e busybox image's /bin/sh. Debian bookworm's busybox
#              1.35 sh drops environment variables whose names are not
#              shell identifiers ("data-1", which the envFrom specs set and
#              read back with `sh -c env`); upstream's busybox 1.37 image
#              passes them on, and so does bash.
#   ginkgo     the Ginkgo CLI of the version e2e.test links, which runs
#              e2e.test's specs in parallel processes (ginkgo -p)
#
# and prints the directory on stdout (progress on stderr). `go build` and
# `go test -c` relink only when a source changed (a few seconds when
# nothing did); a cold build compiles most of Kubernetes (minutes).
set -euo pipefail
# The patched Go toolchain of the Makefile (tests/lint checks they agree).
export GOTOOLCHAIN=go1.27.3
# The one build configuration of every build and test (the Makefile says
# why; tests/lint checks they agree).
export CGO_ENABLED=0
export GOEXPERIMENT=nojsonv2

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
out=${CONFORMANCE_BIN:-$repo/bin/conformance}
k8s_version=v1.36.3

ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$k8s_version"
ldflags+=" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=36"
ldflags+=" -X k8s.io/component-base/version.gitTreeState=clean"
mkdir -p "$out"
start=$(date +%s)
(cd "$here" && CGO_ENABLED=0 GOFLAGS=-buildvcs=false go test -c -vet=off -trimpath -ldflags "$ldflags" -o "$out/e2e.test" ./nodee2e) >&2
secs=$(($(date +%s) - start))
echo "conformance/build.sh: e2e.test built in ${secs}s" >&2
for p in agnhost:k8s.io/kubernetes/test/images/agnhost nnp:k8s.io/kubernetes/test/images/nonewprivs ginkgo:github.com/onsi/ginkgo/v2/ginkgo; do
	start=$(date +%s)
	(cd "$here" && CGO_ENABLED=0 GOFLAGS=-buildvcs=false go build -trimpath -ldflags "$ldflags" -o "$out/${p%%:*}" "${p#*:}") >&2
	secs=$(($(date +%s) - start))
	echo "conformance/build.sh: ${p%%:*} built in ${secs}s" >&2
done
src=$(cd "$here" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)
for f in localhost.crt localhost.key; do
	install -m 0644 "$src/test/images/agnhost/porter/$f" "$out/$f"
done
if [ ! -x "$out/bash-static" ]; then
	tmp=$(mktemp -d)
	(cd "$tmp" && apt-get download -q -o APT::Sandbox::User=root bash-static >&2 && dpkg-deb -x bash-static_*.deb x) || { rm -rf "$tmp"; exit 1; }
	install -m 0755 "$tmp/x/bin/bash-static" "$out/bash-static"
	rm -rf "$tmp"
fi
echo "$out"
