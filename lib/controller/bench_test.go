package controller

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"unbounded-cloud.io/agent/lib/api/identity"
	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/kube/clustertest"
	"unbounded-cloud.io/agent/tests/kubeenv"
	"unbounded-cloud.io/agent/tests/tiers"
)

// controllerProcess is bin/unbounded-controller (make bench builds it)
// running against the test API server, leader election off, its metrics
// on a loopback port.
type controllerProcess struct {
	cmd     *exec.Cmd
	metrics string
}

func runController(b *testing.B) *controllerProcess {
	b.Helper()
	bin, _ := filepath.Abs("../../bin/unbounded-controller")
	if _, err := os.Stat(bin); err != nil {
		tiers.Skip(b, tiers.Kube, "%s is missing: `make bench` builds it (make build)", bin)
	}
	kc := os.Getenv(kubeenv.EnvKubeconfig)
	if kc == "" {
		tiers.Skip(b, tiers.Kube, "%s is not set: run under tests/kube/with-env.sh", kubeenv.EnvKubeconfig)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	cmd := exec.Command(bin, "--kubeconfig", kc, "--no-leader-elect", "--metrics-bind-address", addr, "--health-probe-bind-address", "0")
	cmd.Stderr = nil // its structured log is not the benchmark's output
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	p := &controllerProcess{cmd: cmd, metrics: "http://" + addr + "/metrics"}
	b.Cleanup(func() { cmd.Process.Signal(syscall.SIGTERM); cmd.Wait() })
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := p.requests(); err == nil {
			return p
		}
		if time.Now().After(deadline) {
			b.Fatalf("unbounded-controller: no metrics at %s within 30s", p.metrics)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// requests is the controller's rest_client_requests_total, all codes and
// methods.
func (p *controllerProcess) requests() (float64, error) {
	resp, err := http.Get(p.metrics)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sum := 0.0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "rest_client_requests_total{") {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err == nil {
			sum += v
		}
	}
	return sum, sc.Err()
}

// usage is the process' CPU time and peak resident memory.
func (p *controllerProcess) usage(b *testing.B) (cpu time.Duration, peakKiB int) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid))
	if err != nil {
		b.Fatal(err)
	}
	f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+2:]))
	ut, _ := strconv.Atoi(f[11])
	st, _ := strconv.Atoi(f[12])
	status, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	for _, l := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			peakKiB, _ = strconv.Atoi(strings.Fields(v)[0])
		}
	}
	return time.Duration(ut+st) * time.Second / 100, peakKiB
}

// BenchmarkRollout: a MachineRollout over 200 played hosts (Machines and
// Nodes on the real API server, each operation InProgress then Complete
// 0.3 s later with a fresh Ready), 10% at a time, a gate of one second,
// run by the real bin/unbounded-controller. Reported: the controller's
// API requests per host, its CPU time and peak memory, the rollout's
// time, and the gap from a host's gate passing (its Ready + the gate) to
// the next host's operation, p50 and max.
func BenchmarkRollout(b *testing.B) {
	e := clustertest.Get(b)
	const n = 200
	for b.Loop() {
		prefix := clustertest.UniqueName("bro")
		hosts := benchHosts(b, e, prefix, n)
		play := playHostsB(b, e, prefix)
		p := runController(b)
		c := clientForB(b, e)
		before, _ := p.requests()
		cpu0, _ := p.usage(b)
		pct := intstr.FromString("10%")
		ro := &v1alpha3.MachineRollout{ObjectMeta: metav1.ObjectMeta{Name: prefix + "-repave"}, Spec: v1alpha3.MachineRolloutSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"pool": prefix}}, Operation: v1alpha3.OperationRepave,
			MaxUnavailable: &pct, ReadySeconds: 1,
		}}
		begin := time.Now()
		if err := c.Create(context.Background(), ro); err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
		for {
			got := &v1alpha3.MachineRollout{}
			if err := c.Get(ctx, client.ObjectKeyFromObject(ro), got); err == nil && got.Status.Phase == v1alpha3.RolloutComplete {
				break
			}
			if ctx.Err() != nil {
				b.Fatalf("rollout not complete within 15 min: %+v", got.Status)
			}
			time.Sleep(200 * time.Millisecond)
		}
		cancel()
		took := time.Since(begin)
		after, _ := p.requests()
		cpu1, peak := p.usage(b)
		gaps := play.gaps(time.Second)
		if len(gaps) == 0 || len(hosts) != n {
			b.Fatalf("no gap measured (%d operations seen)", len(play.seenAt))
		}
		b.ReportMetric((after-before)/n, "requests/host")
		b.ReportMetric((cpu1 - cpu0).Seconds(), "controller-cpu-s")
		b.ReportMetric(float64(peak)/1024, "controller-peak-MiB")
		b.ReportMetric(took.Seconds(), "rollout-s")
		b.ReportMetric(float64(gaps[len(gaps)/2].Milliseconds()), "gate-to-next-ms")
		b.ReportMetric(float64(gaps[len(gaps)-1].Milliseconds()), "gate-to-next-max-ms")
	}
}

// benchHosts is hostsFixture for a benchmark.
func benchHosts(b *testing.B, e *clustertest.Env, prefix string, n int) []string {
	ctx := context.Background()
	kc := e.Client(b)
	machines := e.Machines(b)
	var names []string
	for i := range n {
		name := fmt.Sprintf("%s-h%03d", prefix, i+1)
		names = append(names, name)
		if _, err := machines.Create(ctx, &v1alpha3.Machine{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"pool": prefix}}}); err != nil {
			b.Fatal(err)
		}
		if _, err := kc.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		e.WriteNodeReady(b, name)
	}
	b.Cleanup(func() {
		for _, name := range names {
			e.DeleteMachine(name)
			kc.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{})
		}
	})
	return names
}

func clientForB(b *testing.B, e *clustertest.Env) client.Client {
	s, err := Scheme()
	if err != nil {
		b.Fatal(err)
	}
	c, err := client.New(e.Admin, client.Options{Scheme: s})
	if err != nil {
		b.Fatal(err)
	}
	return c
}

// benchPlay plays the hosts as hostsPlay does, recording when each
// operation was seen and when each Node was written Ready.
type benchPlay struct {
	*hostsPlay
	seenAt, readyAt []time.Time
}

func playHostsB(b *testing.B, e *clustertest.Env, prefix string) *benchPlay {
	bp := &benchPlay{}
	bp.hostsPlay = playHostsWith(b, e, prefix, 300*time.Millisecond, func(*v1alpha3.MachineOperation) string { return "" },
		func() { bp.mu.Lock(); bp.seenAt = append(bp.seenAt, time.Now()); bp.mu.Unlock() },
		func() { bp.mu.Lock(); bp.readyAt = append(bp.readyAt, time.Now()); bp.mu.Unlock() })
	return bp
}

// gaps: for each operation seen after the first batch, the time from the
// latest gate that passed before it (a Ready + gate) to it, sorted.
func (bp *benchPlay) gaps(gate time.Duration) []time.Duration {
	bp.mu.Lock()
	defer bp.mu.Unlock()
	var gaps []time.Duration
	for _, s := range bp.seenAt {
		var last time.Time
		for _, r := range bp.readyAt {
			if p := r.Add(gate); p.Before(s) && p.After(last) {
				last = p
			}
		}
		if !last.IsZero() {
			gaps = append(gaps, s.Sub(last))
		}
	}
	slices.Sort(gaps)
	return gaps
}

// BenchmarkCSRApproval: 100 hosts' daemons each ask for their client
// certificate with their machine's bootstrap token, at once, and the real
// bin/unbounded-controller judges them. Reported: the time from each
// request's creation to its approval, p50 and p99.
func BenchmarkCSRApproval(b *testing.B) {
	e := clustertest.Get(b)
	const n = 100
	for b.Loop() {
		prefix := clustertest.UniqueName("bcsr")
		ctx := context.Background()
		kc := e.Client(b)
		machines := e.Machines(b)
		var clients []kubernetes.Interface
		var names []string
		for i := range n {
			name := fmt.Sprintf("%s-m%03d", prefix, i+1)
			if _, err := machines.Create(ctx, &v1alpha3.Machine{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { e.DeleteMachine(name) })
			token, _ := e.BootstrapToken(b, name)
			clients = append(clients, kubernetes.NewForConfigOrDie(e.TokenConfig(token)))
			names = append(names, name)
		}
		b.Cleanup(func() {
			for _, m := range names {
				kc.CertificatesV1().CertificateSigningRequests().Delete(context.Background(), m+"-client", metav1.DeleteOptions{})
			}
		})
		runController(b)
		w, err := kc.CertificatesV1().CertificateSigningRequests().Watch(ctx, metav1.ListOptions{})
		if err != nil {
			b.Fatal(err)
		}
		created := map[string]time.Time{}
		var mu sync.Mutex
		var wg sync.WaitGroup
		for i, name := range names {
			wg.Go(func() {
				mu.Lock()
				created[name+"-client"] = time.Now()
				mu.Unlock()
				agentRequest(b, clients[i], name+"-client", identity.AgentUserName(name),
					[]certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth})
			})
		}
		wg.Wait()
		var lat []time.Duration
		timeout := time.After(2 * time.Minute)
		for len(lat) < n {
			select {
			case ev := <-w.ResultChan():
				csr, ok := ev.Object.(*certificatesv1.CertificateSigningRequest)
				if !ok || !strings.HasPrefix(csr.Name, prefix) {
					continue
				}
				for _, c := range csr.Status.Conditions {
					if c.Type == certificatesv1.CertificateDenied {
						b.Fatalf("%s denied: %s", csr.Name, c.Message)
					}
					if c.Type == certificatesv1.CertificateApproved {
						mu.Lock()
						if t, ok := created[csr.Name]; ok {
							lat = append(lat, time.Since(t))
							delete(created, csr.Name)
						}
						mu.Unlock()
					}
				}
			case <-timeout:
				b.Fatalf("%d of %d requests approved within 2 min", len(lat), n)
			}
		}
		w.Stop()
		slices.Sort(lat)
		b.ReportMetric(float64(lat[len(lat)/2].Milliseconds()), "approval-p50-ms")
		b.ReportMetric(float64(lat[len(lat)*99/100].Milliseconds()), "approval-p99-ms")
	}
}
