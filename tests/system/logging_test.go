package system_test

import (
	"encoding/json"
	"strings"
	"testing"

	"unbounded-cloud.io/agent/tests/system/harness"
)

// A one-shot started by its unit logs through the journal's native
// protocol: the attributes are journal fields an operator can filter on,
// and MESSAGE still reads as a whole line in `journalctl -u`.
func TestOneShotLogsStructuredFieldsToTheJournal(t *testing.T) {
	t.Parallel()
	m := harness.New(t, harness.Options{Package: true})
	m.Start()
	// No config on the host: the fence refuses with 78 and logs why.
	if out, err := m.Systemctl("start", "unbounded-fence.service"); err == nil {
		t.Fatalf("fence started without a config: %s", out)
	}
	out, err := m.Run("journalctl", "-u", "unbounded-fence.service", "-o", "json", "--no-pager")
	if err != nil {
		t.Fatalf("journalctl: %v\n%s", err, out)
	}
	var found bool
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var e map[string]any
		if json.Unmarshal([]byte(line), &e) != nil {
			continue
		}
		msg, _ := e["MESSAGE"].(string)
		if !strings.Contains(msg, "configuration invalid") {
			continue
		}
		found = true
		errField, _ := e["ERROR"].(string)
		if !strings.Contains(errField, "agent.toml") {
			t.Errorf("entry has no ERROR field naming the config file: %v", e)
		}
		if !strings.Contains(msg, "error=") {
			t.Errorf("MESSAGE %q lacks the attributes as text", msg)
		}
		if e["PRIORITY"] != "3" {
			t.Errorf("PRIORITY %v, want 3 (error)", e["PRIORITY"])
		}
	}
	if !found {
		t.Fatalf("no journal entry of the fence's refusal; journal:\n%s", m.Journal("unbounded-fence.service"))
	}
}
