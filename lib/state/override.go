package state

import (
	"time"

	"unbounded-cloud.io/agent/lib/hostpaths"
)

// AgentOverride is the record of the staged agent the units of an
// image-based host run in place of the image's (lib/upgrade writes it,
// lifecycle and `unbounded status` read it).
type AgentOverride struct {
	Version string    `json:"version"`
	Dir     string    `json:"dir"` // host path of the staged libexec directory
	Units   []string  `json:"units"`
	At      time.Time `json:"at"`
}

// ReadAgentOverride returns the active override, nil when the units run
// the image's agent.
func ReadAgentOverride(p hostpaths.Paths) (*AgentOverride, error) {
	var o AgentOverride
	ok, err := ReadRecord(p.AgentOverride(), 64<<10, &o)
	if !ok {
		return nil, err
	}
	return &o, nil
}
