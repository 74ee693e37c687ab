#!/bin/sh
# rootfs.sh builds (once) the Debian bookworm root file system that the
# system tests boot with systemd-nspawn, and prints its path.
#
# Why cached: debootstrap downloads and unpacks a whole Debian; every test boots the same
# tree read-only under a per-test copy-on-write layer, so one build serves
# every run until the recipe below changes.
#
# Why the hash in the name: the directory name carries a short hash of the
# recipe, so changing the package list or the post-processing builds a new
# tree instead of silently reusing a stale one.
#
# Why build into a temporary directory and rename: an interrupted build
# (Ctrl-C, power cut, full disk) must never leave a half tree under the final
# name, where the next run would take it for a complete one. rename(2) within
# one directory is atomic.
#
# Environment:
#   UNBOUNDED_ROOTFS_CACHE  cache directory (default /var/cache/unbounded-tests)
#   UNBOUNDED_DEBIAN_MIRROR mirror (default http://deb.debian.org/debian)
#
# Progress goes to stderr; stdout carries only the path, so callers can write
#   UNBOUNDED_TEST_ROOTFS=$(tests/system/rootfs.sh)
set -eu

suite=bookworm
variant=minbase
# systemd-container lets later scenarios nest nspawn machines inside the
# test container; iproute2 and procps are what a debugging human reaches for.
include=systemd,systemd-sysv,dbus,systemd-container,iproute2,procps,ca-certificates
mirror=${UNBOUNDED_DEBIAN_MIRROR:-http://deb.debian.org/debian}
cache=${UNBOUNDED_ROOTFS_CACHE:-/var/cache/unbounded-tests}
# Bump when the post-processing below changes.
postproc=4

log() { echo "rootfs.sh: $*" >&2; }

# The mirror is not part of the recipe: the same packages from another
# mirror are the same tree.
hash=$(printf '%s\n' "$suite" "$variant" "$include" "$postproc" | sha256sum | cut -c1-12)
final="$cache/rootfs-$suite-$hash"

if [ -f "$final/usr/lib/systemd/systemd" ]; then
	echo "$final"
	exit 0
fi

if [ "$(id -u)" != 0 ]; then
	log "building the rootfs needs root (debootstrap); run as root or set UNBOUNDED_TEST_ROOTFS to a prebuilt tree"
	exit 1
fi

missing=
command -v systemd-nspawn >/dev/null 2>&1 || missing="$missing systemd-container"
command -v debootstrap >/dev/null 2>&1 || missing="$missing debootstrap"
if [ -n "$missing" ]; then
	log "installing$missing"
	# --no-install-recommends keeps libnss-mymachines out of the host's
	# nsswitch.conf.
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $missing >&2
fi

mkdir -p "$cache"
tmp=$(mktemp -d "$cache/.rootfs-$suite-$hash.XXXXXX")
cleanup() { rm -rf "$tmp"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

start=$(date +%s)
log "debootstrap $suite into $tmp (once; cached at $final)"
debootstrap --variant="$variant" --include="$include" "$suite" "$tmp" "$mirror" >&2

# Package caches and lists: the tests never read them.
rm -rf "$tmp"/var/cache/apt/archives/*.deb "$tmp"/var/lib/apt/lists/*
# Every machine booted from this tree must get its own machine id, as every
# host of a fleet has (journald, machined and the node stack key on it):
# - an empty /etc/machine-id makes the first boot of each machine generate
#   one (nspawn passes a random one in) and commit it to the machine's own
#   overlay, where it survives the machine's reboots;
# - /var/lib/dbus/machine-id must not hold the id dbus's postinst wrote:
#   systemd takes that file, when it is not a symlink, in preference to
#   anything else for an empty /etc/machine-id, so every machine had the
#   same id. A link to /etc/machine-id is what D-Bus expects on systemd
#   hosts (TESTING.md);
# - no /etc/hostname: the machine's name, which nspawn sets, is its hostname.
: >"$tmp/etc/machine-id"
rm -f "$tmp/var/lib/dbus/machine-id" "$tmp/etc/hostname"
ln -s /etc/machine-id "$tmp/var/lib/dbus/machine-id"

# debootstrap writes no /etc/hosts (an installer does, on a real host);
# containerd copies it into every pod sandbox and fails the pod without it,
# and this tree is also the node image of the nspawn mode's tests.
printf '127.0.0.1\tlocalhost\n::1\t\tlocalhost ip6-localhost ip6-loopback\n' >"$tmp/etc/hosts"

# debootstrap copies the build machine's /etc/resolv.conf, which names the
# VM's resolver, an address outside every namespace a test creates. Test
# hosts (and the nspawn nodes, which copy their host's) resolve no name
# through DNS: with no nameserver line, glibc and Go ask only the
# loopback (127.0.0.1:53, ::1), where nothing listens, and fail at once.
rm -f "$tmp/etc/resolv.conf"
printf '# No resolver: test hosts resolve names only through /etc/hosts.\n' >"$tmp/etc/resolv.conf"

# Another run may have finished the same recipe meanwhile: keep theirs.
if mv -T "$tmp" "$final" 2>/dev/null; then
	trap - EXIT
else
	log "another build finished first; using it"
fi
log "built in $(($(date +%s) - start)) s, $(du -sh "$final" | cut -f1)"
echo "$final"
