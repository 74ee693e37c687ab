package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"
)

// runsPerOp is how many generator runs one benchmark iteration makes, so
// that `make bench` (-benchtime 1x) still takes the median of 100.
const runsPerOp = 100

// BenchmarkGenerator measures what systemd waits for at every boot and
// daemon-reload: one run of the built (static, stripped) binary, from exec
// to exit, on a bootstrapped nspawn host (fence unit and
// systemd-nspawn@.service installed, so the lookups of both are measured
// too: nine stat calls), each run into three fresh output
// directories. The budget is a median under 2 ms and a binary under 3 MB
// (TestGeneratorBinaryIsUnder3MB): systemd waits for every generator
// before it loads a unit, at every boot and daemon-reload. The median is
// reported because a loaded CI machine adds outliers that say nothing
// about the generator.
//
// The output directories are on tmpfs when the machine has one at
// /dev/shm, as systemd's are (/run/systemd/generator*); on a loaded disk,
// creating a few directories costs more than the generator's decision.
//
// Each run is paired with a run of an empty static Go program built the
// same way (ms/run-median-go-noop): on a shared machine the load moves
// both, and the difference is what the generator itself costs.
func BenchmarkGenerator(b *testing.B) {
	h := newHost(b)
	h.config()
	h.applied("kube2", "nspawn")
	fi, err := os.Stat(binary)
	if err != nil {
		b.Fatal(err)
	}
	noop := buildNoop(b)
	base := outputBase(b)
	var runs, noops []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for r := 0; r < runsPerOp; r++ {
			b.StopTimer()
			dir, err := os.MkdirTemp(base, "run")
			if err != nil {
				b.Fatal(err)
			}
			var outs []string
			for _, d := range []string{"normal", "early", "late"} {
				o := filepath.Join(dir, d)
				if err := os.Mkdir(o, 0o755); err != nil {
					b.Fatal(err)
				}
				outs = append(outs, o)
			}
			cmd := exec.Command(binary, append([]string{"--root", h.p.Root}, outs...)...)
			b.StartTimer()
			start := time.Now()
			err = cmd.Run()
			d := time.Since(start)
			b.StopTimer()
			if err != nil {
				b.Fatal(err)
			}
			runs = append(runs, d)
			start = time.Now()
			if err := exec.Command(noop).Run(); err != nil {
				b.Fatal(err)
			}
			noops = append(noops, time.Since(start))
			// A run that did not produce the node output measured
			// nothing worth reporting.
			if _, err := os.Lstat(filepath.Join(outs[0], "unbounded-mode-nspawn.target.requires", "systemd-nspawn@kube2.service")); err != nil {
				b.Fatalf("run %d wrote no node output: %v", r, err)
			}
			b.StartTimer()
		}
	}
	b.StopTimer()
	slices.Sort(runs)
	slices.Sort(noops)
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(ms(noops[len(noops)/2]), "ms/run-median-go-noop")
	b.ReportMetric(ms(runs[len(runs)/2]), "ms/run-median")
	b.ReportMetric(ms(runs[len(runs)*9/10]), "ms/run-p90")
	b.ReportMetric(float64(fi.Size())/(1<<20), "MB-binary")
}

// buildNoop builds an empty Go program with the Makefile's flags: the floor
// of what any static Go binary costs to exec on this machine right now.
func buildNoop(b *testing.B) string {
	dir := b.TempDir()
	os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module noop\n\ngo 1.26\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "main.go"), []byte("package main\n\nfunc main() {}\n"), 0o644)
	out := filepath.Join(dir, "noop")
	build := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", out, ".")
	build.Dir = dir
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-mod=mod")
	if msg, err := build.CombinedOutput(); err != nil {
		b.Fatalf("building the no-op program: %v\n%s", err, msg)
	}
	return out
}

// tmpfsMagic is TMPFS_MAGIC from linux/magic.h.
const tmpfsMagic = 0x01021994

// outputBase is a directory for the runs' output directories: on tmpfs
// when /dev/shm is one, else the benchmark's temporary directory.
func outputBase(b *testing.B) string {
	var st syscall.Statfs_t
	if err := syscall.Statfs("/dev/shm", &st); err == nil && st.Type == tmpfsMagic {
		dir, err := os.MkdirTemp("/dev/shm", "unbounded-generator-bench")
		if err == nil {
			b.Cleanup(func() { os.RemoveAll(dir) })
			return dir
		}
	}
	b.Log("no tmpfs at /dev/shm: output directories on the temporary directory's file system")
	return b.TempDir()
}
