package cli

import (
	"bytes"
	"strconv"
	"strings"
	"testing"
)

// unbounded(1) documents every command, argument and flag of the model,
// and every exit code.
func TestManPageDocumentsEveryCommandFlagAndExitCode(t *testing.T) {
	var b bytes.Buffer
	if code := Main([]string{"__man", "unbounded.1"}, Env{Stdout: &b, Stderr: &b}); code != 0 {
		t.Fatalf("exit %d: %s", code, b.String())
	}
	page := b.String()
	if !strings.HasPrefix(page, "unbounded 1 ") || !strings.Contains(page, "# NAME\nunbounded - ") {
		t.Errorf("no title or NAME section:\n%s", page)
	}
	for _, c := range commands(Model())[1:] {
		if len(c.subs) > 0 {
			continue
		}
		if !strings.Contains(page, "**unbounded "+c.path+"**") {
			t.Errorf("command %q not documented", c.path)
		}
		for _, a := range c.args {
			if !strings.Contains(page, "*"+strings.ToUpper(a.Name)+"*") {
				t.Errorf("argument %s of %q not documented", a.Name, c.path)
			}
		}
		for _, f := range c.flags {
			if !strings.Contains(page, "**--"+f.Name+"**") {
				t.Errorf("flag --%s of %q not documented", f.Name, c.path)
			}
		}
	}
	for _, c := range ExitCodes {
		if !strings.Contains(page, "**"+strconv.Itoa(c.Code)+"**\n:   ") {
			t.Errorf("exit code %d not documented", c.Code)
		}
	}
	// The hidden command is for the build, not in the page or in --help.
	if strings.Contains(page, "__man") {
		t.Error("the page documents the hidden __man command")
	}
}
