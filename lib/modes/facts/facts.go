// Package facts is the one table of what each isolation mode is
// (ARCHITECTURE section 2): its name, whether it is experimental, whether
// its node stack is replaced in place on the host or runs in a slot of its
// own, whether it builds its node from the node image, the units that run
// its node stack, and the changes between modes this build carries out.
// Everything else that needs a fact of a mode (the state's validation,
// the generator, the service manager's unit names, the CLI, the fleet's
// join, the support check, the table of mode implementations) reads it
// here, so that a mode joining is one row. It imports only unit names,
// so that the generator and the small binaries link it.
package facts

import (
	"fmt"
	"slices"
	"strings"

	"unbounded-cloud.io/agent/lib/unitnames"
)

// Mode is one isolation mode's facts.
type Mode struct {
	Name string
	// Experimental: supported, but not yet for production (the support
	// check says so).
	Experimental bool
	// InPlace: the node stack runs on the host itself and a repave
	// replaces it in place (a version directory beside the running one),
	// not in a slot of its own beside the running one (blue/green).
	InPlace bool
	// FromNodeImage: the node is built from the node image (agent.toml's
	// [nspawn] image).
	FromNodeImage bool
	// InMachine: the node stack's kubelet and containerd run in the
	// slot's machine (its own systemd: unitnames.MachineKubelet, ...),
	// not on the host.
	InMachine bool
	// supervising are the units that run the node stack of a slot, "%s"
	// standing for the slot.
	supervising []string
}

// Supervising are the units that run m's node stack in slot: what the
// mode target requires, what the fence guards, what "the node runs"
// means; the kubelet's host last.
func (m Mode) Supervising(slot string) []string {
	out := make([]string, len(m.supervising))
	for i, u := range m.supervising {
		if strings.Contains(u, "%s") {
			u = fmt.Sprintf(u, slot)
		}
		out[i] = u
	}
	return out
}

// Table is every mode this build knows, in the order they are listed.
var Table = []Mode{
	{Name: "nspawn", FromNodeImage: true, InMachine: true, supervising: []string{"systemd-nspawn@%s.service"}},
	{Name: "container", Experimental: true, FromNodeImage: true, InMachine: true, supervising: []string{"unbounded-container@%s.service"}},
	{Name: "none", InPlace: true, supervising: []string{unitnames.Containerd, unitnames.Kubelet}},
}

// Lookup returns the facts of the mode named name.
func Lookup(name string) (Mode, bool) {
	i := slices.IndexFunc(Table, func(m Mode) bool { return m.Name == name })
	if i < 0 {
		return Mode{}, false
	}
	return Table[i], true
}

// Names are the modes' names, in the table's order.
func Names() []string {
	out := make([]string, len(Table))
	for i, m := range Table {
		out[i] = m.Name
	}
	return out
}

// Valid reports whether name names a mode.
func Valid(name string) bool {
	_, ok := Lookup(name)
	return ok
}

// FromNodeImage reports whether mode name builds its node from the node
// image (false for an unknown mode).
func FromNodeImage(name string) bool {
	m, _ := Lookup(name)
	return m.FromNodeImage
}

// Supervising are the units that run the node stack of mode name in slot
// (Mode.Supervising); nil for an unknown mode.
func Supervising(name, slot string) []string {
	m, ok := Lookup(name)
	if !ok {
		return nil
	}
	return m.Supervising(slot)
}

// KubeletHost is the supervising unit whose start starts the kubelet of
// mode name in slot: the machine for a mode InMachine, the kubelet's own
// unit for none. "" for an unknown mode.
func KubeletHost(name, slot string) string {
	if u := Supervising(name, slot); len(u) > 0 {
		return u[len(u)-1]
	}
	return ""
}

// NodeUnit is where component ("kubelet" or "containerd") of mode name's
// node stack in slot runs: the machine ("" for the host) and the unit
// there. ok is false for an unknown mode or component.
func NodeUnit(name, slot, component string) (machine, unit string, ok bool) {
	m, known := Lookup(name)
	if !known || (component != "kubelet" && component != "containerd") {
		return "", "", false
	}
	if m.InMachine {
		if component == "kubelet" {
			return slot, unitnames.MachineKubelet, true
		}
		return slot, unitnames.MachineContainerd, true
	}
	if component == "kubelet" {
		return "", unitnames.Kubelet, true
	}
	return "", unitnames.Containerd, true
}

// How an isolation change is carried out: the values of the Machine's
// status.isolationChange.method.
const (
	// MethodInPlace: both modes can share the host; the target mode's
	// node stack is built into the other slot beside the running one,
	// then the switch is a blue/green one across modes, rolled back when
	// the new node does not come up.
	MethodInPlace = "InPlace"
	// MethodReprovision: the host is reset and bootstrapped again in the
	// target mode (unbounded-reprovision.service).
	MethodReprovision = "Reprovision"
)

// Changes is the table of isolation changes this build carries out:
// from mode, to mode, method. A mode that joins adds its rows here; a
// pair without a row is refused. Every pair of today's modes can share
// the host, so every change is in place by default: the two blue/green
// modes' nodes are in different slots and trees (a machine
// /var/lib/machines/<slot>, a bundle /var/lib/unbounded/slots/<slot>/
// bundle), and mode none's stack is on the host beside either.
var Changes = map[[2]string]string{
	{"nspawn", "none"}:      MethodInPlace,
	{"none", "nspawn"}:      MethodInPlace,
	{"nspawn", "container"}: MethodInPlace,
	{"container", "nspawn"}: MethodInPlace,
	{"container", "none"}:   MethodInPlace,
	{"none", "container"}:   MethodInPlace,
}
