package adopt_test

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"unbounded-cloud.io/agent/lib/adopt"
	"unbounded-cloud.io/agent/lib/crashpoint"
	"unbounded-cloud.io/agent/lib/exitcode"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/state"
	"unbounded-cloud.io/agent/lib/steps"
	"unbounded-cloud.io/agent/lib/testhost"
	"unbounded-cloud.io/agent/lib/unitnames"
)

// The child runs one adoption on the world whose root it names, so that
// a crash point kills a real process (the lock's flock goes with it).
const childRoot = "ADOPT_TEST_CHILD_ROOT"

// adoptedAt is the adoption's clock in every test, so that two worlds'
// end states compare.
var adoptedAt = time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)

func TestMain(m *testing.M) {
	if root := os.Getenv(childRoot); root != "" {
		w := &testhost.World{Root: root}
		w.P.Root = root
		err := adopter(w, slog.New(slog.NewTextHandler(os.Stderr, nil))).Run(context.Background())
		if err != nil {
			os.Stderr.WriteString("adopt: " + err.Error() + "\n")
		}
		os.Exit(exitcode.For(err))
	}
	os.Exit(m.Run())
}

func adopter(w *testhost.World, log *slog.Logger) *adopt.Adopt {
	return &adopt.Adopt{Host: steps.Host{Paths: w.P, Systemd: w.Systemd, Notify: func(string) {}, Now: func() time.Time { return adoptedAt }, Log: log}}
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func child(t *testing.T, w *testhost.World, point string) (int, string) {
	t.Helper()
	return testhost.RunChild(t, childRoot+"="+w.Root, crashpoint.Env+"="+point)
}

// token is the older record's bootstrap token: it must end up nowhere.
const token = "abcdef.0123456789abcdef"

// olderRecord is an applied config as the older agent wrote it for the
// world's cluster (its CA, its API server as host:port) and machine.
func olderRecord(t *testing.T, w *testhost.World, edit func(m map[string]any)) map[string]any {
	t.Helper()
	ca, err := os.ReadFile(w.P.Join("/etc/unbounded/ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]any{
		"MachineName": "site-w1",
		"Cluster": map[string]any{
			"CaCertBase64": base64.StdEncoding.EncodeToString(ca),
			"ClusterDNS":   "10.96.0.10",
			"Version":      "v1.36.3",
		},
		"Kubelet": map[string]any{
			"ApiServer":          "127.0.0.1:6443",
			"BootstrapToken":     token,
			"Labels":             map[string]string{"topology.kubernetes.io/zone": "edge-1"},
			"RegisterWithTaints": []string{},
		},
		"OCIImage": "registry.example/node:1.36.3",
	}
	if edit != nil {
		edit(m)
	}
	return m
}

// writeOlder writes rec as the older agent's applied config of slot,
// with its bare-hex sidecar.
func writeOlder(t *testing.T, w *testhost.World, slot string, rec map[string]any) {
	t.Helper()
	data, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	f := w.P.LegacyAppliedConfig(slot)
	os.MkdirAll(filepath.Dir(f), 0o755)
	sum := sha256.Sum256(data)
	if err := os.WriteFile(f, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(hostpaths.Checksum(f), []byte(hex.EncodeToString(sum[:])+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
}

// olderHost is a host the older agent installed, its node running in
// kube1: its record, its other state, its binaries and links, its units
// enabled and running, the machine enabled with machinectl; and this
// agent's package with a configuration for the same cluster and machine.
func olderHost(t *testing.T) *testhost.World {
	t.Helper()
	w, err := testhost.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	writeOlder(t, w, "kube1", olderRecord(t, w, nil))
	for f, c := range map[string]string{
		"/etc/unbounded/agent/kube1-nspawn-lifecycle.json":            `{"version":1,"machineName":"kube1"}`,
		"/usr/local/bin/unbounded-agent":                              "#!/bin/sh\n",
		"/usr/local/bin/unbounded-agent-blue":                         "#!/bin/sh\n",
		"/usr/local/bin/unbounded-agent-daemon-recovery.sh":           "#!/bin/bash\n",
		"/etc/systemd/system/unbounded-agent-daemon.service":          "[Service]\nExecStart=/usr/local/bin/unbounded-agent-current daemon\n",
		"/etc/systemd/system/unbounded-agent-daemon-recovery.service": "[Service]\nExecStart=/usr/local/bin/unbounded-agent-daemon-recovery.sh\n",
		"/var/lib/machines/kube1/etc/os-release":                      "ID=debian\n",
		"/usr/local/bin/someone-elses-tool":                           "#!/bin/sh\n",
	} {
		if err := w.Write(f, c); err != nil {
			t.Fatal(err)
		}
	}
	for link, target := range map[string]string{
		"/usr/local/bin/unbounded-agent-current":                                     "/usr/local/bin/unbounded-agent-blue",
		"/usr/local/bin/unbounded-agent-last-good":                                   "/usr/local/bin/unbounded-agent-blue",
		"/etc/systemd/system/multi-user.target.wants/unbounded-agent-daemon.service": "/etc/systemd/system/unbounded-agent-daemon.service",
		"/etc/systemd/system/machines.target.wants/systemd-nspawn@kube1.service":     "/lib/systemd/system/systemd-nspawn@.service",
	} {
		os.MkdirAll(filepath.Dir(w.P.Join(link)), 0o755)
		if err := os.Symlink(target, w.P.Join(link)); err != nil {
			t.Fatal(err)
		}
	}
	w.SetUnitState("systemd-nspawn@kube1.service", "active")
	w.SetUnitState(unitnames.LegacyDaemon, "active")
	w.ClearCalls()
	return w
}

// snapshot is the host without the fakes' unit states and the lock's
// anchor under /run (a tmpfs in real life).
func snapshot(t *testing.T, w *testhost.World) map[string]string {
	t.Helper()
	s, err := w.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	for k := range s {
		if strings.HasPrefix(k, "fake/units") || k == "run/unbounded/ownership.lock" {
			delete(s, k)
		}
	}
	// Each world has its own CA.
	s["etc/unbounded/ca.crt"] = "(ca)"
	return s
}

func TestAdoptionTakesTheOlderNodeOverWithoutRestartingIt(t *testing.T) {
	w := olderHost(t)
	if err := adopter(w, quiet()).Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	a, err := state.ReadActive(w.P)
	if err != nil || a == nil {
		t.Fatalf("this agent's record: %+v, %v", a, err)
	}
	if a.Slot != "kube1" || a.Mode != "nspawn" || a.Machine != "site-w1" || a.KubernetesVersion != "1.36.3" {
		t.Errorf("record %+v", a)
	}
	var cfg struct {
		Mode    string
		Cluster struct{ KubernetesVersion, BootstrapTokenFile string }
		Node    struct{ Labels map[string]string }
		Nspawn  struct{ Image string }
		Files   []string
	}
	if err := json.Unmarshal(a.Config, &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.Mode != "nspawn" || cfg.Cluster.KubernetesVersion != "1.36.3" || cfg.Node.Labels["topology.kubernetes.io/zone"] != "edge-1" ||
		cfg.Nspawn.Image != "registry.example/node:1.36.3" || cfg.Cluster.BootstrapTokenFile != "/etc/unbounded/bootstrap-token" || cfg.Files != nil {
		t.Errorf("the record's effective config: %+v", cfg)
	}
	rec := w.P.AppliedConfig("kube1")
	data, _ := os.ReadFile(rec)
	if strings.Contains(string(data), strings.Split(token, ".")[1]) {
		t.Error("the older record's bootstrap token is in this agent's record")
	}
	if fi, err := os.Stat(rec); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("record mode: %v, %v", fi, err)
	}
	// Nothing of the older agent is left but what is not its own.
	for _, f := range []string{hostpaths.LegacyStateDirHost, hostpaths.LegacyUnitHost, hostpaths.LegacyRecoveryUnitHost,
		"/etc/systemd/system/multi-user.target.wants/unbounded-agent-daemon.service",
		"/etc/systemd/system/machines.target.wants/systemd-nspawn@kube1.service"} {
		if _, err := os.Lstat(w.P.Join(f)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s is left: %v", f, err)
		}
	}
	for _, b := range hostpaths.LegacyBinaries {
		if _, err := os.Lstat(w.P.Join("/usr/local/bin/" + b)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("/usr/local/bin/%s is left: %v", b, err)
		}
	}
	if _, err := os.Stat(w.P.Join("/usr/local/bin/someone-elses-tool")); err != nil {
		t.Errorf("a file the older agent did not install was removed: %v", err)
	}
	if d := state.DetectLegacy(w.P); d.Found() {
		t.Errorf("legacy still detected: %+v", d)
	}
	ad, err := state.ReadAdopted(w.P)
	if err != nil || ad == nil || ad.Slot != "kube1" || !slices.Equal(ad.From, []string{"/etc/unbounded/agent/kube1-applied-config.json"}) || !ad.At.Equal(adoptedAt) {
		t.Errorf("adoption record %+v, %v", ad, err)
	}
	if o, _ := state.ReadOwnership(w.P); o != nil {
		t.Errorf("still owned: %+v", o)
	}
	if _, err := os.Stat(w.P.Journal(adopt.Operation)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("journal left: %v", err)
	}
	// The older daemon was stopped after its unit went (no rollback can
	// start it), the node never.
	want := []string{"reload", "stop " + unitnames.LegacyDaemon, "reload", "enqueue " + unitnames.NodeTarget, "enqueue " + unitnames.Daemon}
	if c := w.Calls(); !slices.Equal(c, want) {
		t.Errorf("calls %q, want %q", c, want)
	}
	if st := w.UnitState("systemd-nspawn@kube1.service"); st != "active" {
		t.Errorf("the node machine is %s", st)
	}
	if st := w.UnitState(unitnames.LegacyDaemon); st != "inactive" {
		t.Errorf("the older daemon is %s", st)
	}
}

func TestAdoptionOfAnAdoptedOrFreshHostDoesNothing(t *testing.T) {
	w := olderHost(t)
	if err := adopter(w, quiet()).Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, w)
	w.ClearCalls()
	if err := adopter(w, quiet()).Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	if c := w.Calls(); len(c) != 0 {
		t.Errorf("a second run made calls: %q", c)
	}
	if d := testhost.Diff(before, snapshot(t, w)); len(d) > 0 {
		t.Errorf("a second run changed the host:\n%s", strings.Join(d, "\n"))
	}
	fresh, err := testhost.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := adopter(fresh, quiet()).Run(context.Background()); err != nil || len(fresh.Calls()) != 0 {
		t.Errorf("fresh host: %v, calls %q", err, fresh.Calls())
	}
}

func TestAdoptionCrashAtEveryPointThenRerunEndsAsAnUninterruptedAdoption(t *testing.T) {
	if testing.Short() {
		t.Skip("runs child processes; skipped with -short")
	}
	ref := olderHost(t)
	if code, out := child(t, ref, ""); code != 0 {
		t.Fatalf("adoption: exit %d\n%s", code, out)
	}
	want := snapshot(t, ref)
	for _, point := range append([]string{state.CrashAfterStagedApplied}, adopt.CrashPoints...) {
		t.Run(strings.ReplaceAll(point, "/", "_"), func(t *testing.T) {
			w := olderHost(t)
			code, out := child(t, w, point)
			if code != crashpoint.ExitCode || !strings.Contains(out, "crash point "+point) {
				t.Fatalf("crash at %s: exit %d\n%s", point, code, out)
			}
			// In between, no command of this agent runs on the host
			// as if it were its own, nor as if it were fresh.
			if err := state.CheckAdopted(w.P); err == nil {
				if o, _ := state.ReadOwnership(w.P); o == nil && point != adopt.CrashAfterRelease {
					t.Errorf("after a crash at %s the host is neither the older agent's nor owned", point)
				}
			}
			if code, out := child(t, w, ""); code != 0 {
				t.Fatalf("rerun after the crash at %s: exit %d\n%s", point, code, out)
			}
			if d := testhost.Diff(want, snapshot(t, w)); len(d) > 0 {
				t.Errorf("end state after a crash at %s differs:\n%s", point, strings.Join(d, "\n"))
			}
			calls := w.Calls()
			// Cut after the release, the host is adopted and handed
			// over at the next daemon-reload or boot, as a bootstrap
			// cut at bootstrap/after-release is: the generator wires
			// the node target then. Any other cut is handed over by
			// the rerun.
			if n := len(calls); point != adopt.CrashAfterRelease && (n < 2 || calls[n-2] != "enqueue "+unitnames.NodeTarget || calls[n-1] != "enqueue "+unitnames.Daemon) {
				t.Errorf("the rerun did not hand the node over: %q", calls)
			}
			if slices.ContainsFunc(calls, func(c string) bool { return strings.Contains(c, "systemd-nspawn@") && !strings.HasPrefix(c, "enqueue") }) {
				t.Errorf("the node machine was touched: %q", calls)
			}
		})
	}
}

// Every record the adoption cannot take over is refused with the file
// and the key named, exit 78 (1 for a corrupt one), and the host is left
// exactly as it was: the older agent keeps its node.
func TestAdoptionRefusesWhatItCannotMapAndChangesNothing(t *testing.T) {
	const file = "/etc/unbounded/agent/kube1-applied-config.json"
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, w *testhost.World)
		code  int
		says  []string
	}{
		{"unknown key", func(t *testing.T, w *testhost.World) {
			writeOlder(t, w, "kube1", olderRecord(t, w, func(m map[string]any) { m["Kubelet"].(map[string]any)["MaxPods"] = 250 }))
		}, 78, []string{file, "key Kubelet.MaxPods", "unknown"}},
		{"exec credential", func(t *testing.T, w *testhost.World) {
			writeOlder(t, w, "kube1", olderRecord(t, w, func(m map[string]any) {
				m["Kubelet"].(map[string]any)["Auth"] = map[string]any{"ExecCredential": map[string]any{"command": "/bin/cred"}}
			}))
		}, 78, []string{file, "key Kubelet.Auth.ExecCredential"}},
		{"attestation", func(t *testing.T, w *testhost.World) {
			writeOlder(t, w, "kube1", olderRecord(t, w, func(m map[string]any) { m["Attest"] = map[string]any{"URL": "http://10.0.0.1:8880"} }))
		}, 78, []string{file, "key Attest"}},
		{"another Node name", func(t *testing.T, w *testhost.World) {
			writeOlder(t, w, "kube1", olderRecord(t, w, func(m map[string]any) { m["NodeName"] = "other" }))
		}, 78, []string{file, "key NodeName"}},
		{"a wrong type", func(t *testing.T, w *testhost.World) {
			writeOlder(t, w, "kube1", olderRecord(t, w, func(m map[string]any) { m["Kubelet"].(map[string]any)["Labels"] = []string{"a"} }))
		}, 78, []string{file, "key Kubelet.Labels"}},
		{"another machine", func(t *testing.T, w *testhost.World) {
			writeOlder(t, w, "kube1", olderRecord(t, w, func(m map[string]any) { m["MachineName"] = "site-w2" }))
		}, 78, []string{file, "key MachineName", "/etc/unbounded/agent.toml"}},
		{"another API server", func(t *testing.T, w *testhost.World) {
			writeOlder(t, w, "kube1", olderRecord(t, w, func(m map[string]any) { m["Kubelet"].(map[string]any)["ApiServer"] = "https://10.1.1.1:6443" }))
		}, 78, []string{file, "key Kubelet.ApiServer", "cluster.api-server"}},
		{"another CA", func(t *testing.T, w *testhost.World) {
			writeOlder(t, w, "kube1", olderRecord(t, w, func(m map[string]any) {
				m["Cluster"].(map[string]any)["CaCertBase64"] = base64.StdEncoding.EncodeToString([]byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"))
			}))
		}, 78, []string{file, "key Cluster.CaCertBase64", "cluster.ca-file"}},
		{"no configuration", func(t *testing.T, w *testhost.World) {
			os.Remove(w.P.ConfigFile())
		}, 78, []string{file, "/etc/unbounded/agent.toml is missing"}},
		{"a sidecar that does not match", func(t *testing.T, w *testhost.World) {
			os.WriteFile(hostpaths.Checksum(w.P.LegacyAppliedConfig("kube1")), []byte(strings.Repeat("0", 64)+"\n"), 0o600)
		}, 1, []string{file, "does not match"}},
		{"this agent's record beside it", func(t *testing.T, w *testhost.World) {
			if err := state.WriteApplied(w.P, &state.AppliedConfig{Slot: "kube2", Mode: "nspawn"}); err != nil {
				t.Fatal(err)
			}
		}, 1, []string{file, "/var/lib/unbounded/kube2-applied-config.json", "both layouts"}},
		{"two records, neither machine running", func(t *testing.T, w *testhost.World) {
			writeOlder(t, w, "kube2", olderRecord(t, w, nil))
			w.SetUnitState("systemd-nspawn@kube1.service", "inactive")
		}, 1, []string{file, "kube2-applied-config.json", "cannot tell"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := olderHost(t)
			tc.setup(t, w)
			before := snapshot(t, w)
			w.ClearCalls()
			err := adopter(w, quiet()).Run(context.Background())
			if code := exitcode.For(err); code != tc.code {
				t.Errorf("exit %d (%v), want %d", code, err, tc.code)
			}
			for _, s := range tc.says {
				if err == nil || !strings.Contains(err.Error(), s) {
					t.Errorf("error %v does not say %q", err, s)
				}
			}
			if err != nil && strings.Contains(err.Error(), strings.Split(token, ".")[1]) {
				t.Errorf("the error holds the bootstrap token: %v", err)
			}
			if d := testhost.Diff(before, snapshot(t, w)); len(d) > 0 {
				t.Errorf("a refused adoption changed the host:\n%s", strings.Join(d, "\n"))
			}
			if c := w.Calls(); len(c) > 0 {
				t.Errorf("a refused adoption called systemd: %q", c)
			}
		})
	}
}

// The older agent's repave recorded the new slot before it removed the
// old one's record: the running machine says which node to adopt.
func TestAdoptionOfTwoOlderRecordsTakesTheRunningMachine(t *testing.T) {
	w := olderHost(t)
	writeOlder(t, w, "kube2", olderRecord(t, w, func(m map[string]any) { m["Cluster"].(map[string]any)["Version"] = "v1.36.4" }))
	w.Write("/var/lib/machines/kube2/etc/os-release", "ID=debian\n")
	w.SetUnitState("systemd-nspawn@kube1.service", "inactive")
	w.SetUnitState("systemd-nspawn@kube2.service", "active")
	if err := adopter(w, quiet()).Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	a, err := state.ReadActive(w.P)
	if err != nil || a == nil || a.Slot != "kube2" || a.KubernetesVersion != "1.36.4" {
		t.Fatalf("adopted %+v, %v", a, err)
	}
	ad, _ := state.ReadAdopted(w.P)
	if ad == nil || len(ad.From) != 2 {
		t.Errorf("adoption record %+v: both older records are its origin", ad)
	}
	if len(state.LegacyAppliedConfigs(w.P)) != 0 {
		t.Error("an older record is left")
	}
}

// Another installation owns the host: the adoption defers (69) and
// changes nothing.
func TestAdoptionDefersToAnInstallationThatOwnsTheHost(t *testing.T) {
	w := olderHost(t)
	lock, err := state.AcquireOwnership(w.P, "reset", unitnames.Reset)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Release()
	err = adopter(w, quiet()).Run(context.Background())
	if exitcode.For(err) != exitcode.Deferred {
		t.Fatalf("%v, want a deferral", err)
	}
	if _, err := os.Stat(w.P.AppliedConfig("kube1")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a deferred adoption wrote a record: %v", err)
	}
}

func TestRemovingTheOlderLayoutIsIdempotent(t *testing.T) {
	w := olderHost(t)
	sd, _ := w.Systemd(context.Background())
	for i := 0; i < 2; i++ {
		if err := adopt.RetireOlderUnits(context.Background(), w.P, sd, quiet()); err != nil {
			t.Fatal(err)
		}
		if err := adopt.RemoveOlderFiles(w.P, quiet()); err != nil {
			t.Fatal(err)
		}
	}
	if d := state.DetectLegacy(w.P); d.Found() {
		t.Errorf("left: %+v", d)
	}
}
