package main

import (
	"bytes"
	"os"
	"strings"
	"testing"

	"unbounded-cloud.io/agent/lib/bootstrap"
	"unbounded-cloud.io/agent/lib/isolation"
	"unbounded-cloud.io/agent/lib/repave"
	"unbounded-cloud.io/agent/lib/reset"
	"unbounded-cloud.io/agent/lib/steps"
	"unbounded-cloud.io/agent/lib/upgrade"
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

// The help of each concern that runs journaled steps lists them in order,
// from the one list the runner follows (lib/steps.Doc).
func TestConcernHelpListsItsStepsInOrder(t *testing.T) {
	for concern, docs := range map[string][]steps.Doc{
		"bootstrap": bootstrap.PhaseDocs, "repave": repave.StepDocs, "isolation": isolation.StepDocs,
		"reset": reset.StepDocs, "upgrade": upgrade.StepDocs,
	} {
		// A concern's main writes its help to the process's stdout.
		f, err := os.CreateTemp(t.TempDir(), "help")
		if err != nil {
			t.Fatal(err)
		}
		stdout := os.Stdout
		os.Stdout = f
		code := run([]string{"unbounded-agent", concern, "--help"}, &bytes.Buffer{}, &bytes.Buffer{})
		os.Stdout = stdout
		f.Close()
		out, _ := os.ReadFile(f.Name())
		if code != 0 {
			t.Fatalf("%s --help: exit %d", concern, code)
		}
		help := strings.Join(strings.Fields(string(out)), " ")
		last := -1
		for _, d := range docs {
			i := strings.Index(help, d.Name+": "+strings.Join(strings.Fields(d.Does), " "))
			if i < 0 || i < last {
				t.Errorf("%s --help: step %q missing or out of order (at %d after %d):\n%s", concern, d.Name, i, last, help)
			}
			last = i
		}
	}
}
