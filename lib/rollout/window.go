package rollout

import (
	"fmt"
	"slices"
	"time"

	"unbounded-cloud.io/agent/lib/api/v1alpha3"
)

var weekdays = map[v1alpha3.Weekday]time.Weekday{
	"Sun": time.Sunday, "Mon": time.Monday, "Tue": time.Tuesday, "Wed": time.Wednesday,
	"Thu": time.Thursday, "Fri": time.Friday, "Sat": time.Saturday,
}

// Open says whether the window w is open at now, and if not when it next
// opens. A nil window is always open. The window opens on each of its
// days at Start, wall-clock time in its time zone, and closes at End the
// same day, or the next day when End is not after Start (across
// midnight). Wall-clock times follow the zone's daylight saving time: a
// start that does not exist on the night the clocks go forward (02:30 in
// Europe/Berlin) is read in the offset before the change (03:30 summer
// time, Go's normalisation), and on the night they go back a window
// lasts an hour longer in real time.
func Open(w *v1alpha3.MaintenanceWindow, now time.Time) (bool, time.Time, error) {
	if w == nil {
		return true, time.Time{}, nil
	}
	loc := time.UTC
	if w.TimeZone != "" {
		l, err := time.LoadLocation(w.TimeZone)
		if err != nil {
			return false, time.Time{}, fmt.Errorf("time zone %q: %w", w.TimeZone, err)
		}
		loc = l
	}
	sh, sm, err := clock(w.Start)
	if err != nil {
		return false, time.Time{}, fmt.Errorf("start: %w", err)
	}
	eh, em, err := clock(w.End)
	if err != nil {
		return false, time.Time{}, fmt.Errorf("end: %w", err)
	}
	var days []time.Weekday
	for _, d := range w.Days {
		wd, ok := weekdays[d]
		if !ok {
			return false, time.Time{}, fmt.Errorf("day %q is none of Mon, Tue, Wed, Thu, Fri, Sat, Sun", d)
		}
		days = append(days, wd)
	}
	overnight := eh*60+em <= sh*60+sm
	local := now.In(loc)
	// The windows that opened yesterday or will open in the next eight
	// days: one of them is open now, or the first to open is next.
	for i := -1; i <= 8; i++ {
		y, m, d := local.AddDate(0, 0, i).Date()
		start := time.Date(y, m, d, sh, sm, 0, 0, loc)
		if len(days) > 0 && !slices.Contains(days, time.Date(y, m, d, 12, 0, 0, 0, loc).Weekday()) {
			continue
		}
		ed := d
		if overnight {
			ed++
		}
		end := time.Date(y, m, ed, eh, em, 0, 0, loc)
		if !now.Before(start) && now.Before(end) {
			return true, time.Time{}, nil
		}
		if start.After(now) {
			return false, start, nil
		}
	}
	return false, time.Time{}, fmt.Errorf("never opens")
}

// clock parses HH:MM.
func clock(s string) (int, int, error) {
	t, err := time.Parse("15:04", s)
	if err != nil {
		return 0, 0, fmt.Errorf("%q is not HH:MM", s)
	}
	return t.Hour(), t.Minute(), nil
}
