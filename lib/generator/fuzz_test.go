package generator

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/state"
)

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
func FuzzDecideFromState(f *testing.F) {
	valid := func(slot, mode string) []byte {
		return []byte(`{"slot":"` + slot + `","mode":"` + mode + `","machine":"m","agent-version":"0.1.0"}`)
	}
	f.Add(valid("kube1", "nspawn"), []byte(nil), []byte(nil), byte(0b1100_0000|0b0001))
	f.Add([]byte(nil), valid("kube2", "none"), []byte(nil), byte(0b1100_0000|0b1010))
	f.Add(valid("kube1", "container"), valid("kube2", "nspawn"), []byte(`{"running-slot":"kube2"}`), byte(0b1100_0000|0b0111))
	f.Add(valid("kube1", "nspawn"), valid("kube2", "nspawn"), []byte(`{"running-slot":"kube3"}`), byte(0b1100_0000|0b0111))
	f.Add(valid("kube1", "nspawn"), valid("kube2", "nspawn"), []byte("\x00garbage"), byte(0b1100_0000|0b0111))
	f.Add(valid("kube1", "nspawn"), valid("kube2", "nspawn"), []byte(nil), byte(0b1100_0000|0b0011))
	f.Add(valid("kube2", "nspawn"), []byte(nil), []byte(nil), byte(0b1100_0000|0b0001))
	f.Add(valid("kube1", "vm"), []byte(nil), []byte(nil), byte(0b1100_0000|0b0001))
	f.Add([]byte("\xff\xfe{"), []byte(nil), []byte(nil), byte(0b1100_0000|0b0001))
	f.Add([]byte(""), []byte(nil), []byte(nil), byte(0b1100_0000|0b0001))
	f.Add(valid("kube1", "nspawn"), []byte(nil), []byte(nil), byte(0b1100_0000|0b10000))
	f.Add([]byte(`{"slot":"kube1","mode":"nspawn"} {"x":1}`), []byte(nil), []byte(nil), byte(0b1100_0000|0b0001))
	f.Add([]byte(`{"slot":"kube1","mode":"none","config":{"a":[1,2,{"b":null}]}}`), []byte(nil), []byte(nil), byte(0b1100_0000|0b1001))
	f.Add(valid("kube2", "container"), []byte(nil), []byte(nil), byte(0b1010))
	f.Add(valid("kube1", "nspawn"), []byte(nil), []byte(nil), byte(0b100_0000|0b0001))
	f.Add([]byte(nil), valid("kube2", "none"), []byte(nil), byte(0b1000_0000|0b0010))

	f.Fuzz(func(t *testing.T, kube1, kube2, journal []byte, flags byte) {
		root := t.TempDir()
		p := hostpaths.New(root)
		os.MkdirAll(p.JournalDir(), 0o755)
		for i, data := range [][]byte{kube1, kube2} {
			if data == nil {
				continue
			}
			file := p.AppliedConfig(hostpaths.Slots[i])
			os.WriteFile(file, data, 0o600)
			switch {
			case flags&(1<<i) != 0:
				os.WriteFile(hostpaths.Checksum(file), state.ChecksumLine(data, filepath.Base(file)), 0o600)
			case flags&(1<<(4+i)) != 0:
				os.WriteFile(hostpaths.Checksum(file), state.ChecksumLine(append(data, 'x'), filepath.Base(file)), 0o600)
			}
		}
		if flags&4 != 0 {
			os.WriteFile(p.Journal("isolation"), journal, 0o644)
		}
		if flags&8 != 0 {
			os.MkdirAll(filepath.Dir(p.ConfigFile()), 0o755)
			os.WriteFile(p.ConfigFile(), nil, 0o644)
		}
		fenced := flags&64 != 0
		if fenced {
			os.MkdirAll(p.UnitDir(), 0o755)
			os.WriteFile(filepath.Join(p.UnitDir(), FenceService), []byte("[Service]\nType=oneshot\n"), 0o644)
		}

		nodeUnits := flags&128 != 0
		if nodeUnits {
			os.MkdirAll(p.UnitDir(), 0o755)
			for _, m := range state.Modes {
				for _, u := range SupervisingUnits(m, "kube1") {
					os.WriteFile(filepath.Join(p.UnitDir(), template(u)), []byte("[Service]\nExecStart=/bin/true\n"), 0o644)
				}
			}
		}

		in := Host{}.Read(p)
		plan := Decide(in)
		hasNode, hasRecover := false, false
		for _, l := range plan.Links {
			if !filepath.IsLocal(l.Path) || !strings.HasPrefix(l.Target, "/usr/lib/systemd/system/") {
				t.Fatalf("link %+v leaves its directory", l)
			}
			hasNode = hasNode || strings.HasSuffix(l.Path, "/"+NodeTarget) || strings.HasSuffix(l.Path, "/"+DaemonService)
			hasRecover = hasRecover || strings.HasSuffix(l.Path, "/"+RecoverUnit)
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
