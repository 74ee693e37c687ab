package daemon

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/coreos/go-systemd/v22/unit"
)

// TestUnitFileCarriesTheDaemonContract checks units/unbounded-daemon.service
// against ARCHITECTURE section 6: what systemd does with the daemon follows
// from these lines alone (the system test runs the unit for real).
func TestUnitFileCarriesTheDaemonContract(t *testing.T) {
	f, err := os.Open(filepath.Join("..", "..", "units", "unbounded-daemon.service"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	opts, err := unit.DeserializeOptions(f)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]string{}
	for _, o := range opts {
		k := o.Section + "." + o.Name
		got[k] = append(got[k], o.Value)
	}
	for key, want := range map[string]string{
		"Service.Type":              "notify",
		"Service.ExecStart":         "/usr/libexec/unbounded/daemon",
		"Service.Restart":           "always",
		"Service.SuccessExitStatus": "69",
		"Service.WatchdogSec":       "60s",
		"Unit.OnFailure":            "unbounded-recover@%n.service",
		"Unit.Wants":                "network-online.target",
		"Unit.After":                "unbounded-lifecycle.service",
	} {
		if !slices.Contains(got[key], want) {
			t.Errorf("%s = %q, want it to contain %q", key, got[key], want)
		}
	}
	// Neither "deferred" nor "configuration invalid" is restarted: a rerun
	// would find the same owner or read the same file (exit codes table).
	prevent := strings.Fields(strings.Join(got["Service.RestartPreventExitStatus"], " "))
	for _, code := range []string{"69", "78"} {
		if !slices.Contains(prevent, code) {
			t.Errorf("Service.RestartPreventExitStatus = %q lacks %s", prevent, code)
		}
	}
	if !slices.Contains(got["Unit.After"], "network-online.target") {
		t.Errorf("Unit.After = %q lacks network-online.target", got["Unit.After"])
	}
	if len(got["Unit.Documentation"]) == 0 {
		t.Error("no Documentation=")
	}
}
