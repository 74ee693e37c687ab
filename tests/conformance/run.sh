#!/usr/bin/env bash
# run.sh (`make conformance`): upstream Kubernetes node conformance of a
# node the agent makes, on this machine (root, Debian 12):
#
#   1. builds e2e.test, agnhost, nnp and the ginkgo CLI from this
#      directory's module (build.sh: the Kubernetes of the test control
#      plane, tests/kube), the packages, the system-test rootfs, the
#      kubelet and the node stack (the same fixtures as `make test`);
#   2. runs tests/system's TestConformance with every [NodeConformance]
#      spec (UNBOUNDED_TEST_CONFORMANCE_FOCUS=all, or the focus given):
#      a control plane of its own, a test host that becomes a Node through
#      the agent's first boot (mode nspawn or CONFORMANCE_MODES, offline: the e2e images are
#      built here from source and loaded under their upstream names), then
#      e2e.test through `ginkgo -p` (12 processes), skipping skips.yaml's
#      specs;
#   3. writes the report (passed, failed, skipped with reasons, time) to
#      $CONFORMANCE_REPORT (default <repo>/bin/conformance/report) and
#      prints its summary.
#
# Exit status: non-zero when a spec failed, a spec was skipped without an
# entry in skips.yaml, or something could not be built or started.
#
# Environment: CONFORMANCE_FOCUS ("all", "ci" or a Ginkgo regexp),
# CONFORMANCE_MODES (the isolation modes, each a node and a control plane
# of its own: default nspawn; "nspawn container" for both, each report
# in a directory named after its mode),
# CONFORMANCE_PROCS (parallel e2e processes, default 12), CONFORMANCE_SEED
# (Ginkgo's order), CONFORMANCE_REPORT.
set -euo pipefail
# The patched Go toolchain of the Makefile (tests/lint checks they agree).
export GOTOOLCHAIN=go1.27.3
# The one build configuration of every build and test (the Makefile says
# why; tests/lint checks they agree).
export CGO_ENABLED=0
export GOEXPERIMENT=nojsonv2

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cd "$repo"
if [ "$(id -u)" != 0 ]; then
	echo "conformance: must run as root (it boots systemd-nspawn machines)" >&2
	exit 2
fi
report=${CONFORMANCE_REPORT:-$repo/bin/conformance/report}
log() { printf '\n== %s (%s) ==\n' "$*" "$(date +%T)" >&2; }
start=$(date +%s)

log "building e2e.test and the test image binaries"
bin=$("$here/build.sh")
log "building packages and fixtures"
make -s packages >/dev/null
# The package this build made (the newest in dist/).
UNBOUNDED_TEST_DEB=$repo/$(ls -t dist/unbounded-agent_*.deb | head -1)
UNBOUNDED_TEST_ROOTFS=$(tests/system/rootfs.sh | tail -1)
UNBOUNDED_TEST_KUBELET=$(tests/kube/kubelet.sh | tail -1)
UNBOUNDED_TEST_NODESTACK=$(tests/system/nodestack/stage.sh | tail -1)
manifests=$(mktemp /tmp/conformance-manifests.XXXXXX.yaml)
trap 'rm -f "$manifests"' EXIT
bin/unbounded manifests >"$manifests"
export UNBOUNDED_TEST_DEB UNBOUNDED_TEST_ROOTFS UNBOUNDED_TEST_KUBELET UNBOUNDED_TEST_NODESTACK
export UNBOUNDED_TEST_MANIFESTS=$manifests
export UNBOUNDED_TEST_CONFORMANCE=$bin
export UNBOUNDED_TEST_CONFORMANCE_FOCUS=${CONFORMANCE_FOCUS:-all}
export UNBOUNDED_TEST_CONFORMANCE_MODES=${CONFORMANCE_MODES:-nspawn}
# Twelve processes on two cores: the specs wait (probes, back-offs,
# timeouts) far more than they compute; 190 minutes of specs ran in 28.
export UNBOUNDED_TEST_CONFORMANCE_PROCS=${CONFORMANCE_PROCS:-12}
# This seed hands the longest spec (Pods should cap back-off at
# MaxContainerBackOff, about 27 minutes) to a process first, so the run
# is about as long as that spec.
export UNBOUNDED_TEST_CONFORMANCE_SEED=${CONFORMANCE_SEED:-1796125234}
rm -rf "$report"
mkdir -p "$report"
export UNBOUNDED_TEST_CONFORMANCE_REPORT=$report
# The kube tier and the system tier must run: a missing fixture fails.
export UNBOUNDED_TEST_REQUIRED=kube,system
prep=$(($(date +%s) - start))

log "running [NodeConformance] specs (focus: $UNBOUNDED_TEST_CONFORMANCE_FOCUS, $UNBOUNDED_TEST_CONFORMANCE_PROCS processes)"
rc=0
tests/kube/with-env.sh go test -count=1 -v -timeout 180m -run '^(TestConformanceSkipListIsCurrent|TestConformance)$' ./tests/system/ \
	| tee "$report/go-test.log" | grep -E '^(=== RUN|--- |\s+conformance_test.go|ok|FAIL|PASS)' || rc=$?
[ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
for r in "$report"/report.md "$report"/*/report.md; do
	[ -f "$r" ] || continue
	log "report: $r"
	sed -n '1,/^## Skipped, with reasons/p' "$r" | sed '$d'
done
echo "conformance: preparation ${prep}s, total $(($(date +%s) - start))s, exit $rc" >&2
exit "$rc"
