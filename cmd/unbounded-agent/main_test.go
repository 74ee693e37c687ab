package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestHelpExitsZeroAndListsEveryConcern(t *testing.T) {
	for _, arg := range []string{"--help", "-h", "help"} {
		var out, errb bytes.Buffer
		if code := run([]string{"/usr/libexec/unbounded/unbounded-agent", arg}, &out, &errb); code != 0 {
			t.Errorf("%s: exit %d, stderr %q", arg, code, errb.String())
		}
		for _, want := range []string{"Usage: unbounded-agent CONCERN", "\n  daemon ", "\n  fence "} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("%s: stdout lacks %q:\n%s", arg, want, out.String())
			}
		}
		for name := range concerns {
			if !strings.Contains(out.String(), "\n  "+name+" ") {
				t.Errorf("%s: concern %s not listed:\n%s", arg, name, out.String())
			}
		}
	}
}

func TestVersionAndUsageErrors(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"unbounded-agent", "--version"}, &out, &errb); code != 0 || !strings.HasPrefix(out.String(), "unbounded-agent ") {
		t.Errorf("--version: exit %d, %q", code, out.String())
	}
	for _, argv := range [][]string{{"unbounded-agent"}, {"unbounded-agent", "frobnicate"}} {
		out.Reset()
		errb.Reset()
		if code := run(argv, &out, &errb); code != usageExit || out.Len() != 0 || !strings.Contains(errb.String(), "Concerns:") {
			t.Errorf("%q: exit %d, stdout %q, stderr %q", argv, code, out.String(), errb.String())
		}
	}
	if !strings.Contains(errb.String(), `unknown concern "frobnicate"`) {
		t.Errorf("unknown concern not named: %q", errb.String())
	}
}

// A concern's own --help is reached through both spellings and exits 0.
func TestConcernHelpThroughBothSpellings(t *testing.T) {
	for _, argv := range [][]string{{"/usr/libexec/unbounded/fence", "--help"}, {"unbounded-agent", "fence", "--help"}} {
		if code := run(argv, &bytes.Buffer{}, &bytes.Buffer{}); code != 0 {
			t.Errorf("%q: exit %d", argv, code)
		}
	}
}
