#!/usr/bin/env bash
# `make demo`: on a Debian 12 machine, as root, from a clean clone: installs
# what it needs (.ci/deps.sh, the list CI installs), builds the packages
# and the test fixtures (cached Debian rootfs, node stack, kubelet, the
# test control plane), starts the control plane (tests/kube/with-env.sh)
# and runs tests/demo: a systemd host with the .deb installed and an
# agent.toml boots, unbounded-bootstrap.service turns it into a Ready
# Node, and a Deployment's pod runs on it. It prints each step with its
# time, and leaves nothing running, also on Ctrl-C or SIGTERM.
#
# Build output goes to a log directory (shown on a failure); the demo's
# own lines go to the terminal.
#
# Environment:
#   UNBOUNDED_DEMO_NO_APT=1  skip .ci/deps.sh (the packages are installed)
#   UNBOUNDED_DEMO_BENCH=F   tests/bench.sh: write the measurements to F
#                            ("NAME SECONDS" lines), reset the host, and
#                            measure the floor (tests/bench.sh says which)
#   UNBOUNDED_DEMO_MODE=M    the host's isolation mode: nspawn (default),
#                            container or none (tests/bench.sh says what
#                            each one's floor is)
#   UNBOUNDED_DEMO_LOCAL_DNS=false  the node without the node-local DNS
#                            cache (node.local-dns; tests/bench.sh compares
#                            first boots with BENCH_LOCAL_DNS=false)
#   UNBOUNDED_DEMO_ISOLATION=M  end with an isolation change into mode M
#                            (the other one): the Machine's spec is patched,
#                            the daemon moves the node in place
set -uo pipefail
# The patched Go toolchain of the Makefile (tests/lint checks they agree).
export GOTOOLCHAIN=go1.27.3
# The one build configuration of every build and test (the Makefile says
# why; tests/lint checks they agree).
export CGO_ENABLED=0
export GOEXPERIMENT=nojsonv2
export PATH=/usr/local/go/bin:$PATH
cd "$(dirname "$0")/../.."

start_ns=$(date +%s%N)
export UNBOUNDED_DEMO_START_NS=$start_ns
elapsed() { awk -v s="$start_ns" -v n="$(date +%s%N)" 'BEGIN { printf "%6.1f", (n - s) / 1e9 }'; }
say() { printf '[%ss] %s\n' "$(elapsed)" "$*"; }

if [ "$(id -u)" != 0 ]; then
	echo "make demo: needs root (systemd-nspawn, overlay mounts, cgroups): sudo make demo" >&2
	exit 1
fi
if ! command -v go >/dev/null; then
	echo "make demo: needs Go 1.21 or later on PATH (it fetches the Makefile's $GOTOOLCHAIN itself)" >&2
	exit 1
fi

log=$(mktemp -d /tmp/unbounded-demo.XXXXXX)
child=
stopping=
on_signal() {
	stopping=$1
	[ -n "$child" ] || exit 130
	# The demo binary (a child of with-env.sh) cleans up and exits; then
	# with-env.sh stops the API server. A build step just stops.
	local p
	for p in $(pgrep -P "$child" -x demo.test) "$child"; do
		kill -TERM "$p" 2>/dev/null
	done
}
trap 'on_signal SIGINT' INT
trap 'on_signal SIGTERM' TERM
finish() {
	local rc=$?
	if [ "$rc" -eq 130 ] && [ -n "$stopping" ]; then
		rm -rf "$log"
		say "make demo: stopped by $stopping after $(elapsed | tr -d ' ')s; everything it started is stopped and removed"
	elif [ "$rc" -eq 0 ]; then
		rm -rf "$log"
		say "make demo: done in $(elapsed | tr -d ' ')s in all; nothing left running"
	else
		say "make demo: FAILED (exit $rc) after $(elapsed | tr -d ' ')s; logs in $log"
	fi
}
trap finish EXIT

# wait_child: waits for $child, through the traps (a trapped signal ends
# `wait` early); returns its exit status.
wait_child() {
	local rc
	while :; do
		wait "$child"
		rc=$?
		kill -0 "$child" 2>/dev/null || break
	done
	child=
	return "$rc"
}

# step ID TITLE CMD...: runs CMD with its output in $log/ID.{out,err}, says
# every 20 s that it is still running, and how long it took; on a failure
# it shows the end of the output and exits. $out is CMD's last stdout line.
out=
step() {
	local id=$1 name=$2 t0 next=20 secs
	shift 2
	t0=$(date +%s)
	say "$name"
	"$@" >"$log/$id.out" 2>"$log/$id.err" &
	child=$!
	while kill -0 "$child" 2>/dev/null; do
		sleep 1
		secs=$(($(date +%s) - t0))
		if [ "$secs" -ge "$next" ]; then
			say "  ... still running (${secs}s; $(tail -c 300 "$log/$id.err" | tail -1 | cut -c1-80))"
			next=$((next + 20))
		fi
	done
	if ! wait_child; then
		[ -n "$stopping" ] && exit 130
		say "  FAILED:"
		tail -n 30 "$log/$id.err" "$log/$id.out" | sed 's/^/    /'
		exit 1
	fi
	[ -n "$stopping" ] && exit 130
	out=$(tail -1 "$log/$id.out")
	say "  done in $(($(date +%s) - t0))s"
}

echo "make demo: a Debian host with /etc/unbounded/agent.toml becomes a Kubernetes node"
echo
if [ "${UNBOUNDED_DEMO_NO_APT:-}" != 1 ]; then
	step deps "Debian packages (.ci/deps.sh)" .ci/deps.sh
fi
step go "go toolchain $GOTOOLCHAIN" go version
say "  $out"
step packages "build: binaries, man pages, the .deb and .rpm (make packages)" make -s packages
# The .deb this build made (the newest in dist/).
deb=$(ls -t dist/unbounded-agent_*.deb 2>/dev/null | head -1)
[ -n "$deb" ] || { say "no dist/unbounded-agent_*.deb after make packages"; exit 1; }
cp "$deb" "$log/" && export UNBOUNDED_TEST_DEB="$log/$(basename "$deb")"
say "  $(basename "$deb"): $(du -k "$deb" | cut -f1) kB"
step rootfs "Debian bookworm rootfs for the host (tests/system/rootfs.sh, cached)" tests/system/rootfs.sh
export UNBOUNDED_TEST_ROOTFS=$out
step kubelet "kubelet v1.36.3 from the control plane's module (tests/kube/kubelet.sh)" tests/kube/kubelet.sh
export UNBOUNDED_TEST_KUBELET=$out
step stage "node stack: containerd, runc, CNI plugins, pause (tests/system/nodestack/stage.sh, cached)" tests/system/nodestack/stage.sh
export UNBOUNDED_TEST_NODESTACK=$out
bin/unbounded manifests >"$log/manifests.yaml" && export UNBOUNDED_TEST_MANIFESTS=$log/manifests.yaml
step demo "the demo program (tests/demo)" go test -c -tags demo -o "$log/demo.test" ./tests/demo
if [ -n "${UNBOUNDED_DEMO_BENCH:-}" ]; then
	# The floor's image pull and unpack, run inside the host (demo_test.go).
	step floorunpack "bench: the floor's unpack (tests/demo/floorunpack)" env CGO_ENABLED=0 go build -trimpath -o "$log/floorunpack" ./tests/demo/floorunpack
	export UNBOUNDED_DEMO_FLOORUNPACK=$log/floorunpack
fi
say "starting the control plane (tests/kube/with-env.sh; the first build of kube-testenv takes minutes)"
# The demo's output goes to the terminal. Its fixtures' logs stay in the
# test binary unless it fails.
# The cluster's approver of the host's certificate requests is
# unbounded-controller (bin/unbounded-controller, which make packages
# built), which the demo starts beside the control plane; the test control
# plane's own approver of kubelet serving certificates is off.
UNBOUNDED_DEMO_CONTROLLER=$PWD/bin/unbounded-controller UNBOUNDED_TEST_KUBE_NO_SERVING_APPROVER=1 \
	tests/kube/with-env.sh "$log/demo.test" -test.run '^TestDemo$' -test.timeout 30m &
child=$!
wait_child
rc=$?
[ -n "$stopping" ] && exit 130
[ "$rc" -eq 0 ] || exit "$rc"
[ -n "${UNBOUNDED_DEMO_BENCH:-}" ] || exit 0

# tests/bench.sh: the floor's boot and kubelet by hand, from the node-stack
# test that starts the same containerd and kubelet in a systemd-nspawn
# machine without the product (tests/system/nodestack).
secs() { # a Go duration (1m2.5s, 850ms, 3.2s) in seconds
	awk -v d="$1" 'BEGIN { t = 0; while (match(d, /^[0-9.]+(h|ms|m|s)/)) { u = substr(d, RSTART, RLENGTH); d = substr(d, RLENGTH + 1)
		n = u + 0; if (u ~ /ms$/) t += n / 1000; else if (u ~ /h$/) t += n * 3600; else if (u ~ /m$/) t += n * 60; else t += n }
		printf "%.3f", t }'
}
step floorbin "bench: the floor's by-hand node (tests/system/nodestack)" go test -c -o "$log/nodestack.test" ./tests/system/nodestack
say "bench: the floor: containerd and kubelet started by hand in a systemd-nspawn machine"
tests/kube/with-env.sh "$log/nodestack.test" -test.run '^TestKubeletJoinsAndRunsADeploymentPodInAnNspawnMachine$' -test.v -test.timeout 20m >"$log/floor.log" 2>&1 &
child=$!
wait_child || { say "the floor's node-stack test FAILED:"; tail -n 40 "$log/floor.log"; exit 1; }
[ -n "$stopping" ] && exit 130
boot=$(sed -n 's/.*machine ubt-[0-9a-f]*: [a-z]* after \([0-9.hms]*\) .*/\1/p' "$log/floor.log" | tail -1)
ready=$(sed -n 's/.*Node Ready \([0-9.hms]*\) after systemctl start kubelet.*/\1/p' "$log/floor.log" | tail -1)
[ -n "$boot" ] && [ -n "$ready" ] || { say "no boot or Ready time in the floor's log"; tail -n 40 "$log/floor.log"; exit 1; }
printf 'floor.boot %s\nfloor.kubelet %s\n' "$(secs "$boot")" "$(secs "$ready")" >>"$UNBOUNDED_DEMO_BENCH"
say "floor: machine booted in $boot, kubelet to Node Ready in $ready"
