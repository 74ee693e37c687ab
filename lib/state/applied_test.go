package state

import (
	"encoding/json"
	"testing"
)

func TestAppliedConfigSaysWhetherItsNodeRunsTheLocalDNSCache(t *testing.T) {
	for _, c := range []struct {
		config string
		want   bool
	}{
		{`{"Mode":"nspawn","Node":{"LocalDNS":true}}`, true},
		{`{"Mode":"nspawn","Node":{"LocalDNS":false}}`, false},
		// A record of an agent from before the cache: its node has none.
		{`{"Mode":"nspawn","Node":{"PodCIDR":""}}`, false},
		{``, false},
		{`not json`, false},
	} {
		a := &AppliedConfig{Slot: "kube1", Mode: "nspawn", Config: json.RawMessage(c.config)}
		if got := a.LocalDNS(); got != c.want {
			t.Errorf("%s: LocalDNS() = %v, want %v", c.config, got, c.want)
		}
	}
}
