package steps

import "strings"

// Doc is one step of an operation as an operator reads it: its name and
// what it does, in a few words. An operation's list of them is the one
// home of its steps' order and description: the runner's step list
// follows it (Names), its package doc points at it, and its --help shows
// it (Help).
type Doc struct{ Name, Does string }

// Names are the steps' names in order.
func Names(docs []Doc) []string {
	out := make([]string, len(docs))
	for i, d := range docs {
		out[i] = d.Name
	}
	return out
}

// Help is the steps as a paragraph of a command's help: "Steps (each
// journaled): name: does; ...". label names them ("step", "phase").
func Help(label string, docs []Doc) string {
	parts := make([]string, len(docs))
	for i, d := range docs {
		parts[i] = d.Name + ": " + d.Does
	}
	return strings.ToUpper(label[:1]) + label[1:] + "s, in order, each journaled (a run cut anywhere resumes from the journal): " + strings.Join(parts, "; ") + "."
}
