package system_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
	"unbounded-cloud.io/agent/lib/fence/record"
	"unbounded-cloud.io/agent/lib/health"
	"unbounded-cloud.io/agent/tests/system/harness"
)

// Shared by the restart and health scenarios (restart_*_test.go,
// health_*_test.go), all on the first-boot fixture.

const (
	restartUnit = "unbounded-restart.service"
	healthUnit  = "unbounded-health.service"
	nodeTarget  = "unbounded-node.target"
	nspawnKube1 = "systemd-nspawn@kube1.service"
	kubeletUnit = "unbounded-kubelet.service"
	containerd  = "unbounded-containerd.service"
)

// healthTimings are the test's drop-ins for the health timer and the
// restart, in /etc (an operator's place): the product's defaults (30 s
// between checks, 3 failures, 2 restarts, 5 min restart wait) would make
// each scenario last many minutes.
type healthTimings struct {
	interval       time.Duration
	failures       int
	maxRestarts    int
	restartTimeout time.Duration
}

func (h healthTimings) write(f *firstBoot) {
	f.m.WriteFile("/etc/systemd/system/unbounded-health.timer.d/50-test.conf", fmt.Appendf(nil,
		"# tests/system: checks every %s\n[Timer]\nOnBootSec=5s\nOnUnitInactiveSec=%s\nAccuracySec=100ms\n",
		h.interval, secs(h.interval)), 0o644)
	f.m.WriteFile("/etc/systemd/system/unbounded-health.service.d/50-test.conf", fmt.Appendf(nil,
		"[Service]\nExecStart=\nExecStart=/usr/libexec/unbounded/health --failures=%d --max-restarts=%d --boot-wait=3m\n",
		h.failures, h.maxRestarts), 0o644)
	f.m.WriteFile("/etc/systemd/system/unbounded-restart.service.d/50-test.conf", fmt.Appendf(nil,
		"[Service]\nExecStart=\nExecStart=/usr/libexec/unbounded/restart --timeout=%s\n", h.restartTimeout), 0o644)
}

// waitHealthBootChecked waits for health's first check of this boot (the
// boot's verdict, which waits up to --boot-wait for the node) to be done:
// a fault a scenario starts before it would be judged by that verdict
// (exit 1, "did not become healthy within ..., the first check of this boot"), not by the failure count and the
// restarts the scenario is about. Health's checks skip while an operation
// runs, so after a first boot and a restart by hand that check may still
// be owed.
func waitHealthBootChecked(t *testing.T, f *firstBoot) {
	t.Helper()
	waitUntil(t, 2*time.Minute, "health's first check of this boot", func(context.Context) (bool, error) {
		data, err := f.m.ReadFile("/run/unbounded/health.json")
		if errors.Is(err, os.ErrNotExist) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		var st health.State
		if err := json.Unmarshal(data, &st); err != nil {
			return false, fmt.Errorf("health.json: %w", err) // written atomically: never half
		}
		return st.BootChecked, nil
	})
}

func secs(d time.Duration) string { return strconv.FormatFloat(d.Seconds(), 'f', -1, 64) + "s" }

// allocatedHost creates the Machine of f bound to allocation uid before
// the host boots (as an allocation controller would; bootstrap registers
// no allocation).
func allocatedHost(t *testing.T, f *firstBoot, uid string) {
	t.Helper()
	in := &v1alpha3.Machine{
		ObjectMeta: metav1.ObjectMeta{Name: f.name},
		Spec: v1alpha3.MachineSpec{Allocation: &v1alpha3.AllocationRef{
			Name: "alloc-" + f.name, UID: uid}},
	}
	if err := f.env.api.Post().Resource(v1alpha3.ResourceMachines).Body(in).Do(context.Background()).Error(); err != nil {
		t.Fatalf("create Machine: %v", err)
	}
}

// setFenced sets the allocation's fence flag on the Machine (a spec
// change: a new generation).
func setFenced(t *testing.T, f *firstBoot, fenced bool) {
	t.Helper()
	ctx := context.Background()
	for range 5 {
		cur := f.machine(t)
		cur.Spec.Allocation.Fenced = fenced
		err := f.env.api.Put().Resource(v1alpha3.ResourceMachines).Name(f.name).Body(cur).Do(ctx).Error()
		if err == nil {
			return
		}
		t.Logf("set fenced=%v: %v (retrying)", fenced, err)
	}
	t.Fatalf("could not set fenced=%v on Machine %s", fenced, f.name)
}

// mainPID is a unit's MainPID on the test host ("0" when not running).
func mainPID(t *testing.T, m *harness.Machine, unit string) string {
	t.Helper()
	return showProps(t, m, unit, "MainPID")["MainPID"]
}

// hostIdentity is what tells the test host's own boot: its PID 1 (the
// container's leader as the VM sees it) and its boot ID.
type hostIdentity struct {
	leader int
	boot   string
	start  string // systemd's (PID 1's) start timestamp
}

func hostIdentityOf(t *testing.T, m *harness.Machine) hostIdentity {
	t.Helper()
	b, err := m.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		t.Fatal(err)
	}
	out, _ := m.Systemctl("show", "-p", "UserspaceTimestampMonotonic", "--value")
	return hostIdentity{leader: m.Leader(), boot: strings.TrimSpace(string(b)), start: strings.TrimSpace(out)}
}

// wantSameHost: a restart of the node stack never restarts the host.
func wantSameHost(t *testing.T, m *harness.Machine, before hostIdentity) {
	t.Helper()
	if now := hostIdentityOf(t, m); now != before {
		t.Errorf("the test host restarted: before %+v, after %+v", before, now)
	}
}

// nodeUID is the Node's UID (it must not change: the Node stays
// registered across a restart).
func nodeUID(t *testing.T, f *firstBoot) types.UID {
	t.Helper()
	n, err := f.env.kube.CoreV1().Nodes().Get(context.Background(), f.name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("Node %s: %v", f.name, err)
	}
	return n.UID
}

// unitStartedAt is when unit's main process last started on the test
// host (systemd's ExecMainStartTimestamp, to the second). A heartbeat at
// or after the start of the kubelet's unit (none) or of the machine that
// runs it (nspawn) was written by the kubelet that runs now.
func unitStartedAt(t *testing.T, m *harness.Machine, unit string) time.Time {
	t.Helper()
	out, err := m.Systemctl("show", "--timestamp=unix", "-p", "ExecMainStartTimestamp", "--value", unit)
	sec, perr := strconv.ParseInt(strings.TrimPrefix(strings.TrimSpace(out), "@"), 10, 64)
	if err != nil || perr != nil || sec == 0 {
		t.Fatalf("start of %s: %q %v %v", unit, out, err, perr)
	}
	return time.Unix(sec, 0)
}

// waitNodeReadySince waits until the Node (the same object, uid) reports
// Ready with a heartbeat at or after since. Since must be a moment before
// the kubelet that should report it started (unitStartedAt, or a moment
// taken before the node was started): the kubelet writes an unchanged
// Node only every nodeStatusReportFrequency (5 min), so its first write
// after its start may be the only one for minutes, and a moment taken
// after that write is never reached in time.
func waitNodeReadySince(t *testing.T, f *firstBoot, uid types.UID, since time.Time, timeout time.Duration) {
	t.Helper()
	begin := time.Now()
	waitUntil(t, timeout, "Node Ready reported by the restarted kubelet", func(ctx context.Context) (bool, error) {
		n, err := f.env.kube.CoreV1().Nodes().Get(ctx, f.name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		if n.UID != uid {
			return false, fmt.Errorf("the Node was deleted and registered again (uid %s, was %s)", n.UID, uid)
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady {
				return c.Status == corev1.ConditionTrue && !c.LastHeartbeatTime.Time.Before(since.Truncate(time.Second)), nil
			}
		}
		return false, nil
	})
	t.Logf("Node %s Ready again %v after the wait began", f.name, time.Since(begin).Round(time.Millisecond))
}

// fenceRecord reads /run/unbounded/fence.json on the test host.
func fenceRecord(t *testing.T, m *harness.Machine) *record.Record {
	t.Helper()
	data, err := m.ReadFile("/run/unbounded/fence.json")
	if err != nil {
		return nil
	}
	var r record.Record
	if err := json.Unmarshal(data, &r); err != nil {
		t.Fatalf("fence record: %v\n%s", err, data)
	}
	return &r
}

// journalCount counts the lines of unit's journal in this boot that
// contain s.
func journalCount(m *harness.Machine, unit, s string) int {
	return strings.Count(m.Journal(unit), s)
}

// waitOpFinished waits, bounded, until the operation is Complete or Failed.
func waitOpFinished(t *testing.T, f *firstBoot, name string, timeout time.Duration) *v1alpha3.MachineOperation {
	t.Helper()
	var op v1alpha3.MachineOperation
	waitUntil(t, timeout, "operation "+name+" finished", func(ctx context.Context) (bool, error) {
		op = v1alpha3.MachineOperation{}
		err := f.env.api.Get().Resource(v1alpha3.ResourceMachineOperations).Name(name).Do(ctx).Into(&op)
		return err == nil && op.Status.State.Finished(), nil
	})
	return &op
}

// futureServerCert is a serving certificate for 127.0.0.1, signed by the
// cluster CA, valid only from a year from now: to a host, what the real
// API server's certificate is when the host's clock is a year behind.
func futureServerCert(t *testing.T, f *firstBoot) *tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(now.UnixNano()),
		Subject:      pkix.Name{CommonName: "kube-apiserver"},
		NotBefore:    now.AddDate(1, 0, 0),
		NotAfter:     now.AddDate(2, 0, 0),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		DNSNames:     []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, f.env.CACert(t), key.Public(), f.env.CAKey(t))
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// logJournalsOnFailure logs the journals of the units these scenarios are
// about when the test fails (before the fixture stops the host).
func logJournalsOnFailure(t *testing.T, f *firstBoot) {
	t.Cleanup(func() {
		if !t.Failed() || f.m.Leader() == 0 {
			return
		}
		for _, u := range []string{healthUnit, restartUnit, fenceUnit, daemonUnit} {
			out, _ := f.m.Run("sh", "-c", "journalctl -b --no-pager -q -o short-precise -u "+u+" | tail -n 60")
			t.Logf("journal of %s (last lines):\n%s", u, out)
		}
	})
}

// progLog is what a one-shot wrote in this boot, found by its program's
// name (SYSLOG_IDENTIFIER) rather than by unit: journald attributes a
// message sent over its native socket to a unit by reading the sender's
// /proc/PID/cgroup, and a one-shot that exits right after its last line
// (health, every few seconds) is often gone by then, so `journalctl -u`
// misses its lines. systemd's own lines about the unit are in
// m.Journal(unit).
func progLog(m *harness.Machine, prog string) string {
	out, _ := m.Run("journalctl", "--no-pager", "-b", "-o", "cat", "-t", prog)
	return out
}

// logRestartTimeline logs, with microsecond times, what the host's journal
// and the node machine's (machine, its slot) say between since and now
// about a restart: the restart unit's lines, the node unit's stop and
// start (the graceful poweroff's), the fence, and in the machine its
// systemd's and the kubelet's lines on shutdown and start. Where the
// restart's seconds go (issue 41); only logged.
func logRestartTimeline(t *testing.T, m *harness.Machine, since time.Time, nodeUnit, machine string) {
	t.Helper()
	m.SyncJournal()
	at := since.Add(-time.Second).Format("2006-01-02 15:04:05")
	host, err := m.Run("journalctl", "--no-pager", "-o", "short-precise", "--since", at,
		"-u", restartUnit, "-u", nodeUnit, "-u", fenceUnit, "-u", "systemd-machined.service")
	if err != nil {
		t.Logf("restart timeline: the host's journal: %v", err)
	}
	t.Logf("restart timeline, the host's journal:\n%s", host)
	if machine == "" {
		return
	}
	node, err := m.Run("sh", "-c", `journalctl --no-pager -o short-precise -M "$1" --since "$2" -t systemd -t kubelet -t systemd-logind -t systemd-shutdown 2>&1 |
		grep -E 'Shutdown manager|shutdown|Stopp|Stopped|Reached target|Startup finished|Started|Sending SIGTERM|Waiting for process|Killing|Power|inhibit|Successfully registered node|NodeReady|Starting' | head -n 150`, "sh", machine, at)
	if err != nil {
		t.Logf("restart timeline: the machine's journal: %v", err)
	}
	t.Logf("restart timeline, machine %s's journal:\n%s", machine, node)
}
