// Command kubectl-unbounded is the operator's workstation side of the
// agent, a kubectl plugin (`kubectl unbounded ...`, or run on its own):
// join a host, see the fleet, roll an operation across it. See
// lib/kubectlplugin.
package main

import (
	"os"

	"unbounded-cloud.io/agent/lib/kubectlplugin"
)

func main() { os.Exit(kubectlplugin.Main(os.Args[1:])) }
