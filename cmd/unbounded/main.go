// Command unbounded is the operator CLI of unbounded-agent: status, config
// check, supports-isolation, manifests, version. See lib/cli.
package main

import (
	"os"

	"unbounded-cloud.io/agent/lib/cli"
)

func main() { os.Exit(cli.Main(os.Args[1:], cli.Env{})) }
