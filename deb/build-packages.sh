#!/bin/sh
# Builds dist/unbounded-agent_<version>_<arch>.deb and
# dist/unbounded-agent-<version>-1.<rpmarch>.rpm from the binaries in bin/
# (`make build`) with the nfpm pinned in tools/go.mod. `make packages` runs it
# with VERSION and PKG_ARCH set. DIST names another output directory than
# dist/ (the packages tests build into their own).
#
# The static part of the package is deb/nfpm.yaml. This script appends what
# depends on the tree: every file of units/ (so a new unit is packaged by
# adding it there), the multicall executable with one link per concern, the
# example config, and the Debian changelog. The .rpm that nfpm builds is then
# rebuilt by rpmbuild (package rpm) from a spec generated from it
# (rpm_from_nfpm), for the scriptlet dependencies nfpm cannot write. The
# build is reproducible: file times come from SOURCE_DATE_EPOCH, the time of
# the last commit by default.
set -eu
cd "$(dirname "$0")/.."
# The patched Go toolchain of the Makefile (tests/lint checks they agree).
export GOTOOLCHAIN=go1.27.3
# The one build configuration of every build and test (the Makefile says
# why; tests/lint checks they agree).
export CGO_ENABLED=0
export GOEXPERIMENT=nojsonv2

# One-shot concerns served by the multicall executable bin/unbounded-agent
# (ARCHITECTURE section 3): each becomes a link
# /usr/libexec/unbounded/<concern> -> unbounded-agent. Empty: no concern is
# built yet, and then the executable is not packaged either.
CONCERNS="bootstrap daemon fence isolation lifecycle prepare recover repave reprovision reset upgrade"

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
for b in bin/unbounded bin/unbounded-generator bin/unbounded-restart bin/unbounded-health ${CONCERNS:+bin/unbounded-agent}; do
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

# rpm_from_nfpm NFPM_RPM DIR rebuilds the .rpm that nfpm made with the real
# rpmbuild into DIR, under the same file name. nfpm can write Requires(post)
# but not Requires(preun) or Requires(postun), and Fedora's guidelines
# (%systemd_requires) want all three for scriptlets that run systemctl. The
# spec is generated from the nfpm rpm itself, its header and its file list
# (rpm -qp --qf), and %install unpacks its payload: what the package holds
# is still said once, in deb/nfpm.yaml and above, and the two formats cannot
# drift. The rebuilt rpm is checked to hold the same files, bit for bit and
# with the same modes, owners and flags, and the same scriptlets.
rpm_from_nfpm() {
	src=$1 dest=$2
	rpmtop=$work/rpmbuild
	mkdir -p "$rpmtop/tmp" "$rpmtop/db" "$rpmtop/home"
	# No side effects outside $work (a private rpm database and temporary
	# directory), and no ~/.rpmmacros of the builder's (HOME): two
	# machines build the same package. rpmq [-p RPM] ARGS... queries $src,
	# or RPM.
	rpmq() {
		f=$src
		[ "$1" != -p ] || { f=$2 && shift 2; }
		HOME=$rpmtop/home rpm --dbpath "$rpmtop/db" -qp "$@" "$f" 2>/dev/null
	}
	qf() { rpmq --qf "$1"; }
	# % starts a macro in a spec, even in scriptlets and the description.
	esc() { sed 's/%/%%/g'; }

	name=$(qf '%{NAME}') version=$(qf '%{VERSION}') release=$(qf '%{RELEASE}') arch=$(qf '%{ARCH}')
	[ -n "$name" ] && [ -n "$arch" ] || die "rpm -qp cannot read $src"
	rpmq -l | grep -q '[^-./_+~@0-9A-Za-z]' &&
		die "$src: a file name has a character the generated spec cannot carry: $(rpmq -l | grep '[^-./_+~@0-9A-Za-z]' | head -1)"

	# The scriptlets nfpm stored (rpm/*.sh), by spec section; tag names
	# the header tag of one.
	tag() { case $1 in pre) echo PREIN ;; post) echo POSTIN ;; *) echo "$1" | tr a-z A-Z ;; esac; }
	scriptlets=""
	for s in pre post preun postun; do
		[ "$(qf "%{$(tag "$s")}")" = "(none)" ] || scriptlets="$scriptlets $s"
	done

	spec=$rpmtop/$name.spec
	{
		printf 'Name: %s\nVersion: %s\nRelease: %s\n' "$name" "$version" "$release"
		for t in Summary License URL Vendor Packager Group; do
			v=$(qf "%{$(echo "$t" | tr a-z A-Z)}")
			[ "$v" = "(none)" ] || printf '%s: %s\n' "$t" "$v" | esc
		done
		# The dependencies are nfpm's, as nfpm.yaml declares them, not
		# what rpmbuild would find in the (static) binaries.
		printf 'AutoReqProv: no\n'
		# rpm.requires.post of nfpm.yaml names what the scriptlets run;
		# nfpm can write it only for %%post, the spec says it for each
		# scriptlet there is.
		rpmq --qf '[%{REQUIREFLAGS:deptype}|%{REQUIRENAME} %{REQUIREFLAGS:depflags} %{REQUIREVERSION}\n]' | sed 's/ *$//' |
			while IFS='|' read -r type dep; do
				case $type in
				rpmlib | interp) ;; # rpmbuild's own
				manual) printf 'Requires: %s\n' "$dep" ;;
				post) for s in $scriptlets; do printf 'Requires(%s): %s\n' "$s" "$dep"; done ;;
				*) printf 'Requires(%s): %s\n' "$type" "$dep" ;;
				esac
			done
		for t in Recommends Suggests Supplements Enhances Conflicts Obsoletes Provides; do
			T=$(echo "$t" | tr a-z A-Z | sed 's/S$//')
			rpmq --qf "[%{${T}NAME} %{${T}FLAGS:depflags} %{${T}VERSION}\n]" | sed 's/ *$//' |
				while read -r dep; do
					# rpmbuild adds the package's own provides.
					case $t:$dep in Provides:"$name "* | Provides:"$name("*) continue ;; esac
					printf '%s: %s\n' "$t" "$dep"
				done
		done
		printf '\n%%description\n'
		qf '%{DESCRIPTION}\n' | esc
		printf '\n%%install\n'
		printf 'rpm2archive -n - <%s | tar -x -C "$RPM_BUILD_ROOT"\n' "$src"
		for s in $scriptlets; do
			printf '\n%%%s\n' "$s"
			qf "%{$(tag "$s")}\n" | esc
		done
		# Every file, with its mode, owner and flags as nfpm set them:
		# a directory the package owns is %dir (a plain directory
		# entry would take in all below it), d is %doc, l %license,
		# c %config (n noreplace, m missingok), g %ghost.
		printf '\n%%files\n'
		rpmq --qf '[%{FILEMODES:octal}|%{FILEUSERNAME}|%{FILEGROUPNAME}|%{FILEFLAGS:fflags}|%{FILENAMES}\n]' |
			while IFS='|' read -r mode user group flags path; do
				perm=$(printf '%04o' $((0$mode & 07777)))
				attrs=""
				case $mode in
				12????) perm=- ;;
				4????) attrs="%dir " ;;
				esac
				case $flags in *d*) attrs="$attrs%doc " ;; esac
				case $flags in *l*) attrs="$attrs%license " ;; esac
				case $flags in *g*) attrs="$attrs%ghost " ;; esac
				case $flags in
				*c*n* | *n*c*) attrs="$attrs%config(noreplace) " ;;
				*c*m* | *m*c*) attrs="$attrs%config(missingok) " ;;
				*c*) attrs="$attrs%config " ;;
				esac
				printf '%%attr(%s,%s,%s) %s%s\n' "$perm" "$user" "$group" "$attrs" "$path"
			done
	} >"$spec"

	# Reproducible: the build time and every file time come from
	# SOURCE_DATE_EPOCH, the build host is not named, the files are put in
	# as nfpm made them (no strip, no build-id links, no debuginfo: the
	# binaries are built by make build) and compressed with zstd, which
	# Debian's rpm 4.18 and every current RPM distribution read.
	HOME=$rpmtop/home rpmbuild -bb --quiet --target "$arch-linux" \
		--define "_topdir $rpmtop" --define "_tmppath $rpmtop/tmp" --define "_dbpath $rpmtop/db" \
		--define "_buildhost reproducible" \
		--define "use_source_date_epoch_as_buildtime 1" \
		--define "clamp_mtime_to_source_date_epoch 1" \
		--define "_binary_payload w19.zstdio" \
		--define "__os_install_post %{nil}" --define "debug_package %{nil}" \
		--define "_build_id_links none" \
		--define "_rpmfilename %%{NAME}-%%{VERSION}-%%{RELEASE}.%%{ARCH}.rpm" \
		"$spec" >"$rpmtop/rpmbuild.log" 2>&1 || { cat "$rpmtop/rpmbuild.log" >&2; die "rpmbuild failed (its output above)"; }
	out=$rpmtop/RPMS/$name-$version-$release.$arch.rpm
	[ -f "$out" ] || die "rpmbuild made no $out"

	# The same files and scriptlets as nfpm's rpm, or the build fails.
	files='[%{FILENAMES} %{FILEMODES:octal} %{FILEUSERNAME} %{FILEGROUPNAME} %{FILEFLAGS:fflags} %{FILEDIGESTS} %{FILELINKTOS}\n]'
	# (A symlink's permission bits are those lstat gives, 0777, where nfpm
	# writes none: rpm ignores them.)
	symlinks='s/ 120[0-7]{3} / 120xxx /'
	rpmq --qf="$files" | sed -E "$symlinks" >"$rpmtop/nfpm.q"
	rpmq -p "$out" --qf="$files" | sed -E "$symlinks" >"$rpmtop/rpmbuild.q"
	diff -u "$rpmtop/nfpm.q" "$rpmtop/rpmbuild.q" >&2 ||
		die "the rpm rebuilt by rpmbuild holds other files than nfpm's (diff above)"
	# (rpmbuild drops the newline that ends a scriptlet.)
	for t in PREIN POSTIN PREUN POSTUN PRETRANS POSTTRANS; do
		[ "$(qf "%{$t}")" = "$(rpmq -p "$out" --qf "%{$t}")" ] ||
			die "the rpm rebuilt by rpmbuild has another $t scriptlet than nfpm's"
	done
	cp "$out" "$dest/$(basename "$src")"
	echo "created package: $dest/$(basename "$src") (rpmbuild)"
}

DIST=${DIST:-dist}
mkdir -p "$DIST"
nfpm() { go tool -modfile=tools/go.mod nfpm "$@"; }
# Old builds of this package are removed so that $DIST holds one of each.
rm -f "$DIST"/unbounded-agent_*.deb "$DIST"/unbounded-agent-*.rpm
nfpm pkg --config "$config" --packager deb --target "$DIST/"
# The .rpm: nfpm builds it from the same contents as the .deb, then
# rpmbuild rebuilds it from a spec generated from that rpm (rpm_from_nfpm,
# below), for what nfpm cannot write.
mkdir "$work/nfpm"
nfpm pkg --config "$config" --packager rpm --target "$work/nfpm/"
rpm_from_nfpm "$work"/nfpm/*.rpm "$DIST"
