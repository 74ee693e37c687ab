package bluegreen

import (
	"strings"
	"testing"
)

func TestFilterOwnedDropsTheNodeStacksChainsAndTheRulesThatJumpToThem(t *testing.T) {
	dump := `*nat
:PREROUTING ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:CNI-HOSTPORT-DNAT - [0:0]
:CNI-abc123 - [0:0]
:DOCKER - [0:0]
-A PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT
-A POSTROUTING -s 10.88.0.5/32 -m comment --comment "name: unbounded" -j CNI-abc123
-A POSTROUTING -s 172.17.0.0/16 -j MASQUERADE
-A CNI-abc123 -d 10.88.0.0/16 -j ACCEPT
COMMIT
*filter
:INPUT ACCEPT [0:0]
:KUBE-FIREWALL - [0:0]
-A INPUT -j KUBE-FIREWALL
-A INPUT -p tcp --dport 22 -j ACCEPT
COMMIT
`
	got, n := filterOwned([]byte(dump))
	if n != 3 {
		t.Errorf("dropped %d chains, want 3", n)
	}
	for _, gone := range []string{"CNI-", "KUBE-"} {
		if strings.Contains(string(got), gone) {
			t.Errorf("%s left:\n%s", gone, got)
		}
	}
	for _, kept := range []string{":DOCKER", "MASQUERADE", "--dport 22", "*filter", "COMMIT"} {
		if !strings.Contains(string(got), kept) {
			t.Errorf("%q dropped:\n%s", kept, got)
		}
	}
}
