package health

import (
	"encoding/json"
	"errors"
	"os"
	"time"

	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/regfile"
	"unbounded-cloud.io/agent/lib/state"
)

// State is what health keeps between runs, in /run/unbounded/health.json.
//
// /run, not /var/lib/unbounded: everything in it is about this boot. A
// reboot starts the node again behind a new fence check, so the failure
// and restart counts, a give-up and the fence retries' delay must start
// afresh (a new boot is one of the changes that end a give-up), and a
// count carried across boots would restart or give up on a node that has
// not failed yet in this one.
type State struct {
	// Applied names the applied config the counts are about; another one
	// (a repave) resets them.
	Applied string `json:"applied"`
	// BootChecked: the first check of this boot is done.
	BootChecked bool `json:"bootChecked,omitempty"`
	// Failures: consecutive unhealthy runs since the last restart.
	Failures int `json:"failures,omitempty"`
	// Restarts: restarts started since the node was last healthy.
	Restarts int       `json:"restarts,omitempty"`
	GaveUp   bool      `json:"gaveUp,omitempty"`
	GaveUpAt time.Time `json:"gaveUpAt,omitzero"`
	// FenceRetries and NextFenceRetry: node starts retried after a fence
	// without an answer, and when the next one is due.
	FenceRetries   int       `json:"fenceRetries,omitempty"`
	NextFenceRetry time.Time `json:"nextFenceRetry,omitzero"`
}

func stateFile(p hostpaths.Paths) string { return p.HealthRecord() }

func loadState(p hostpaths.Paths) (*State, error) {
	data, err := regfile.Read(stateFile(p), 64<<10)
	if errors.Is(err, os.ErrNotExist) {
		return &State{}, nil
	}
	if err != nil {
		return nil, err
	}
	var s State
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

func (s *State) save(p hostpaths.Paths) error {
	if _, err := state.RunDir(p); err != nil {
		return err
	}
	data, _ := json.Marshal(s)
	return state.WriteFileAtomic(stateFile(p), append(data, '\n'), 0o644)
}

// ReadState reads what health keeps between runs (the zero State when it
// has not run this boot): the daemon's host metrics show it.
func ReadState(p hostpaths.Paths) (*State, error) { return loadState(p) }
