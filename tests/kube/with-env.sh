#!/usr/bin/env bash
# with-env.sh CMD [ARGS...]: runs CMD with the Kubernetes test environment
# (tests/kube/cmd/kube-testenv: embedded etcd + in-process kube-apiserver on
# loopback) up, and stops it afterwards. Exits with CMD's exit status.
# Each run has an environment of its own (its own directory and ports), so
# several may run at once (tests/run-tiers.sh runs the system tier beside
# the others); they share the binary.
#
# with-env.sh --build: only builds the binary (exit 1 if that fails), so
# that environments started together do not build it at once.
#
# CMD sees:
#   UNBOUNDED_TEST_KUBECONFIG  admin kubeconfig (system:masters, token auth)
#   UNBOUNDED_TEST_KUBEDIR     directory with kubeconfig, ca.crt, ca.key, admin-token
#   UNBOUNDED_TEST_KUBE_BIN    the kube-testenv binary (for tests of the binary itself)
# or, when the environment cannot be built or started,
#   UNBOUNDED_TEST_KUBE_SKIP   the reason, so the Kubernetes tests skip with it.
#
# Input:
#   UNBOUNDED_TEST_MANIFESTS       optional file of manifests applied before READY
#   UNBOUNDED_TEST_KUBE_NO_SERVING_APPROVER=1
#                                  kubelet-serving CSRs are left to an approver CMD
#                                  runs (unbounded-controller: make demo)
#   UNBOUNDED_TEST_REQUIRED        comma-separated tiers that must run (tests/tiers);
#                                  with "kube" in it, fail (exit 3) without running
#                                  CMD instead of skipping when the environment
#                                  cannot be built or started
#   UNBOUNDED_TEST_KUBE_REQUIRED=1 the older spelling of "kube" in the above
#   KUBE_TESTENV_BIN               binary to build and run (default <repo>/bin/kube-testenv)
set -uo pipefail
# The patched Go toolchain of the Makefile (tests/lint checks they agree).
export GOTOOLCHAIN=go1.27.3
# The one build configuration of every build and test (the Makefile says
# why; tests/lint checks they agree).
export CGO_ENABLED=0
export GOEXPERIMENT=nojsonv2

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
bin=${KUBE_TESTENV_BIN:-$repo/bin/kube-testenv}
k8s_version=v1.36.3
ready_timeout=120

if [ $# -eq 0 ]; then
	echo "usage: $0 CMD [ARGS...]" >&2
	exit 2
fi

loud() {
	{
		echo "########################################################################"
		echo "# kube-testenv: $1"
		echo "########################################################################"
		[ -n "${2:-}" ] && printf '%s\n' "$2"
	} >&2
}

# kube_required: the kube tier must run (the same rule as tests/tiers).
kube_required() {
	[ "${UNBOUNDED_TEST_KUBE_REQUIRED:-}" = 1 ] && return 0
	# Spaces around the names are allowed, as tests/tiers allows them.
	case ",$(printf '%s' "${UNBOUNDED_TEST_REQUIRED:-}" | tr -d ' \t')," in
	*,kube,* | *,kubernetes,*) return 0 ;;
	esac
	return 1
}

# skip_run REASON CMD [ARGS...]: run CMD without the environment, telling
# the tests why.
skip_run() {
	local reason=$1
	shift
	if kube_required; then
		loud "$reason (the kube tier is required: not running the tests)"
		exit 3
	fi
	loud "$reason; Kubernetes tests will skip"
	unset UNBOUNDED_TEST_KUBECONFIG UNBOUNDED_TEST_KUBEDIR UNBOUNDED_TEST_KUBE_BIN
	export UNBOUNDED_TEST_KUBE_SKIP="$reason"
	"$@"
}

# Build. Always ask go: with a warm build cache it only relinks when a
# source changed, and it leaves an up-to-date binary alone.
# -buildvcs=false: VCS stamps would relink it at every commit.
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$k8s_version"
ldflags+=" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=36"
ldflags+=" -X k8s.io/component-base/version.gitTreeState=clean"
mkdir -p "$(dirname "$bin")"
[ -x "$bin" ] || echo "kube-testenv: building $bin (a cold build of Kubernetes takes minutes)" >&2
build_start=$(date +%s)
if ! build_out=$(cd "$here" && CGO_ENABLED=0 GOFLAGS=-buildvcs=false go build -trimpath -ldflags "$ldflags" -o "$bin" ./cmd/kube-testenv 2>&1); then
	reason="cannot build kube-testenv: $(printf '%s\n' "$build_out" | grep -v '^#' | head -1 | sed 's/^.*with-env.sh: line [0-9]*: //')"
	loud "BUILD FAILED" "$(printf '%s\n' "$build_out" | tail -40)"
	[ "$1" = --build ] && exit 1
	skip_run "$reason" "$@"
	exit $?
fi
build_secs=$(($(date +%s) - build_start))
[ "$build_secs" -gt 5 ] && echo "kube-testenv: built in ${build_secs}s" >&2
[ "$1" = --build ] && exit 0

dir=$(mktemp -d /tmp/kube-testenv.XXXXXX)
args=(--dir "$dir")
if [ -n "${UNBOUNDED_TEST_MANIFESTS:-}" ]; then
	args+=(--manifests "$UNBOUNDED_TEST_MANIFESTS")
fi
if [ "${UNBOUNDED_TEST_KUBE_NO_SERVING_APPROVER:-}" = 1 ]; then
	args+=(--no-serving-approver)
fi

# The environment's stdout is a FIFO read line by line: READY comes as one
# line, and nothing is left buffered in a file that a poll could miss.
fifo=$dir/stdout
mkfifo "$fifo"
"$bin" "${args[@]}" >"$fifo" 2>"$dir/stderr.log" &
env_pid=$!
exec 3<"$fifo"

# stop_env [quiet]: SIGTERM, then SIGKILL after 10 s; shows the log tail if
# the environment failed (unless quiet: the caller shows it).
stop_env() {
	if kill -0 "$env_pid" 2>/dev/null; then
		kill -TERM "$env_pid" 2>/dev/null
		for _ in $(seq 100); do
			kill -0 "$env_pid" 2>/dev/null || break
			sleep 0.1
		done
		if kill -0 "$env_pid" 2>/dev/null; then
			echo "kube-testenv: still running 10s after SIGTERM; killing it" >&2
			kill -KILL "$env_pid" 2>/dev/null
		fi
	fi
	wait "$env_pid" 2>/dev/null
	local rc=$?
	exec 3<&-
	if [ "$rc" -ne 0 ] && [ "$rc" -ne 143 ] && [ -z "${1:-}" ]; then
		echo "kube-testenv: exited with status $rc; last lines of its log:" >&2
		tail -20 "$dir/stderr.log" >&2
	fi
	rm -rf "$dir"
}

kubeconfig=
start_ms=$(($(date +%s%N) / 1000000))
trap 'stop_env; exit 130' INT
trap 'stop_env; exit 143' TERM
why=
while [ -z "$kubeconfig" ]; do
	IFS= read -r -t "$ready_timeout" -u 3 line
	rc=$?
	if [ "$rc" -gt 128 ]; then
		why="not ready within ${ready_timeout}s"
		break
	elif [ "$rc" -ne 0 ]; then
		# EOF: it closed its stdout, so it has exited (or is exiting).
		why="exited before it was ready"
		break
	fi
	case $line in
	"READY "*) kubeconfig=${line#READY } ;;
	esac
done
if [ -z "$kubeconfig" ]; then
	tail=$(tail -30 "$dir/stderr.log")
	stop_env quiet
	trap - INT TERM
	loud "the test API server $why" "$tail"
	skip_run "test API server $why (see the log above)" "$@"
	exit $?
fi
echo "kube-testenv: ready in $(($(date +%s%N) / 1000000 - start_ms)) ms: $kubeconfig" >&2
export UNBOUNDED_TEST_KUBECONFIG=$kubeconfig UNBOUNDED_TEST_KUBEDIR=$dir UNBOUNDED_TEST_KUBE_BIN=$bin
unset UNBOUNDED_TEST_KUBE_SKIP
"$@" 3<&- # the environment's stdout stays with this script
rc=$?
stop_env
exit "$rc"
