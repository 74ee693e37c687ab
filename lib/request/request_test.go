package request

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/state"
)

// runRoot is a host root with /run/unbounded in place, as
// systemd-tmpfiles creates it at boot.
func runRoot(t *testing.T) hostpaths.Paths {
	t.Helper()
	p := hostpaths.New(t.TempDir())
	if err := os.MkdirAll(p.RunDir(), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestWrittenRequestReadsBackAtTheConcernsPath(t *testing.T) {
	p := runRoot(t)
	in := &Request{Operation: "op-1", UID: "u-1", Type: "Repave", Machine: "m1", Unit: "unbounded-repave.service",
		RequestedAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), PreviousInvocation: "abc",
		Parameters: map[string]string{"k": "v"}, Desired: []byte(`{"isolation":{"mode":"nspawn"}}`)}
	if err := Write(p, "repave", in); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(p.Request("repave"))
	if err != nil || fi.Mode().Perm() != 0o644 {
		t.Fatalf("request file %s: %v, mode %v; want 0644", p.Request("repave"), err, fi.Mode())
	}
	out, err := Read(p, "repave")
	if err != nil {
		t.Fatal(err)
	}
	if out.UID != in.UID || out.Operation != in.Operation || !out.RequestedAt.Equal(in.RequestedAt) ||
		out.Parameters["k"] != "v" || compact(t, out.Desired) != string(in.Desired) || out.PreviousInvocation != "abc" {
		t.Fatalf("read %+v, wrote %+v", out, in)
	}
}

// compact undoes the file's indentation of the embedded JSON.
func compact(t *testing.T, b []byte) string {
	var buf bytes.Buffer
	if err := json.Compact(&buf, b); err != nil {
		t.Fatal(err)
	}
	return buf.String()
}

// /run/unbounded is the tmpfiles.d entry's to create, with its declared
// mode: on a host without it the write fails, says where it comes from, and
// creates nothing.
func TestWriteWithoutRunDirFailsAndCreatesNothing(t *testing.T) {
	p := hostpaths.New(t.TempDir())
	err := Write(p, "repave", &Request{UID: "u-1", Type: "Repave", Machine: "m1"})
	if err == nil || !strings.Contains(err.Error(), state.TmpfilesConfHost) || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Write without %s = %v, want a not-exist error naming %s", p.RunDir(), err, state.TmpfilesConfHost)
	}
	if _, err := os.Lstat(p.RunDir()); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Write created %s (%v); its mode and owner are the tmpfiles.d entry's", p.RunDir(), err)
	}
}

func TestMissingRequestIsNotExist(t *testing.T) {
	_, err := Read(hostpaths.New(t.TempDir()), "restart")
	if !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Read = %v, want os.ErrNotExist", err)
	}
}

func TestBadRequestFilesAreCorruptAndNameTheFile(t *testing.T) {
	for name, content := range map[string]string{
		"not json":      "{",
		"no uid":        `{"type":"Repave"}`,
		"unknown field": `{"uid":"u","color":"blue"}`,
	} {
		t.Run(name, func(t *testing.T) {
			p := hostpaths.New(t.TempDir())
			if err := state.WriteFileAtomic(p.Request("repave"), []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := Read(p, "repave")
			if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), p.Request("repave")) {
				t.Fatalf("Read = %v, want ErrCorrupt naming %s", err, p.Request("repave"))
			}
		})
	}
}
