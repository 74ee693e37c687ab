package config

import (
	"encoding"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
	"github.com/agnivade/levenshtein"
)

// The loader decodes each file into a generic tree first and checks that
// tree against the Config type itself (its toml tags are the schema). That
// way one pass reports every unknown key and every wrong type with its key
// and line, where decoding straight into the struct would stop at the
// first mismatch and say little about where it was.

var textUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()

// tomlType names the TOML type of a decoded value, for messages.
func tomlType(v any) string {
	switch v.(type) {
	case string:
		return "string"
	case int64:
		return "integer"
	case float64:
		return "float"
	case bool:
		return "boolean"
	case time.Time:
		return "datetime"
	case []any, []map[string]any:
		return "array"
	case map[string]any:
		return "table"
	}
	return fmt.Sprintf("%T", v)
}

// wantType names the TOML type a Go type expects.
func wantType(t reflect.Type) string {
	if reflect.PointerTo(t).Implements(textUnmarshaler) {
		if t == reflect.TypeFor[Duration]() {
			return `duration string (e.g. "2m")`
		}
		return "string"
	}
	switch t.Kind() {
	case reflect.String:
		return "string"
	case reflect.Bool:
		return "boolean"
	case reflect.Int, reflect.Int64:
		return "integer"
	case reflect.Slice:
		return "array of " + wantType(t.Elem()) + "s"
	case reflect.Struct:
		return "table"
	case reflect.Map:
		return "table of " + wantType(t.Elem()) + "s"
	}
	return t.String()
}

// fieldByKey finds the struct field whose toml tag is key.
func fieldByKey(t reflect.Type, key string) (reflect.StructField, bool) {
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
		if name == key && name != "" && name != "-" {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

// sortedKeys gives map iteration a stable order, so messages come out in
// the same order on every run.
func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// checkTree reports every key of v that t does not have and every value
// whose type does not fit, calling bad(key, msg) for each.
func checkTree(v any, t reflect.Type, key toml.Key, bad func(toml.Key, string)) {
	if reflect.PointerTo(t).Implements(textUnmarshaler) {
		s, ok := v.(string)
		if !ok {
			bad(key, fmt.Sprintf("must be %s, got %s", withArticle(wantType(t)), withArticle(tomlType(v))))
			return
		}
		if err := reflect.New(t).Interface().(encoding.TextUnmarshaler).UnmarshalText([]byte(s)); err != nil {
			bad(key, err.Error())
		}
		return
	}
	mismatch := func() {
		bad(key, fmt.Sprintf("must be %s, got %s", withArticle(wantType(t)), withArticle(tomlType(v))))
	}
	switch t.Kind() {
	case reflect.Struct:
		m, ok := v.(map[string]any)
		if !ok {
			mismatch()
			return
		}
		for _, k := range sortedKeys(m) {
			sub := addKey(key, k)
			f, ok := fieldByKey(t, k)
			if !ok {
				bad(sub, unknownKey(t, key, k))
				continue
			}
			checkTree(m[k], f.Type, sub, bad)
		}
	case reflect.Map:
		m, ok := v.(map[string]any)
		if !ok {
			mismatch()
			return
		}
		for _, k := range sortedKeys(m) {
			checkTree(m[k], t.Elem(), addKey(key, k), bad)
		}
	case reflect.Slice:
		var items []any
		switch a := v.(type) {
		case []any:
			items = a
		case []map[string]any:
			for _, x := range a {
				items = append(items, x)
			}
		default:
			mismatch()
			return
		}
		for i, x := range items {
			checkTree(x, t.Elem(), key, func(k toml.Key, msg string) {
				bad(k, fmt.Sprintf("element %d: %s", i+1, msg))
			})
		}
	case reflect.String:
		if _, ok := v.(string); !ok {
			mismatch()
		}
	case reflect.Bool:
		if _, ok := v.(bool); !ok {
			mismatch()
		}
	case reflect.Int, reflect.Int64:
		if _, ok := v.(int64); !ok {
			mismatch()
		}
	default:
		mismatch()
	}
}

// mergeTree applies src over dst following the drop-in rule: tables that
// are sections of Config (struct types) merge key by key; every other value
// (scalars, arrays and map-typed values like node.labels) replaces the
// earlier one whole. set(key) is called for every key src sets, so the
// loader knows which file each value came from. src has passed checkTree.
func mergeTree(dst, src map[string]any, t reflect.Type, key toml.Key, set func(toml.Key)) {
	for _, k := range sortedKeys(src) {
		sub := addKey(key, k)
		f, ok := fieldByKey(t, k)
		if !ok {
			continue
		}
		sm, isTable := src[k].(map[string]any)
		if isTable && f.Type.Kind() == reflect.Struct && !reflect.PointerTo(f.Type).Implements(textUnmarshaler) {
			dm, ok := dst[k].(map[string]any)
			if !ok {
				dm = map[string]any{}
				dst[k] = dm
			}
			mergeTree(dm, sm, f.Type, sub, set)
			continue
		}
		dst[k] = src[k]
		set(sub)
	}
}

// addKey returns key extended by part, never sharing key's backing array.
func addKey(key toml.Key, part string) toml.Key {
	return append(append(make(toml.Key, 0, len(key)+1), key...), part)
}

func withArticle(s string) string {
	if strings.IndexByte("aeiou", s[0]) >= 0 {
		return "an " + s
	}
	return "a " + s
}

// unknownKey is the message for key k, unknown in the table at path table
// (of type t). It says what the operator most likely meant, in this order:
//
//   - k is a key of another table. The usual cause is TOML itself: every
//     key below a [section] header belongs to that section, so a top-level
//     key written after [cluster] reads as cluster.machine, and
//     api-server written above [cluster] reads as a top-level key.
//   - k is a misspelling of a key of this table ("did you mean").
//   - k is a misspelling of a key of another table.
func unknownKey(t reflect.Type, table toml.Key, k string) string {
	const msg = "unknown key"
	if t.Kind() != reflect.Struct {
		return msg
	}
	var elsewhere []string
	for _, s := range sections() {
		if s.path.String() == table.String() {
			continue
		}
		if _, ok := fieldByKey(s.typ, k); ok {
			elsewhere = append(elsewhere, s.name())
		}
	}
	if len(elsewhere) > 0 {
		return fmt.Sprintf("%s: %s belongs %s", msg, k, strings.Join(elsewhere, " or "))
	}
	if near := closest(k, tomlKeys(t)); near != "" {
		return fmt.Sprintf("%s; did you mean %q?", msg, near)
	}
	var all []string
	full := map[string]string{}
	for _, s := range sections() {
		if s.path.String() == table.String() {
			continue
		}
		for _, name := range tomlKeys(s.typ) {
			all = append(all, name)
			if _, dup := full[name]; !dup {
				full[name] = addKey(s.path, name).String() + " (" + s.name() + ")"
			}
		}
	}
	if near := closest(k, all); near != "" {
		return fmt.Sprintf("%s; did you mean %s?", msg, full[near])
	}
	return msg
}

// section is a table of the configuration with a fixed set of keys: the
// top level or one of its [sections]. Tables of free-form keys
// (node.labels, artifacts.overrides) are not sections.
type section struct {
	path toml.Key
	typ  reflect.Type
}

func (s section) name() string {
	if len(s.path) == 0 {
		return "at the top level (above the first [section] header)"
	}
	return "in [" + s.path.String() + "]"
}

func sections() []section {
	out := []section{{nil, configType}}
	for i := range configType.NumField() {
		f := configType.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
		if name == "" || name == "-" || f.Type.Kind() != reflect.Struct || reflect.PointerTo(f.Type).Implements(textUnmarshaler) {
			continue
		}
		out = append(out, section{toml.Key{name}, f.Type})
	}
	return out
}

// tomlKeys are the keys a struct type accepts, in declaration order.
func tomlKeys(t reflect.Type) []string {
	var keys []string
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("toml"), ",")
		if name != "" && name != "-" {
			keys = append(keys, name)
		}
	}
	return keys
}

// closest returns the candidate nearest to k by edit distance, when it is
// near enough to be a typo: at most one edit in three characters and never
// more than three ("api-servr" -> "api-server", but "colour" suggests
// nothing). Ties go to the first candidate, so messages are stable.
func closest(k string, candidates []string) string {
	limit := min(3, max(1, len(k)/3))
	best, bestD := "", limit+1
	for _, c := range candidates {
		if d := levenshtein.ComputeDistance(k, c); d < bestD {
			best, bestD = c, d
		}
	}
	return best
}
