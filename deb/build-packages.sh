#!/bin/sh
# Builds dist/unbounded-agent_<version>_<arch>.deb and
# dist/unbounded-agent-<version>-1.<rpmarch>.rpm from the binaries in bin/
# (`make build`) with the nfpm pinned in tools/go.mod. `make packages` runs it
# with VERSION and PKG_ARCH set.
#
# The static part of the package is deb/nfpm.yaml. This script appends what
# depends on the tree: every file of units/ (so a new unit is packaged by
# adding it there), the multicall executable with one link per concern, the
# example config, and the Debian changelog. The build is reproducible: file
# times come from SOURCE_DATE_EPOCH, the time of the last commit by default.
set -eu
cd "$(dirname "$0")/.."

# One-shot concerns served by the multicall executable bin/unbounded-agent
# (ARCHITECTURE section 3): each becomes a link
# /usr/libexec/unbounded/<concern> -> unbounded-agent. Empty: no concern is
# built yet, and then the executable is not packaged either.
CONCERNS="bootstrap daemon fence reset"

die() {
	echo "build-packages.sh: $*" >&2
	exit 1
}

: "${VERSION:?VERSION is not set (make packages sets it)}"
# A semantic version, which both dpkg and rpm order the same way once nfpm
# has turned its pre-release into a ~ suffix.
if ! printf '%s\n' "$VERSION" | grep -Eqx '[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.]+)?'; then
	die "VERSION=$VERSION is not a version like 1.2.3 or 1.2.3-dev.4.gabcdef12"
fi
PKG_ARCH=${PKG_ARCH:-amd64}
export VERSION PKG_ARCH

missing=""
for b in bin/unbounded bin/unbounded-generator ${CONCERNS:+bin/unbounded-agent}; do
	[ -f "$b" ] && [ -x "$b" ] || missing="$missing $b"
done
[ -z "$missing" ] || die "missing binaries:$missing (run make build first)"
[ -f units/80-unbounded.preset ] || die "units/80-unbounded.preset is missing"
# Man pages and completion scripts (`make docs`), named in deb/nfpm.yaml.
for d in unbounded.1.gz unbounded-agent.toml.5.gz unbounded.bash _unbounded unbounded.fish; do
	[ -s "bin/doc/$d" ] || die "bin/doc/$d is missing (run make docs first)"
done

if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then
	SOURCE_DATE_EPOCH=$(git log -1 --format=%ct 2>/dev/null) || die "SOURCE_DATE_EPOCH is not set and git log failed"
fi
export SOURCE_DATE_EPOCH

work=$(mktemp -d "${TMPDIR:-/tmp}/unbounded-packages.XXXXXX")
trap 'rm -rf "$work"' EXIT

# The Debian version nfpm derives from a semver pre-release:
# 0.1.0-dev.5.gabc -> 0.1.0~dev.5.gabc (sorts below the 0.1.0 release).
case $VERSION in
*-*) debversion="${VERSION%%-*}~${VERSION#*-}" ;;
*) debversion=$VERSION ;;
esac

# The Debian changelog: deb/changelog as written, with an entry on top for a
# build whose version it does not name (a development snapshot), dated by
# SOURCE_DATE_EPOCH so that the build stays reproducible. The package is
# native (its version has no Debian revision), hence changelog.gz rather
# than changelog.Debian.gz.
top=$(sed -n '1s/^[^ ]* (\([^)]*\)).*/\1/p' deb/changelog)
if [ "$debversion" = "$VERSION" ] && [ "$top" != "$VERSION" ]; then
	die "release $VERSION has no entry at the top of deb/changelog: add one"
fi
{
	if [ "$top" != "$debversion" ]; then
		commit=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
		date=$(LC_ALL=C date -u -d "@$SOURCE_DATE_EPOCH" '+%a, %d %b %Y %H:%M:%S +0000')
		printf 'unbounded-agent (%s) UNRELEASED; urgency=medium\n\n' "$debversion"
		printf '  * Development snapshot built from commit %s.\n\n' "$commit"
		printf ' -- unbounded-agent maintainers <unbounded-agent@unbounded-cloud.io>  %s\n\n' "$date"
	fi
	cat deb/changelog
} | gzip -9n >"$work/changelog.gz"
touch -d "@$SOURCE_DATE_EPOCH" "$work/changelog.gz"

# Files of units/ that are not units: the preset (installed apart), docs,
# and the Go tests that lint the units with their testdata/ (skipped by find).
# tests/packages applies the same rule to compute what the package must hold.
is_unit_file() {
	case ${1##*/} in
	80-unbounded.preset | README* | *.go | *.md | .*) return 1 ;;
	esac
	return 0
}

config=$work/nfpm.yaml
{
	cat deb/nfpm.yaml
	find units -name testdata -prune -o -type f -print | LC_ALL=C sort | while read -r f; do
		is_unit_file "$f" || continue
		printf '  - src: %s\n    dst: /usr/lib/systemd/system/%s\n    file_info: {mode: 0644}\n' "$f" "${f#units/}"
	done
	# Drop-in directories (units/<unit>.d/) belong to the package too.
	find units -mindepth 1 -name testdata -prune -o -type d -print | LC_ALL=C sort | while read -r d; do
		printf '  - dst: /usr/lib/systemd/system/%s\n    type: dir\n    file_info: {mode: 0755}\n' "${d#units/}"
	done
	if [ -n "$CONCERNS" ]; then
		printf '  - src: bin/unbounded-agent\n    dst: /usr/libexec/unbounded/unbounded-agent\n    file_info: {mode: 0755}\n'
		for c in $CONCERNS; do
			printf '  - src: unbounded-agent\n    dst: /usr/libexec/unbounded/%s\n    type: symlink\n' "$c"
		done
	fi
	if [ -f lib/config/reference.toml ]; then
		# Once per format: `type: doc` (documentation in the .rpm) keeps
		# an entry out of the .deb.
		printf '  - src: lib/config/reference.toml\n    dst: /usr/share/doc/unbounded-agent/agent.toml.example\n    packager: deb\n    file_info: {mode: 0644}\n'
		printf '  - src: lib/config/reference.toml\n    dst: /usr/share/doc/unbounded-agent/agent.toml.example\n    type: doc\n    file_info: {mode: 0644}\n'
	fi
	printf '  - src: %s\n    dst: /usr/share/doc/unbounded-agent/changelog.gz\n    packager: deb\n    file_info: {mode: 0644}\n' "$work/changelog.gz"
} >"$config"

mkdir -p dist
nfpm() { go tool -modfile=tools/go.mod nfpm "$@"; }
# Old builds of this package are removed so that dist/ holds one of each.
rm -f dist/unbounded-agent_*.deb dist/unbounded-agent-*.rpm
nfpm pkg --config "$config" --packager deb --target dist/
nfpm pkg --config "$config" --packager rpm --target dist/
