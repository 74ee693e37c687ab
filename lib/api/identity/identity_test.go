package identity

import (
	"strings"
	"testing"
)

func TestMachineNamesThatCannotBeBootstrapGroupsAreRejected(t *testing.T) {
	for _, good := range []string{"a", "site-w1", "0", strings.Repeat("a", 63)} {
		if err := ValidateMachineName(good); err != nil {
			t.Errorf("ValidateMachineName(%q) = %v, want nil", good, err)
		}
	}
	for _, bad := range []string{"", "a.b", "A", "-a", "a-", "a_b", "a:b", strings.Repeat("a", 64)} {
		if err := ValidateMachineName(bad); err == nil {
			t.Errorf("ValidateMachineName(%q) = nil, want an error", bad)
		}
	}
}

func TestIdentitiesNameTheMachine(t *testing.T) {
	if got := AgentUserName("site-w1"); got != "unbounded-agent:site-w1" {
		t.Errorf("AgentUserName = %q", got)
	}
	if m, ok := MachineOfAgentUser(AgentUserName("site-w1")); !ok || m != "site-w1" {
		t.Errorf("MachineOfAgentUser(AgentUserName(site-w1)) = %q, %v", m, ok)
	}
	for _, u := range []string{"system:bootstrap:abcdef", "unbounded-agent:", "unbounded-agent:a.b"} {
		if _, ok := MachineOfAgentUser(u); ok {
			t.Errorf("MachineOfAgentUser(%q) accepted a non-agent user", u)
		}
	}
	if got := BootstrapGroup("site-w1"); got != "system:bootstrappers:unbounded:site-w1" {
		t.Errorf("BootstrapGroup = %q", got)
	}
	if got := BootstrapExtraGroups("site-w1"); got != "system:bootstrappers:unbounded,system:bootstrappers:unbounded:site-w1" {
		t.Errorf("BootstrapExtraGroups = %q", got)
	}
}
