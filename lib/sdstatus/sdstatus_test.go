package sdstatus

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

func TestShowLogsAndNotifiesTheStatus(t *testing.T) {
	var buf bytes.Buffer
	var sent []string
	Show(slog.New(slog.NewTextHandler(&buf, nil)), func(s string) { sent = append(sent, s) }, "step %d of %s", 2, "repave")
	if len(sent) != 1 || sent[0] != "STATUS=step 2 of repave" {
		t.Errorf("sent %q, want [STATUS=step 2 of repave]", sent)
	}
	if !strings.Contains(buf.String(), `msg="step 2 of repave"`) || !strings.Contains(buf.String(), "level=INFO") {
		t.Errorf("log %q lacks the message at info", buf.String())
	}
}
