package none

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"unbounded-cloud.io/agent/lib/modes"
	"unbounded-cloud.io/agent/lib/modes/modestest"
	"unbounded-cloud.io/agent/lib/state"
	"unbounded-cloud.io/agent/lib/unitnames"
)

// repaveHost is a host whose node stack runs version 1.36.3 as slot
// kube1, with a recorder of what the repave does in order (systemd
// calls, the fence, the network cleanup, health waits).
type repaveHost struct {
	m   *Mode
	sd  *modestest.Systemd
	ctx context.Context
	// unhealthy are the slots whose health wait fails.
	unhealthy map[string]bool
	fenceErr  error
	crashAt   string
	crashes   []string
}

type crashed struct{ point string }

func newRepaveHost(t *testing.T) *repaveHost {
	t.Helper()
	m, sd, _ := newMode(t)
	h := &repaveHost{m: m, sd: sd, ctx: context.Background(), unhealthy: map[string]bool{}}
	m.CleanNetwork = func(context.Context) error { sd.Calls = append(sd.Calls, "clean network"); return nil }
	if err := m.Prepare(h.ctx, slot(t, "1.36.3")); err != nil {
		t.Fatal(err)
	}
	if err := m.Start(h.ctx, "kube1"); err != nil {
		t.Fatal(err)
	}
	sd.Calls = nil
	return h
}

func (h *repaveHost) hooks() modes.RepaveHooks {
	return modes.RepaveHooks{
		Fence: func(context.Context) error { h.sd.Calls = append(h.sd.Calls, "fence"); return h.fenceErr },
		Healthy: func(_ context.Context, slot string) error {
			h.sd.Calls = append(h.sd.Calls, "healthy "+slot)
			if h.unhealthy[slot] {
				return errors.New("kubelet healthz: connection refused")
			}
			return nil
		},
		Crash: func(p string) {
			h.crashes = append(h.crashes, p)
			if p == h.crashAt {
				panic(crashed{p})
			}
		},
	}
}

// repave runs Repave and reports a crash at h.crashAt as crashed=true (the
// process would have died there; the journal is what survives).
func (h *repaveHost) repave(s modes.Slot) (err error, crash bool) {
	defer func() {
		if r := recover(); r != nil {
			if _, ok := r.(crashed); !ok {
				panic(r)
			}
			crash = true
		}
	}()
	return h.m.Repave(h.ctx, "kube1", s, h.hooks()), false
}

func newSlot(t *testing.T, version, cidr string) modes.Slot {
	s := slot(t, version)
	s.Name = "kube2"
	s.Node.PodCIDR = cidr
	return s
}

func (h *repaveHost) versions(t *testing.T) []string {
	t.Helper()
	ents, err := os.ReadDir(h.m.Paths.VersionsDir())
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

func (h *repaveHost) liveCNI(t *testing.T) string {
	data, _ := os.ReadFile(h.m.Paths.Join("/etc/cni/net.d/10-unbounded-bridge.conflist"))
	return string(data)
}

func journalStep(t *testing.T, m *Mode) string {
	t.Helper()
	if j := readJournal(t, m); j != nil {
		return j.Step
	}
	return ""
}

// readJournal is the repave's journal, nil when there is none.
func readJournal(t *testing.T, m *Mode) *repaveJournal {
	t.Helper()
	var j repaveJournal
	ok, err := state.ReadJournal(m.Paths, JournalName, &j)
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		return nil
	}
	return &j
}

func TestRepaveInstallsBesideStopsFlipsStartsAndKeepsTheOldVersionUntilRemoveSuperseded(t *testing.T) {
	h := newRepaveHost(t)
	if !strings.Contains(h.liveCNI(t), "10.244.1.0/24") {
		t.Fatalf("live CNI config before the repave:\n%s", h.liveCNI(t))
	}
	s := newSlot(t, "1.36.4", "10.244.9.0/24")
	if err, _ := h.repave(s); err != nil {
		t.Fatal(err)
	}
	want := []string{"stop " + KubeletUnit, "stop " + ContainerdUnit, "stop " + unitnames.LocalDNS, "clean network", "fence",
		"reset-failed " + ContainerdUnit, "reset-failed " + KubeletUnit,
		"reload", "start " + ContainerdUnit, "start " + KubeletUnit, "healthy kube2"}
	if !slices.Equal(h.sd.Calls, want) {
		t.Errorf("repave did\n %q\nwant\n %q", h.sd.Calls, want)
	}
	if cur, _ := h.m.CurrentVersion(); cur != "1.36.4" {
		t.Errorf("current -> %q", cur)
	}
	if want := CrashPoints[:len(CrashPoints)-1]; !slices.Equal(h.crashes, want) {
		t.Errorf("crash points passed: %q, want CrashPoints %q", h.crashes, want)
	}
	if !strings.Contains(h.liveCNI(t), "10.244.9.0/24") {
		t.Errorf("the live CNI config is not the new version's:\n%s", h.liveCNI(t))
	}
	// The old version stays (a rollback target) until the caller has
	// recorded the new applied config.
	if got := h.versions(t); !slices.Equal(got, []string{"1.36.3", "1.36.4", "current"}) {
		t.Errorf("versions after the repave: %q", got)
	}
	if st := journalStep(t, h.m); st != "" {
		t.Errorf("journal left at step %q", st)
	}
	// The caller crashed before recording and runs again: done already.
	h.sd.Calls = nil
	if err, _ := h.repave(s); err != nil || len(h.sd.Calls) != 0 {
		t.Errorf("repave again with the same arguments: %v, did %q", err, h.sd.Calls)
	}
	if err := h.m.RemoveSuperseded(h.ctx); err != nil {
		t.Fatal(err)
	}
	if got := h.versions(t); !slices.Equal(got, []string{"1.36.4", "current"}) {
		t.Errorf("versions after RemoveSuperseded: %q", got)
	}
}

// A repave without its fence or its health wait fails closed: refused
// before anything changes (no version built, no journal, no call).
func TestRepaveWithoutItsHooksChangesNothing(t *testing.T) {
	h := newRepaveHost(t)
	s := newSlot(t, "1.36.4", "10.244.9.0/24")
	for _, hk := range []modes.RepaveHooks{{}, {Fence: func(context.Context) error { return nil }}, {Healthy: func(context.Context, string) error { return nil }}} {
		err := h.m.Repave(h.ctx, "kube1", s, hk)
		if !errors.Is(err, modes.ErrHookMissing) || len(h.sd.Calls) != 0 {
			t.Errorf("hooks %+v: %v, calls %q; want ErrHookMissing and no call", hk, err, h.sd.Calls)
		}
	}
	if _, err := os.Stat(h.m.Paths.Journal(JournalName)); !os.IsNotExist(err) {
		t.Errorf("journal written without hooks: %v", err)
	}
	if cur, _ := h.m.CurrentVersion(); cur != "1.36.3" {
		t.Errorf("current is %s, want 1.36.3 untouched", cur)
	}
}

func TestRepaveToTheSameVersionBuildsASecondDirectoryNeverTheRunningOne(t *testing.T) {
	h := newRepaveHost(t)
	s := newSlot(t, "1.36.3", "10.244.2.0/24")
	s.Node.Labels = map[string]string{"changed": "yes"}
	if err, _ := h.repave(s); err != nil {
		t.Fatal(err)
	}
	if cur, _ := h.m.CurrentVersion(); cur != "1.36.3_2" {
		t.Errorf("current -> %q, want 1.36.3_2", cur)
	}
	env, _ := os.ReadFile(filepath.Join(h.m.VersionDir("1.36.3_2"), "etc/kubelet/kubelet.env"))
	if !strings.Contains(string(env), "changed=yes") {
		t.Errorf("the new version's kubelet flags lack the new label:\n%s", env)
	}
	// The next repave (another caller, back to kube1) takes the plain
	// name again, and removes the superseded one first.
	s.Name = "kube1"
	s.Node.Labels = nil
	if err := h.m.Repave(h.ctx, "kube2", s, h.hooks()); err != nil {
		t.Fatal(err)
	}
	if cur, _ := h.m.CurrentVersion(); cur != "1.36.3" {
		t.Errorf("current -> %q, want 1.36.3", cur)
	}
	if got := h.versions(t); !slices.Equal(got, []string{"1.36.3", "1.36.3_2", "current"}) {
		t.Errorf("versions: %q", got)
	}
}

func TestRepaveThatNeverBecomesHealthyFlipsBackAndStartsTheOldVersionWithItsConfiguration(t *testing.T) {
	h := newRepaveHost(t)
	old, _ := os.ReadFile(filepath.Join(h.m.VersionDir("1.36.3"), "etc/kubelet/kubelet.env"))
	h.unhealthy["kube2"] = true
	err, _ := h.repave(newSlot(t, "1.36.4", "10.244.9.0/24"))
	if !errors.Is(err, modes.ErrRolledBack) {
		t.Fatalf("repave: %v, want ErrRolledBack", err)
	}
	for _, want := range []string{"1.36.4 did not become healthy", "connection refused", "rolled back", "version 1.36.3 runs", "configuration it ran", "1.36.4 removed"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
	rf := []string{"reset-failed " + ContainerdUnit, "reset-failed " + KubeletUnit}
	want := slices.Concat([]string{"stop " + KubeletUnit, "stop " + ContainerdUnit, "stop " + unitnames.LocalDNS, "clean network", "fence"}, rf,
		[]string{"reload", "start " + ContainerdUnit, "start " + KubeletUnit, "healthy kube2",
			"stop " + KubeletUnit, "stop " + ContainerdUnit, "stop " + unitnames.LocalDNS, "clean network", "fence"}, rf,
		[]string{"reload", "start " + ContainerdUnit, "start " + KubeletUnit, "healthy kube1"})
	if !slices.Equal(h.sd.Calls, want) {
		t.Errorf("repave did\n %q\nwant\n %q", h.sd.Calls, want)
	}
	if cur, _ := h.m.CurrentVersion(); cur != "1.36.3" {
		t.Errorf("current -> %q after the rollback", cur)
	}
	if env, _ := os.ReadFile(filepath.Join(h.m.VersionDir("1.36.3"), "etc/kubelet/kubelet.env")); string(env) != string(old) {
		t.Errorf("the old version's flags changed")
	}
	if !strings.Contains(h.liveCNI(t), "10.244.1.0/24") || strings.Contains(h.liveCNI(t), "10.244.9.0/24") {
		t.Errorf("the live CNI config is not the old version's again:\n%s", h.liveCNI(t))
	}
	if got := h.versions(t); !slices.Equal(got, []string{"1.36.3", "current"}) {
		t.Errorf("versions after the rollback: %q", got)
	}
	if st := journalStep(t, h.m); st != "" {
		t.Errorf("journal left at %q", st)
	}
}

// The fence runs once the old kubelet is stopped; a refusal starts
// nothing: not the new version, and not the old one either (the
// rollback's start is fenced too), so the rollback fails and says so.
func TestRepaveRefusedByTheFenceStartsNothing(t *testing.T) {
	h := newRepaveHost(t)
	h.fenceErr = errors.New("fence: the Machine is fenced")
	s := newSlot(t, "1.36.4", "10.244.9.0/24")
	err, _ := h.repave(s)
	if err == nil || errors.Is(err, modes.ErrRolledBack) || !strings.Contains(err.Error(), "Machine is fenced") || !strings.Contains(err.Error(), "rollback to version 1.36.3 failed") {
		t.Fatalf("repave: %v, want a failed rollback naming the refusal", err)
	}
	want := []string{"stop " + KubeletUnit, "stop " + ContainerdUnit, "stop " + unitnames.LocalDNS, "clean network", "fence",
		"stop " + KubeletUnit, "stop " + ContainerdUnit, "stop " + unitnames.LocalDNS, "clean network", "fence"}
	if !slices.Equal(h.sd.Calls, want) {
		t.Errorf("a refused repave did\n %q\nwant\n %q", h.sd.Calls, want)
	}
	if cur, _ := h.m.CurrentVersion(); cur != "1.36.3" {
		t.Errorf("current -> %q", cur)
	}
	// Allowed again: the next call finishes the rollback.
	h.fenceErr = nil
	if err, _ := h.repave(s); !errors.Is(err, modes.ErrRolledBack) || !strings.Contains(err.Error(), "Machine is fenced") {
		t.Fatalf("repave once allowed: %v, want the rollback finished", err)
	}
	if got := h.versions(t); !slices.Equal(got, []string{"1.36.3", "current"}) {
		t.Errorf("versions: %q", got)
	}
}

func TestRepaveWhoseRollbackFailsSaysSoAndRollsBackOnTheNextCall(t *testing.T) {
	h := newRepaveHost(t)
	h.unhealthy["kube1"], h.unhealthy["kube2"] = true, true
	s := newSlot(t, "1.36.4", "10.244.9.0/24")
	err, _ := h.repave(s)
	if err == nil || errors.Is(err, modes.ErrRolledBack) || !strings.Contains(err.Error(), "rollback to version 1.36.3 failed") {
		t.Fatalf("repave: %v, want a failed rollback not wrapping ErrRolledBack", err)
	}
	if j := readJournal(t, h.m); j == nil || j.RollingBack == "" || !strings.HasPrefix(j.Step, stepFlipped+" undo failed") {
		t.Errorf("journal %+v, want it rolling back, the undo of %s failed", j, stepFlipped)
	}
	h.unhealthy["kube1"] = false
	err, _ = h.repave(s)
	if !errors.Is(err, modes.ErrRolledBack) || !strings.Contains(err.Error(), "did not become healthy") {
		t.Fatalf("repave again: %v, want the rollback finished with the first cause", err)
	}
	if cur, _ := h.m.CurrentVersion(); cur != "1.36.3" {
		t.Errorf("current -> %q", cur)
	}
}

// Killed at each crash point and run again with the same arguments, a
// repave ends with exactly one version current, the stack started and
// healthy, and (for a repave that cannot succeed) the old one back.
func TestRepaveKilledAtEveryCrashPointConvergesWhenRunAgain(t *testing.T) {
	points := CrashPoints[:len(CrashPoints)-1] // all but the rollback's
	for _, p := range points {
		t.Run(p, func(t *testing.T) {
			h := newRepaveHost(t)
			h.crashAt = p
			s := newSlot(t, "1.36.4", "10.244.9.0/24")
			if err, crash := h.repave(s); !crash {
				t.Fatalf("no crash at %s: %v", p, err)
			}
			h.crashAt = ""
			h.sd.Calls = nil
			if err, _ := h.repave(s); err != nil {
				t.Fatal(err)
			}
			if cur, _ := h.m.CurrentVersion(); cur != "1.36.4" {
				t.Errorf("current -> %q", cur)
			}
			if p != "repave/after-healthy" && !slices.Contains(h.sd.Calls, "healthy kube2") {
				t.Errorf("the resumed repave did not wait healthy: %q", h.sd.Calls)
			}
			for _, u := range []string{ContainerdUnit, KubeletUnit} {
				if st, _ := h.sd.ActiveState(h.ctx, u); st != "active" {
					t.Errorf("%s is %s", u, st)
				}
			}
			if err := h.m.RemoveSuperseded(h.ctx); err != nil {
				t.Fatal(err)
			}
			if got := h.versions(t); !slices.Equal(got, []string{"1.36.4", "current"}) {
				t.Errorf("versions: %q", got)
			}
		})
	}
	// Up to the health wait, which fails, then the rollback's own.
	for _, p := range slices.Concat(points[:len(points)-1], []string{"repave/after-rollback-begun"}, RollbackCrashPoints) {
		t.Run("rollback/"+p, func(t *testing.T) {
			h := newRepaveHost(t)
			h.unhealthy["kube2"] = true
			h.crashAt = p
			s := newSlot(t, "1.36.4", "10.244.9.0/24")
			if err, crash := h.repave(s); !crash {
				t.Fatalf("no crash at %s: %v", p, err)
			}
			h.crashAt = ""
			if err, _ := h.repave(s); !errors.Is(err, modes.ErrRolledBack) {
				t.Fatalf("repave again: %v, want ErrRolledBack", err)
			}
			if cur, _ := h.m.CurrentVersion(); cur != "1.36.3" {
				t.Errorf("current -> %q", cur)
			}
			if got := h.versions(t); !slices.Equal(got, []string{"1.36.3", "current"}) {
				t.Errorf("versions: %q", got)
			}
			if !strings.Contains(h.liveCNI(t), "10.244.1.0/24") {
				t.Errorf("live CNI config not the old one:\n%s", h.liveCNI(t))
			}
			for _, u := range []string{ContainerdUnit, KubeletUnit} {
				if st, _ := h.sd.ActiveState(h.ctx, u); st != "active" {
					t.Errorf("%s is %s", u, st)
				}
			}
		})
	}
}

func TestRepaveOfOtherArgumentsRollsBackTheUnfinishedOneFirst(t *testing.T) {
	h := newRepaveHost(t)
	h.crashAt = "repave/after-flipped"
	if _, crash := h.repave(newSlot(t, "1.36.4", "10.244.9.0/24")); !crash {
		t.Fatal("no crash")
	}
	h.crashAt = ""
	if err, _ := h.repave(newSlot(t, "1.36.5", "10.244.9.0/24")); err != nil {
		t.Fatal(err)
	}
	if cur, _ := h.m.CurrentVersion(); cur != "1.36.5" {
		t.Errorf("current -> %q", cur)
	}
	if got := h.versions(t); !slices.Equal(got, []string{"1.36.3", "1.36.5", "current"}) {
		t.Errorf("versions: %q (1.36.4 should be gone, 1.36.3 kept until RemoveSuperseded)", got)
	}
}

func TestRepaveRefusesACorruptJournalAndTouchesNothing(t *testing.T) {
	h := newRepaveHost(t)
	if err := state.WriteJournal(h.m.Paths, JournalName, map[string]string{"unknown": "x"}); err != nil {
		t.Fatal(err)
	}
	err, _ := h.repave(newSlot(t, "1.36.4", "10.244.9.0/24"))
	if err == nil || !errors.Is(err, state.ErrCorrupt) {
		t.Fatalf("repave over a corrupt journal: %v", err)
	}
	if len(h.sd.Calls) != 0 {
		t.Errorf("did %q", h.sd.Calls)
	}
}

func TestCleanHostNetworkRemovesPodNamespacesBridgeReservationsAndCNIChains(t *testing.T) {
	m, _, p := newMode(t)
	os.MkdirAll(p.Join("/run/netns"), 0o755)
	for _, n := range []string{"cni-1234", "cni-5678", "admin-ns"} {
		os.WriteFile(p.Join("/run/netns/"+n), nil, 0o644)
	}
	os.MkdirAll(p.Join("/var/lib/cni/networks/unbounded"), 0o755)
	os.WriteFile(p.Join("/var/lib/cni/networks/unbounded/10.244.1.5"), []byte("abc"), 0o644)
	m.SysClassNet = t.TempDir()
	os.MkdirAll(filepath.Join(m.SysClassNet, "cni0/brif/veth1a2b"), 0o755)
	os.MkdirAll(filepath.Join(m.SysClassNet, "cni0/brif/veth3c4d"), 0o755)
	var unmounted, ran, deleted []string
	m.DeleteLink = func(n string) error { deleted = append(deleted, n); return nil }
	m.Unmount = func(t string) error { unmounted = append(unmounted, p.Rel(t)); return nil }
	m.Command = func(_ context.Context, stdin []byte, name string, args ...string) ([]byte, error) {
		cmd := name + " " + strings.Join(args, " ")
		ran = append(ran, cmd)
		switch cmd {
		case "iptables -w -t nat -S":
			return []byte(natListed), nil
		case "iptables -w -t filter -S", "ip6tables -w -t nat -S":
			return []byte("-P INPUT ACCEPT\n-N KUBE-FIREWALL\n-A INPUT -j KUBE-FIREWALL\n"), nil
		case "ip6tables -w -t filter -S":
			return nil, errors.New("ip6tables v1.8.9 (legacy): can't initialize ip6tables table `filter'")
		}
		return nil, nil
	}
	if err := m.cleanHostNetwork(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(unmounted, []string{"/run/netns/cni-1234", "/run/netns/cni-5678"}) {
		t.Errorf("unmounted %q", unmounted)
	}
	for n, gone := range map[string]bool{"cni-1234": true, "cni-5678": true, "admin-ns": false} {
		if _, err := os.Stat(p.Join("/run/netns/" + n)); os.IsNotExist(err) != gone {
			t.Errorf("/run/netns/%s gone=%v, want %v", n, os.IsNotExist(err), gone)
		}
	}
	if _, err := os.Stat(p.Join("/var/lib/cni/networks/unbounded")); !os.IsNotExist(err) {
		t.Errorf("host-local's reservations are still there")
	}
	if !slices.Equal(deleted, []string{"veth1a2b", "veth3c4d", "cni0"}) {
		t.Errorf("interfaces deleted: %q, want the pods' veths, then the bridge", deleted)
	}
	want := []string{"iptables -w -t nat -S",
		// Jumps last first within a chain, so that positions hold.
		"iptables -w -t nat -D POSTROUTING 3", "iptables -w -t nat -D POSTROUTING 1", "iptables -w -t nat -D PREROUTING 1",
		"iptables -w -t nat -F CNI-HOSTPORT-DNAT", "iptables -w -t nat -F CNI-3f2a", "iptables -w -t nat -F CNI-DN-77",
		"iptables -w -t nat -X CNI-HOSTPORT-DNAT", "iptables -w -t nat -X CNI-3f2a", "iptables -w -t nat -X CNI-DN-77",
		"iptables -w -t filter -S", "ip6tables -w -t nat -S", "ip6tables -w -t filter -S"}
	if !slices.Equal(ran, want) {
		t.Errorf("ran\n %q\nwant\n %q", ran, want)
	}
}

const natListed = `-P PREROUTING ACCEPT
-P POSTROUTING ACCEPT
-N CNI-HOSTPORT-DNAT
-N CNI-3f2a
-N CNI-DN-77
-N KUBE-KUBELET-CANARY
-A PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT
-A POSTROUTING -s 10.244.1.5/32 -m comment --comment "name: \"unbounded\" id: \"abc\"" -j CNI-3f2a
-A POSTROUTING -s 192.0.2.0/24 -j MASQUERADE
-A POSTROUTING -s 10.244.1.6/32 -m comment --comment "name: \"unbounded\" id: \"def\"" -j CNI-3f2a
-A CNI-HOSTPORT-DNAT -p tcp -j CNI-DN-77
-A CNI-3f2a -d 10.244.1.0/24 -m comment --comment "name: \"unbounded\" id: \"abc\"" -j ACCEPT
`

func TestEnsureHooksRemovesTheSupersededVersionOnceTheCallerRecordedTheNewOne(t *testing.T) {
	h := newRepaveHost(t)
	if err, _ := h.repave(newSlot(t, "1.36.4", "10.244.9.0/24")); err != nil {
		t.Fatal(err)
	}
	// Not recorded yet (the caller crashed before): the old one stays.
	if err := h.m.EnsureHooks(h.ctx, "kube2"); err != nil {
		t.Fatal(err)
	}
	if got := h.versions(t); !slices.Equal(got, []string{"1.36.3", "1.36.4", "current"}) {
		t.Errorf("versions before the record: %q", got)
	}
	if err := state.WriteApplied(h.m.Paths, &state.AppliedConfig{Slot: "kube2", Mode: "none", KubernetesVersion: "1.36.4"}); err != nil {
		t.Fatal(err)
	}
	if err := h.m.EnsureHooks(h.ctx, "kube2"); err != nil {
		t.Fatal(err)
	}
	if got := h.versions(t); !slices.Equal(got, []string{"1.36.4", "current"}) {
		t.Errorf("versions after the record: %q", got)
	}
	if st := journalStep(t, h.m); st != "" {
		t.Errorf("journal left at %q", st)
	}
}

func TestEnsureHooksRemovesLeftoversRestoresTheCNIConfigAndReloadsWithoutRestarting(t *testing.T) {
	h := newRepaveHost(t)
	versions := h.m.Paths.VersionsDir()
	os.Mkdir(filepath.Join(versions, ".1.36.4.tmp-123"), 0o755)
	os.Symlink("x", filepath.Join(versions, ".current.tmp"))
	live := h.m.Paths.Join("/etc/cni/net.d/10-unbounded-bridge.conflist")
	os.Remove(live)
	if err := h.m.EnsureHooks(h.ctx, "kube1"); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(h.sd.Calls, []string{"reload"}) {
		t.Errorf("EnsureHooks did %q, want only a reload", h.sd.Calls)
	}
	if got := h.versions(t); !slices.Equal(got, []string{"1.36.3", "current"}) {
		t.Errorf("versions: %q", got)
	}
	if !strings.Contains(h.liveCNI(t), "10.244.1.0/24") {
		t.Errorf("the live CNI config was not restored")
	}

	// A version that lacks what the units run is named, not papered over.
	os.Remove(filepath.Join(h.m.VersionDir("1.36.3"), "bin/kubelet"))
	if err := h.m.EnsureHooks(h.ctx, "kube1"); err == nil || !strings.Contains(err.Error(), "bin/kubelet") {
		t.Errorf("EnsureHooks over an incomplete version: %v", err)
	}
}

// A none record whose versions/current is gone is corrupt state that no
// hook makes up: lifecycle fails naming the path and the way out (its
// failure is what recovery reports), and changes nothing.
func TestEnsureHooksRefusesARecordWhoseCurrentVersionIsMissingAndChangesNothing(t *testing.T) {
	h := newRepaveHost(t)
	current := filepath.Join(h.m.Paths.VersionsDir(), "current")
	if err := os.Remove(current); err != nil {
		t.Fatal(err)
	}
	h.sd.Calls = nil
	cni := h.liveCNI(t)
	err := h.m.EnsureHooks(h.ctx, "kube1")
	if err == nil || !strings.Contains(err.Error(), current+" does not exist") || !strings.Contains(err.Error(), "unbounded reset") {
		t.Fatalf("EnsureHooks without versions/current: %v; want an error naming %s and the way out", err, current)
	}
	if len(h.sd.Calls) != 0 {
		t.Errorf("EnsureHooks without versions/current called systemd: %q", h.sd.Calls)
	}
	if got := h.versions(t); !slices.Equal(got, []string{"1.36.3"}) {
		t.Errorf("versions after the refusal: %q, want the installed one left alone", got)
	}
	if h.liveCNI(t) != cni {
		t.Errorf("the live CNI config changed")
	}
}

func TestEnsureHooksLeavesAnUnfinishedRepaveAlone(t *testing.T) {
	h := newRepaveHost(t)
	h.crashAt = "repave/after-old-stopped"
	if _, crash := h.repave(newSlot(t, "1.36.4", "10.244.9.0/24")); !crash {
		t.Fatal("no crash")
	}
	h.sd.Calls = nil
	before := h.liveCNI(t)
	if err := h.m.EnsureHooks(h.ctx, "kube2"); err != nil {
		t.Fatal(err)
	}
	if cur, _ := h.m.CurrentVersion(); cur != "1.36.3" || h.liveCNI(t) != before || !slices.Equal(h.sd.Calls, []string{"reload"}) {
		t.Errorf("EnsureHooks during a repave: current %q, calls %q", cur, h.sd.Calls)
	}
	if got := h.versions(t); !slices.Contains(got, "1.36.4") {
		t.Errorf("the repave's new version was removed: %q", got)
	}
	if err := h.m.RemoveSuperseded(h.ctx); err == nil || !strings.Contains(err.Error(), "unfinished") {
		t.Errorf("RemoveSuperseded during a repave: %v", err)
	}
	if got := h.versions(t); !slices.Equal(got, []string{"1.36.3", "1.36.4", "current"}) {
		t.Errorf("versions: %q", got)
	}
}

// Sandboxed without the right to unmount (unbounded-repave.service's
// system call filter), the cleanup still removes the interfaces and
// leaves the namespaces to containerd.
func TestCleanHostNetworkWithoutTheRightToUnmountLeavesTheNamespaces(t *testing.T) {
	m, _, p := newMode(t)
	os.MkdirAll(p.Join("/run/netns"), 0o755)
	os.WriteFile(p.Join("/run/netns/cni-1234"), nil, 0o644)
	m.SysClassNet = t.TempDir()
	os.MkdirAll(filepath.Join(m.SysClassNet, "cni0/brif/veth1a2b"), 0o755)
	var deleted []string
	m.DeleteLink = func(n string) error { deleted = append(deleted, n); return nil }
	m.Unmount = func(string) error { return unix.EPERM }
	m.Command = func(context.Context, []byte, string, ...string) ([]byte, error) { return nil, nil }
	if err := m.cleanHostNetwork(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(deleted, []string{"veth1a2b", "cni0"}) {
		t.Errorf("interfaces deleted: %q", deleted)
	}
	if _, err := os.Stat(p.Join("/run/netns/cni-1234")); err != nil {
		t.Errorf("a namespace still mounted was removed: %v", err)
	}
}

// A journal of an earlier build (format 1: the step under way, and a
// rollback's cause and whether the old stack was stopped) is carried on
// by this one: each step under way the earlier build could leave, on the
// host as it left it, converges as that build's run would have.
func TestRepaveCarriesOnAJournalOfAnEarlierBuild(t *testing.T) {
	for _, c := range []struct {
		step    string
		crashAt string // where this build leaves the host as the earlier one did
		fail    bool   // the new version never gets healthy
		stopped bool
		want    string // the version current at the end
	}{
		{step: v1Install, want: "1.36.4"},
		{step: v1Switch, crashAt: "repave/after-new-built", stopped: true, want: "1.36.4"},
		{step: v1Switch, crashAt: "repave/after-fence", stopped: true, want: "1.36.4"},
		{step: v1Start, crashAt: "repave/after-flipped", stopped: true, want: "1.36.4"},
		{step: v1Rollback, crashAt: "repave/after-rollback-begun", fail: true, stopped: true, want: "1.36.3"},
		{step: v1Rollback, crashAt: "repave/after-new-built", stopped: false, want: "1.36.3"},
	} {
		t.Run(c.step+"/"+c.crashAt, func(t *testing.T) {
			h := newRepaveHost(t)
			h.unhealthy["kube2"] = c.fail
			s := newSlot(t, "1.36.4", "10.244.9.0/24")
			var j *repaveJournal
			if c.crashAt != "" {
				h.crashAt = c.crashAt
				if err, crash := h.repave(s); !crash {
					t.Fatalf("no crash at %s: %v", c.crashAt, err)
				}
				h.crashAt = ""
				j = readJournal(t, h.m)
			} else {
				in, err := inputDigest("kube1", s)
				if err != nil {
					t.Fatal(err)
				}
				j = &repaveJournal{Running: "kube1", Slot: s.Name, Input: in, Old: "1.36.3", New: "1.36.4", Version: "1.36.4"}
			}
			v1 := map[string]any{"running": j.Running, "slot": j.Slot, "input": j.Input, "old": j.Old, "new": j.New, "version": j.Version, "step": c.step}
			if c.stopped {
				v1["stopped"] = true
			}
			if c.step == v1Rollback {
				v1["cause"] = "version 1.36.4 did not become healthy: an earlier build's cause"
			}
			if err := state.WriteJournal(h.m.Paths, JournalName, v1); err != nil {
				t.Fatal(err)
			}
			h.unhealthy["kube2"] = c.fail
			err, _ := h.repave(s)
			if c.step == v1Rollback {
				if !errors.Is(err, modes.ErrRolledBack) || !strings.Contains(err.Error(), "an earlier build's cause") {
					t.Fatalf("repave over a format-1 rollback: %v, want it rolled back with the journal's cause", err)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			if cur, _ := h.m.CurrentVersion(); cur != c.want {
				t.Errorf("current -> %q, want %s", cur, c.want)
			}
			if j := readJournal(t, h.m); j != nil {
				t.Errorf("journal left: %+v", j)
			}
			for _, u := range []string{ContainerdUnit, KubeletUnit} {
				if st, _ := h.sd.ActiveState(h.ctx, u); st != "active" {
					t.Errorf("%s is %s", u, st)
				}
			}
			if c.want == "1.36.3" {
				if got := h.versions(t); !slices.Equal(got, []string{"1.36.3", "current"}) {
					t.Errorf("versions after the rollback: %q", got)
				}
			}
		})
	}
}
