// Command floorunpack is the floor of a first boot's slot in mode nspawn,
// run inside the bench's test host (tests/demo): the node image pulled
// from the same reference the host's agent.toml names, over the same
// network path, and unpacked by lib/modes/bluegreen/tree.Unpack (what the mode
// runs) into DIR on the host's own file system, with nothing else of the
// product. It prints "FILES BYTES SECONDS".
//
//	floorunpack REF DIR
package main

import (
	"fmt"
	"os"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"unbounded-cloud.io/agent/lib/modes/bluegreen/tree"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: floorunpack REF DIR")
		os.Exit(2)
	}
	begin := time.Now()
	ref, err := name.ParseReference(os.Args[1])
	if err != nil {
		fail(err)
	}
	img, err := remote.Image(ref)
	if err != nil {
		fail(err)
	}
	st, err := tree.Unpack(img, os.Args[2])
	if err != nil {
		fail(err)
	}
	fmt.Printf("%d %d %.3f\n", st.Files, st.Bytes, time.Since(begin).Seconds())
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "floorunpack:", err)
	os.Exit(1)
}
