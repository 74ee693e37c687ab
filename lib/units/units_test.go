package units

import (
	"reflect"
	"strings"
	"testing"

	sdbus "github.com/coreos/go-systemd/v22/dbus"

	"unbounded-cloud.io/agent/lib/unitnames"
)

// The transient reboot unit runs `systemctl reboot` in a sandbox that
// leaves it the system bus and PID 1 (path sockets, reachable read-only
// and without a network) and its capabilities (logind's Reboot wants
// CAP_SYS_BOOT), with the shipped units' Documentation=.
func TestRebootPropertiesSandboxTheTransientUnit(t *testing.T) {
	got := map[string]any{}
	for _, p := range RebootProperties() {
		if _, dup := got[p.Name]; dup {
			t.Errorf("%s set twice", p.Name)
		}
		got[p.Name] = p.Value.Value()
	}
	want := map[string]any{
		"Type":           "oneshot",
		"PrivateNetwork": true,
		"ProtectSystem":  "strict",
		"ProtectHome":    "yes",
		"PrivateTmp":     true,
		"Documentation":  []string{"https://unbounded-cloud.io/docs/agent/units/" + unitnames.HostReboot, "man:systemctl(1)"},
	}
	for k, v := range want {
		if !reflect.DeepEqual(got[k], v) {
			t.Errorf("%s = %#v, want %#v", k, got[k], v)
		}
	}
	if exec := sdbus.PropExecStart([]string{"/usr/bin/systemctl", "--no-ask-password", "reboot"}, true); !reflect.DeepEqual(got["ExecStart"], exec.Value.Value()) {
		t.Errorf("ExecStart = %#v, want %#v", got["ExecStart"], exec.Value.Value())
	}
	// What would break the reboot through logind: no bus to reach it, or
	// no CAP_SYS_BOOT to be granted it without polkit.
	for _, k := range []string{"CapabilityBoundingSet", "AmbientCapabilities", "User", "DynamicUser", "RestrictAddressFamilies", "IPAddressDeny", "NoNewPrivileges"} {
		if v, set := got[k]; set {
			t.Errorf("%s = %#v: the transient unit must keep the bus and CAP_SYS_BOOT", k, v)
		}
	}
	if !strings.HasPrefix(unitnames.HostReboot, "unbounded-") {
		t.Errorf("%s: every unit name starts with unbounded-", unitnames.HostReboot)
	}
}
