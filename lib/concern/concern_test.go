package concern

import (
	"bytes"
	"strings"
	"testing"

	"unbounded-cloud.io/agent/lib/exitcode"
)

type flags struct {
	Root string `default:"/"`
}

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		args     []string
		code     int
		done     bool
		root     string
		inStderr string
	}{
		{args: nil, done: false, root: "/"},
		{args: []string{"--root", "/tmp/r"}, done: false, root: "/tmp/r"},
		{args: []string{"--help"}, done: true, code: 0},
		{args: []string{"--bogus"}, done: true, code: exitcode.Failed, inStderr: "probe: unknown flag --bogus"},
	} {
		var f flags
		var out, errb bytes.Buffer
		code, done := Parse("probe", "a probe", &f, tc.args, &out, &errb)
		if done != tc.done || (done && code != tc.code) {
			t.Errorf("%v: (%d, %v), want (%d, %v)", tc.args, code, done, tc.code, tc.done)
		}
		if !done && f.Root != tc.root {
			t.Errorf("%v: root %q, want %q", tc.args, f.Root, tc.root)
		}
		if tc.inStderr != "" && !strings.Contains(errb.String(), tc.inStderr) {
			t.Errorf("%v: stderr %q lacks %q", tc.args, errb.String(), tc.inStderr)
		}
	}
}
