#!/usr/bin/env bash
# deps.sh: install the Debian packages that building and testing need, on a
# fresh Debian 12 machine (root). Called by .ci/run and by `make demo`
# (tests/demo/demo.sh): one list, so that the demo needs nothing CI does
# not install. Everything installed by hand on a developer machine must be
# listed here too.
set -euo pipefail

export DEBIAN_FRONTEND=noninteractive
# systemd-container: systemd-nspawn (the system tier's machines, the demo's
# host). debootstrap: the cached Debian rootfs (tests/system/rootfs.sh).
# rpm: rpmbuild and rpm2archive build the .rpm (deb/build-packages.sh), rpm
# installs it in scratch roots. lintian checks the .deb. busybox-static:
# the node stack's test image. zsh and fish: the completion scripts are run
# by the shells they are for. gcc and libc6-dev: the static pause binary of
# the node stack (tests/system/nodestack/stage.sh).
need=(systemd-container debootstrap lintian rpm busybox-static zsh fish gcc libc6-dev)
missing=()
for p in "${need[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
# Another apt (unattended-upgrades on a fresh machine) may hold the dpkg
# lock: wait for it, up to 10 minutes, instead of failing the run.
apt=(apt-get -o DPkg::Lock::Timeout=600)
# The package lists are refreshed even when nothing is missing: the system
# tier's node stack is staged with `apt-get download` (containerd, runc,
# CNI plugins, busybox-static: tests/system/nodestack/stage.sh), which needs
# current lists.
"${apt[@]}" update -qq
if [ ${#missing[@]} -gt 0 ]; then
	echo "deps: installing ${missing[*]}"
	"${apt[@]}" install -y -qq --no-install-recommends "${missing[@]}"
fi
