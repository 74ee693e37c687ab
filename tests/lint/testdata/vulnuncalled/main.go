// Command vulnuncalled requires the same old golang.org/x/text as
// vulncalled but calls none of its vulnerable functions: govulncheck
// reports the module's vulnerabilities as not called, and the static tier
// prints them and passes.
package main

import (
	"fmt"

	"golang.org/x/text/width"
)

func main() {
	fmt.Println(width.Narrow.String("ｗｉｄｅ"))
}
