// Package logging builds the slog.Logger of every agent binary. Started by
// systemd with stderr connected to the journal, a binary logs through the
// journal's native protocol (github.com/systemd/slog-journal), so that each
// attribute becomes a journal field an operator can filter on
// (`journalctl -u unbounded-fence REASON=Fenced`); anywhere else (a
// terminal, a test) it logs text to stderr.
//
// The journal shows only MESSAGE by default (`journalctl -u`, and the last
// lines the daemon copies into a failed operation), so the message carries
// the attributes as text too: "fence refused reason=Fenced machine=w1".
package logging

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"syscall"

	slogjournal "github.com/systemd/slog-journal"
)

// New returns the logger for a binary whose standard error is stderr.
func New(stderr io.Writer, level slog.Leveler) *slog.Logger {
	if f, ok := stderr.(*os.File); ok && connectedToJournal(f) {
		if h, err := Journal(level); err == nil {
			return slog.New(h)
		}
	}
	return slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
}

// connectedToJournal reports whether f is the stream systemd connected to
// the journal: $JOURNAL_STREAM names its device and inode (systemd.exec(5)).
// Checking the inode, not just the variable, keeps a child whose stderr was
// redirected (a test, a pipe) on text.
func connectedToJournal(f *os.File) bool {
	js := os.Getenv("JOURNAL_STREAM")
	if js == "" {
		return false
	}
	fi, err := f.Stat()
	if err != nil {
		return false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return false
	}
	return js == fmt.Sprintf("%d:%d", st.Dev, st.Ino)
}

// Journal returns a handler that writes to the journal through its native
// socket, with attribute keys mapped to journal field names and the
// attributes also rendered into MESSAGE.
func Journal(level slog.Leveler) (slog.Handler, error) {
	h, err := slogjournal.NewHandler(&slogjournal.Options{
		Level:        level,
		ReplaceAttr:  func(_ []string, a slog.Attr) slog.Attr { a.Key = FieldName(a.Key); return a },
		ReplaceGroup: FieldName,
	})
	if err != nil {
		return nil, err
	}
	var next slog.Handler = h
	if unit := ownUnit(); unit != "" {
		// journald finds a native message's unit (_SYSTEMD_UNIT) from
		// the sender's cgroup, which it can no longer read once the
		// process has exited: the last lines of a one-shot that exits
		// at once (an error, then exit 1) were missing from `journalctl
		// -u`, and so from the failure reports that copy a unit's last
		// lines (the daemon's, recovery's). journalctl -u also matches
		// OBJECT_SYSTEMD_UNIT= on messages of uid 0 (_UID is trusted),
		// which every agent unit runs as. Not rendered into MESSAGE.
		next = h.WithAttrs([]slog.Attr{slog.String("OBJECT_SYSTEMD_UNIT", unit)})
	}
	return &textMessage{next: next}, nil
}

// ownUnit is the service unit whose cgroup this process is in, from
// /proc/self/cgroup (the unified hierarchy's line, or the legacy
// name=systemd one); "" when it is not in a service's cgroup.
func ownUnit() string {
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return ""
	}
	return unitOfCgroup(string(data))
}

// unitOfCgroup reads the service unit from the text of /proc/PID/cgroup.
func unitOfCgroup(text string) string {
	for _, line := range strings.Split(text, "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 || (parts[1] != "" && parts[1] != "name=systemd") {
			continue
		}
		elems := strings.Split(parts[2], "/")
		for i := len(elems) - 1; i >= 0; i-- {
			if strings.HasSuffix(elems[i], ".service") {
				return elems[i]
			}
		}
	}
	return ""
}

// FieldName maps an slog key to a journal field name, which must match
// ^[A-Z_][A-Z0-9_]*$ (the journal silently drops anything else): upper
// case, every other character an underscore, a leading digit prefixed.
func FieldName(key string) string {
	b := []byte(strings.ToUpper(key))
	for i, c := range b {
		if (c < 'A' || c > 'Z') && (c < '0' || c > '9') && c != '_' {
			b[i] = '_'
		}
	}
	if len(b) == 0 || (b[0] >= '0' && b[0] <= '9') {
		b = append([]byte{'_'}, b...)
	}
	return string(b)
}

// textMessage appends the record's attributes (and those added with
// WithAttrs) to its message as key=value text, then passes the record on
// unchanged otherwise, so the attributes stay fields as well.
type textMessage struct {
	next slog.Handler
	// ops replays WithAttrs/WithGroup, in their order, on the text
	// rendering of the message.
	ops []func(slog.Handler) slog.Handler
}

func (h *textMessage) Enabled(ctx context.Context, l slog.Level) bool {
	return h.next.Enabled(ctx, l)
}

func (h *textMessage) Handle(ctx context.Context, r slog.Record) error {
	var buf bytes.Buffer
	text := slog.NewTextHandler(&buf, &slog.HandlerOptions{
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if len(groups) == 0 && (a.Key == slog.TimeKey || a.Key == slog.LevelKey || a.Key == slog.MessageKey) {
				return slog.Attr{}
			}
			return a
		},
	})
	var th slog.Handler = text
	for _, op := range h.ops {
		th = op(th)
	}
	plain := slog.NewRecord(r.Time, r.Level, "", r.PC)
	r.Attrs(func(a slog.Attr) bool { plain.AddAttrs(a); return true })
	if err := th.Handle(ctx, plain); err != nil {
		return err
	}
	msg := r.Message
	if s := strings.TrimSpace(buf.String()); s != "" {
		msg += " " + s
	}
	out := slog.NewRecord(r.Time, r.Level, msg, r.PC)
	r.Attrs(func(a slog.Attr) bool { out.AddAttrs(a); return true })
	return h.next.Handle(ctx, out)
}

func (h *textMessage) WithAttrs(as []slog.Attr) slog.Handler {
	return &textMessage{
		next: h.next.WithAttrs(as),
		ops:  append(h.ops[:len(h.ops):len(h.ops)], func(t slog.Handler) slog.Handler { return t.WithAttrs(as) }),
	}
}

func (h *textMessage) WithGroup(name string) slog.Handler {
	return &textMessage{
		next: h.next.WithGroup(name),
		ops:  append(h.ops[:len(h.ops):len(h.ops)], func(t slog.Handler) slog.Handler { return t.WithGroup(name) }),
	}
}
