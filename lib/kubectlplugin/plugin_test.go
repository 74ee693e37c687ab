package kubectlplugin

import "testing"

func TestParseRefusesWhatMainRefusesAndRunsNothing(t *testing.T) {
	for _, args := range [][]string{
		{"frobnicate"},
		{"join", "site-w1", "--bogus"},
		{"get", "-o", "table"},   // not one of wide, json, yaml
		{"get", "nodes"},         // not machines or rollouts
		{"describe"},             // no machine
		{"join", "--mode", "vm"}, // not nspawn or none
		{"repave", "--max-unavailable", "two"},
	} {
		if err := Parse(args); err == nil {
			t.Errorf("Parse(%q) = nil, want the usage error Main prints", args)
		}
	}
	// Each would talk to a cluster if it ran: Parse must not run it.
	for _, args := range [][]string{
		{"join", "site-w1", "--image", "registry.example.internal/unbounded/node:1.36.3", "-o", "host/"},
		{"get", "-o", "wide"},
		{"get", "rollouts", "-o", "yaml"},
		{"repave", "-l", "pool=edge", "--max-unavailable", "2"},
		{"restart", "w1", "w2", "--local", "--ready-timeout", "5m"},
		{"reboot", "w1", "--no-watch"},
		{"upgrade", "site-w1", "--version", "0.2.0", "--url", "https://example.internal/p.deb", "--sha256", "00"},
		{"--version"},
		{"--help"},
	} {
		if err := Parse(args); err != nil {
			t.Errorf("Parse(%q): %v", args, err)
		}
	}
}
