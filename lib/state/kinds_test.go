package state

import (
	"errors"
	"os"
	"strings"
	"testing"

	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/regfile/regfiletest"
)

// TestEveryStateFileThatIsNotARegularFileIsCorrupt puts each kind of
// non-regular file (a FIFO would block a plain read forever, /dev/zero
// would never end) where each state file belongs, and checks that the
// reader returns ErrCorrupt naming the file and the kind: the generator
// turns that into its safe state, one-shots into recovery.
func TestEveryStateFileThatIsNotARegularFileIsCorrupt(t *testing.T) {
	for _, k := range regfiletest.Kinds {
		t.Run(k.String(), func(t *testing.T) {
			for _, tc := range []struct {
				name string
				file func(p hostpaths.Paths) string
				read func(p hostpaths.Paths) error
			}{
				{"applied config", func(p hostpaths.Paths) string { return p.AppliedConfig("kube1") },
					func(p hostpaths.Paths) error { _, err := ReadActive(p); return err }},
				{"sidecar", func(p hostpaths.Paths) string { return hostpaths.Checksum(p.AppliedConfig("kube1")) },
					func(p hostpaths.Paths) error { _, err := ReadActive(p); return err }},
				{"in-place journal", func(p hostpaths.Paths) string { return p.Journal("isolation") },
					func(p hostpaths.Paths) error { _, err := ReadActive(p); return err }},
				{"ownership record", func(p hostpaths.Paths) string { return p.Ownership() },
					func(p hostpaths.Paths) error {
						o, err := ReadOwnership(p)
						if o == nil || o.Owner != "unknown" {
							t.Errorf("ownership %+v: an unreadable record must still mean owned", o)
						}
						return err
					}},
			} {
				p := hostpaths.New(t.TempDir())
				// Two records, so that the journal is read too.
				WriteApplied(p, rec("kube1", "nspawn"))
				WriteApplied(p, rec("kube2", "none"))
				file := tc.file(p)
				regfiletest.Make(t, file, k)
				err := tc.read(p)
				if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), file) || !strings.Contains(err.Error(), k.Describes()) {
					t.Errorf("%s: %v, want ErrCorrupt naming %s and saying it %s", tc.name, err, file, k.Describes())
				}
			}
		})
	}
}

func TestStateFilesOverTheirLimitAreCorrupt(t *testing.T) {
	p := hostpaths.New(t.TempDir())
	WriteApplied(p, rec("kube1", "nspawn"))
	regfiletest.Sparse(t, hostpaths.Checksum(p.AppliedConfig("kube1")), maxSidecarSize+1)
	if _, err := ReadApplied(p, "kube1"); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "more than the limit") {
		t.Errorf("oversized sidecar: %v", err)
	}
	regfiletest.Sparse(t, p.AppliedConfig("kube2"), MaxRecordSize+1)
	if _, err := ReadApplied(p, "kube2"); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "kube2-applied-config.json") {
		t.Errorf("oversized record: %v", err)
	}
	regfiletest.Sparse(t, p.Ownership(), maxOwnershipSize+1)
	if o, err := ReadOwnership(p); o == nil || !errors.Is(err, ErrCorrupt) {
		t.Errorf("oversized ownership record: %+v, %v", o, err)
	}
}

// TestWriteAppliedRefusesARecordNoReaderAccepts: written, it would read
// as corrupt at the next boot and pull in recovery for nothing.
func TestWriteAppliedRefusesARecordNoReaderAccepts(t *testing.T) {
	p := hostpaths.New(t.TempDir())
	a := rec("kube1", "nspawn")
	a.Config = []byte(`"` + strings.Repeat("x", MaxRecordSize) + `"`)
	if err := WriteApplied(p, a); err == nil || !strings.Contains(err.Error(), "more than") {
		t.Fatalf("WriteApplied of a record over the limit: %v", err)
	}
	if _, err := os.Stat(p.AppliedConfig("kube1")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused record was written: %v", err)
	}
}

// TestASymlinkToARegularRecordIsRead keeps the host-root migration
// working: it links the legacy agent's state into the host root.
func TestASymlinkToARegularRecordIsRead(t *testing.T) {
	p := hostpaths.New(t.TempDir())
	legacy := hostpaths.New(t.TempDir())
	if err := WriteApplied(legacy, rec("kube1", "container")); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(p.HostRoot(), 0o755)
	for _, f := range []string{p.AppliedConfig("kube1"), hostpaths.Checksum(p.AppliedConfig("kube1"))} {
		if err := os.Symlink(legacy.Join(p.Rel(f)), f); err != nil {
			t.Fatal(err)
		}
	}
	a, err := ReadActive(p)
	if err != nil || a == nil || a.Mode != "container" {
		t.Fatalf("active %+v, %v", a, err)
	}
}
