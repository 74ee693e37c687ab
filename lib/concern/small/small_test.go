package small

import (
	"io"
	"testing"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		done bool
		root string
	}{
		{args: nil, root: "/"},
		{args: []string{"-root", "/tmp/r", "-n", "3"}, root: "/tmp/r"},
		{args: []string{"--help"}, done: true, code: 0},
		{args: []string{"--bogus"}, done: true, code: 2},
		{args: []string{"-n", "x"}, done: true, code: 2},
	} {
		c := New("probe", "a probe")
		c.Flags.SetOutput(io.Discard)
		n := c.Flags.Int("n", 1, "a number")
		code, done := c.Parse(tc.args)
		if done != tc.done || (done && code != tc.code) {
			t.Errorf("%v: (%d, %v), want (%d, %v)", tc.args, code, done, tc.code, tc.done)
		}
		if !done && c.Paths().Root != tc.root {
			t.Errorf("%v: root %q, want %q", tc.args, c.Paths().Root, tc.root)
		}
		if !done && len(tc.args) > 2 && *n != 3 {
			t.Errorf("%v: -n %d, want 3", tc.args, *n)
		}
	}
}
