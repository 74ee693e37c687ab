package logging

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"strings"
	"testing"
)

// entry is what reached the journal handler: MESSAGE and the fields.
type entry struct {
	msg    string
	fields map[string]string
}

// recorder stands in for the journal handler; handlers derived with
// WithAttrs report into the same sink.
type recorder struct {
	sink *[]entry
	with []slog.Attr
}

func (r recorder) Enabled(context.Context, slog.Level) bool { return true }
func (r recorder) Handle(_ context.Context, rec slog.Record) error {
	e := entry{msg: rec.Message, fields: map[string]string{}}
	for _, a := range r.with {
		e.fields[a.Key] = a.Value.String()
	}
	rec.Attrs(func(a slog.Attr) bool { e.fields[a.Key] = a.Value.String(); return true })
	*r.sink = append(*r.sink, e)
	return nil
}
func (r recorder) WithAttrs(as []slog.Attr) slog.Handler {
	return recorder{sink: r.sink, with: append(append([]slog.Attr(nil), r.with...), as...)}
}
func (r recorder) WithGroup(string) slog.Handler { return r }

func TestJournalMessageCarriesTheAttributesAsTextAndKeepsThemAsFields(t *testing.T) {
	var got []entry
	log := slog.New(&textMessage{next: recorder{sink: &got}}).With("machine", "w1")
	log.Error("fence refused", "reason", "Fenced", "error", "allocation is fenced")
	if len(got) != 1 {
		t.Fatalf("got %d records", len(got))
	}
	want := `fence refused machine=w1 reason=Fenced error="allocation is fenced"`
	if got[0].msg != want {
		t.Errorf("MESSAGE %q, want %q", got[0].msg, want)
	}
	if f := got[0].fields; f["reason"] != "Fenced" || f["machine"] != "w1" {
		t.Errorf("attributes not kept as fields: %v", f)
	}
}

func TestFieldNameIsAValidJournalField(t *testing.T) {
	for in, want := range map[string]string{
		"error": "ERROR", "retry-budget": "RETRY_BUDGET", "op.uid": "OP_UID", "9lives": "_9LIVES", "": "_",
	} {
		if got := FieldName(in); got != want {
			t.Errorf("FieldName(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestNewLogsTextWhenStderrIsNotTheJournal(t *testing.T) {
	var buf bytes.Buffer
	New(&buf, slog.LevelInfo).Info("hello", "k", "v")
	if !strings.Contains(buf.String(), "msg=hello k=v") {
		t.Errorf("text output %q", buf.String())
	}
	// A file that is not the journal stream stays on text even when
	// JOURNAL_STREAM is set (a child whose stderr was redirected).
	f, err := os.CreateTemp(t.TempDir(), "stderr")
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("JOURNAL_STREAM", "1:2")
	if connectedToJournal(f) {
		t.Error("a temp file taken for the journal stream")
	}
}

func TestUnitOfCgroupFindsTheServiceInEitherHierarchy(t *testing.T) {
	for text, want := range map[string]string{
		"0::/system.slice/system-unbounded\\x2drecover.slice/unbounded-recover@unbounded-bootstrap.service.service\n": "unbounded-recover@unbounded-bootstrap.service.service",
		"12:cpu,cpuacct:/\n1:name=systemd:/system.slice/unbounded-fence.service\n0::/\n":                              "unbounded-fence.service",
		"0::/user.slice/user-0.slice/session-1.scope\n":                                                               "",
	} {
		if got := unitOfCgroup(text); got != want {
			t.Errorf("unitOfCgroup(%q) = %q, want %q", text, got, want)
		}
	}
}
