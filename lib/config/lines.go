package config

import (
	"strconv"
	"strings"

	"github.com/BurntSushi/toml"
)

// lineIndex maps a dotted key (toml.Key.String()) to the 1-based line where
// a file first defines it.
//
// BurntSushi/toml knows every key's position but does not export it
// (MetaData keeps it private), and a semantic error (an http:// api-server)
// is found after decoding. So the loader scans the file's text once more
// for key positions. The text has already been accepted by the TOML parser,
// so this scanner is lenient: it only needs to follow tables, dotted and
// quoted keys, inline tables, arrays and multi-line strings well enough to
// not mistake a value for a key. On anything unexpected it moves on; it
// never fails, and a key it cannot place falls back to its parent's line.
type lineIndex map[string]int

// lookup returns the line of key, or of its nearest ancestor the file
// defines, or 0.
func (ix lineIndex) lookup(key toml.Key) int {
	for n := len(key); n > 0; n-- {
		if l, ok := ix[key[:n].String()]; ok {
			return l
		}
	}
	return 0
}

func indexLines(text string) lineIndex {
	s := &lineScanner{src: text, line: 1, idx: lineIndex{}}
	s.document()
	return s.idx
}

type lineScanner struct {
	src  string
	pos  int
	line int
	idx  lineIndex
}

func (s *lineScanner) eof() bool { return s.pos >= len(s.src) }

func (s *lineScanner) peek() byte {
	if s.eof() {
		return 0
	}
	return s.src[s.pos]
}

func (s *lineScanner) advance() {
	if s.eof() {
		return
	}
	if s.src[s.pos] == '\n' {
		s.line++
	}
	s.pos++
}

func (s *lineScanner) record(key toml.Key, line int) {
	k := key.String()
	if _, ok := s.idx[k]; !ok {
		s.idx[k] = line
	}
}

// skipSpace skips blanks; with newlines also line ends and comments.
func (s *lineScanner) skipSpace(newlines bool) {
	for !s.eof() {
		switch c := s.peek(); {
		case c == ' ' || c == '\t' || c == '\r':
			s.advance()
		case c == '#':
			for !s.eof() && s.peek() != '\n' {
				s.advance()
			}
		case c == '\n' && newlines:
			s.advance()
		default:
			return
		}
	}
}

func (s *lineScanner) skipLine() {
	for !s.eof() && s.peek() != '\n' {
		s.advance()
	}
}

func (s *lineScanner) document() {
	var table toml.Key
	for !s.eof() {
		s.skipSpace(true)
		if s.eof() {
			return
		}
		start := s.pos
		if s.peek() == '[' {
			s.advance()
			if s.peek() == '[' { // [[array.of.tables]]: elements are not indexed
				s.advance()
			}
			s.skipSpace(false)
			table = s.key()
			s.record(table, s.line)
			s.skipLine()
		} else {
			line := s.line
			k := s.key()
			if len(k) > 0 {
				full := append(append(toml.Key{}, table...), k...)
				s.record(full, line)
				s.skipSpace(false)
				if s.peek() == '=' {
					s.advance()
					s.value(full)
				}
			}
			s.skipLine()
		}
		if s.pos == start { // no progress: never loop on input we do not understand
			s.advance()
		}
	}
}

// key reads a dotted key: bare, "basic" or 'literal' parts joined by dots.
func (s *lineScanner) key() toml.Key {
	var k toml.Key
	for !s.eof() {
		s.skipSpace(false)
		var part string
		var ok bool
		switch c := s.peek(); {
		case c == '"':
			part, ok = s.basicString()
		case c == '\'':
			part, ok = s.literalString()
		case isBare(c):
			start := s.pos
			for !s.eof() && isBare(s.peek()) {
				s.advance()
			}
			part, ok = s.src[start:s.pos], true
		}
		if !ok {
			return k
		}
		k = append(k, part)
		s.skipSpace(false)
		if s.peek() != '.' {
			return k
		}
		s.advance()
	}
	return k
}

func isBare(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_'
}

// basicString reads a "..." string (or a """...""" one) and returns its
// value as far as Go's unquoting agrees with TOML's; keys only need it to
// match what the decoder reports.
func (s *lineScanner) basicString() (string, bool) {
	if strings.HasPrefix(s.src[s.pos:], `"""`) {
		s.multiline(`"""`)
		return "", false
	}
	start := s.pos
	s.advance()
	for !s.eof() && s.peek() != '"' && s.peek() != '\n' {
		if s.peek() == '\\' {
			s.advance()
		}
		s.advance()
	}
	if s.peek() != '"' {
		return "", false
	}
	s.advance()
	raw := s.src[start:s.pos]
	if v, err := strconv.Unquote(raw); err == nil {
		return v, true
	}
	return raw[1 : len(raw)-1], true
}

func (s *lineScanner) literalString() (string, bool) {
	if strings.HasPrefix(s.src[s.pos:], `'''`) {
		s.multiline(`'''`)
		return "", false
	}
	s.advance()
	start := s.pos
	for !s.eof() && s.peek() != '\'' && s.peek() != '\n' {
		s.advance()
	}
	if s.peek() != '\'' {
		return "", false
	}
	v := s.src[start:s.pos]
	s.advance()
	return v, true
}

// multiline skips a multi-line string opened by delim (up to five quotes
// may close it: the closing delimiter may be preceded by one or two quotes
// that belong to the content).
func (s *lineScanner) multiline(delim string) {
	for range 3 {
		s.advance()
	}
	for !s.eof() {
		if delim == `"""` && s.peek() == '\\' {
			s.advance()
			s.advance()
			continue
		}
		if strings.HasPrefix(s.src[s.pos:], delim) {
			for range 3 {
				s.advance()
			}
			for !s.eof() && s.peek() == delim[0] {
				s.advance()
			}
			return
		}
		s.advance()
	}
}

// value skips one value, recording the keys of inline tables under prefix.
func (s *lineScanner) value(prefix toml.Key) {
	s.skipSpace(false)
	switch c := s.peek(); c {
	case '"':
		s.basicString()
	case '\'':
		s.literalString()
	case '[':
		s.advance()
		for !s.eof() {
			s.skipSpace(true)
			if s.peek() == ']' {
				s.advance()
				return
			}
			start := s.pos
			s.value(prefix)
			s.skipSpace(true)
			if s.peek() == ',' {
				s.advance()
			}
			if s.pos == start {
				s.advance()
			}
		}
	case '{':
		s.advance()
		for !s.eof() {
			s.skipSpace(true)
			if s.peek() == '}' {
				s.advance()
				return
			}
			start := s.pos
			line := s.line
			k := s.key()
			if len(k) > 0 {
				full := append(append(toml.Key{}, prefix...), k...)
				s.record(full, line)
				s.skipSpace(false)
				if s.peek() == '=' {
					s.advance()
					s.value(full)
				}
			}
			s.skipSpace(true)
			if s.peek() == ',' {
				s.advance()
			}
			if s.pos == start {
				s.advance()
			}
		}
	default: // number, boolean, date: up to a delimiter
		for !s.eof() {
			switch s.peek() {
			case ',', ']', '}', '\n', '#':
				return
			}
			s.advance()
		}
	}
}
