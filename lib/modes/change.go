package modes

import (
	"fmt"
	"slices"
	"strings"
)

// How an isolation change is carried out (lib/repave's isolation
// variant, unbounded-isolation.service): the values of the Machine's
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

// changeMethods is the table of isolation changes this build carries
// out: from mode, to mode, method. A mode that joins (container) adds its
// rows here; a pair without a row is refused (ChangeMethod's error).
var changeMethods = map[[2]string]string{
	{"nspawn", "none"}: MethodInPlace,
	{"none", "nspawn"}: MethodInPlace,
}

// ChangeMethod returns how a change of isolation mode from one mode to
// another is carried out; an error says that this build cannot change
// between them (and changes nothing).
func ChangeMethod(from, to string) (string, error) {
	if from == to {
		return "", fmt.Errorf("isolation change from %s to %s: the same mode", from, to)
	}
	if m, ok := changeMethods[[2]string{from, to}]; ok {
		return m, nil
	}
	return "", fmt.Errorf("isolation change from %s to %s: not carried out by this build (it changes between %s)", from, to, changePairs())
}

func changePairs() string {
	var s []string
	for p := range changeMethods {
		s = append(s, p[0]+" -> "+p[1])
	}
	slices.Sort(s)
	return strings.Join(s, ", ")
}
