package config

import (
	"testing"

	"github.com/BurntSushi/toml"
)

func TestLineIndexPlacesKeysAndIsNotFooledByValues(t *testing.T) {
	text := `# comment with key = 1
machine = "a" # trailing
notes = """
mode = "not a key"
[not.a.table]
"""
[cluster]   # header comment
'api-server' = "https://x"
ca-file.x = 1
[node]
taints = [
  "a=b:NoSchedule",
  "mode = 1",
]
labels = { "topology.kubernetes.io/zone" = "z", b.c = { d = 1 } }

  [ "node" . "labels" ]
"k/v" = "w"
`
	ix := indexLines(text)
	for key, want := range map[string]int{
		"machine":            2,
		"notes":              3,
		"cluster":            7,
		"cluster.api-server": 8,
		"cluster.ca-file.x":  9,
		"node.taints":        11,
		"node.labels":        15,
		`node.labels."topology.kubernetes.io/zone"`: 15,
		"node.labels.b.c.d":                         15,
		`node.labels."k/v"`:                         18,
	} {
		if got := ix[key]; got != want {
			t.Errorf("line of %s = %d, want %d", key, got, want)
		}
	}
	for _, notKey := range []string{"mode", "not.a.table", "key"} {
		if l, ok := ix[notKey]; ok {
			t.Errorf("%s (inside a string or comment) indexed at line %d", notKey, l)
		}
	}
	if got := ix.lookup(toml.Key{"cluster", "ca-file", "x", "deeper"}); got != 9 {
		t.Errorf("lookup falls back to the nearest ancestor: got %d, want 9", got)
	}
}
