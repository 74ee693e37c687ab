package daemon

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sync"
	"testing"
	"time"

	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/state"
)

// fakeSystemd stands in for systemd at the D-Bus seam (Host.Systemd). Like
// the real one it outlives the daemons that connect to it: a test stops a
// daemon and starts another against the same fakeSystemd, as systemd keeps
// running units across a restart of unbounded-daemon.
type fakeSystemd struct {
	mu     sync.Mutex
	units  map[string]*fakeUnit
	starts []string
	// onStart is called at the start of every StartUnit, before the unit
	// "runs" (the test checks what the daemon did before starting it).
	onStart func(unit string)
	reboots int
	journal map[string][]string // unit -> lines of its last run
	// stateErrs makes that many of the next UnitState calls fail, as a
	// D-Bus call that times out does.
	stateErrs int
}

type fakeUnit struct {
	st UnitState
	// fail makes the next runs exit with status 1.
	fail bool
	// hold, when not nil, keeps a run "activating" until it is closed.
	hold chan struct{}
	// ranAt is when the last run started (for journal Since queries).
	ranAt time.Time
}

func newFakeSystemd() *fakeSystemd {
	return &fakeSystemd{units: map[string]*fakeUnit{}, journal: map[string][]string{}}
}

// host is a Host whose systemd and journal are this fake, whose boot ID is
// fixed, and with no sd_notify socket.
func (f *fakeSystemd) host() Host {
	return Host{
		Systemd: func(context.Context) (Systemd, error) { return fakeConn{f}, nil },
		Journal: f.readJournal,
		BootID:  func() (string, error) { return "boot-1", nil },
		Notify:  func(string) error { return nil },
		Watchdog: func() (time.Duration, error) {
			return 0, nil
		},
	}
}

func (f *fakeSystemd) unit(name string) *fakeUnit {
	u, ok := f.units[name]
	if !ok {
		u = &fakeUnit{st: UnitState{ActiveState: "inactive", SubState: "dead", Result: "success"}}
		f.units[name] = u
	}
	return u
}

// configure changes a unit under the lock.
func (f *fakeSystemd) configure(name string, fn func(u *fakeUnit)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f.unit(name))
}

func (f *fakeSystemd) startCount(unit string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, s := range f.starts {
		if s == unit {
			n++
		}
	}
	return n
}

func (f *fakeSystemd) rebootCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.reboots
}

func (f *fakeSystemd) readJournal(_ context.Context, q JournalQuery) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	u := f.unit(q.Unit)
	if q.Invocation != "" && q.Invocation != u.st.InvocationID {
		return nil, nil
	}
	if !q.Since.IsZero() && u.ranAt.Before(q.Since) {
		return nil, nil
	}
	lines := f.journal[q.Unit]
	if len(lines) > q.Lines {
		lines = lines[len(lines)-q.Lines:]
	}
	return lines, nil
}

// collect forgets a finished unit's run, as systemd's garbage collection
// does for a unit that ended well and that nothing references.
func (f *fakeSystemd) collect(name string) {
	f.configure(name, func(u *fakeUnit) {
		u.st = UnitState{ActiveState: "inactive", SubState: "dead"}
	})
}

type fakeConn struct{ f *fakeSystemd }

func (c fakeConn) StartUnit(ctx context.Context, name string) (string, error) {
	f := c.f
	if f.onStart != nil {
		f.onStart(name)
	}
	f.mu.Lock()
	f.starts = append(f.starts, name)
	u := f.unit(name)
	var id [16]byte
	_, _ = rand.Read(id[:])
	u.st = UnitState{ActiveState: "activating", SubState: "start", InvocationID: hex.EncodeToString(id[:])}
	u.ranAt = time.Now()
	hold, fail := u.hold, u.fail
	f.journal[name] = []string{"Starting " + name + "...", name + ": working"}
	f.mu.Unlock()

	// The run goes on in "systemd" whatever happens to the caller.
	finished := make(chan struct{})
	go func() {
		if hold != nil {
			<-hold
		}
		f.mu.Lock()
		if fail {
			u.st.ActiveState, u.st.SubState, u.st.Result, u.st.ExecMainStatus = "failed", "failed", "exit-code", 1
			f.journal[name] = append(f.journal[name], name+": step 3: disk full", name+": Main process exited, code=exited, status=1/FAILURE")
		} else {
			u.st.ActiveState, u.st.SubState, u.st.Result, u.st.ExecMainStatus = "inactive", "dead", "success", 0
			f.journal[name] = append(f.journal[name], "Finished "+name+".")
		}
		f.mu.Unlock()
		close(finished)
	}()
	select {
	case <-finished:
		if fail {
			return "failed", nil
		}
		return "done", nil
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

func (c fakeConn) UnitState(_ context.Context, name string) (UnitState, error) {
	c.f.mu.Lock()
	defer c.f.mu.Unlock()
	if c.f.stateErrs > 0 {
		c.f.stateErrs--
		return UnitState{}, fmt.Errorf("read state of %s: %w", name, context.DeadlineExceeded)
	}
	return c.f.unit(name).st, nil
}

func (c fakeConn) Reboot(context.Context) error {
	c.f.mu.Lock()
	defer c.f.mu.Unlock()
	c.f.reboots++
	return nil
}

func (c fakeConn) Close() {}

func writeApplied(t testing.TB, p hostpaths.Paths, machine, slot string) {
	t.Helper()
	if err := state.WriteApplied(p, &state.AppliedConfig{Slot: slot, Mode: "nspawn", Machine: machine}); err != nil {
		t.Fatal(err)
	}
}
