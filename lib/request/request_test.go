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

// hostRoot is a host root (/var/lib/unbounded) in place, as bootstrap
// creates it.
func hostRoot(t *testing.T) hostpaths.Paths {
	t.Helper()
	p := hostpaths.New(t.TempDir())
	if err := os.MkdirAll(p.HostRoot(), 0o700); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestWrittenRequestReadsBackAtTheConcernsPath(t *testing.T) {
	p := hostRoot(t)
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

// The host root is bootstrap's to create, with its mode: on a host
// without it the write fails and creates nothing.
func TestWriteWithoutTheHostRootFailsAndCreatesNothing(t *testing.T) {
	p := hostpaths.New(t.TempDir())
	err := Write(p, "repave", &Request{UID: "u-1", Type: "Repave", Machine: "m1"})
	if err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Write without %s = %v, want a not-exist error", p.HostRoot(), err)
	}
	if _, err := os.Lstat(p.HostRoot()); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Write created %s (%v); it is bootstrap's", p.HostRoot(), err)
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

// A request is carried out once a run marks it so, never before: the
// mark names the request's UID, and a newer request is not taken.
func TestARequestIsTakenOnlyOnceMarkedCarriedOut(t *testing.T) {
	p := hostRoot(t)
	if err := Write(p, "repave", &Request{UID: "u1"}); err != nil {
		t.Fatal(err)
	}
	if Taken(p, "repave", "u1") {
		t.Fatal("taken before any run marked it")
	}
	if err := MarkTaken(p, "repave", "u1"); err != nil {
		t.Fatal(err)
	}
	if !Taken(p, "repave", "u1") {
		t.Fatal("not taken after MarkTaken")
	}
	if Taken(p, "repave", "u2") || Taken(p, "restart", "u1") {
		t.Fatal("a mark of u1 for repave taken as another request's or concern's")
	}
}
