package system_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"unbounded-cloud.io/agent/tests/system/harness"
)

// A one-shot started by its unit logs through the journal's native
// protocol: the attributes are journal fields an operator can filter on,
// and MESSAGE still reads as a whole line in `journalctl -u`.
func TestOneShotLogsStructuredFieldsToTheJournal(t *testing.T) {
	defer scenario(t)()
	m := harness.New(t, harness.Options{Package: true})
	m.Start()
	// No config on the host: the fence refuses with 78 and logs why.
	if out, err := m.Systemctl("start", "unbounded-fence.service"); err == nil {
		t.Fatalf("fence started without a config: %s", out)
	}
	// The fence has exited, but journald may not have processed its last
	// datagrams yet: ask it to (journalctl --sync answers once what is
	// queued is processed), and read until the refusal is there, bounded.
	var out string
	for deadline := time.Now().Add(journalWait); ; {
		m.Run("journalctl", "--sync")
		var err error
		out, err = m.Run("journalctl", "-u", "unbounded-fence.service", "-o", "json", "--no-pager")
		if err != nil {
			t.Fatalf("journalctl: %v\n%s", err, out)
		}
		if strings.Contains(out, "configuration invalid") || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
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

// journalWait bounds how long a test waits for a line a finished unit
// logged to reach the journal: journald processes its sockets
// asynchronously, and a loaded 2-core machine can take a moment.
const journalWait = 10 * time.Second
