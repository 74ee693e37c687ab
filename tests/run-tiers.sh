#!/usr/bin/env bash
# `make test`: runs every test tier of ARCHITECTURE section 9 that this
# machine supports, then prints which tiers ran and which skipped, and why
# (tests/tiersum). A tier that cannot run here skips with a reason; it never
# passes silently. Exit status: non-zero if any test or package failed, any
# go test exited non-zero, tests/kube/with-env.sh failed, or a tier named in
# UNBOUNDED_TEST_REQUIRED (see tests/tiers; .ci/run sets it) skipped or ran
# no test.
#
# Preparation that a tier needs (the cached Debian rootfs, the packages, the
# API server) is done here; when it cannot be done the reason is exported
# and the tier's tests skip with it.
set -uo pipefail
# The patched Go toolchain of the Makefile (tests/lint checks they agree).
export GOTOOLCHAIN=go1.27.3
# The one build configuration of every build and test (the Makefile says
# why; tests/lint checks they agree).
export CGO_ENABLED=0
export GOEXPERIMENT=nojsonv2
cd "$(dirname "$0")/.."
repo=$(pwd)
out=$(mktemp -d /tmp/unbounded-tiers.XXXXXX)
# UNBOUNDED_TEST_KEEP=DIR keeps every tier's `go test -json` stream there
# (per-test times, whole outputs) for a look after the run.
trap '[ -n "${UNBOUNDED_TEST_KEEP:-}" ] && mkdir -p "$UNBOUNDED_TEST_KEEP" && cp "$out"/*.json "$UNBOUNDED_TEST_KEEP"/; rm -rf "$out"' EXIT
# -trimpath for every build and test: without it a compiled package's
# cache key holds the checkout's directory, so a clean clone elsewhere (a
# CI run) compiled and vetted every package of the project again (4.4
# CPU-minutes of compile and 2.6 of vet in a warm run, a quarter of the
# whole run's CPU). With it a warm run reuses them wherever the clone is.
case " ${GOFLAGS:-} " in
*" -trimpath "*) ;;
*) GOFLAGS="-trimpath ${GOFLAGS:-}" ;;
esac
# -ldflags=-w for what the tiers link without flags of their own (every
# test binary, a test's own go build): no DWARF, which only a debugger
# reads (a panic's trace comes from the function table). The link was a
# tenth of a warm run's CPU (process accounting: 249 links, 192 CPU-s);
# DWARF is about a fifth of a client-go test binary's link. The Makefile's
# builds and the Kubernetes builds pass -ldflags themselves, which wins.
case " ${GOFLAGS:-} " in
*" -ldflags="*) ;;
*) GOFLAGS="$GOFLAGS -ldflags=-w" ;;
esac
export GOFLAGS
# A budget in executions, not in seconds: with a duration, go1.26's fuzz
# coordinator can report its own deadline as a failure ("context deadline
# exceeded", no crasher) when the workers are starved at the end of the
# window (golang/go#75804, fixed in go1.27). A count cannot race a clock.
# A duration (FUZZTIME=10m) still works for a long run by hand, with that
# race.
FUZZTIME=${FUZZTIME:-3000x}
# How many system scenarios run beside the first tiers (inner says why).
SYSTEM_EARLY=${UNBOUNDED_TEST_SYSTEM_EARLY:-2}

# Kubernetes' binaries that the tiers build from tests/kube's module (the
# test API server, the kubelet, the conformance binaries) go to the test
# cache beside the rootfs rather than to this clone's bin/: go build
# compares the build ID of the file already there and leaves an
# up-to-date one alone, so a clean clone whose tests/kube did not change
# links none of them (the test API server's link alone held every tier
# back 14 s; the kubelet's and e2e.test's cost the first minutes' CPU).
# Set KUBE_TESTENV_BIN, KUBELET_BIN or CONFORMANCE_BIN to choose.
kbin=${UNBOUNDED_ROOTFS_CACHE:-/var/cache/unbounded-tests}/bin
if mkdir -p "$kbin" 2>/dev/null && [ -w "$kbin" ]; then
	export KUBE_TESTENV_BIN=${KUBE_TESTENV_BIN:-$kbin/kube-testenv}
	export KUBELET_BIN=${KUBELET_BIN:-$kbin/kubelet}
	export CONFORMANCE_BIN=${CONFORMANCE_BIN:-$kbin/conformance}
fi
# The tiers' test binaries (run_tests below), kept between runs beside
# them; in the run's own directory where the cache is not writable.
testbin=${UNBOUNDED_ROOTFS_CACHE:-/var/cache/unbounded-tests}/testbin
mkdir -p "$testbin" 2>/dev/null && [ -w "$testbin" ] || testbin=

# Each heading says when it began (since the start of the run), so that
# the log shows where a run's minutes went, builds and setup included.
start=$(date +%s)
log() { printf '\n== %s (at %s) ==\n' "$*" "$(elapsed)"; }
elapsed() { local s=$(($(date +%s) - start)); printf '%dm%02ds' $((s / 60)) $((s % 60)); }

# The required tiers, checked before the long run: a misspelt name fails
# here, not after an hour.
if ! required=$(go run ./tests/tiersum -required); then
	echo "run-tiers: bad UNBOUNDED_TEST_REQUIRED (see above)" >&2
	exit 2
fi
echo "required tiers: ${required:-none}"
# is_required TIER: TIER must run (it is in the list tiersum printed).
is_required() { case ",$required," in *,"$1",*) return 0 ;; esac; return 1; }

# What the packages tier and the system tier need: the packages (for
# both), the cached Debian rootfs, the kubelet, the node stack and the
# conformance binaries (the system tier). Made in the background from the
# start (prepare below), beside the API server's start and the first
# tiers, which do not need them (warm: about 45 s of `make packages`;
# cold: the Kubernetes builds, minutes). A tier that needs them waits for
# them (await_prepared) and reads what they are from $out/prep.env; their
# log is printed once, by the first that waits.
prepared() { printf 'export %s=%q\n' "$1" "$2" >>"$out/prep.env"; }
prepare() {
	# Packages (tier 3 and the system tier install them).
	log "building packages"
	if make -s packages >"$out/packages.log" 2>&1; then
		# The packages of this build (nfpm turns a pre-release 0.1.0-dev.N
		# into 0.1.0~dev.N), not whatever else lies in dist/.
		v=${VERSION:?make test sets VERSION}
		case $v in *-*) v="${v%%-*}~${v#*-}" ;; esac
		deb=$(ls dist/unbounded-agent_"$v"_*.deb 2>/dev/null | head -1)
		rpm=$(ls dist/unbounded-agent-"$v"-*.rpm 2>/dev/null | head -1)
		# Copies: another `make packages` (a developer's, in the same tree)
		# replaces dist/ while the tiers run.
		[ -n "$deb" ] && cp "$deb" "$out/" && prepared UNBOUNDED_TEST_DEB "$out/$(basename "$deb")"
		[ -n "$rpm" ] && cp "$rpm" "$out/" && prepared UNBOUNDED_TEST_RPM "$out/$(basename "$rpm")"
		echo "deb: ${deb:-none}  rpm: ${rpm:-none}"
	else
		echo "make packages FAILED:"; tail -30 "$out/packages.log"
		: >"$out/packages.failed"
	fi

	# The cluster side's image (make images: an OCI layout archive of
	# bin/unbounded-controller), which the system tier's rollout scenario
	# pushes to its registry and runs by the shipped manifests.
	if make -s images >"$out/images.log" 2>&1 && img=$(ls dist/unbounded-controller_"${VERSION:?}"_linux_*.oci.tar 2>/dev/null | head -1) && [ -n "$img" ]; then
		cp "$img" "$out/" && prepared UNBOUNDED_TEST_CONTROLLER_IMAGE "$out/$(basename "$img")"
		echo "controller image: $img"
	else
		echo "make images failed (the controller's scenario will skip, or fail where the system tier is required):"; tail -20 "$out/images.log"
	fi

	# The cached Debian rootfs for the system tier.
	if [ -x tests/system/rootfs.sh ]; then
		log "system test rootfs"
		# Where the system tier is required, its tests fail instead of skipping.
		verb=skip
		is_required system && verb="FAIL (required)"
		if [ "$(id -u)" != 0 ]; then
			echo "not root: the system tier will $verb"
		elif rootfs=$(tests/system/rootfs.sh 2>"$out/rootfs.log" | tail -1) && [ -d "$rootfs" ]; then
			prepared UNBOUNDED_TEST_ROOTFS "$rootfs"
			echo "rootfs: $rootfs"
		else
			echo "rootfs build failed (the system tier will $verb):"; tail -20 "$out/rootfs.log"
		fi
		# The node stack (tests/system/nodestack): the kubelet built from the
		# test control plane's module, and Debian's containerd, runc and CNI
		# plugins with a static pause (both cached after the first run).
		# The kubelet and e2e.test link most of what the test API server
		# links (one module graph, one build configuration): built after
		# it, they compile only their own packages. Built beside it, both
		# go commands compiled the same packages at once (go's build cache
		# does not share work in progress).
		flock -s "$out/kbuild.lock" true
		if [ "$(id -u)" = 0 ]; then
			if kubelet=$(tests/kube/kubelet.sh 2>"$out/kubelet.log" | tail -1) && [ -x "$kubelet" ]; then
				prepared UNBOUNDED_TEST_KUBELET "$kubelet"
			else
				echo "kubelet build failed (node-stack tests will $verb):"; tail -20 "$out/kubelet.log"
			fi
			if stage=$(tests/system/nodestack/stage.sh 2>"$out/stage.log" | tail -1) && [ -d "$stage" ]; then
				prepared UNBOUNDED_TEST_NODESTACK "$stage"
				echo "node stack: $stage"
			else
				echo "node stack staging failed (node-stack tests will $verb):"; tail -20 "$out/stage.log"
			fi
			# Upstream node conformance (tests/conformance): e2e.test and the
			# test images' binaries from the test control plane's module,
			# for the CI subset of TestConformance (cached like the kubelet;
			# a cold build compiles minutes of Kubernetes' e2e framework).
			# Only the conformance scenarios need them, so they are built
			# after prepare has ended, beside the system tier, rather than
			# before it: a cold run's system tier started only once they
			# were built. The build holds an exclusive lock on
			# $out/conformance.build (given to the background job, closed
			# here) and writes its outcome to conformance.build.result;
			# those scenarios wait on the lock before they take a place.
			confdir=${CONFORMANCE_BIN:-$PWD/bin/conformance}
			prepared UNBOUNDED_TEST_CONFORMANCE "$confdir"
			prepared UNBOUNDED_TEST_CONFORMANCE_BUILD "$out/conformance.build"
			rm -f "$out/conformance.build.result"
			exec 7>"$out/conformance.build"
			flock 7
			(
				exec 9>&-
				if conformance=$(tests/conformance/build.sh 2>"$out/conformance.log" | tail -1) && [ "$conformance" = "$confdir" ] && [ -x "$conformance/e2e.test" ]; then
					echo ok >"$out/conformance.build.result"
				else
					{ echo "tests/conformance/build.sh failed (the conformance tests will $verb):"; tail -20 "$out/conformance.log"; } >"$out/conformance.build.result"
				fi
			) >/dev/null 2>&1 &
			exec 7>&-
			echo "conformance: building into $confdir beside the system tier (log $out/conformance.log)"
		fi
	fi
}

# The lock is held by prepare's background shell alone (the parent closes
# its copy of the descriptor), so it is released when prepare ends, how
# ever it ends: await_prepared's shared lock waits for exactly that.
: >"$out/prep.env"
# kbuild.lock is held while the test API server is built (below, before
# the tiers start), prep.lock by prepare's background shell alone.
exec 8>"$out/kbuild.lock"
flock 8
exec 9>"$out/prep.lock"
flock 9
(exec 8>&- && prepare >"$out/prep.log" 2>&1) &
prep_pid=$!
exec 9>&-

await_prepared() {
	flock -s "$out/prep.lock" true
	if mkdir "$out/prep.shown" 2>/dev/null; then
		log "the packages and the system tier's inputs (made beside the tiers above)"
		cat "$out/prep.log"
	fi
	# shellcheck disable=SC1091
	. "$out/prep.env"
}

# The project's CRDs and RBAC, installed into the test API server.
if bin/unbounded manifests >"$out/manifests.yaml" 2>"$out/manifests.err" && [ -s "$out/manifests.yaml" ]; then
	export UNBOUNDED_TEST_MANIFESTS="$out/manifests.yaml"
else
	echo "unbounded manifests failed: $(head -3 "$out/manifests.err")"
fi

# run_tests NAME TIMEOUT [-test.FLAG ...] -- PATTERN...: the tier NAME's
# tests, as `go test -count=1 -json -timeout TIMEOUT` runs them (JSON to
# $out/NAME.json, the exit status to $out/status), with their test
# binaries kept between runs in $testbin: `go test -c -o` leaves a binary
# whose build ID is current alone, so a run whose packages (and their
# dependencies) did not change since the last run links none of them (the
# linker was the run's largest command, 152 CPU-s of a warm run's 1,900:
# every test binary linked again by every run). The binaries are built
# first (one go command per set of distinct package names: -o DIR names
# each NAME.test), then run two at a time in the order given (as go test
# -p 2 does), each in its package's directory through test2json, as go
# test runs them. A package that does not build is a failed package, its
# errors its output. go test's own vet checks are not run here: the
# static tier runs go vet whole.
run_tests() {
	local tier=$1 timeout=$2 p name dir i
	shift 2
	local flags=()
	while [ $# -gt 0 ] && [ "$1" != -- ]; do flags+=("$1"); shift; done
	shift
	local list
	list=$(go list -f '{{if or .TestGoFiles .XTestGoFiles}}{{.ImportPath}} {{.Dir}}{{end}}' "$@" 2>>"$out/$tier.err")
	# go test -c -o DIR/ names a package's binary after the last element
	# of its import path (a main package's too): a package whose name an
	# earlier one took goes to the next directory.
	local -A seen=()
	local -a batch=()
	: >"$out/$tier.list"
	while read -r p dir; do
		[ -n "$p" ] || continue
		name=${p##*/}
		i=0
		while [ -n "${seen[$i/$name]:-}" ]; do i=$((i + 1)); done
		seen[$i/$name]=1
		batch[i]="${batch[i]:-} $p"
		echo "$p $dir $testbin/$tier/$i/$name.test" >>"$out/$tier.list"
	done <<<"$list"
	mkdir -p "$out/$tier.d"
	for i in "${!batch[@]}"; do
		mkdir -p "$testbin/$tier/$i"
		# shellcheck disable=SC2086
		go test -c -o "$testbin/$tier/$i/" ${batch[i]} >"$out/$tier.build" 2>&1 && continue
		# Which of them did not build: each alone, its errors kept.
		for p in ${batch[i]}; do
			bin=$(awk -v p="$p" '$1 == p {print $3}' "$out/$tier.list")
			go test -c -o "$bin" "$p" >"$out/$tier.build" 2>&1 ||
				cp "$out/$tier.build" "$out/$tier.d/$(echo "$p" | tr / _).build-failed"
		done
	done
	local t2j rc
	t2j=$(go tool -n test2json) || { echo "$tier 1" >>"$out/status"; return; }
	i=0
	while read -r p dir bin; do
		i=$((i + 1))
		printf '%s\0' "$(printf '%04d' $i)" "$p" "$dir" "$bin"
	done <"$out/$tier.list" |
		RT_TIER=$tier RT_TIMEOUT=$timeout RT_FLAGS="${flags[*]}" xargs -0 -n 4 -P 2 bash -c '
			tier=$RT_TIER timeout=$RT_TIMEOUT flags=$RT_FLAGS
			unset RT_TIER RT_TIMEOUT RT_FLAGS
			j=$out/$tier.d/$1.json
			failed=$out/$tier.d/$(echo "$2" | tr / _).build-failed
			if [ -e "$failed" ]; then
				{ cat "$failed"; echo FAIL; } | "$0" -p "$2" >"$j"
				exit 1
			fi
			# shellcheck disable=SC2086
			cd "$3" && exec "$0" -t -p "$2" "$4" -test.v=test2json -test.count=1 -test.paniconexit0 -test.timeout="$timeout" $flags >"$j" 2>&1
		' "$t2j"
	rc=$?
	cat "$out/$tier.d"/*.json >"$out/$tier.json" 2>/dev/null
	echo "$tier $rc" >>"$out/status"
}

# Every tier runs with one real API server up (started once per run).
# Each go test's exit status goes to $out/status ("TIER STATUS" lines):
# the summary must agree with it. inner itself exits 0 once every tier has
# run, so a non-zero status from with-env.sh is with-env.sh's own failure.
# The system tier (tier 5): a few scenarios beside the first tiers (inner),
# all its places after them. Started with all its places beside them (the
# unit tier leaves one of the two cores idle half of its time), it ran
# with the VM's load at 16-20 for ten minutes: the run was 1.4 minutes
# shorter, and two scenarios failed on timing that load alone explains (a
# kubelet killed before its graceful shutdown's pod status reached the API
# server; a test that lost its race with a unit's RestartSec). Its
# scenarios keep the two cores busy by themselves.
system_tier() {
	# Every booted test host and node machine runs its own systemd, which
	# takes inotify instances from the one per-user pool of the VM
	# (fs.inotify.max_user_instances, 128 on Debian): with a few first
	# boots at once, a node's containerd once started without its CRI
	# plugin ("failed to create fsnotify watcher: too many open files").
	# Raised (never lowered) for the run, as a host running several
	# nested machines needs.
	if [ "$(id -u)" = 0 ] && [ "$(cat /proc/sys/fs/inotify/max_user_instances 2>/dev/null || echo 0)" -lt 1024 ]; then
		echo "fs.inotify.max_user_instances: $(cat /proc/sys/fs/inotify/max_user_instances) -> 1024"
		sysctl -q -w fs.inotify.max_user_instances=1024 || echo "could not raise fs.inotify.max_user_instances"
	fi
	# Five scenarios at a time on two cores (tests/system/schedule_test.go
	# says why; UNBOUNDED_TEST_SYSTEM_PARALLEL). go test lets every scenario go at
	# once (-parallel above their number) and each waits for a place,
	# the longest expected first (tests/system/schedule_test.go), so that
	# the tier does not end on a long scenario started last. The tier
	# took 23 minutes in a cold CI run before the container mode's crash
	# chains, isolation changes and conformance node joined it (about 3
	# more): its bound leaves room for a slower machine, inside CI's 90.
	run_tests system 45m -test.parallel=64 -- ./tests/system/...
}

# The unit tier (with the kube tier inside it) leaves one of the two cores
# idle about half of its time (148 s of CPU in 181 s, D2): the lint,
# static, fuzz and packages tiers run beside it, one after another (the
# packages tier once prepare has made them), and the system tier after
# both, alone (above).
others() {
	log "tier 2 (unit lint)"
	run_tests lint 10m -- ./units/...
	log "static analysis (gofmt, go vet, staticcheck, govulncheck: tests/lint)"
	run_tests static 20m -- ./tests/lint/...
	log "tier 7 (fuzzing, -fuzztime $FUZZTIME per target)"
	: >"$out/fuzz.json"
	local f pkg name
	while IFS=: read -r f name; do
		pkg=./$(dirname "$f")
		name=${name#func }; name=${name%%(*}
		go test -json -run '^$' -fuzz "^${name}\$" -fuzztime "$FUZZTIME" "$pkg" >>"$out/fuzz.json" 2>>"$out/fuzz.err"
		echo "fuzz:$name $?" >>"$out/status"
	done < <(grep -rHo --include='*_test.go' '^func Fuzz[A-Za-z0-9_]*(' lib cmd generators 2>/dev/null | sort -u)
	await_prepared
	log "tier 3 (packages)"
	run_tests packages 10m -- ./tests/packages/...
	log "lint, static, packages and fuzzing done"
}

inner() {
	local pkgs all p first
	all=$(go list ./... | grep -v -e '/tests/system' -e '/tests/packages' -e '/tests/lint' -e '/units$')
	# go test runs two packages at a time, in the order given. The ones
	# whose tests wait longest on the API server's timers (a Node's grace
	# period, leases, watches) go first: in alphabetical order
	# tests/kubeenv (53 s) started last and held the tier's last 46 s
	# alone (K1, 31a0f3e). The rest follow in go list's order.
	first="tests/kubeenv lib/kube lib/daemon lib/controller lib/bootstrap lib/repave"
	pkgs=$(
		for p in $first; do grep -x "unbounded-cloud.io/agent/$p" <<<"$all"; done
		grep -v -x -F -f <(printf 'unbounded-cloud.io/agent/%s\n' $first) <<<"$all"
	)
	flock -s "$out/precompile.lock" true
	log "tier 1 (unit) and tier 4 (kubernetes), beside the next four"
	# shellcheck disable=SC2086
	run_tests unit 15m -- $pkgs &
	local unit=$!
	# The system tier starts as soon as its inputs are made, with
	# $SYSTEM_EARLY places (tests/system/schedule_test.go's places file)
	# while the first tiers run, and all its places once they end: its
	# longest scenarios (first to get a place) spend most of their time
	# waiting on the product's timers and the cluster, and the first
	# tiers leave part of the two cores idle.
	echo "$SYSTEM_EARLY" >"$out/system.places"
	export UNBOUNDED_TEST_SYSTEM_PLACES_FILE="$out/system.places"
	(
		await_prepared
		log "tier 5 (system: real systemd in nspawn), $SYSTEM_EARLY at a time until the first tiers end"
		system_tier
	) &
	local system=$!
	others
	wait "$unit"
	rm -f "$out/system.places"
	log "unit, lint, static, packages and fuzzing done: the system tier takes all its places"
	wait "$system"
	# The conformance build (prepare started it beside the system tier)
	# has ended by now unless the tier ended without its scenarios: the
	# run does not leave it behind.
	if [ -e "$out/conformance.build" ]; then
		flock "$out/conformance.build" true
		grep -h "built in" "$out/conformance.log" 2>/dev/null
	fi
	log "all tiers done"
	return 0
}
export -f inner others system_tier log elapsed await_prepared run_tests
testbin=${testbin:-$out/testbin}
export out FUZZTIME start SYSTEM_EARLY testbin
: >"$out/status"
if [ -x tests/kube/with-env.sh ]; then
	log "building the test API server (tests/kube)"
	# A failure is reported by with-env.sh's next run, below (once).
	tests/kube/with-env.sh --build 2>"$out/kbuild.log" && cat "$out/kbuild.log"
	exec 8>&-
	# Every package the tiers compile, compiled by one go command while
	# the API server starts (go vet compiles what every package and its
	# tests import, and checks them: the static tier's TestGoVet then
	# finds its result cached). Cold, the unit tier's go test and the
	# static tier's go vet, started together, compiled the same packages
	# at once; warm this takes 3 s, inside the API server's start.
	exec 7>"$out/precompile.lock"
	flock 7
	(go vet -tags demo ./... >"$out/precompile.log" 2>&1) &
	exec 7>&-
	log "starting the test API server (tests/kube)"
	tests/kube/with-env.sh bash -c inner
	envrc=$?
	wait "$prep_pid"
else
	exec 8>&-
	UNBOUNDED_TEST_KUBE_SKIP="tests/kube/with-env.sh is missing" bash -c inner
	envrc=$?
	wait "$prep_pid"
fi

for f in "$out"/*.err; do
	[ -s "$f" ] && { echo "--- $(basename "$f")"; tail -40 "$f"; }
done
rc=0
if [ "$envrc" -ne 0 ]; then
	# 3: the kube tier is required and the API server could not be built
	# or started (its log is above); 130/143: interrupted. The tiers did
	# not run (or not all of them): there is nothing to summarize.
	echo "tests/kube/with-env.sh exited $envrc: the test tiers did not run (completed: $(cut -d' ' -f1 "$out/status" | tr '\n' ' '))"
	exit 1
fi
go run ./tests/tiersum unit="$out/unit.json" lint="$out/lint.json" static="$out/static.json" packages="$out/packages.json" \
	system="$out/system.json" fuzz="$out/fuzz.json" || rc=1
bad=$(awk '$2 != 0' "$out/status")
if [ -n "$bad" ]; then
	echo "go test exited non-zero (tier status): $(echo $bad)"
	rc=1
fi
[ -e "$out/packages.failed" ] && { echo "make packages failed"; rc=1; }
exit $rc
