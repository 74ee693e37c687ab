package concern

import (
	"bytes"
	"log/slog"
	"testing"
)

type rootedFlags struct {
	Root
	Force bool
}

func TestStartParsesTheEmbeddedRoot(t *testing.T) {
	root := t.TempDir()
	var f rootedFlags
	var out, errb bytes.Buffer
	paths, code, done := Start("probe", "a probe", &f, []string{"--root", root, "--force"}, &out, &errb)
	if done {
		t.Fatalf("done with %d: %s", code, errb.String())
	}
	if paths.Root != root || !f.Force {
		t.Errorf("paths.Root %q, force %v; want %q, true", paths.Root, f.Force, root)
	}
	if _, code, done := Start("probe", "a probe", &f, []string{"--help"}, &out, &errb); !done || code != 0 {
		t.Errorf("--help: (%d, %v), want (0, true)", code, done)
	}
}

func TestLevel(t *testing.T) {
	for name, want := range map[string]slog.Level{"": slog.LevelInfo, "debug": slog.LevelDebug, "info": slog.LevelInfo, "warn": slog.LevelWarn, "error": slog.LevelError, "loud": slog.LevelInfo} {
		if got := Level(name); got != want {
			t.Errorf("Level(%q) = %v, want %v", name, got, want)
		}
	}
}
