package recovery

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/regfile"
	"unbounded-cloud.io/agent/lib/state"
)

// Limit is how often one unit's failures are recovered: at most Burst
// recoveries of the same unit within Window. A unit that fails in a loop
// (a crash loop that Restart= does not absorb, a timer whose service keeps
// failing) would otherwise start recovery at every failure: a report on
// the Machine each time (a write that every watcher of Machines is sent)
// and a restart of the daemon each time. Past the limit recovery says so
// in the journal, once on the Machine, and does nothing else until the
// window has room again.
//
// The runs are recorded under the host root, so that a unit that fails
// at every boot is limited across reboots too. systemd's own start limit
// on unbounded-recover@.service is the backstop for a recovery that
// fails before it reads this record.
type Limit struct {
	Burst  int
	Window time.Duration
}

// DefaultLimit: three recoveries of one unit per hour. Three, so that a
// failure, its repair failing once more and a third try are all reported;
// an hour, so that a unit failing every few minutes (a health timer's
// service, say) is reported a few times an hour, not every time.
var DefaultLimit = Limit{Burst: 3, Window: time.Hour}

// history is the record of one unit's recoveries.
type history struct {
	// Runs are the start times of recent recoveries, oldest first.
	Runs []time.Time `json:"runs"`
	// HeldBack is when recovery last said on the Machine that it holds
	// back; it says it once per window.
	HeldBack time.Time `json:"held-back,omitzero"`
}

// maxHistorySize bounds what is read of a history file: Burst times and
// one more, a few hundred bytes.
const maxHistorySize = 64 << 10

// historyFile is where unit's recoveries are recorded. Unit names hold no
// "/" (systemd refuses them), so the name is the file's.
func historyFile(p hostpaths.Paths, unit string) (string, error) {
	if unit == "" || strings.ContainsAny(unit, "/\x00") || unit == "." || unit == ".." {
		return "", fmt.Errorf("unit name %q cannot name a file", unit)
	}
	return filepath.Join(p.RecoverDir(), unit+".json"), nil
}

// readHistory reads unit's record; a missing one is empty. A record that
// cannot be read is started afresh (and said so by the caller): losing
// the count of recent runs is a smaller harm than a recovery that never
// runs again.
func readHistory(file string) (history, error) {
	var h history
	data, err := regfile.Read(file, maxHistorySize)
	if errors.Is(err, os.ErrNotExist) {
		return h, nil
	}
	if err != nil {
		return h, err
	}
	if err := json.Unmarshal(data, &h); err != nil {
		return history{}, fmt.Errorf("%s: %w", file, err)
	}
	return h, nil
}

func writeHistory(file string, h history) error {
	if err := os.MkdirAll(filepath.Dir(file), 0o700); err != nil {
		return err
	}
	data, _ := json.Marshal(h)
	return state.WriteFileAtomic(file, append(data, '\n'), 0o600)
}

// admit decides whether a recovery may run at now: it drops the runs that
// left the window and, when there is room, records this one. held is
// true when recovery holds back; next is then when the window has room
// again.
func (l Limit) admit(h *history, now time.Time) (held bool, next time.Time) {
	keep := h.Runs[:0]
	for _, t := range h.Runs {
		if now.Sub(t) < l.Window && !t.After(now) {
			keep = append(keep, t)
		}
	}
	h.Runs = keep
	if len(h.Runs) >= l.Burst {
		return true, h.Runs[len(h.Runs)-l.Burst].Add(l.Window)
	}
	h.Runs = append(h.Runs, now)
	return false, time.Time{}
}

// sayHeldBack reports whether the hold-back at now is the first of its
// window (the one said on the Machine), and records it.
func (l Limit) sayHeldBack(h *history, now time.Time) bool {
	if !h.HeldBack.IsZero() && now.Sub(h.HeldBack) < l.Window && !h.HeldBack.After(now) {
		return false
	}
	h.HeldBack = now
	return true
}
