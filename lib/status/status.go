// Package status gathers the one-screen summary of `unbounded status` from
// local state only: applied configs, ownership record, legacy root and
// journals, whether a configuration is in place, and what the next boot
// will start (decided by lib/generator's own Read and Decide, so that
// status and the generator cannot disagree). It reads; it never repairs,
// never takes a lock and never panics on a broken file, because an
// operator runs it exactly when something is broken.
package status

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"unbounded-cloud.io/agent/lib/config"
	"unbounded-cloud.io/agent/lib/devices"
	"unbounded-cloud.io/agent/lib/exitcode"
	"unbounded-cloud.io/agent/lib/generator"
	"unbounded-cloud.io/agent/lib/hostpaths"
	"unbounded-cloud.io/agent/lib/modes/nspawn/machinefile"
	"unbounded-cloud.io/agent/lib/outcome"
	"unbounded-cloud.io/agent/lib/owed"
	"unbounded-cloud.io/agent/lib/regfile"
	"unbounded-cloud.io/agent/lib/reprovision"
	"unbounded-cloud.io/agent/lib/state"
)

// States of a host, the first line of the summary.
const (
	NotBootstrapped = "not-bootstrapped"
	Bootstrapped    = "bootstrapped"
	Corrupt         = "corrupt"
)

// Report is the summary; its JSON form is what `unbounded status --json`
// prints, a stable interface for scripts (fields are only ever added).
type Report struct {
	// State is NotBootstrapped, Bootstrapped or Corrupt.
	State string `json:"state"`
	// Message says the state in words: "not bootstrapped",
	// "state corrupt: ...".
	Message string `json:"message"`
	// Mode and ActiveSlot come from the active applied config.
	Mode       string `json:"mode,omitempty"`
	ActiveSlot string `json:"active-slot,omitempty"`
	// Applied lists the applied config record of each slot that has one.
	Applied []Applied `json:"applied"`
	// Ownership is the installation lock record; null when not owned.
	Ownership *Ownership `json:"ownership"`
	// Legacy is what an older agent left on the host.
	Legacy Legacy `json:"legacy"`
	// Journals are the multi-step operations' journals.
	Journals []Journal `json:"journals"`
	// Handoff is the reprovision handoff (lib/reprovision), nil when
	// there is none; HandoffError says why it could not be read.
	Handoff      *reprovision.Journal `json:"handoff,omitempty"`
	HandoffError string               `json:"handoff-error,omitempty"`
	// Config is the operator configuration: present, and valid.
	Config Config `json:"config"`
	// NextBoot is what the generator makes systemd start at the next boot
	// (or daemon-reload), decided by the generator's own code.
	NextBoot generator.NextBoot `json:"next-boot"`
	// Owed are the cluster writes an operation owes the cluster and the
	// daemon makes once the API server answers (lib/owed).
	Owed []owed.Write `json:"owed"`
	// OwedError says why some owed writes could not be read.
	OwedError string `json:"owed-error,omitempty"`
	// Outcomes are how each concern's last run ended (lib/outcome), until
	// the daemon has reported them (the upgrade's, the isolation
	// change's) or the next run replaces them.
	Outcomes []outcome.Record `json:"outcomes"`
	// OutcomesError says why some outcomes could not be read.
	OutcomesError string `json:"outcomes-error,omitempty"`
	// Upgrade is the outcome of the agent's last self-upgrade that the
	// daemon has not reported yet (lib/outcome), and what is staged for
	// the next; null when there is neither.
	Upgrade *Upgrade `json:"upgrade"`
	// Devices are the host devices the active slot's node was given
	// (lib/devices' record, found at its last prepare or restart); null
	// where the mode gives none (none: the node is the host).
	Devices *Devices `json:"devices"`
	// LocalDNS says whether the active slot's node runs the node-local
	// DNS cache (its applied config's node.local-dns); null when no slot
	// is active.
	LocalDNS *bool `json:"local-dns"`
}

// Upgrade is what the self-upgrade left for the daemon to report, and
// what is staged.
type Upgrade struct {
	// Override is an image-based host's staged agent that the units run
	// in place of the image's.
	Override *state.AgentOverride `json:"override,omitempty"`
	// Failed or Upgraded is the last upgrade's outcome (as the signal
	// builds before lib/outcome wrote), until the daemon reported it.
	Failed   *outcome.UpgradeFailed    `json:"failed,omitempty"`
	Upgraded *outcome.UpgradeSucceeded `json:"upgraded,omitempty"`
	Staged   []string                  `json:"staged,omitempty"`
	Error    string                    `json:"error,omitempty"`
}

// Devices is what the node has of the host's devices.
type Devices struct {
	Found   []devices.Device `json:"found"`
	Driver  []string         `json:"driver-files,omitempty"`
	GPUs    []string         `json:"gpus,omitempty"`
	FoundAt time.Time        `json:"found-at,omitzero"`
	Error   string           `json:"error,omitempty"`
}

// Config says whether the operator configuration is in place and valid.
type Config struct {
	// File is the main file, as the host sees it.
	File string `json:"file"`
	// Present: the main file exists (what the generator looks at to
	// bootstrap a fresh host).
	Present bool `json:"present"`
	// Valid: the main file and its drop-ins load without a problem;
	// Problems lists them otherwise.
	Valid    bool     `json:"valid"`
	Problems []string `json:"problems,omitempty"`
	// needsRoot is why the configuration could not be checked: only
	// root may read a file of it (lib/privilege). The report is then
	// not to be shown: it would call the configuration invalid.
	needsRoot error
}

// NeedsRoot returns why the report could not be made without root, or nil.
func (r Report) NeedsRoot() error { return r.Config.needsRoot }

// Applied is one slot's applied config record.
type Applied struct {
	Slot              string    `json:"slot"`
	Active            bool      `json:"active"`
	Mode              string    `json:"mode,omitempty"`
	KubernetesVersion string    `json:"kubernetes-version,omitempty"`
	AgentVersion      string    `json:"agent-version,omitempty"`
	AppliedAt         time.Time `json:"applied-at,omitzero"`
	Error             string    `json:"error,omitempty"`
}

// Ownership is who holds the installation lock.
type Ownership struct {
	Owner string    `json:"owner"`
	Unit  string    `json:"unit,omitempty"`
	PID   int       `json:"pid,omitempty"`
	Since time.Time `json:"since,omitzero"`
	Error string    `json:"error,omitempty"`
}

// Legacy says whether an older agent's state is on the host, and whether
// this agent adopted an older agent's node (lib/adopt).
type Legacy struct {
	Detected       bool     `json:"detected"`
	AppliedConfigs []string `json:"applied-configs,omitempty"`
	Binary         bool     `json:"binary,omitempty"`
	Unit           bool     `json:"unit,omitempty"`
	// Adopted is the adoption's record: the slot, the machine, the older
	// records it came from and when; null on a host never adopted.
	Adopted *state.Adopted `json:"adopted"`
	// AdoptedError says why the adoption's record could not be read.
	AdoptedError string `json:"adopted-error,omitempty"`
}

// Journal is one operation's journal.
type Journal struct {
	Operation string `json:"operation"`
	Step      string `json:"step,omitempty"`
	// Change is an isolation change's: the modes, the method and the
	// slot whose node runs ("nspawn -> none in place, running slot
	// kube1").
	Change  string    `json:"change,omitempty"`
	Updated time.Time `json:"updated,omitzero"`
	Error   string    `json:"error,omitempty"`
}

// Gather builds the report for the host under p.
func Gather(p hostpaths.Paths) Report {
	r := Report{Applied: []Applied{}, Journals: []Journal{}}

	active, activeErr := state.ReadActive(p)
	for _, slot := range hostpaths.Slots {
		a, err := state.ReadApplied(p, slot)
		switch {
		case err == nil:
			r.Applied = append(r.Applied, Applied{
				Slot: a.Slot, Mode: a.Mode, KubernetesVersion: a.KubernetesVersion,
				AgentVersion: a.AgentVersion, AppliedAt: a.AppliedAt,
				Active: active != nil && active.Slot == a.Slot,
			})
		case errors.Is(err, os.ErrNotExist):
		default:
			r.Applied = append(r.Applied, Applied{Slot: slot, Error: err.Error()})
		}
	}
	switch {
	case activeErr != nil:
		r.State, r.Message = Corrupt, "state corrupt: "+activeErr.Error()
	case active == nil:
		r.State, r.Message = NotBootstrapped, "not bootstrapped"
	default:
		r.State, r.Message = Bootstrapped, fmt.Sprintf("bootstrapped: %s in slot %s", active.Mode, active.Slot)
		r.Mode, r.ActiveSlot = active.Mode, active.Slot
	}

	if o, err := state.ReadOwnership(p); o != nil {
		r.Ownership = &Ownership{Owner: o.Owner, Unit: o.Unit, PID: o.PID, Since: o.Since}
		if err != nil {
			r.Ownership.Error = err.Error()
		}
	}

	l := state.DetectLegacy(p)
	r.Legacy = Legacy{Detected: l.Found(), AppliedConfigs: l.AppliedConfigs, Binary: l.Binary, Unit: l.Unit}
	if a, err := state.ReadAdopted(p); err != nil {
		r.Legacy.AdoptedError = err.Error()
	} else {
		r.Legacy.Adopted = a
	}

	r.Journals = readJournals(p)
	if h, err := reprovision.ReadJournal(p); err == nil {
		r.Handoff = h
	} else if !errors.Is(err, os.ErrNotExist) {
		r.HandoffError = err.Error()
	}
	r.Owed = []owed.Write{}
	if ws, err := owed.List(p); err != nil {
		r.OwedError = err.Error()
		r.Owed = append(r.Owed, ws...)
	} else if len(ws) > 0 {
		r.Owed = ws
	}

	r.Upgrade = readUpgrade(p)
	r.Outcomes = []outcome.Record{}
	if recs, err := outcome.List(p); err != nil {
		r.OutcomesError = err.Error()
		r.Outcomes = append(r.Outcomes, recs...)
	} else if len(recs) > 0 {
		r.Outcomes = recs
	}

	if active != nil {
		on := active.LocalDNS()
		r.LocalDNS = &on
	}
	// The modes that give the node host devices record what they found
	// (mode none's node sees the host's /dev: no record).
	if active != nil {
		rec, err := devices.ReadRecord(p, active.Slot)
		switch {
		case err != nil:
			r.Devices = &Devices{Found: []devices.Device{}, Error: err.Error()}
		case rec != nil:
			r.Devices = &Devices{Found: append([]devices.Device{}, rec.Found.Devices...), Driver: rec.Found.DriverFiles, GPUs: rec.Found.GPUs, FoundAt: rec.At}
		}
	}

	in := generator.Host{}.Read(p)
	r.NextBoot = generator.Explain(p, in, generator.Decide(in))
	r.Config = gatherConfig(p)
	return r
}

func gatherConfig(p hostpaths.Paths) Config {
	c := Config{File: hostpaths.ConfigFileHost}
	_, err := os.Stat(p.ConfigFile())
	c.Present = err == nil
	_, err = config.Load(p)
	switch es := config.AsErrors(err); {
	case err == nil:
		c.Valid = true
	case errors.Is(err, exitcode.ErrNeedsRoot):
		c.needsRoot = err
	case es != nil:
		for _, e := range es {
			c.Problems = append(c.Problems, e.Error())
		}
	default:
		c.Problems = []string{err.Error()}
	}
	return c
}

// maxJournal bounds what is read of one journal: status shows a step name,
// and a huge file is itself a finding, not something to load.
const maxJournal = 1 << 20

func readJournals(p hostpaths.Paths) []Journal {
	out := []Journal{}
	files, _ := filepath.Glob(filepath.Join(p.JournalDir(), "*.json"))
	sort.Strings(files)
	for _, f := range files {
		j := Journal{Operation: strings.TrimSuffix(filepath.Base(f), ".json")}
		fi, err := os.Stat(f)
		if err == nil {
			j.Updated = fi.ModTime().UTC()
		}
		var data []byte
		if err == nil {
			// regfile: a FIFO or a device named *.json must not block
			// status (the stat above does not open it).
			data, err = regfile.Read(f, maxJournal)
		}
		if err == nil {
			var rec map[string]any
			dec := json.NewDecoder(bytes.NewReader(data))
			if derr := dec.Decode(&rec); derr != nil {
				err = fmt.Errorf("not a JSON object: %v", derr)
			} else if s, ok := rec["step"].(string); ok {
				j.Step = s
				if from, ok := rec["from-mode"].(string); ok {
					to, _ := rec["mode"].(string)
					method, _ := rec["method"].(string)
					rs, _ := rec["running-slot"].(string)
					j.Change = fmt.Sprintf("%s -> %s %s, running slot %s", from, to, method, rs)
				}
			} else if rs, ok := rec["running-slot"].(string); ok {
				// The in-place isolation journal records the running slot.
				j.Step = "running-slot " + rs
			}
		}
		if err != nil {
			j.Error = err.Error()
		}
		out = append(out, j)
	}
	return out
}

func lastError(e string) string {
	if e == "" {
		return ""
	}
	return "; last error: " + e
}

// Text writes the report for a terminal. It returns the first write error:
// a status that did not reach its reader must not exit 0.
func (r Report) Text(out io.Writer) error {
	w := &errWriter{w: out}
	row := func(k, format string, args ...any) { fmt.Fprintf(w, "%-12s %s\n", k+":", fmt.Sprintf(format, args...)) }
	row("state", "%s", r.Message)
	switch c := r.Config; {
	case !c.Present && c.Valid:
		row("config", "%s absent, drop-ins only (valid)", c.File)
	case !c.Present:
		row("config", "none: no %s", c.File)
	case c.Valid:
		row("config", "%s (valid)", c.File)
	default:
		row("config", "%s (invalid, %d %s: see unbounded config check)", c.File, len(c.Problems), plural(len(c.Problems), "problem", "problems"))
	}
	row("next boot", "%s", r.NextBoot.Reason)
	if r.Mode != "" {
		row("mode", "%s", r.Mode)
		row("active slot", "%s", r.ActiveSlot)
	}
	if len(r.Applied) == 0 {
		row("applied", "none")
	}
	for _, a := range r.Applied {
		if a.Error != "" {
			row("applied", "%s: %s", a.Slot, a.Error)
			continue
		}
		mark := ""
		if a.Active {
			mark = " (active)"
		}
		at := ""
		if !a.AppliedAt.IsZero() {
			at = " at " + a.AppliedAt.Format(time.RFC3339)
		}
		row("applied", "%s%s: mode %s, kubernetes %s, agent %s%s", a.Slot, mark, a.Mode, orNone(a.KubernetesVersion), orNone(a.AgentVersion), at)
	}
	r.textOwnership(row)
	r.textWork(row)
	r.textNode(row)
	return w.err
}

// row writes one "key: value" line of Text.
type row func(k, format string, args ...any)

// textOwnership writes the ownership and the older agent's layout.
func (r Report) textOwnership(row row) {
	if o := r.Ownership; o == nil {
		row("ownership", "not owned")
	} else {
		s := "held by " + o.Owner
		if o.Unit != "" {
			s += " (" + o.Unit + ")"
		}
		if o.PID != 0 {
			s += fmt.Sprintf(", pid %d", o.PID)
		}
		if !o.Since.IsZero() {
			s += ", since " + o.Since.Format(time.RFC3339)
		}
		if o.Error != "" {
			s += "; record unreadable: " + o.Error
		}
		row("ownership", "%s", s)
	}
	l := r.Legacy
	if a := l.Adopted; a != nil {
		row("legacy root", "adopted: the older agent's node in slot %s (machine %s) from %s at %s",
			a.Slot, orNone(a.Machine), strings.Join(a.From, ", "), a.At.Format(time.RFC3339))
	}
	if l.AdoptedError != "" {
		row("legacy root", "adoption record unreadable: %s", l.AdoptedError)
	}
	switch {
	case l.Detected:
		var parts []string
		parts = append(parts, l.AppliedConfigs...)
		if l.Binary {
			parts = append(parts, hostpaths.LegacyBinaryHost)
		}
		if l.Unit {
			parts = append(parts, hostpaths.LegacyUnitHost)
		}
		what := "detected: "
		if len(l.AppliedConfigs) > 0 {
			what = "detected, not adopted yet (unbounded-lifecycle.service adopts it; its journal says why not, if it could not): "
		}
		row("legacy root", "%s%s", what, strings.Join(parts, ", "))
	case l.Adopted == nil && l.AdoptedError == "":
		row("legacy root", "not detected")
	}
}

// textWork writes the journals, the handoff and the owed writes: the
// work under way or left.
func (r Report) textWork(row row) {
	if len(r.Journals) == 0 {
		row("journals", "none")
	}
	for _, j := range r.Journals {
		switch {
		case j.Error != "":
			row("journal", "%s: unreadable: %s", j.Operation, j.Error)
		case j.Change != "":
			row("journal", "%s: %s; step %s, updated %s", j.Operation, j.Change, orNone(j.Step), j.Updated.Format(time.RFC3339))
		default:
			row("journal", "%s: step %s, updated %s", j.Operation, orNone(j.Step), j.Updated.Format(time.RFC3339))
		}
	}
	switch h := r.Handoff; {
	case r.HandoffError != "":
		row("handoff", "unreadable: %s", r.HandoffError)
	case h != nil && h.Live():
		next := "now"
		if !h.NextAttempt.IsZero() {
			next = h.NextAttempt.UTC().Format(time.RFC3339)
		}
		row("handoff", "reprovision %s -> %s in progress: steps done %s, attempt %d, next attempt %s, gives up at %s (in %s)%s",
			h.FromMode, h.ToMode, orNone(strings.Join(h.Done, ", ")), h.Attempts, next, h.Deadline.UTC().Format(time.RFC3339),
			time.Until(h.Deadline).Round(time.Second), lastError(h.LastError))
	case h != nil:
		row("handoff", "reprovision %s -> %s %s at %s: %s (the daemon reports it, then removes the handoff)", h.FromMode, h.ToMode, h.State, h.EndedAt.UTC().Format(time.RFC3339), h.Message)
	}
	if len(r.Owed) == 0 && r.OwedError == "" {
		row("owed", "nothing owed to the cluster")
	}
	for _, o := range r.Owed {
		row("owed", "%s", o)
	}
	if r.OwedError != "" {
		row("owed", "unreadable: %s", r.OwedError)
	}
}

// textNode writes the agent's upgrade, the local DNS cache and the
// devices.
func (r Report) textNode(row row) {
	if u := r.Upgrade; u != nil {
		if o := u.Override; o != nil {
			row("upgrade", "override active: the agent's units run %s from %s, not the image's (a newer image supersedes it)", o.Version, o.Dir)
		}
		if f := u.Failed; f != nil {
			row("upgrade", "failed at step %s (%s -> %s, rolled back: %v), not reported yet: %s", f.Step, orNone(f.From), orNone(f.To), f.RolledBack, f.Message)
		}
		if g := u.Upgraded; g != nil {
			row("upgrade", "upgraded %s -> %s at %s, not reported yet", g.From, g.To, g.At.Format(time.RFC3339))
		}
		for _, f := range u.Staged {
			row("upgrade", "staged: %s", f)
		}
		if u.Error != "" {
			row("upgrade", "unreadable: %s", u.Error)
		}
	}
	for _, o := range r.Outcomes {
		if o.Concern == outcome.Upgrade {
			continue // above
		}
		what := string(o.State)
		if o.Reason != "" && o.State == outcome.Failed {
			what += " (" + o.Reason + ")"
		}
		if o.Step != "" {
			what += " at step " + o.Step
		}
		row("outcome", "%s %s at %s: %s", o.Concern, what, o.Time.Format(time.RFC3339), o.Message)
	}
	if r.OutcomesError != "" {
		row("outcome", "unreadable: %s", r.OutcomesError)
	}
	if r.LocalDNS != nil {
		if *r.LocalDNS {
			row("local DNS", "on: the node stack runs the node-local DNS cache, the pods' cluster DNS")
		} else {
			row("local DNS", "off: pods ask the cluster DNS (cluster.cluster-dns) itself")
		}
	}
	if d := r.Devices; d != nil {
		switch {
		case d.Error != "":
			row("devices", "record unreadable: %s", d.Error)
		case len(d.Found) == 0:
			row("devices", "none of the host's (found %s)", d.FoundAt.Format(time.RFC3339))
		}
		for _, x := range d.Found {
			kind := "char"
			if x.Block {
				kind = "block"
			}
			row("device", "%s (%s %d:%d, %s)", x.Path, kind, x.Major, x.Minor, x.Why)
		}
		if len(d.Driver) > 0 {
			row("devices", "%d NVIDIA driver %s bound read-only; %d GPU(s) in %s", len(d.Driver), plural(len(d.Driver), "file", "files"), len(d.GPUs), machinefile.CDISpecPath)
		}
	}
}

// errWriter keeps the first write error and writes nothing after it.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(b []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.w.Write(b)
	e.err = err
	return n, err
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

func readUpgrade(p hostpaths.Paths) *Upgrade {
	var u Upgrade
	var errs []string
	var err error
	if o, err := outcome.Read(p, outcome.Upgrade); err != nil {
		errs = append(errs, err.Error())
	} else if o != nil {
		u.Failed, u.Upgraded = o.UpgradeSignals()
	}
	if u.Override, err = state.ReadAgentOverride(p); err != nil {
		errs = append(errs, err.Error())
	}
	ents, err := os.ReadDir(p.UpgradeStaged())
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, err.Error())
	}
	for _, e := range ents {
		u.Staged = append(u.Staged, e.Name())
	}
	u.Error = strings.Join(errs, "; ")
	if u.Override == nil && u.Failed == nil && u.Upgraded == nil && len(u.Staged) == 0 && u.Error == "" {
		return nil
	}
	return &u
}
