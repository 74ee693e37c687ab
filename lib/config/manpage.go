package config

import (
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"

	"unbounded-cloud.io/agent/lib/hostpaths"
)

// WriteManPage writes unbounded-agent.toml(5) as markdown for go-md2man,
// made from Reference: its opening comment is the description, and every
// key is listed under its section with its default (or REQUIRED) and the
// comment above it. A key added to reference.toml is documented by adding
// it there, as every default is.
func WriteManPage(out io.Writer, version string) error {
	var w strings.Builder
	fmt.Fprintf(&w, "unbounded-agent.toml 5 \"\" \"unbounded-agent %s\" \"File Formats\"\n==========\n\n", version)
	w.WriteString("# NAME\nunbounded-agent.toml - configuration of unbounded-agent\n\n")
	fmt.Fprintf(&w, "# SYNOPSIS\n*%s*\n\n*%s/\\*.toml*\n\n", hostpaths.ConfigFileHost, hostpaths.ConfigDropinDirHost)
	ref := parseReference(Reference)
	w.WriteString("# DESCRIPTION\n")
	// The reference's opening comment speaks of itself as "this file".
	intro := slices.Clone(ref.intro)
	if len(intro) > 0 {
		intro[0] = strings.Replace(intro[0], "This file is", "The reference configuration (KEYS below) is", 1)
	}
	writeProse(&w, intro)
	w.WriteString("# KEYS\n")
	for _, s := range ref.sections {
		if s.name == "" {
			w.WriteString("## Top level\n")
		} else {
			fmt.Fprintf(&w, "## [%s]\n", s.name)
		}
		for _, k := range s.keys {
			term := "**" + k.name + "**"
			if k.required {
				term += " (required)"
			} else {
				term += " = " + mdEscape(k.value)
			}
			fmt.Fprintf(&w, "%s\n", term)
			var b strings.Builder
			writeProse(&b, k.doc)
			for i, line := range strings.Split(strings.TrimSpace(b.String()), "\n") {
				switch {
				case line == "":
					w.WriteString("\n")
				case i == 0:
					w.WriteString(":   " + line + "\n")
				default:
					w.WriteString("    " + line + "\n")
				}
			}
			w.WriteString("\n")
		}
	}
	w.WriteString("# FILES\n")
	fmt.Fprintf(&w, "*%s*\n:   The configuration.\n\n", hostpaths.ConfigFileHost)
	fmt.Fprintf(&w, "*%s/\\*.toml*\n:   Drop-ins, merged in lexical order over it.\n\n", hostpaths.ConfigDropinDirHost)
	fmt.Fprintf(&w, "*%s*\n:   This reference as a file to start from; **unbounded config check --reference** prints it.\n\n", ExampleFile)
	w.WriteString("# SEE ALSO\n**unbounded**(1)\n")
	_, err := io.WriteString(out, w.String())
	return err
}

type refKey struct {
	name, value string
	required    bool
	doc         []string // comment lines, "# " removed
}

type refSection struct {
	name string
	keys []refKey
}

type reference struct {
	intro    []string
	sections []refSection
}

var (
	refKeyRE     = regexp.MustCompile(`^([a-z0-9-]+) = (.*)$`)
	refSectionRE = regexp.MustCompile(`^\[([a-z0-9.-]+)\]$`)
)

// parseReference reads reference.toml's layout: an opening comment block,
// then keys each under the comment that documents it, in [sections]. A
// REQUIRED key is a comment block whose last line is the key commented out
// ("# machine = ..."), as the file's header says.
func parseReference(ref string) reference {
	var r reference
	r.sections = []refSection{{}}
	var doc []string
	intro := true
	flush := func() {
		// A comment block ending in a commented-out key: a REQUIRED key.
		if n := len(doc); n > 0 {
			if m := refKeyRE.FindStringSubmatch(doc[n-1]); m != nil && strings.Contains(strings.Join(doc, " "), "REQUIRED") {
				text := append([]string{}, doc[:n-1]...)
				if len(text) > 0 {
					text[0] = strings.TrimSpace(strings.TrimPrefix(text[0], "REQUIRED."))
				}
				text = append(text, "", "For example: "+doc[n-1])
				s := &r.sections[len(r.sections)-1]
				s.keys = append(s.keys, refKey{name: m[1], required: true, doc: text})
			}
		}
		doc = nil
	}
	for i, line := range strings.Split(ref, "\n") {
		switch {
		case i == 0:
			// The file's title.
		case strings.HasPrefix(line, "#"):
			doc = append(doc, strings.TrimPrefix(strings.TrimPrefix(line, "#"), " "))
		case strings.TrimSpace(line) == "":
			if intro {
				r.intro, doc, intro = doc, nil, false
				continue
			}
			flush()
		case refSectionRE.MatchString(line):
			flush()
			r.sections = append(r.sections, refSection{name: refSectionRE.FindStringSubmatch(line)[1]})
		default:
			if m := refKeyRE.FindStringSubmatch(line); m != nil {
				s := &r.sections[len(r.sections)-1]
				s.keys = append(s.keys, refKey{name: m[1], value: m[2], doc: doc})
				doc = nil
			}
		}
	}
	flush()
	return r
}

// writeProse renders comment lines as markdown: blank lines part
// paragraphs, "- " lines are list items, and lines that are TOML (a
// commented example) are code.
func writeProse(w *strings.Builder, lines []string) {
	inList, inCode := false, false
	for _, l := range lines {
		t := strings.TrimSpace(l)
		isCode := refSectionRE.MatchString(t) || refKeyRE.MatchString(t)
		switch {
		case isCode:
			if !inCode {
				w.WriteString("\n")
			}
			w.WriteString("    " + t + "\n")
			inCode, inList = true, false
			continue
		case inCode:
			w.WriteString("\n")
			inCode = false
		}
		switch {
		case t == "":
			w.WriteString("\n")
			inList = false
		case strings.HasPrefix(t, "- "):
			if !inList {
				w.WriteString("\n")
			}
			w.WriteString("- " + mdEscape(strings.TrimPrefix(t, "- ")) + "\n")
			inList = true
		case inList && strings.HasPrefix(l, "    "):
			w.WriteString("  " + mdEscape(t) + "\n") // a list item's continuation
		default:
			if inList {
				w.WriteString("\n")
				inList = false
			}
			w.WriteString(mdEscape(t) + "\n")
		}
	}
	w.WriteString("\n")
}

var codeSpanRE = regexp.MustCompile("`([^`]+)`")

// mdEscape escapes what markdown would take for formatting; a `command`
// in the comments becomes bold, as man pages show commands.
func mdEscape(s string) string {
	s = strings.NewReplacer(`\`, `\\`, "*", `\*`, "_", `\_`, "<", `\<`, "[", `\[`).Replace(s)
	return codeSpanRE.ReplaceAllString(s, "**$1**")
}
