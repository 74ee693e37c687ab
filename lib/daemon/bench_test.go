package daemon

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
)

// The daemon's cost, measured against the real API server of tests/kube
// (`make bench` runs every Benchmark under tests/kube/with-env.sh).
//
//	UNBOUNDED_BENCH_AGENTS  simulated daemons (default 200)
//	UNBOUNDED_BENCH_IDLE    idle window measured (default 60s)

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func envDuration(name string, def time.Duration) time.Duration {
	if v, err := time.ParseDuration(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// apiServerProc finds the kube-testenv process that serves kubeconfig
// (its --dir is the kubeconfig's directory).
func apiServerProc(kubeconfig string) (int, error) {
	dir := filepath.Dir(kubeconfig)
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	var found []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmd, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(bytes.TrimRight(cmd, "\x00")), "\x00")
		if !strings.HasSuffix(args[0], "kube-testenv") {
			continue
		}
		for i, a := range args {
			if a == "--dir="+dir || (a == "--dir" && i+1 < len(args) && args[i+1] == dir) {
				found = append(found, pid)
			}
		}
	}
	if len(found) != 1 {
		return 0, fmt.Errorf("found %d kube-testenv processes serving %s, want 1", len(found), dir)
	}
	return found[0], nil
}

// procUsage is a process's CPU time (user+system) and resident memory.
type procUsage struct {
	cpu time.Duration
	rss int64 // bytes
}

func readProc(pid int) (procUsage, error) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procUsage{}, err
	}
	// Fields after the command (which may hold spaces) start after ")".
	f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+2:]))
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	const hz = 100 // USER_HZ on Linux
	u := procUsage{cpu: time.Duration(utime+stime) * time.Second / hz}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return procUsage{}, err
	}
	for _, l := range strings.Split(string(status), "\n") {
		if rest, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			u.rss = kb * 1024
		}
	}
	return u, nil
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

// BenchmarkIdle200Daemons runs UNBOUNDED_BENCH_AGENTS daemons (goroutines
// in this process, each with its own identity, TLS connection, watches and
// fake systemd) against one real API server, waits until all have
// registered and reported, then counts every request they send during the
// idle window and what the API server spends on them.
func BenchmarkIdle200Daemons(b *testing.B) {
	env := getEnv(b)
	agents := envInt("UNBOUNDED_BENCH_AGENTS", 200)
	idle := envDuration("UNBOUNDED_BENCH_IDLE", 60*time.Second)
	pid, err := apiServerProc(os.Getenv(envKubeconfig))
	if err != nil {
		b.Skipf("API server process not found, cannot measure its CPU and memory: %v", err)
	}
	for i := 0; i < b.N; i++ {
		// The API server's own idle cost, before any daemon, to subtract.
		baseWindow := min(idle, 20*time.Second)
		b0, _ := readProc(pid)
		time.Sleep(baseWindow)
		b1, _ := readProc(pid)
		baseCores := (b1.cpu - b0.cpu).Seconds() / baseWindow.Seconds()

		runtime.GC()
		base, _ := readProc(pid)
		var heapBefore runtime.MemStats
		runtime.ReadMemStats(&heapBefore)

		var counters []*countingTransport
		var names []string
		start := time.Now()
		for a := 0; a < agents; a++ {
			machine := env.newMachine(b)
			names = append(names, machine)
			env.createReadyNode(b, machine)
			cfg, ct := countRequests(env.agentConfig(b, machine))
			counters = append(counters, ct)
			fake := newFakeSystemd()
			startDaemon(b, Options{Paths: newRoot(b, machine), Host: fake.host(), Machine: machine, REST: cfg, NodeGoneGrace: time.Hour})
		}
		// Settled: every Machine registered with its Node seen.
		want := map[string]bool{}
		for _, n := range names {
			want[n] = true
		}
		deadline := time.Now().Add(5 * time.Minute)
		for {
			list := &v1alpha3.MachineList{}
			if err := env.ops.ops.Get().Resource(v1alpha3.ResourceMachines).Do(context.Background()).Into(list); err != nil {
				b.Fatal(err)
			}
			ready := 0
			for _, m := range list.Items {
				if want[m.Name] && m.Status.NodeName == m.Name && m.Status.Agent != nil {
					ready++
				}
			}
			if ready == agents {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("only %d of %d daemons registered within 5 minutes", ready, agents)
			}
			time.Sleep(500 * time.Millisecond)
		}
		settle := time.Since(start)
		time.Sleep(2 * time.Second) // their last status writes come back through the watches
		marks := make([]int, len(counters))
		startup := 0
		for i, c := range counters {
			marks[i] = c.count()
			startup += marks[i]
		}
		before, _ := readProc(pid)
		time.Sleep(idle)
		after, _ := readProc(pid)
		var idleReqs []string
		for i, c := range counters {
			idleReqs = append(idleReqs, c.since(marks[i])...)
		}
		during := len(idleReqs)
		runtime.GC()
		var heapAfter runtime.MemStats
		runtime.ReadMemStats(&heapAfter)

		perMin := float64(during) / idle.Minutes()
		cpu := after.cpu - before.cpu
		cores := max(cpu.Seconds()/idle.Seconds()-baseCores, 0)
		rssPerAgent := float64(after.rss-base.rss) / float64(agents)
		heapPerAgent := float64(int64(heapAfter.HeapInuse)-int64(heapBefore.HeapInuse)) / float64(agents)

		b.ReportMetric(perMin, "idle-req/min")
		b.ReportMetric(cores*1000/float64(agents), "apiserver-mcores/agent")
		b.ReportMetric(rssPerAgent/1024, "apiserver-KiB/agent")
		b.ReportMetric(heapPerAgent/1024, "daemon-heap-KiB/agent")
		b.Logf("%d daemons settled in %v with %d requests (lists, watches, registration, status)", agents, settle.Round(time.Millisecond), startup)
		b.Logf("idle %v: %d requests (%.2f/min) from %d daemons", idle, during, perMin, agents)
		b.Logf("API server: CPU %v over the idle window, %.4f cores above its own idle (%.4f cores without agents), %.3f millicores/agent; RSS %.0f MiB -> %.0f MiB (+%.1f KiB/agent, objects and watch cache included)",
			cpu, cores, baseCores, cores*1000/float64(agents), mib(base.rss), mib(after.rss), rssPerAgent/1024)
		b.Logf("extrapolated to 10000 agents: %.0f watches, %.2f cores idle, +%.0f MiB API server memory, %.0f requests/min",
			10000*3.0, cores*10000/float64(agents), rssPerAgent*10000/(1<<20), perMin*10000/float64(agents))
		b.Logf("daemon Go heap in use: %.0f KiB per daemon (in-process; a real daemon's RSS is measured by the system test)", heapPerAgent/1024)
		if during > 0 {
			sort.Strings(idleReqs)
			b.Logf("idle requests (first 10): %v", idleReqs[:min(10, len(idleReqs))])
		}
		for _, n := range names {
			_ = env.kube.CoreV1().Nodes().Delete(context.Background(), n, metav1.DeleteOptions{})
		}
	}
}

// BenchmarkDispatchLatency measures the time from the create of a
// MachineOperation (the API server's answer) to the daemon's StartUnit
// call, for operations in a row with one daemon (goal: under 1 s).
func BenchmarkDispatchLatency(b *testing.B) {
	env := getEnv(b)
	machine := env.newMachine(b)
	fake := newFakeSystemd()
	var mu sync.Mutex
	started := make(chan time.Time, 1)
	fake.onStart = func(string) {
		mu.Lock()
		defer mu.Unlock()
		select {
		case started <- time.Now():
		default:
		}
	}
	startDaemon(b, Options{Paths: newRoot(b, machine), Host: fake.host(), Machine: machine, REST: env.agentConfig(b, machine), NodeGoneGrace: time.Hour})
	// At least 20 samples, also under `make bench`'s -benchtime 1x.
	n := max(b.N, envInt("UNBOUNDED_BENCH_DISPATCHES", 20))
	var lat []time.Duration
	b.ResetTimer()
	for i := 0; i < n; i++ {
		op := env.createOp(b, machine, v1alpha3.OperationRestart)
		created := time.Now()
		select {
		case s := <-started:
			lat = append(lat, s.Sub(created))
		case <-time.After(30 * time.Second):
			b.Fatalf("operation %s not dispatched within 30s", op.Name)
		}
		env.waitOp(b, op.Name, 30*time.Second)
	}
	b.StopTimer()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	p50, max := lat[len(lat)/2], lat[len(lat)-1]
	b.ReportMetric(float64(p50.Microseconds())/1000, "ms-p50-create-to-StartUnit")
	b.ReportMetric(float64(max.Microseconds())/1000, "ms-max-create-to-StartUnit")
}
