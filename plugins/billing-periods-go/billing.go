// The period billing plugin in Go: usage events metered per customer,
// metric and calendar period in the customer's time zone. The host owns
// the periods (docs/periods.md); this plugin says what each event is and
// how its metric's meter counts it. It computes what
// plugins/billing-periods (Rust) computes, byte for byte, with the same
// refusal reasons: the spec is docs/billing.md, "The period billing plugin".
//
// Input: {"id":"e1","customer":"acme","metric":"calls","quantity":3,"ts":"2026-11-03T10:00:00Z"}
//
// The job's [plugin_config] names each metric's meter:
//
//	[plugin_config]
//	meters = { calls = "sum", requests = "count", peak_gb = "max", storage_gb = "latest", seats = { unique_count = "user" } }
package main

import (
	"bytes"
	"errors"
	"strconv"

	"tally"
	"tally/periods"
)

// Billing is the plugin, configured: each metric's meter.
type Billing struct {
	meters map[string]Meter
	// metrics are the metered metrics by their UTF-8 bytes, joined by ", ".
	metrics string
}

func init() {
	periods.Export(newBilling)
}

// Usage is one decoded event: the fields every event has, its quantity as
// written (nil: none), and all its members as written (a unique_count
// meter reads one).
type Usage struct {
	id, customer, metric, ts string
	quantity                 []byte
	members                  []tally.Member
}

// fields are the fields every event has, in the order they are checked.
var fields = [...]string{"id", "customer", "metric", "quantity", "ts"}

// quantityField is quantity's place in fields: the one an event may leave
// out (only sum, max and latest meters read it).
const quantityField = 3

var notJSON = errors.New("event is not valid JSON")

// ParseJSON decodes an event with the checks of docs/billing.md, in their
// order: UTF-8, JSON, an object, each field given once and present, the
// four text fields strings without lone surrogates.
func (usage *Usage) ParseJSON(value []byte) error {
	// The whole value is set anew; the members' buffer is reused (the
	// SDK hands each event of a batch the same Usage).
	kind, members, err := tally.ScanObject(value, usage.members[:0])
	*usage = Usage{members: members}
	if err != nil {
		return err
	}
	if kind != tally.Object {
		return notAnObject(value)
	}
	var at [len(fields)]int // each field's member index + 1
	var twice [len(fields)]bool
	for index := range members {
		member := &members[index]
		if member.NameLoneSurrogate {
			return notJSON // a name is text: serde_json refuses it as it reads it
		}
		field := fieldIndex(member.Name)
		if field < 0 {
			continue
		}
		twice[field] = twice[field] || at[field] != 0
		at[field] = index + 1
	}
	for field, name := range fields {
		if twice[field] {
			return tally.Rejectf("field `%s` is given twice", name)
		}
		if at[field] == 0 && field != quantityField {
			return tally.Rejectf("field `%s` is missing", name)
		}
	}
	// The record as one string: text fields without escapes are substrings
	// of it (one copy for them all).
	var whole string
	text := func(field int) (string, error) {
		member := &members[at[field]-1]
		raw := member.Value
		if raw[0] != '"' {
			return "", tally.Rejectf("field `%s` must be a string", fields[field])
		}
		if bytes.IndexByte(raw, '\\') < 0 {
			if whole == "" {
				whole = string(value)
			}
			return whole[member.At+1 : member.At+len(raw)-1], nil
		}
		text, lone := tally.UnquoteJSON(raw)
		if lone {
			return "", notJSON
		}
		return text, nil
	}
	if usage.id, err = text(0); err != nil {
		return err
	}
	if usage.customer, err = text(1); err != nil {
		return err
	}
	if usage.metric, err = text(2); err != nil {
		return err
	}
	if usage.ts, err = text(4); err != nil {
		return err
	}
	if at[quantityField] != 0 {
		usage.quantity = members[at[quantityField]-1].Value
	}
	return nil
}

func fieldIndex(name []byte) int {
	switch string(name) {
	case "id":
		return 0
	case "customer":
		return 1
	case "metric":
		return 2
	case "quantity":
		return 3
	case "ts":
		return 4
	}
	return -1
}

// notAnObject is why a record that is JSON but no object is refused:
// serde_json reads a lone string or number as it refuses it, so a lone
// surrogate escape or a number out of a double's range is no JSON.
func notAnObject(value []byte) error {
	decoded, err := tally.DecodeJSON(value, tally.DecodeOptions{AllowLoneSurrogates: true})
	if err != nil || (decoded.Kind == tally.String && decoded.LoneSurrogate) || (decoded.Kind == tally.Number && !decoded.Finite()) {
		return notJSON
	}
	return tally.Rejectf("event must be a JSON object")
}

// quoted is text as a JSON string, as a refusal quotes it.
func quoted(text string) string { return string(tally.AppendJSONString(nil, text)) }

// quantity is a quantity as written: a non-negative integer up to 2^64 − 1.
func quantity(raw []byte) (uint64, error) {
	if raw == nil {
		return 0, tally.Rejectf("field `quantity` is missing")
	}
	for _, c := range raw {
		if c < '0' || c > '9' {
			return 0, tally.Rejectf("quantity must be a non-negative integer, got %s", raw)
		}
	}
	value, err := strconv.ParseUint(string(raw), 10, 64)
	if err != nil {
		return 0, tally.Rejectf("quantity %s is over the largest meterable, 2^64 - 1", raw)
	}
	return value, nil
}

// field is the named string field, for unique_count (of a field other
// than the five every event has written twice, the last).
func (usage *Usage) field(name string) (string, error) {
	var raw []byte
	switch name {
	case "id":
		return usage.id, nil
	case "customer":
		return usage.customer, nil
	case "metric":
		return usage.metric, nil
	case "ts":
		return usage.ts, nil
	case "quantity":
		raw = usage.quantity
	default:
		for index := len(usage.members) - 1; index >= 0; index-- {
			if string(usage.members[index].Name) == name {
				raw = usage.members[index].Value
				break
			}
		}
	}
	if raw == nil {
		return "", tally.Rejectf("field %s (counted by unique_count) is missing", quoted(name))
	}
	if raw[0] != '"' {
		return "", tally.Rejectf("field %s must be a string for its unique_count meter, got %s", quoted(name), raw)
	}
	text, lone := tally.UnquoteJSON(raw)
	if lone {
		return "", notJSON
	}
	return text, nil
}

// Describe is the event's facts: its id, ts as its time, the key
// customer, metric, the customer; and what its metric's meter reads of it.
func (billing *Billing) Describe(usage Usage) (periods.Facts[Addend], error) {
	meter, ok := billing.meters[usage.metric]
	if !ok {
		return periods.Facts[Addend]{}, tally.Rejectf("metric %s has no meter; name it in the job's [plugin_config] meters (it has: %s)", quoted(usage.metric), billing.metrics)
	}
	addend := Addend{meter: meter.kind}
	var err error
	switch meter.kind {
	case sum, maximum, latest:
		addend.quantity, err = quantity(usage.quantity)
	case unique:
		addend.unique, err = usage.field(meter.field)
	}
	if err != nil {
		return periods.Facts[Addend]{}, err
	}
	return periods.Facts[Addend]{
		ID:       usage.id,
		Time:     periods.RFC3339(usage.ts),
		Key:      []periods.Field{{Name: "customer", Value: usage.customer}, {Name: "metric", Value: usage.metric}},
		Customer: usage.customer,
		Addend:   addend,
	}, nil
}

// Add is a period's state after an addend: a sum refused past 2^64 − 1, a
// count that stops there, the largest, the latest by event time (a tie
// keeps the one added first), the distinct values.
func (billing *Billing) Add(state *State, at periods.Instant, addend Addend) (State, error) {
	if state == nil {
		opened := State{meter: addend.meter, value: addend.quantity, at: at}
		switch addend.meter {
		case count:
			opened.value = 1
		case unique:
			opened.values = []string{addend.unique}
		}
		return opened, nil
	}
	if state.meter != addend.meter {
		return State{}, tally.Rejectf("the event's metric is metered by %s but its period was opened by %s: a metric's meter changed while its period was open; keep a metric's meter for its periods", meterNames[addend.meter], meterNames[state.meter])
	}
	switch addend.meter {
	case sum:
		if state.value > ^uint64(0)-addend.quantity {
			return State{}, tally.Rejectf("the period's sum would pass 2^64 - 1, the largest meterable")
		}
		state.value += addend.quantity
	case count:
		if state.value != ^uint64(0) {
			state.value++
		}
	case maximum:
		state.value = max(state.value, addend.quantity)
	case latest:
		if at.Compare(state.at) > 0 {
			state.value, state.at = addend.quantity, at
		}
	case unique:
		state.values = insertSorted(state.values, addend.unique)
	}
	return *state, nil
}

// insertSorted adds value to values (sorted by their UTF-8 bytes, each
// once) where it belongs.
func insertSorted(values []string, value string) []string {
	low, high := 0, len(values)
	for low < high {
		middle := int(uint(low+high) >> 1)
		if values[middle] < value {
			low = middle + 1
		} else {
			high = middle
		}
	}
	if low < len(values) && values[low] == value {
		return values
	}
	values = append(values, "")
	copy(values[low+1:], values[low:])
	values[low] = value
	return values
}

// Value is the period's value: the total, events, largest, latest
// quantity, or how many distinct values.
func (billing *Billing) Value(state *State) uint64 {
	if state.meter == unique {
		return uint64(len(state.values))
	}
	return state.value
}
