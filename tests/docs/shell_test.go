package docs

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// The documents' command lines are read by a small lexer of the shell's
// words: enough for what a README shows (quotes, backslashes, comments,
// pipelines and lists, redirections, NAME=value prefixes), and an error
// for anything more (command substitution, subshells), so that no part of
// a line goes unchecked.

// simple is one simple command of a line: its words (after the NAME=value
// assignments before it) and the targets of its redirections.
type simple struct {
	words     []string
	redirects []string
}

var errUnsupported = errors.New("shell syntax the docs test does not read (command substitution, a subshell or a group): show a simpler command")

// assignment is a NAME=value word before a command: its environment.
var assignment = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*=`)

// splitLine splits one logical command line into its simple commands.
func splitLine(line string) ([]simple, error) {
	var (
		out      []simple
		cur      simple
		word     strings.Builder
		inWord   bool
		redirect bool // the next word is a redirection's target
	)
	endWord := func() {
		if !inWord {
			return
		}
		if redirect {
			cur.redirects = append(cur.redirects, word.String())
			redirect = false
		} else {
			cur.words = append(cur.words, word.String())
		}
		word.Reset()
		inWord = false
	}
	endCommand := func() error {
		endWord()
		if redirect {
			return fmt.Errorf("a redirection without its target in %q", line)
		}
		for len(cur.words) > 0 && assignment.MatchString(cur.words[0]) {
			cur.words = cur.words[1:]
		}
		if len(cur.words) > 0 {
			out = append(out, cur)
		} else if len(cur.redirects) > 0 {
			return fmt.Errorf("a redirection without a command in %q", line)
		}
		cur = simple{}
		return nil
	}
	r := []rune(line)
	for i := 0; i < len(r); i++ {
		c := r[i]
		switch {
		case c == '#' && !inWord:
			i = len(r) // a comment, to the end of the line
		case c == ' ' || c == '\t':
			endWord()
		case c == '\'':
			j := i + 1
			for j < len(r) && r[j] != '\'' {
				j++
			}
			if j == len(r) {
				return nil, fmt.Errorf("an unterminated ' in %q", line)
			}
			word.WriteString(string(r[i+1 : j]))
			inWord, i = true, j
		case c == '"':
			j := i + 1
			for ; j < len(r) && r[j] != '"'; j++ {
				switch {
				case r[j] == '\\' && j+1 < len(r) && strings.ContainsRune("\"\\$`", r[j+1]):
					j++
					word.WriteRune(r[j])
				case r[j] == '`' || (r[j] == '$' && j+1 < len(r) && r[j+1] == '('):
					return nil, errUnsupported
				default:
					word.WriteRune(r[j])
				}
			}
			if j == len(r) {
				return nil, fmt.Errorf(`an unterminated " in %q`, line)
			}
			inWord, i = true, j
		case c == '\\':
			if i+1 < len(r) {
				i++
				word.WriteRune(r[i])
				inWord = true
			}
		case c == '`', c == '(', c == ')', c == '$' && i+1 < len(r) && r[i+1] == '(':
			return nil, errUnsupported
		case c == '|' || c == ';' || c == '&':
			if err := endCommand(); err != nil {
				return nil, err
			}
			if i+1 < len(r) && (r[i+1] == c) {
				i++ // || and &&
			}
		case c == '>' || c == '<':
			// A descriptor number before it (2>) is not a word.
			if inWord && strings.Trim(word.String(), "0123456789") == "" {
				word.Reset()
				inWord = false
			}
			endWord()
			if i+1 < len(r) && r[i+1] == '>' {
				i++
			}
			if i+1 < len(r) && r[i+1] == '&' {
				// >&2, 2>&1: a descriptor, no target
				i++
				for i+1 < len(r) && r[i+1] >= '0' && r[i+1] <= '9' {
					i++
				}
				continue
			}
			redirect = true
		default:
			word.WriteRune(c)
			inWord = true
		}
	}
	if err := endCommand(); err != nil {
		return nil, err
	}
	return out, nil
}
