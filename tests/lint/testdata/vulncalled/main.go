// Command vulncalled calls a known-vulnerable function of an old
// golang.org/x/text (GO-2022-1059, fixed in v0.3.8): govulncheck must report
// it as called and the static tier must fail on it.
package main

import (
	"fmt"
	"os"

	"golang.org/x/text/language"
)

func main() {
	tags, _, err := language.ParseAcceptLanguage(os.Getenv("ACCEPT_LANGUAGE"))
	fmt.Println(tags, err)
}
