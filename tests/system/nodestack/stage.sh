#!/bin/sh
# stage.sh builds (once) the node-stack test inputs that do not come from
# this repository, and prints their directory:
#
#   UNBOUNDED_TEST_NODESTACK=$(tests/system/nodestack/stage.sh)
#
# From Debian bookworm's packages (downloaded with `apt-get download`,
# unpacked with `dpkg-deb -x`, never installed on this host):
#   artifacts/containerd-<v>.tar.gz   bin/containerd, bin/containerd-shim-runc-v2, bin/ctr, ...
#   artifacts/runc-<v>                runc (dynamic: libseccomp2, libc)
#   artifacts/cni-plugins-<v>.tgz     ./bridge, ./host-local, ./loopback, ./portmap, ...
#   artifacts/versions                name=version lines (the Debian upstream versions)
#   bin/busybox                       busybox-static, for the test image
#   layers/iptables/                  iptables (legacy backend selected) and
#                                     its libraries: the node image's second
#                                     layer (the CNI bridge masquerades with
#                                     iptables; the test rootfs has none)
# and from the Kubernetes module in the Go module cache:
#   bin/pause                         build/pause/linux/pause.c, gcc -static
# and from CoreDNS's Go module (tests/coredns: the plugins the agent's
# Corefile uses, and hosts for the tests' own resolvers):
#   artifacts/coredns_<v>_linux_<arch>.tgz   ./coredns, as CoreDNS's releases
#
# The kubelet is not here: it changes with every Kubernetes bump and is
# built by tests/kube/kubelet.sh. Package nodestack (this directory) turns
# these into a mirror, a loopback artifact server and OCI images.
#
# Cached like tests/system/rootfs.sh: the directory name carries a hash of
# the recipe, the build goes to a temporary directory renamed into place.
#
# Environment:
#   UNBOUNDED_ROOTFS_CACHE  cache directory (default /var/cache/unbounded-tests)
set -eu

packages="containerd runc containernetworking-plugins busybox-static"
# iptables and the libraries it needs beyond the test rootfs's.
iptables_packages="iptables libip4tc2 libip6tc2 libnetfilter-conntrack3 libnfnetlink0 libnftnl11"
k8s_version=v1.36.3
# Bump when the steps below change.
recipe=4
cache=${UNBOUNDED_ROOTFS_CACHE:-/var/cache/unbounded-tests}
coredns_dir=$(cd "$(dirname "$0")/../../coredns" && pwd)
# The patched Go toolchain of the Makefile, as tests/kube/kubelet.sh.
export GOTOOLCHAIN=go1.27.3
# The one build configuration of every build and test (the Makefile says
# why; tests/lint checks they agree).
export CGO_ENABLED=0
export GOEXPERIMENT=nojsonv2

log() { echo "stage.sh: $*" >&2; }

hash=$(printf '%s\n' "$packages" "$iptables_packages" "$k8s_version" "$recipe" "$(cat "$coredns_dir/go.mod" "$coredns_dir/go.sum" "$coredns_dir/main.go")" | sha256sum | cut -c1-12)
final="$cache/nodestack-$hash"
if [ -f "$final/artifacts/versions" ]; then
	echo "$final"
	exit 0
fi

for bin in apt-get dpkg-deb gcc go; do
	command -v $bin >/dev/null 2>&1 || { log "needs $bin on PATH"; exit 1; }
done
pause_c=$(cd "$(dirname "$0")/../../kube" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)/build/pause/linux/pause.c
[ -f "$pause_c" ] || { log "no $pause_c (go mod download in tests/kube)"; exit 1; }

mkdir -p "$cache"
tmp=$(mktemp -d "$cache/.nodestack-$hash.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM
start=$(date +%s)

mkdir "$tmp/debs" "$tmp/x" "$tmp/artifacts" "$tmp/bin" "$tmp/layers"
log "apt-get download $packages $iptables_packages"
# apt warns that it downloads "unsandboxed as root" (its _apt user cannot
# enter the 0700 temporary directory): harmless, the files are only unpacked.
(cd "$tmp/debs" && apt-get download $packages $iptables_packages >&2)

version_of() { # PKG: Debian upstream version (1.6.20~ds1-1+deb12u3 -> 1.6.20)
	dpkg-deb -f "$tmp"/debs/"$1"_*.deb Version | sed -e 's/^[0-9]*://' -e 's/[~+-].*//'
}
for p in $packages; do
	dpkg-deb -x "$tmp"/debs/"$p"_*.deb "$tmp/x/$p"
done

cv=$(version_of containerd)
rv=$(version_of runc)
nv=$(version_of containernetworking-plugins)

mkdir -p "$tmp/stage/containerd/bin"
cp -a "$tmp"/x/containerd/usr/bin/* "$tmp/stage/containerd/bin/"
tar -C "$tmp/stage/containerd" --owner=0 --group=0 --numeric-owner -czf "$tmp/artifacts/containerd-$cv.tar.gz" bin
cp "$tmp/x/runc/usr/sbin/runc" "$tmp/artifacts/runc-$rv"
tar -C "$tmp/x/containernetworking-plugins/usr/lib/cni" --owner=0 --group=0 --numeric-owner -czf "$tmp/artifacts/cni-plugins-$nv.tgz" .

log "building CoreDNS from $coredns_dir"
dv=$(cd "$coredns_dir" && go list -m -f '{{.Version}}' github.com/coredns/coredns)
dv=${dv#v}
mkdir -p "$tmp/x/coredns"
# With go1.27's default experiments, not nojsonv2: CoreDNS's dependencies
# (prometheus/common) import encoding/json/jsontext, which nojsonv2 leaves
# out. It shares no compiled package with the project's builds anyway
# (its own module graph), and upstream builds it this way.
(cd "$coredns_dir" && CGO_ENABLED=0 GOEXPERIMENT= GOFLAGS=-buildvcs=false go build -trimpath -ldflags "-s -w" -o "$tmp/x/coredns/coredns" .) >&2
tar -C "$tmp/x/coredns" --owner=0 --group=0 --numeric-owner -czf "$tmp/artifacts/coredns_${dv}_linux_$(go env GOARCH).tgz" coredns
printf 'containerd=%s\nrunc=%s\ncni-plugins=%s\nkubelet=%s\ncoredns=%s\n' "$cv" "$rv" "$nv" "${k8s_version#v}" "$dv" >"$tmp/artifacts/versions"

cp "$tmp/x/busybox-static/bin/busybox" "$tmp/bin/busybox"

# The iptables layer: the packages' files, and the links update-alternatives
# would make, to the legacy backend (the nft backend needs nf_tables in the
# kernel of every machine that runs the tests).
for p in $iptables_packages; do
	dpkg-deb -x "$tmp"/debs/"$p"_*.deb "$tmp/layers/iptables"
done
rm -rf "$tmp/layers/iptables/usr/share/doc" "$tmp/layers/iptables/usr/share/man"
# The package names the legacy tools iptables-legacy, iptables-legacy-save
# and iptables-legacy-restore (not iptables-save-legacy).
for t in iptables ip6tables; do
	for suffix in "" -save -restore; do
		[ -e "$tmp/layers/iptables/usr/sbin/$t-legacy$suffix" ] || { log "the iptables package has no $t-legacy$suffix"; exit 1; }
		ln -sf "$t-legacy$suffix" "$tmp/layers/iptables/usr/sbin/$t$suffix"
	done
done
gcc -Os -static -DVERSION="$k8s_version-unbounded-test" -o "$tmp/bin/pause" "$pause_c"
strip "$tmp/bin/pause" 2>/dev/null || true
rm -rf "$tmp/x" "$tmp/stage"

if mv -T "$tmp" "$final" 2>/dev/null; then
	trap - EXIT
else
	log "another build finished first; using it"
fi
log "staged in $(($(date +%s) - start)) s, $(du -sh "$final" | cut -f1)"
echo "$final"
