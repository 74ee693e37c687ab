// Command coredns is the node-local DNS cache of the node-stack tests: CoreDNS
// (github.com/coredns/coredns, the same server an operator's mirror serves
// from CoreDNS's releases) built from its Go module, as the kubelet is
// (tests/kube/kubelet.sh), with the plugins the agent's Corefile uses
// (lib/modes/nodestack), hosts, which the tests' own resolvers (the
// stand-in cluster DNS and the external upstream) answer from, and
// erratic, whose delayed answers stand for a resolver some way off in the
// benchmark (tests/bench.sh, part dns).
//
// A release build has every plugin; these are a subset of it, so a Corefile
// that runs here runs there. tests/system/nodestack/stage.sh builds it into
// the staged artifacts.
package main

import (
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/erratic"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/hosts"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
)

// The plugins run in a release build's order (core/dnsserver's
// Directives, which lists every plugin; the ones not linked are unused).
func main() { coremain.Run() }
