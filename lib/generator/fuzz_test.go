package generator

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/modes/facts"
	"unbounded-cloud.io/agent/lib/regfile/regfiletest"
	"unbounded-cloud.io/agent/lib/state"
	"unbounded-cloud.io/agent/lib/unitnames"
)

// hangBudget bounds one Read of the state in tests. It detects a read
// that blocks (a FIFO opened without O_NONBLOCK blocks until a writer
// comes, /dev/zero never ends), not a slow one: the generator's speed is
// measured by BenchmarkGenerator (make bench), far inside this even on a
// loaded 2-core machine.
const hangBudget = 2 * time.Second

// readWithin runs Host{}.Read(p) and fails the test if it does not return
// within hangBudget (its goroutine is leaked then: it would never end).
func readWithin(t *testing.T, p hostpaths.Paths) Input {
	t.Helper()
	ch := make(chan Input, 1)
	go func() { ch <- Host{}.Read(p) }()
	select {
	case in := <-ch:
		return in
	case <-time.After(hangBudget):
		t.Fatalf("reading the state under %s did not return within %v", p.Root, hangBudget)
		return Input{}
	}
}

// fileKind is what the fuzzer makes of one state file.
type fileKind uint32

const (
	kindRegular   fileKind = iota // what the flags say (nothing, for the ownership record)
	kindFIFO                      // then regfiletest.Kinds in order: FIFO,
	kindDevZero                   // symlink to /dev/zero,
	kindDirectory                 // directory,
	kindSocket                    // socket
	kindOversized                 // a sparse regular file over every limit
	kindLink                      // a symlink to a regular file with what kindRegular writes
	kindDangling                  // a symlink to nothing: a missing file
)

// abnormal kinds are never a trustworthy state file.
func (k fileKind) abnormal() bool { return k >= kindFIFO && k <= kindOversized }

func (k fileKind) String() string {
	return [...]string{"regular file", "FIFO", "symlink to /dev/zero", "directory", "socket", "oversized file", "symlink to a regular file", "dangling symlink"}[k]
}

// The state files whose kind the fuzzer picks, three bits each in kinds.
const (
	kindKube1 = iota
	kindKube1Sidecar
	kindKube2
	kindKube2Sidecar
	kindJournal
	kindOwnership
)

var kindFiles = []string{"kube1's record", "kube1's sidecar", "kube2's record", "kube2's sidecar", "the in-place journal", "the ownership record"}

// FuzzDecideFromState feeds arbitrary bytes as both slots' applied configs
// and the in-place journal through the real readers (lib/state) into the
// decision and the writer, and checks the generator's safety properties:
// it never panics, node units appear only for a trusted active record, a
// problem always means no node units and recovery pulled in, and every
// output stays inside the output directory.
//
// flags: bit 0/1 give kube1/kube2 a matching sidecar (else none, or a
// wrong one with bit 4/5), bit 2 writes the journal, bit 3 the config,
// bit 6 installs the fence unit, bit 7 the supervising units of every mode
// (templates where they are instances).
//
// kinds lets the fuzzer pick what each state file is (see fileKind): a
// regular file, or what a corrupt disk, a bad restore or a mistaken
// operator leaves in its place (a FIFO, a symlink to /dev/zero, a
// directory, a socket, a file over every limit), a symlink to a regular
// file, a dangling symlink. Three bits per file, in the order of
// kindFiles. Whatever it picks, Read returns within hangBudget, and
// anything but a regular file (or a symlink to one) is never trusted.
func FuzzDecideFromState(f *testing.F) {
	valid := func(slot, mode string) []byte {
		return []byte(`{"slot":"` + slot + `","mode":"` + mode + `","machine":"m","agent-version":"0.1.0"}`)
	}
	f.Add(valid("kube1", "nspawn"), []byte(nil), []byte(nil), byte(0b1100_0000|0b0001), uint32(0))
	f.Add([]byte(nil), valid("kube2", "none"), []byte(nil), byte(0b1100_0000|0b1010), uint32(0))
	f.Add(valid("kube1", "container"), valid("kube2", "nspawn"), []byte(`{"running-slot":"kube2"}`), byte(0b1100_0000|0b0111), uint32(0))
	f.Add(valid("kube1", "nspawn"), valid("kube2", "nspawn"), []byte(`{"running-slot":"kube3"}`), byte(0b1100_0000|0b0111), uint32(0))
	f.Add(valid("kube1", "nspawn"), valid("kube2", "nspawn"), []byte("\x00garbage"), byte(0b1100_0000|0b0111), uint32(0))
	f.Add(valid("kube1", "nspawn"), valid("kube2", "nspawn"), []byte(nil), byte(0b1100_0000|0b0011), uint32(0))
	f.Add(valid("kube2", "nspawn"), []byte(nil), []byte(nil), byte(0b1100_0000|0b0001), uint32(0))
	f.Add(valid("kube1", "vm"), []byte(nil), []byte(nil), byte(0b1100_0000|0b0001), uint32(0))
	f.Add([]byte("\xff\xfe{"), []byte(nil), []byte(nil), byte(0b1100_0000|0b0001), uint32(0))
	f.Add([]byte(""), []byte(nil), []byte(nil), byte(0b1100_0000|0b0001), uint32(0))
	f.Add(valid("kube1", "nspawn"), []byte(nil), []byte(nil), byte(0b1100_0000|0b10000), uint32(0))
	f.Add([]byte(`{"slot":"kube1","mode":"nspawn"} {"x":1}`), []byte(nil), []byte(nil), byte(0b1100_0000|0b0001), uint32(0))
	f.Add([]byte(`{"slot":"kube1","mode":"none","config":{"a":[1,2,{"b":null}]}}`), []byte(nil), []byte(nil), byte(0b1100_0000|0b1001), uint32(0))
	f.Add(valid("kube2", "container"), []byte(nil), []byte(nil), byte(0b1010), uint32(0))
	f.Add(valid("kube1", "nspawn"), []byte(nil), []byte(nil), byte(0b100_0000|0b0001), uint32(0))
	f.Add([]byte(nil), valid("kube2", "none"), []byte(nil), byte(0b1000_0000|0b0010), uint32(0))

	nspawn1 := valid("kube1", "nspawn")
	// A FIFO as the ownership record, a record that is a symlink to
	// /dev/zero: the reviewer's hangs.
	f.Add(nspawn1, []byte(nil), []byte(nil), byte(0b1100_0000|0b0001), uint32(kindFIFO)<<(3*kindOwnership))
	f.Add(nspawn1, []byte(nil), []byte(nil), byte(0b1100_0000|0b0001), uint32(kindDevZero)<<(3*kindKube1))
	f.Add(nspawn1, []byte(nil), []byte(nil), byte(0b1100_0000|0b0001), uint32(kindFIFO)<<(3*kindKube1Sidecar))
	f.Add(nspawn1, valid("kube2", "none"), []byte(`{"running-slot":"kube2"}`), byte(0b1100_0000|0b0111), uint32(kindDirectory)<<(3*kindJournal))
	f.Add(nspawn1, []byte(nil), []byte(nil), byte(0b1100_0000|0b0001), uint32(kindSocket)<<(3*kindKube2Sidecar))
	f.Add(nspawn1, []byte(nil), []byte(nil), byte(0b1100_0000|0b0001), uint32(kindOversized)<<(3*kindKube1))
	f.Add(nspawn1, []byte(nil), []byte(nil), byte(0b1100_0000|0b0001), uint32(kindLink)<<(3*kindKube1)|uint32(kindLink)<<(3*kindKube1Sidecar))
	f.Add(nspawn1, []byte(nil), []byte(nil), byte(0b1100_0000|0b0001), uint32(kindLink)<<(3*kindOwnership))
	f.Add(nspawn1, []byte(nil), []byte(nil), byte(0b1100_0000|0b0001), uint32(kindDangling)<<(3*kindKube1Sidecar))

	f.Fuzz(func(t *testing.T, kube1, kube2, journal []byte, flags byte, kinds uint32) {
		root := t.TempDir()
		p := hostpaths.New(root)
		os.MkdirAll(p.JournalDir(), 0o755)
		kindOf := func(i int) fileKind { return fileKind(kinds >> (3 * i) & 7) }
		// place writes data (nil: nothing) at file as kind k says.
		place := func(file string, data []byte, k fileKind) {
			switch {
			case k >= kindFIFO && k <= kindSocket:
				regfiletest.Make(t, file, regfiletest.Kinds[k-kindFIFO])
			case k == kindOversized:
				// Over every state file's limit, at no cost on disk.
				regfiletest.Sparse(t, file, state.MaxRecordSize+1)
			case k == kindDangling:
				os.Symlink(filepath.Join(root, "nowhere"), file)
			case data == nil:
			case k == kindLink:
				target := filepath.Join(root, "elsewhere", filepath.Base(file))
				os.MkdirAll(filepath.Dir(target), 0o755)
				os.WriteFile(target, data, 0o600)
				os.Symlink(target, file)
			default:
				os.WriteFile(file, data, 0o600)
			}
		}
		for i, data := range [][]byte{kube1, kube2} {
			file := p.AppliedConfig(hostpaths.Slots[i])
			var side []byte
			if data != nil {
				switch {
				case flags&(1<<i) != 0:
					side = state.ChecksumLine(data, filepath.Base(file))
				case flags&(1<<(4+i)) != 0:
					side = state.ChecksumLine(append(data, 'x'), filepath.Base(file))
				}
			}
			place(file, data, kindOf(kindKube1+2*i))
			place(hostpaths.Checksum(file), side, kindOf(kindKube1Sidecar+2*i))
		}
		var jdata []byte
		if flags&4 != 0 {
			jdata = append([]byte{}, journal...)
		}
		place(p.Journal("isolation"), jdata, kindOf(kindJournal))
		// The only ownership record the fuzzer writes names no unit: a
		// record that names one is the contract table's business, and
		// it keeps "a problem pulls in recovery" true here.
		owner := kindOf(kindOwnership)
		if owner != kindRegular {
			place(p.Ownership(), []byte(`{"owner":"bootstrap","since":"2026-01-01T00:00:00Z"}`), owner)
		}
		if flags&8 != 0 {
			os.MkdirAll(filepath.Dir(p.ConfigFile()), 0o755)
			os.WriteFile(p.ConfigFile(), nil, 0o644)
		}
		fenced := flags&64 != 0
		if fenced {
			os.MkdirAll(p.UnitDir(), 0o755)
			os.WriteFile(filepath.Join(p.UnitDir(), unitnames.Fence), []byte("[Service]\nType=oneshot\n"), 0o644)
		}

		nodeUnits := flags&128 != 0
		if nodeUnits {
			os.MkdirAll(p.UnitDir(), 0o755)
			for _, m := range facts.Names() {
				for _, u := range facts.Supervising(m, "kube1") {
					os.WriteFile(filepath.Join(p.UnitDir(), template(u)), []byte("[Service]\nExecStart=/bin/true\n"), 0o644)
				}
			}
		}

		in := readWithin(t, p)
		plan := Decide(in)
		if owner.abnormal() && (in.Ownership == nil || in.OwnershipErr == nil) {
			t.Fatalf("ownership record is a %v, read as %+v, %v: it must read as owned and unreadable", owner, in.Ownership, in.OwnershipErr)
		}
		if in.Ownership == nil {
			for i := kindKube1; i <= kindKube2Sidecar; i++ {
				if k := kindOf(i); k.abnormal() && in.ActiveErr == nil {
					t.Fatalf("%s is a %v but the applied state read as sound (%+v)", kindFiles[i], k, in.Active)
				}
			}
		}
		hasNode, hasRecover := false, false
		for _, l := range plan.Links {
			if !filepath.IsLocal(l.Path) || !strings.HasPrefix(l.Target, "/usr/lib/systemd/system/") {
				t.Fatalf("link %+v leaves its directory", l)
			}
			hasNode = hasNode || strings.HasSuffix(l.Path, "/"+unitnames.NodeTarget) || strings.HasSuffix(l.Path, "/"+unitnames.Daemon)
			hasRecover = hasRecover || strings.HasSuffix(l.Path, "/"+unitnames.RecoverGenerator)
		}
		trusted := in.Active != nil && in.ActiveErr == nil
		if hasNode != (trusted && fenced && nodeUnits) {
			t.Fatalf("node units %v but trusted record %v, fence installed %v, node units installed %v (input %+v)", hasNode, trusted, fenced, nodeUnits, in)
		}
		if (plan.Problem != "") != hasRecover {
			t.Fatalf("problem %q but recovery pulled in %v", plan.Problem, hasRecover)
		}
		if hasNode && (len(plan.Files) == 0 || len(plan.Links) != 3+len(plan.Files)) {
			t.Fatalf("node plan without one fence drop-in per supervising unit: %+v", plan)
		}
		if trusted {
			// The record trusted must be one that was written with a
			// matching sidecar, for the slot it names.
			i := 0
			if in.Active.Slot == "kube2" {
				i = 1
			}
			if flags&(1<<i) == 0 {
				t.Fatalf("trusted %s without a matching sidecar", in.Active.Slot)
			}
			for _, k := range []fileKind{kindOf(kindKube1 + 2*i), kindOf(kindKube1Sidecar + 2*i)} {
				if k != kindRegular && k != kindLink {
					t.Fatalf("trusted %s, whose record or sidecar is a %v", in.Active.Slot, k)
				}
			}
		}
		out := t.TempDir()
		if err := Write(out, plan); err != nil {
			t.Fatal(err)
		}
		if got, want := tree(t, out), planTree(plan); strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Fatalf("written %q, planned %q", got, want)
		}
	})
}
