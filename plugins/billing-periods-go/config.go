package main

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"unicode"

	"tally"
)

// A meter's kind.
type meterKind uint8

const (
	sum meterKind = iota
	count
	maximum
	latest
	unique
)

// meterNames are the meters as [plugin_config] names them.
var meterNames = [...]string{"sum", "count", "max", "latest", "unique_count"}

// Meter is how one metric counts: unique_count counts the values of field.
type Meter struct {
	kind  meterKind
	field string
}

// configHint heads every refusal of a config that is not a meters table.
const configHint = `write meters = { calls = "sum", seats = { unique_count = "user" } }: `

// newBilling is the plugin for the job's [plugin_config]: `meters`, one
// meter per metric, written "sum", "count", "max", "latest",
// { unique_count = "<field>" }, "unique_count:<field>" or
// { meter = "unique_count", field = "<field>" }. Its refusals are the Rust
// build's, word for word (serde's words where the Rust build quotes them).
func newBilling(config tally.Value) (*Billing, error) {
	refuse := func(format string, args ...any) (*Billing, error) {
		return nil, fmt.Errorf(configHint+format, args...)
	}
	if config.Kind != tally.Object {
		return refuse("invalid type: %s, expected struct Config", unexpected(&config))
	}
	type spec struct {
		name, field string
		hasField    bool
	}
	specs := map[string]spec{}
	var metrics []string
	found := false
	// serde_json's map is ordered by key bytes: the first wrong member in
	// that order is the refusal.
	for _, name := range sortedNames(&config) {
		if name != "meters" {
			return refuse("unknown field `%s`, expected `meters`", name)
		}
		found = true
		meters := config.Get("meters")
		if meters.Kind != tally.Object {
			return refuse("invalid type: %s, expected a map", unexpected(meters))
		}
		for _, metric := range sortedNames(meters) {
			name, field, hasField, ok := meterSpec(meters.Get(metric))
			if !ok {
				return refuse("data did not match any variant of untagged enum MeterSpec")
			}
			specs[metric] = spec{name, field, hasField}
			metrics = append(metrics, metric)
		}
	}
	if !found {
		return refuse("missing field `meters`")
	}
	if len(metrics) == 0 {
		return nil, fmt.Errorf("meters is empty: name at least one metric's meter")
	}
	billing := &Billing{meters: map[string]Meter{}, metrics: strings.Join(metrics, ", ")}
	for _, metric := range metrics {
		spec := specs[metric]
		var meter Meter
		switch {
		case spec.name == "sum" && !spec.hasField:
			meter = Meter{kind: sum}
		case spec.name == "count" && !spec.hasField:
			meter = Meter{kind: count}
		case spec.name == "max" && !spec.hasField:
			meter = Meter{kind: maximum}
		case spec.name == "latest" && !spec.hasField:
			meter = Meter{kind: latest}
		case spec.name == "unique_count" && spec.field != "":
			meter = Meter{kind: unique, field: spec.field}
		case spec.name == "unique_count":
			return nil, fmt.Errorf(`meters.%s: unique_count counts the values of a field; name it: { unique_count = "user" }`, metric)
		default:
			return nil, fmt.Errorf(`meters.%s = %s: the meters are "sum", "count", "max", "latest" and { unique_count = "<field>" }`, metric, rustDebug(spec.name))
		}
		billing.meters[metric] = meter
	}
	return billing, nil
}

// meterSpec reads one meter as serde's untagged MeterSpec does, trying
// its forms in order: a string ("sum", "unique_count:user"),
// { unique_count = "user" }, { meter = "...", field = "..." } (other
// members ignored; an array is none of them, as the Rust build finds).
func meterSpec(value *tally.Value) (name, field string, hasField, ok bool) {
	text := func(value *tally.Value) (string, bool) {
		if value == nil || value.Kind != tally.String {
			return "", false
		}
		return value.Text, true
	}
	switch value.Kind {
	case tally.String:
		name, field, hasField = strings.Cut(value.Text, ":")
		return name, field, hasField, true
	case tally.Object:
		if field, ok := text(value.Get("unique_count")); ok {
			return "unique_count", field, true, true
		}
		name, ok := text(value.Get("meter"))
		if !ok {
			return "", "", false, false
		}
		given := value.Get("field")
		if given == nil || given.Kind == tally.Null {
			return name, "", false, true
		}
		field, ok := text(given)
		return name, field, true, ok
	}
	return "", "", false, false
}

// sortedNames are an object's member names, each once, by their bytes.
func sortedNames(object *tally.Value) []string {
	seen := map[string]bool{}
	var names []string
	for _, name := range object.Names {
		if !seen[name] {
			seen[name] = true
			names = append(names, name)
		}
	}
	sort.Strings(names)
	return names
}

// unexpected is a JSON value as serde names an unexpected one.
func unexpected(value *tally.Value) string {
	switch value.Kind {
	case tally.Null:
		return "unit value"
	case tally.True:
		return "boolean `true`"
	case tally.False:
		return "boolean `false`"
	case tally.String:
		return "string " + rustDebug(value.Text)
	case tally.Array:
		return "sequence"
	case tally.Object:
		return "map"
	}
	if unsigned, err := strconv.ParseUint(value.Text, 10, 64); err == nil {
		return fmt.Sprintf("integer `%d`", unsigned)
	}
	if signed, err := strconv.ParseInt(value.Text, 10, 64); err == nil {
		return fmt.Sprintf("integer `%d`", signed)
	}
	float, _ := strconv.ParseFloat(value.Text, 64)
	written := strconv.FormatFloat(float, 'f', -1, 64)
	if !strings.Contains(written, ".") {
		written += ".0"
	}
	return "floating point `" + written + "`"
}

// rustDebug is text as Rust's `{:?}` writes a string: quoted, with `"`,
// `\`, \t, \r, \n, \0 escaped and other control characters as \u{..}.
// (Rust also escapes a few unprintable non-control characters this leaves
// as they are.)
func rustDebug(text string) string {
	var out strings.Builder
	out.WriteByte('"')
	for _, r := range text {
		switch {
		case r == '"' || r == '\\':
			out.WriteByte('\\')
			out.WriteRune(r)
		case r == '\t':
			out.WriteString(`\t`)
		case r == '\r':
			out.WriteString(`\r`)
		case r == '\n':
			out.WriteString(`\n`)
		case r == 0:
			out.WriteString(`\0`)
		case unicode.IsControl(r):
			fmt.Fprintf(&out, `\u{%x}`, r)
		default:
			out.WriteRune(r)
		}
	}
	out.WriteByte('"')
	return out.String()
}
