# unbounded-agent build. `make` builds every binary into bin/, `make test`
# runs every test tier this machine supports and prints which ran and which
# skipped (and why), `make packages` builds the .deb and .rpm into dist/.
SHELL := /bin/bash
# The Go toolchain every build and test uses: go1.27.3 carries the standard
# library fixes (net/http, crypto/tls, crypto/x509) that go1.26.8 lacks, and
# the go command fetches it from the module proxy as golang.org/toolchain.
# A machine's own go (GOTOOLCHAIN=local in its go.env) ignores the toolchain
# line of go.mod, so every entry point sets this: Makefile, .ci/run,
# tests/run-tiers.sh, tests/bench.sh, tests/demo/demo.sh, tests/kube/with-env.sh, tests/kube/kubelet.sh,
# deb/build-packages.sh (tests/lint checks that they agree).
export GOTOOLCHAIN := go1.27.3
GO ?= go
# A Debian- and RPM-valid version: 0.1.0 for tagged builds, a pre-release
# with the commit count and hash otherwise (nfpm maps it to 0.1.0~dev... for
# dpkg, so a later tag sorts higher).
BASE_VERSION := 0.1.0
VERSION ?= $(shell if git describe --exact-match --tags >/dev/null 2>&1; then git describe --tags | sed 's/^v//'; else echo "$(BASE_VERSION)-dev.$$(git rev-list --count HEAD 2>/dev/null || echo 0).g$$(git rev-parse --short=8 HEAD 2>/dev/null || echo unknown)"; fi)
PKG_ARCH ?= amd64
LDFLAGS := -s -w -X unbounded-cloud.io/agent/lib/version.Version=$(VERSION)
# One build configuration for every build and test, exported to all that
# make runs, and set alike by every script that builds (tests/lint checks
# that they agree): CGO_ENABLED=0 (static binaries: hosts, nodes and
# images have no libc the binaries may rely on) and GOEXPERIMENT=nojsonv2
# (encoding/json's own implementation, not the one on encoding/json/v2
# that go1.27 builds by default: same behaviour, 0.4-0.5 MB less per
# binary; the hosts' 40 MiB budget, ARCHITECTURE section 3,
# tests/packages/size_test.go). Tests build as shipped, and so do
# Kubernetes' binaries that the tests build (tests/kube, tests/conformance):
# a package compiled once serves every build that links it. With three
# configurations (the Makefile's, go test's cgo default, the test scripts'
# CGO_ENABLED=0) a cold run compiled client-go and its dependencies three
# times.
export CGO_ENABLED := 0
export GOEXPERIMENT := nojsonv2
GOBUILD := $(GO) build -trimpath -ldflags '$(LDFLAGS)'

# Binaries: the operator CLI, the generator, the soft reboot and the health
# check are separate and small (no Kubernetes client; restart and health
# under 5 MB each); the one-shots that talk to the cluster share one
# multicall executable (ARCHITECTURE section 3, size budget).
BINARIES := bin/unbounded bin/unbounded-generator bin/unbounded-agent bin/unbounded-restart bin/unbounded-health
# The operator's workstation side, a kubectl plugin: never in the host
# packages, outside the hosts' size budget; `make packages` archives it.
WORKSTATION := bin/kubectl-unbounded
# The cluster side (controller-runtime): never in the host packages.
CLUSTER := bin/unbounded-controller

.PHONY: all build docs test bench demo packages images conformance clean FORCE
all: build
build: $(BINARIES) $(WORKSTATION) $(CLUSTER)

bin/kubectl-unbounded: FORCE
	$(GOBUILD) -o $@ ./cmd/kubectl-unbounded
bin/unbounded-controller: FORCE
	$(GOBUILD) -o $@ ./cmd/unbounded-controller

bin/unbounded: FORCE
	$(GOBUILD) -o $@ ./cmd/unbounded
bin/unbounded-generator: FORCE
	$(GOBUILD) -o $@ ./generators/unbounded-generator
bin/unbounded-agent: FORCE
	$(GOBUILD) -o $@ ./cmd/unbounded-agent
bin/unbounded-restart: FORCE
	$(GOBUILD) -o $@ ./cmd/restart
bin/unbounded-health: FORCE
	$(GOBUILD) -o $@ ./cmd/health

# Man pages and shell completion scripts, made from the CLI's own models
# (its kong command line, lib/config/reference.toml: lib/cli/man.go and
# completion.go) by `go run` for the build machine, so that a build for
# another PKG_ARCH makes them too; go-md2man (tools/go.mod) turns the
# markdown into roff, gzip -9n as Debian policy asks (no name, no time:
# reproducible). The packages install bin/doc/.
DOCS := bin/doc/unbounded.1.gz bin/doc/unbounded-agent.toml.5.gz \
	bin/doc/unbounded.bash bin/doc/_unbounded bin/doc/unbounded.fish
# The CLI built for this machine, whatever PKG_ARCH the packages are for.
DOCGEN := bin/doc/.unbounded-for-build
MD2MAN := $(GO) tool -modfile=tools/go.mod go-md2man
docs: $(DOCS)
$(DOCGEN): FORCE
	@mkdir -p $(@D)
	$(GO) build -trimpath -ldflags '-X unbounded-cloud.io/agent/lib/version.Version=$(VERSION)' -o $@ ./cmd/unbounded
bin/doc/%.gz: $(DOCGEN)
	set -o pipefail; $(DOCGEN) __man $* | $(MD2MAN) | gzip -9n >$@.tmp && mv $@.tmp $@
bin/doc/unbounded.bash: $(DOCGEN)
	$(DOCGEN) completion bash >$@.tmp && mv $@.tmp $@
bin/doc/_unbounded: $(DOCGEN)
	$(DOCGEN) completion zsh >$@.tmp && mv $@.tmp $@
bin/doc/unbounded.fish: $(DOCGEN)
	$(DOCGEN) completion fish >$@.tmp && mv $@.tmp $@

packages: build docs
	VERSION='$(VERSION)' PKG_ARCH='$(PKG_ARCH)' deb/build-packages.sh
	mkdir -p dist && rm -f dist/kubectl-unbounded_*.tar.gz
	tar -C bin --owner=0 --group=0 --numeric-owner -czf dist/kubectl-unbounded_$(VERSION)_linux_$(PKG_ARCH).tar.gz kubectl-unbounded

# The cluster side's OCI image (cmd/mkimage, lib/ociimage): the static
# bin/unbounded-controller on an empty base, user nonroot, the pinned CA
# bundle; reproducible (file times and the image's time are the last
# commit's, SOURCE_DATE_EPOCH as for the packages). Written to
# dist/unbounded-controller_VERSION_linux_ARCH.oci.tar, its digest beside it.
images: $(CLUSTER)
	$(GO) run -trimpath ./cmd/mkimage --binary $(CLUSTER) --version '$(VERSION)' --arch '$(PKG_ARCH)' --out dist

test: build
	VERSION='$(VERSION)' tests/run-tiers.sh

bench: build
	tests/bench.sh

# The demo (README, "This repository's two commands"): a host becomes a
# Ready node of a real control plane, on this machine (root, Debian 12),
# step by step with timings (tests/demo/demo.sh says what it installs,
# builds and runs).
demo:
	@tests/demo/demo.sh

# Upstream Kubernetes [NodeConformance] specs (e2e.test, built from the
# test control plane's module) on a node the agent's first boot makes, on
# this machine (root): passed, failed and skipped with reasons, in
# bin/conformance/report/report.md (tests/conformance/run.sh).
conformance: build
	@tests/conformance/run.sh

clean:
	rm -rf bin dist
