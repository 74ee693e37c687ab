package hostprep

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/tests/tiers"
)

// The real-kernel test runs Prepare and Undo in a child process (this test
// binary, re-executed with netnsHelperEnv set) that lives in a network
// namespace of its own: net.* sysctls are per namespace, so the child
// really writes /proc/sys and the machine's own values stay untouched.
const netnsHelperEnv = "HOSTPREP_TEST_NETNS_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(netnsHelperEnv) != "" {
		if err := netnsHelper(); err != nil {
			fmt.Fprintln(os.Stderr, "netns helper:", err)
			os.Exit(2)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

type netnsReport struct {
	Keys     []string
	Before   map[string]string
	Prepared map[string]string
	Recorded map[string]string
	Undone   map[string]string
}

func readReal(key string) string {
	b, err := os.ReadFile("/proc/sys/" + strings.ReplaceAll(key, ".", "/"))
	if err != nil {
		return "error: " + err.Error()
	}
	return strings.TrimSpace(string(b))
}

func netnsHelper() error {
	// Refuse to touch anything unless this process is in a namespace
	// other than the test's: a mistake here must not change the machine.
	self, err := os.Readlink("/proc/self/ns/net")
	if err != nil || self == os.Getenv("PARENT_NETNS") {
		return fmt.Errorf("not in a network namespace of its own (%s, %v)", self, err)
	}
	keys := []string{"net.ipv4.ip_forward"}
	for _, k := range []string{"net.bridge.bridge-nf-call-iptables", "net.bridge.bridge-nf-call-ip6tables"} {
		if !strings.HasPrefix(readReal(k), "error") {
			keys = append(keys, k)
		}
	}
	real := hostpaths.Paths{}
	h := &Host{
		Paths:    hostpaths.New(os.Getenv("HELPER_ROOT")),
		Kernel:   &real,
		Log:      slog.New(slog.NewTextHandler(io.Discard, nil)),
		Modprobe: func(context.Context, ...string) error { return errors.New("no modprobe in this test") },
		Swapoff:  func(context.Context, string) error { return errors.New("no swapoff in this test") },
	}
	r := netnsReport{Keys: keys, Before: map[string]string{}, Prepared: map[string]string{}, Recorded: map[string]string{}, Undone: map[string]string{}}
	var plan Plan
	for _, k := range keys {
		// A known start that differs from the plan's value.
		if err := h.writeSysctl(k, "0"); err != nil {
			return err
		}
		r.Before[k] = readReal(k)
		plan.Sysctls = append(plan.Sysctls, Sysctl{k, "1"})
	}
	if _, err := h.Prepare(context.Background(), plan); err != nil {
		return err
	}
	rec, err := ReadRecord(h.Paths)
	if err != nil {
		return err
	}
	for _, k := range keys {
		r.Prepared[k] = readReal(k)
		if c := rec.find(KindSysctl, k); c != nil && c.Previous != nil {
			r.Recorded[k] = *c.Previous
		}
	}
	if _, err := h.Undo(context.Background()); err != nil {
		return err
	}
	for _, k := range keys {
		r.Undone[k] = readReal(k)
	}
	return json.NewEncoder(os.Stdout).Encode(r)
}

func TestPrepareAndUndoRealSysctlsInANetworkNamespace(t *testing.T) {
	if os.Geteuid() != 0 {
		tiers.Skip(t, tiers.Unit, "needs root: creates a network namespace and writes /proc/sys in it")
	}
	parentNS, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		tiers.Skip(t, tiers.Unit, "no /proc/self/ns/net: %v", err)
	}
	parentForward := readReal("net.ipv4.ip_forward")

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), netnsHelperEnv+"=1", "PARENT_NETNS="+parentNS, "HELPER_ROOT="+t.TempDir())
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil && errors.Is(err, syscall.EPERM) {
		tiers.Skip(t, tiers.Unit, "cannot create a network namespace here: %v", err)
	}
	if err != nil {
		t.Fatalf("helper: %v\n%s", err, stderr.String())
	}
	var r netnsReport
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("helper output %q: %v", out, err)
	}
	for _, k := range r.Keys {
		if r.Before[k] != "0" || r.Prepared[k] != "1" || r.Recorded[k] != "0" || r.Undone[k] != "0" {
			t.Errorf("%s: before %q, after Prepare %q (recorded previous %q), after Undo %q; want 0, 1, 0, 0",
				k, r.Before[k], r.Prepared[k], r.Recorded[k], r.Undone[k])
		}
	}
	t.Logf("real sysctls set and restored in a private network namespace: %v", r.Keys)
	if got := readReal("net.ipv4.ip_forward"); got != parentForward {
		t.Errorf("the test's own namespace changed: ip_forward %s -> %s", parentForward, got)
	}
}
