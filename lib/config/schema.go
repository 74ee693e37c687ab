package config

import (
	"encoding"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
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
				bad(sub, "unknown key")
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
