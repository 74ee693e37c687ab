package state

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"unbounded-cloud.io/agent/lib/hostpaths"
)

func rec(slot, mode string) *AppliedConfig {
	return &AppliedConfig{Slot: slot, Mode: mode, KubernetesVersion: "1.36.3"}
}

func TestWriteFileAtomicSetsModeAndReplaces(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "sub", "secret")
	if err := WriteFileAtomic(f, []byte("one"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := WriteFileAtomic(f, []byte("two"), 0o600); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(f)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want 0600", st.Mode().Perm())
	}
	if b, _ := os.ReadFile(f); string(b) != "two" {
		t.Errorf("content %q", b)
	}
	ents, _ := os.ReadDir(filepath.Dir(f))
	if len(ents) != 1 {
		t.Errorf("temporary files left behind: %v", ents)
	}
}

func TestAppliedConfigRoundTrips(t *testing.T) {
	p := hostpaths.New(t.TempDir())
	if err := WriteApplied(p, rec("kube2", "nspawn")); err != nil {
		t.Fatal(err)
	}
	got, err := ReadApplied(p, "kube2")
	if err != nil {
		t.Fatal(err)
	}
	if got.Slot != "kube2" || got.Mode != "nspawn" || got.KubernetesVersion != "1.36.3" {
		t.Errorf("got %+v", got)
	}
	st, _ := os.Stat(p.AppliedConfig("kube2"))
	if st.Mode().Perm() != 0o600 {
		t.Errorf("applied config mode %v, want 0600", st.Mode().Perm())
	}
	if _, err := ReadApplied(p, "kube1"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("kube1: want not-exist, got %v", err)
	}
}

func TestAppliedConfigChecksumMismatchIsCorrupt(t *testing.T) {
	p := hostpaths.New(t.TempDir())
	if err := WriteApplied(p, rec("kube1", "none")); err != nil {
		t.Fatal(err)
	}
	f := p.AppliedConfig("kube1")
	b, _ := os.ReadFile(f)
	b[len(b)-3] ^= 1
	os.WriteFile(f, b, 0o600)
	if _, err := ReadApplied(p, "kube1"); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("want ErrCorrupt, got %v", err)
	}
}

func TestAppliedConfigMissingSidecarIsCorrupt(t *testing.T) {
	p := hostpaths.New(t.TempDir())
	if err := WriteApplied(p, rec("kube1", "none")); err != nil {
		t.Fatal(err)
	}
	os.Remove(hostpaths.Checksum(p.AppliedConfig("kube1")))
	if _, err := ReadApplied(p, "kube1"); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("want ErrCorrupt, got %v", err)
	}
	// And the other way round: a sidecar without its record.
	p2 := hostpaths.New(t.TempDir())
	WriteApplied(p2, rec("kube1", "none"))
	os.Remove(p2.AppliedConfig("kube1"))
	if _, err := ReadApplied(p2, "kube1"); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("sidecar without record: want ErrCorrupt, got %v", err)
	}
}

func TestAppliedConfigAcceptsLegacyBareDigest(t *testing.T) {
	p := hostpaths.New(t.TempDir())
	data := []byte(`{"slot":"kube1","mode":"nspawn"}`)
	f := p.AppliedConfig("kube1")
	os.MkdirAll(filepath.Dir(f), 0o755)
	os.WriteFile(f, data, 0o600)
	line := ChecksumLine(data, "x")
	os.WriteFile(hostpaths.Checksum(f), line[:64], 0o600)
	if _, err := ReadApplied(p, "kube1"); err != nil {
		t.Fatal(err)
	}
}

func TestAppliedConfigRejectsWrongSlotOrMode(t *testing.T) {
	for name, data := range map[string]string{
		"slot mismatch": `{"slot":"kube2","mode":"nspawn"}`,
		"unknown slot":  `{"slot":"kube9","mode":"nspawn"}`,
		"unknown mode":  `{"slot":"kube1","mode":"vm"}`,
		"garbage":       "\x00\xffnot json",
		"empty":         "",
		"trailing":      `{"slot":"kube1","mode":"nspawn"} {}`,
	} {
		t.Run(name, func(t *testing.T) {
			p := hostpaths.New(t.TempDir())
			f := p.AppliedConfig("kube1")
			os.MkdirAll(filepath.Dir(f), 0o755)
			os.WriteFile(f, []byte(data), 0o600)
			os.WriteFile(hostpaths.Checksum(f), ChecksumLine([]byte(data), "kube1-applied-config.json"), 0o600)
			if _, err := ReadApplied(p, "kube1"); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("want ErrCorrupt, got %v", err)
			}
		})
	}
}

// The write of record + sidecar is interrupted at every point in turn; a
// reader must always see the old or the new record, and the next write
// must succeed.
func TestWriteVerifiedSurvivesACrashAtEveryStep(t *testing.T) {
	old := []byte(`{"slot":"kube1","mode":"nspawn","kubernetes-version":"1.35.0"}` + "\n")
	new := []byte(`{"slot":"kube1","mode":"nspawn","kubernetes-version":"1.36.3"}` + "\n")
	name := "kube1-applied-config.json"
	steps := []struct {
		name string
		want string // "old" or "new"
		set  func(f string)
	}{
		{"staged record only", "old", func(f string) {
			os.WriteFile(f+".next", new, 0o600)
		}},
		{"staged record with a half-written sidecar", "old", func(f string) {
			os.WriteFile(f+".next", new, 0o600)
			os.WriteFile(f+".next.sha256", []byte("12ab"), 0o600)
		}},
		{"staged pair complete", "new", func(f string) {
			os.WriteFile(f+".next", new, 0o600)
			os.WriteFile(f+".next.sha256", ChecksumLine(new, name), 0o600)
		}},
		{"record renamed, sidecar still staged", "new", func(f string) {
			os.WriteFile(f, new, 0o600)
			os.WriteFile(f+".next.sha256", ChecksumLine(new, name), 0o600)
		}},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			p := hostpaths.New(t.TempDir())
			f := p.AppliedConfig("kube1")
			os.MkdirAll(filepath.Dir(f), 0o755)
			os.WriteFile(f, old, 0o600)
			os.WriteFile(f+".sha256", ChecksumLine(old, name), 0o600)
			s.set(f)
			got, err := ReadApplied(p, "kube1")
			if err != nil {
				t.Fatalf("read after crash: %v", err)
			}
			want := map[string]string{"old": "1.35.0", "new": "1.36.3"}[s.want]
			if got.KubernetesVersion != want {
				t.Fatalf("read %s, want %s", got.KubernetesVersion, want)
			}
			// The next writer finishes or drops the staged pair first.
			if err := FinishPending(f); err != nil {
				t.Fatal(err)
			}
			got, err = ReadApplied(p, "kube1")
			if err != nil || got.KubernetesVersion != want {
				t.Fatalf("after recovery: %v %v", got, err)
			}
			for _, left := range []string{f + ".next", f + ".next.sha256"} {
				if _, err := os.Stat(left); err == nil {
					t.Errorf("%s left behind", filepath.Base(left))
				}
			}
			if err := WriteApplied(p, rec("kube1", "none")); err != nil {
				t.Fatal(err)
			}
			if got, _ := ReadApplied(p, "kube1"); got == nil || got.Mode != "none" {
				t.Fatalf("write after recovery not visible: %+v", got)
			}
		})
	}
}

func TestReadActive(t *testing.T) {
	p := hostpaths.New(t.TempDir())
	if a, err := ReadActive(p); a != nil || err != nil {
		t.Fatalf("fresh host: %v %v", a, err)
	}
	WriteApplied(p, rec("kube2", "nspawn"))
	if a, err := ReadActive(p); err != nil || a.Slot != "kube2" {
		t.Fatalf("one record: %+v %v", a, err)
	}
	WriteApplied(p, rec("kube1", "none"))
	if _, err := ReadActive(p); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("two records without journal: %v", err)
	}
	WriteFileAtomic(p.Journal("isolation"), []byte(`{"running-slot":"kube1"}`), 0o600)
	if a, err := ReadActive(p); err != nil || a.Slot != "kube1" || a.Mode != "none" {
		t.Fatalf("journal names kube1: %+v %v", a, err)
	}
	RemoveApplied(p, "kube1")
	WriteApplied(p, rec("kube1", "none"))
	WriteFileAtomic(p.Journal("isolation"), []byte(`{"running-slot":"kube7"}`), 0o600)
	if _, err := ReadActive(p); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("journal names a slot without record: %v", err)
	}
}

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

func TestOwnershipExcludesOtherOwnersAndResumesOwn(t *testing.T) {
	p := runRoot(t)
	if o, err := ReadOwnership(p); o != nil || err != nil {
		t.Fatalf("fresh: %v %v", o, err)
	}
	l, err := AcquireOwnership(p, "bootstrap", "unbounded-bootstrap.service")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := AcquireOwnership(p, "bootstrap", ""); !errors.Is(err, ErrOwned) {
		t.Fatalf("second live holder: %v", err)
	}
	o, err := ReadOwnership(p)
	if err != nil || o.Owner != "bootstrap" || o.Unit != "unbounded-bootstrap.service" {
		t.Fatalf("record: %+v %v", o, err)
	}
	// The process dies without releasing: the kernel drops the flock, the
	// record stays. The same owner resumes; another owner is refused.
	l.fd = closeFD(l.fd)
	if _, err := AcquireOwnership(p, "reset", ""); !errors.Is(err, ErrOwned) {
		t.Fatalf("other owner after crash: %v", err)
	}
	l2, err := AcquireOwnership(p, "bootstrap", "unbounded-bootstrap.service")
	if err != nil {
		t.Fatalf("same owner resumes: %v", err)
	}
	if o2, _ := ReadOwnership(p); !o2.Since.Equal(o.Since) {
		t.Errorf("resumed installation lost its start time: %v vs %v", o2.Since, o.Since)
	}
	if err := l2.Release(); err != nil {
		t.Fatal(err)
	}
	if o, _ := ReadOwnership(p); o != nil {
		t.Fatalf("released but record remains: %+v", o)
	}
}

// /run/unbounded is the tmpfiles.d entry's to create: without it the lock
// is not taken, the error says where the directory comes from, and neither
// the directory nor an ownership record is created.
func TestOwnershipWithoutRunDirFailsAndCreatesNothing(t *testing.T) {
	p := hostpaths.New(t.TempDir())
	_, err := AcquireOwnership(p, "bootstrap", "unbounded-bootstrap.service")
	if err == nil || !strings.Contains(err.Error(), TmpfilesConfHost) || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("AcquireOwnership without %s = %v, want a not-exist error naming %s", p.RunDir(), err, TmpfilesConfHost)
	}
	for _, f := range []string{p.RunDir(), p.Ownership()} {
		if _, err := os.Lstat(f); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("AcquireOwnership created %s (%v)", f, err)
		}
	}
	if err := os.MkdirAll(filepath.Dir(p.RunDir()), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p.RunDir(), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := AcquireOwnership(p, "bootstrap", ""); err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Errorf("AcquireOwnership with a file at %s = %v, want \"not a directory\"", p.RunDir(), err)
	}
}

func TestCorruptOwnershipFailsClosed(t *testing.T) {
	p := runRoot(t)
	WriteFileAtomic(p.Ownership(), []byte("garbage"), 0o644)
	o, err := ReadOwnership(p)
	if o == nil || !errors.Is(err, ErrCorrupt) {
		t.Fatalf("want owned+corrupt, got %v %v", o, err)
	}
	if _, err := AcquireOwnership(p, "bootstrap", ""); !errors.Is(err, ErrOwned) {
		t.Fatalf("corrupt record must not be taken over: %v", err)
	}
}

func TestDetectLegacy(t *testing.T) {
	p := hostpaths.New(t.TempDir())
	if DetectLegacy(p).Found() {
		t.Fatal("fresh host detected as legacy")
	}
	f := p.LegacyAppliedConfig("kube1")
	os.MkdirAll(filepath.Dir(f), 0o755)
	os.WriteFile(f, []byte("{}"), 0o600)
	l := DetectLegacy(p)
	if !l.Found() || len(l.AppliedConfigs) != 1 || l.AppliedConfigs[0] != "/etc/unbounded/agent/kube1-applied-config.json" {
		t.Fatalf("got %+v", l)
	}
}

// An older agent's node not adopted yet defers (ErrOwned: exit 69) the
// commands that cannot adopt it themselves.
func TestCheckAdoptedDefersWhileAnOlderRecordIsThere(t *testing.T) {
	p := hostpaths.New(t.TempDir())
	if err := CheckAdopted(p); err != nil {
		t.Fatalf("fresh host: %v", err)
	}
	f := p.LegacyAppliedConfig("kube2")
	os.MkdirAll(filepath.Dir(f), 0o755)
	os.WriteFile(f, []byte("{}"), 0o600)
	err := CheckAdopted(p)
	if !errors.Is(err, ErrNotAdopted) || !errors.Is(err, ErrOwned) || !strings.Contains(err.Error(), "/etc/unbounded/agent/kube2-applied-config.json") {
		t.Fatalf("%v", err)
	}
}

func TestReadLegacyAppliedChecksTheBareDigestAndToleratesNoSidecar(t *testing.T) {
	p := hostpaths.New(t.TempDir())
	f := p.LegacyAppliedConfig("kube1")
	os.MkdirAll(filepath.Dir(f), 0o755)
	os.WriteFile(f, []byte(`{"MachineName":"a"}`), 0o600)
	if _, noSidecar, err := ReadLegacyApplied(p, "kube1"); err != nil || !noSidecar {
		t.Fatalf("no sidecar: %v, %v", noSidecar, err)
	}
	sum := sha256.Sum256([]byte(`{"MachineName":"a"}`))
	os.WriteFile(hostpaths.Checksum(f), []byte(hex.EncodeToString(sum[:])+"\n"), 0o600)
	if data, noSidecar, err := ReadLegacyApplied(p, "kube1"); err != nil || noSidecar || string(data) != `{"MachineName":"a"}` {
		t.Fatalf("bare digest: %q, %v, %v", data, noSidecar, err)
	}
	os.WriteFile(f, []byte(`{"MachineName":"b"}`), 0o600)
	if _, _, err := ReadLegacyApplied(p, "kube1"); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), f) {
		t.Fatalf("mismatch: %v", err)
	}
}

// RemoveVerified interrupted (a power cut) or watched (the generator on
// another unit's daemon-reload) after each of its steps: a reader finds
// the whole record or none, never a corrupt one (which puts the host into
// its safe state), and a RemoveVerified run again finishes the job. CI
// saw the generator read a handoff journal between the removal of the
// record and of its sidecar, the order before.
func TestRemoveVerifiedLeavesNoCorruptStateAtAnyStep(t *testing.T) {
	data := []byte(`{"slot":"kube1","mode":"nspawn","kubernetes-version":"1.36.3"}` + "\n")
	name := "kube1-applied-config.json"
	steps := []struct {
		name    string
		present bool // the record still reads whole
		set     func(f string)
	}{
		{"not begun, a complete staged pair beside", true, func(f string) {
			os.WriteFile(f+".next", data, 0o600)
			os.WriteFile(f+".next.sha256", ChecksumLine(data, name), 0o600)
		}},
		{"sidecar moved to the staged name", true, func(f string) {
			os.Rename(f+".sha256", f+".next.sha256")
		}},
		{"record removed", false, func(f string) {
			os.Rename(f+".sha256", f+".next.sha256")
			os.Remove(f)
		}},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			p := hostpaths.New(t.TempDir())
			f := p.AppliedConfig("kube1")
			os.MkdirAll(filepath.Dir(f), 0o755)
			os.WriteFile(f, data, 0o600)
			os.WriteFile(f+".sha256", ChecksumLine(data, name), 0o600)
			s.set(f)
			got, err := ReadApplied(p, "kube1")
			switch {
			case s.present && (err != nil || got.KubernetesVersion != "1.36.3"):
				t.Fatalf("read: %+v %v, want the whole record", got, err)
			case !s.present && !errors.Is(err, os.ErrNotExist):
				t.Fatalf("read: %+v %v, want no record (not corrupt)", got, err)
			}
			if err := RemoveVerified(f); err != nil {
				t.Fatal(err)
			}
			if _, err := ReadApplied(p, "kube1"); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("after RemoveVerified: %v, want no record", err)
			}
			left, _ := filepath.Glob(f + "*")
			if len(left) > 0 {
				t.Errorf("left behind: %v", left)
			}
		})
	}
}

// A removal that fails part way (the sidecar cannot be moved: immutable
// here) leaves the record whole and readable, not a record gone with its
// sidecar left, which reads as corrupt.
func TestRemoveVerifiedThatFailsLeavesTheRecordWhole(t *testing.T) {
	p := hostpaths.New(t.TempDir())
	if err := WriteApplied(p, rec("kube1", "none")); err != nil {
		t.Fatal(err)
	}
	f := p.AppliedConfig("kube1")
	fd, err := unix.Open(f+".sha256", unix.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	flags, err := unix.IoctlGetUint32(fd, unix.FS_IOC_GETFLAGS)
	if err == nil {
		err = unix.IoctlSetPointerInt(fd, unix.FS_IOC_SETFLAGS, int(flags|fsImmutableFL))
	}
	if err != nil {
		unix.Close(fd)
		t.Skipf("cannot make the sidecar immutable on this file system or as this user: %v", err)
	}
	// Before TempDir's removal (cleanups run last first).
	t.Cleanup(func() {
		unix.IoctlSetPointerInt(fd, unix.FS_IOC_SETFLAGS, int(flags))
		unix.Close(fd)
	})
	if err := RemoveVerified(f); err == nil {
		t.Fatal("RemoveVerified of a record whose sidecar is immutable succeeded")
	}
	if got, err := ReadApplied(p, "kube1"); err != nil || got.Mode != "none" {
		t.Fatalf("after the failed removal: %+v %v, want the record whole", got, err)
	}
}

// fsImmutableFL is FS_IMMUTABLE_FL of linux/fs.h (x/sys/unix lacks it).
const fsImmutableFL = 0x10
