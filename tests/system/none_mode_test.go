package system_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/modes"
	"unbounded-cloud.io/agent/lib/modes/modestest"
	"unbounded-cloud.io/agent/lib/modes/none"
	"unbounded-cloud.io/agent/lib/units"
	"unbounded-cloud.io/agent/tests/system/harness"
)

// standinSource is the node stack stand-in of the none-mode scenario: one
// static program that acts by the name it is started as. containerd
// starts a "shim" child (as the real one does per pod, and which outlives
// it by design), records its PID and says READY=1 (the shipped unit is
// Type=notify); kubelet records its command line; every other name sleeps.
const standinSource = `package main

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

func main() {
	dir := "/run/unbounded-standin"
	os.MkdirAll(dir, 0o755)
	switch filepath.Base(os.Args[0]) {
	case "containerd":
		shim := exec.Command(filepath.Join(filepath.Dir(os.Args[0]), "containerd-shim-runc-v2"))
		if err := shim.Start(); err != nil {
			panic(err)
		}
		os.WriteFile(filepath.Join(dir, "shim.pid"), []byte(strconv.Itoa(shim.Process.Pid)), 0o644)
		if s := os.Getenv("NOTIFY_SOCKET"); s != "" {
			c, err := net.Dial("unixgram", s)
			if err != nil {
				panic(err)
			}
			c.Write([]byte("READY=1"))
			c.Close()
		}
	case "kubelet":
		os.WriteFile(filepath.Join(dir, "kubelet.args"), []byte(strings.Join(os.Args[1:], "\n")), 0o644)
	}
	for {
		time.Sleep(time.Hour)
	}
}
`

// standinArtifacts builds the stand-in and packs it as lib/artifacts
// delivers the node stack's artifacts.
func standinArtifacts(t *testing.T) modes.Artifacts {
	t.Helper()
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "main.go"), []byte(standinSource), 0o644)
	os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module standin\n\ngo 1.22\n"), 0o644)
	bin := filepath.Join(dir, "standin")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Dir = dir
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-mod=mod")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the stand-in: %v\n%s", err, out)
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	tgz := func(name string, files ...string) string {
		var buf bytes.Buffer
		gz := gzip.NewWriter(&buf)
		tw := tar.NewWriter(gz)
		for _, f := range files {
			tw.WriteHeader(&tar.Header{Name: f, Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(data))})
			tw.Write(data)
		}
		tw.Close()
		gz.Close()
		p := filepath.Join(dir, name)
		os.WriteFile(p, buf.Bytes(), 0o644)
		return p
	}
	return modes.Artifacts{
		Kubelet:    bin,
		Runc:       bin,
		Containerd: tgz("containerd.tar.gz", "bin/containerd", "bin/containerd-shim-runc-v2"),
		CNIPlugins: tgz("cni-plugins.tgz", "bridge", "host-local", "loopback", "portmap"),
	}
}

// systemdCgroup is the test host's cgroup in the name=systemd hierarchy,
// as this (outer) process sees it.
func systemdCgroup(t *testing.T, leader int) string {
	t.Helper()
	data, err := os.ReadFile("/proc/" + strconv.Itoa(leader) + "/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(data), "\n") {
		// ID:name=systemd:PATH; the ID differs between hosts.
		if _, p, ok := strings.Cut(l, ":name=systemd:"); ok {
			return filepath.Join("/sys/fs/cgroup/systemd", strings.TrimSuffix(p, "/init.scope"))
		}
	}
	t.Skip("the host has no name=systemd cgroup hierarchy to find the test host's processes in")
	return ""
}

func alive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	st, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	// A zombie is dead: its parent (the test host's init) reaps it soon.
	return err == nil && !strings.Contains(string(st), ") Z ")
}

// TestNoneModeRunsTheShippedUnitsFromTheCurrentVersion installs a node
// stack version with the none mode in a test host that has the package
// (and so the shipped units), and drives it with the mode's own calls over
// the host's D-Bus: the units start the version's binaries through
// `current` with kubelet's flags from the version's kubelet.env; a restart
// of the runtime keeps its shim (the pods) running; Destroy kills what the
// units left behind and removes the version.
//
// The binaries are a stand-in (standinSource): this scenario checks the
// mode and the shipped units under real systemd; the real kubelet and
// containerd run in the first-boot scenarios.
func TestNoneModeRunsTheShippedUnitsFromTheCurrentVersion(t *testing.T) {
	harness.Require(t, true)
	host := harness.Boot(t, harness.Options{Package: true})
	paths := hostpaths.New(host.Root())
	m := &none.Mode{
		Paths:      paths,
		Systemd:    func(context.Context) (modes.Systemd, error) { return units.Borrow(host.Bus()), nil },
		CgroupRoot: systemdCgroup(t, host.Leader()),
	}
	// Without the node-local DNS cache: the stand-ins have no CoreDNS; the
	// real cache runs in the first-boot scenarios (mode none's among them).
	n := modestest.Node()
	n.LocalDNS = false
	slot := modes.Slot{Name: "kube1", Node: n, Artifacts: standinArtifacts(t)}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	if err := m.Prepare(ctx, slot); err != nil {
		t.Fatal(err)
	}
	if err := m.Start(ctx, "kube1"); err != nil {
		t.Fatalf("%v\n%s\n%s", err, host.Journal(none.ContainerdUnit), host.Journal(none.KubeletUnit))
	}
	for _, u := range []string{none.ContainerdUnit, none.KubeletUnit} {
		if st := host.UnitState(u); st.ActiveState != "active" {
			t.Errorf("%s is %s\n%s", u, st, host.Journal(u))
		}
	}
	// kubelet's unit is Type=simple: active as soon as it is forked, before
	// the stand-in has written what it was started with.
	var args []byte
	for deadline := time.Now().Add(10 * time.Second); ; {
		var err error
		if args, err = host.ReadFile("/run/unbounded-standin/kubelet.args"); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, want := range []string{"--config=" + none.Current + "/etc/kubelet/config.yaml", "--hostname-override=site-w1",
		"--bootstrap-kubeconfig=" + none.Current + "/etc/kubelet/bootstrap-kubeconfig"} {
		if !strings.Contains(string(args), want) {
			t.Errorf("kubelet started without %s (kubelet.env not read?):\n%s", want, args)
		}
	}
	exe := host.MustRun("readlink", "/proc/"+strings.TrimSpace(host.MustRun("systemctl", "show", "-P", "MainPID", none.KubeletUnit))+"/exe")
	if !strings.HasPrefix(strings.TrimSpace(exe), hostpaths.VersionsDirHost+"/1.36.3/bin/") {
		t.Errorf("kubelet runs %s, not the installed version's binary", exe)
	}

	// The shim's PID as this process sees it: through the test host's
	// cgroup (the file holds the PID in the host's namespace).
	shimFile := func() int {
		t.Helper()
		b, err := host.ReadFile("/run/unbounded-standin/shim.pid")
		if err != nil {
			t.Fatal(err)
		}
		inner, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		procs, _ := os.ReadFile(filepath.Join(m.CgroupRoot, "system.slice", none.ContainerdUnit, "cgroup.procs"))
		for _, f := range strings.Fields(string(procs)) {
			pid, _ := strconv.Atoi(f)
			status, _ := os.ReadFile("/proc/" + f + "/status")
			for _, l := range strings.Split(string(status), "\n") {
				if ns, ok := strings.CutPrefix(l, "NSpid:"); ok {
					fs := strings.Fields(ns)
					if fs[len(fs)-1] == strconv.Itoa(inner) {
						return pid
					}
				}
			}
		}
		t.Fatalf("shim %d (test host's PID) is not in %s's cgroup", inner, none.ContainerdUnit)
		return 0
	}
	shim := shimFile()
	if err := m.Restart(ctx, "kube1"); err != nil {
		t.Fatal(err)
	}
	if !alive(shim) {
		t.Error("restarting the runtime killed its shim: pods would not survive an in-place restart")
	}
	shim2 := shimFile()
	t.Logf("shim %d outlived the runtime's restart; the new runtime started shim %d", shim, shim2)

	if err := m.Destroy(ctx, "kube1"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for (alive(shim) || alive(shim2)) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if alive(shim) || alive(shim2) {
		t.Error("destroy left the runtime's shims running")
	}
	for _, u := range []string{none.ContainerdUnit, none.KubeletUnit} {
		if st := host.UnitState(u); st.ActiveState == "active" {
			t.Errorf("%s is %s after destroy", u, st)
		}
	}
	if _, err := os.Lstat(paths.VersionsDir()); !os.IsNotExist(err) {
		t.Errorf("%s is still there after destroy", hostpaths.VersionsDirHost)
	}
}
