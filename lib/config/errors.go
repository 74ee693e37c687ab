package config

import (
	"errors"
	"fmt"
	"strings"

	"unbounded-cloud.io/agent/lib/exitcode"
)

// ExampleFile is where the packages install the reference configuration
// as a file to copy (deb/build-packages.sh); tests/packages checks it is
// there.
const ExampleFile = "/usr/share/doc/unbounded-agent/agent.toml.example"

// noConfigHint ends the "no config" error: where an operator starts one.
const noConfigHint = "start from `unbounded config check --reference` (every key with its default) or a copy of " + ExampleFile

// Error is one problem with the configuration, located as precisely as the
// loader can: the file the offending value came from (the drop-in, when a
// drop-in set it), the line of its key (0 when unknown, for example a
// required key that no file sets) and the dotted key.
//
// Its message never contains a secret: the bootstrap token is described,
// never quoted.
type Error struct {
	File string // the file on disk, as opened (under --root when given)
	Line int    // 1-based; 0 when no line applies
	Key  string // dotted TOML key, "" for file-level problems
	Msg  string
	// Err is the underlying error when there is one (os.ErrNotExist for a
	// missing config file), for errors.Is.
	Err error
}

// Error formats as FILE:LINE: KEY: MSG, the way compilers do, so that
// editors can jump to it.
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d", e.Line)
	}
	b.WriteString(": ")
	if e.Key != "" {
		b.WriteString(e.Key)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Unwrap exposes the underlying error (if any).
func (e *Error) Unwrap() error { return e.Err }

// Is makes every config error an exitcode.ErrConfigInvalid (exit 78).
func (e *Error) Is(target error) bool { return target == exitcode.ErrConfigInvalid }

// Errors is every problem found in one load, in file order. Loading does
// not stop at the first problem: an operator fixing a config should see all
// of them at once.
type Errors []*Error

// Error is one problem per line.
func (es Errors) Error() string {
	lines := make([]string, len(es))
	for i, e := range es {
		lines[i] = e.Error()
	}
	return strings.Join(lines, "\n")
}

// Unwrap lets errors.Is and errors.As look at each problem.
func (es Errors) Unwrap() []error {
	out := make([]error, len(es))
	for i, e := range es {
		out[i] = e
	}
	return out
}

// Is makes Errors an exitcode.ErrConfigInvalid even when empty-handed
// callers wrap it.
func (es Errors) Is(target error) bool { return target == exitcode.ErrConfigInvalid }

// AsErrors returns the config errors in err, or nil when err holds none.
func AsErrors(err error) Errors {
	var es Errors
	if errors.As(err, &es) {
		return es
	}
	var e *Error
	if errors.As(err, &e) {
		return Errors{e}
	}
	return nil
}
