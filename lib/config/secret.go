package config

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
)

// Secret holds a credential read from a file. It never prints: String,
// GoString, MarshalText and LogValue all give "[redacted]", and the value
// sits behind a pointer so that even reflection-based printing of a struct
// holding a Secret in an unexported field shows an address, not the token.
// Reveal is the one way to the value; call it only where it is sent to the
// API server.
type Secret struct{ v *string }

const redacted = "[redacted]"

// NewSecret wraps a credential that did not come from a config file (a
// token handed over by another step, a test's).
func NewSecret(v string) Secret { return Secret{v: &v} }

// Reveal returns the secret value.
func (s Secret) Reveal() string {
	if s.v == nil {
		return ""
	}
	return *s.v
}

// Empty reports whether the secret holds nothing.
func (s Secret) Empty() bool { return s.v == nil || *s.v == "" }

func (s Secret) String() string                { return redacted }
func (s Secret) GoString() string              { return redacted }
func (s Secret) MarshalText() ([]byte, error)  { return []byte(redacted), nil }
func (s Secret) LogValue() slog.Value          { return slog.StringValue(redacted) }
func (s Secret) Format(f fmt.State, verb rune) { f.Write([]byte(redacted)) }

// readToken reads a bootstrap token file and checks the token's format. The
// error never quotes the content.
func readToken(file string) (Secret, error) {
	data, err := readLimited(file)
	if err != nil {
		return Secret{}, describedError{err}
	}
	tok := string(bytes.TrimSpace(data))
	if tok == "" {
		return Secret{}, errors.New("is empty")
	}
	if !bootstrapTokenRE.MatchString(tok) {
		return Secret{}, fmt.Errorf("does not hold a bootstrap token of the form [a-z0-9]{6}.[a-z0-9]{16} (%d bytes, value not shown)", len(tok))
	}
	return Secret{v: &tok}, nil
}

// ReadBootstrapToken reads the bootstrap token named by
// cluster.bootstrap-token-file (under the config's root). Load has checked
// the file already; this reads it again because the token can be rotated
// on disk while the config stays the same.
func (c *Config) ReadBootstrapToken() (Secret, error) {
	file := c.Resolve(c.Cluster.BootstrapTokenFile)
	s, err := readToken(file)
	if err != nil {
		return Secret{}, fmt.Errorf("bootstrap token file %s: %w", file, err)
	}
	return s, nil
}

// describedError says err in the loader's words (describe: "no such
// file", not the path again) and keeps it for errors.Is.
type describedError struct{ err error }

func (d describedError) Error() string { return describe(d.err) }
func (d describedError) Unwrap() error { return d.err }
