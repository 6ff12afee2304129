package main

import (
	"errors"
	"fmt"
	"sort"
	"strconv"

	"tally"
	"tally/periods"
)

// Addend is what an event adds to its period, as its metric's meter reads
// it: all Add gets of the event (the host keeps it between the calls).
// Its JSON: {"sum":<quantity>}, "count", {"max":<quantity>},
// {"latest":<quantity>}, {"unique":<value>}.
type Addend struct {
	meter    meterKind
	quantity uint64 // sum, max, latest
	unique   string // unique_count
}

// State is a period's state, tagged by the meter that built it. Its JSON:
// {"sum":<total>}, {"count":<events>}, {"max":<largest>},
// {"latest":{"seconds":<s>,"nanoseconds":<ns>,"value":<quantity>}},
// {"unique":[<values by their UTF-8 bytes>]}.
type State struct {
	meter  meterKind
	value  uint64          // sum, count, max, latest
	at     periods.Instant // latest: the event time of its value
	values []string        // unique_count: sorted by bytes, each once
}

// tags are the JSON tags of addends and states, by meter.
var tags = [...]string{"sum", "count", "max", "latest", "unique"}

// AppendJSON writes the addend as the Rust build's serde does.
func (addend *Addend) AppendJSON(out []byte) []byte {
	switch addend.meter {
	case count:
		return append(out, `"count"`...)
	case unique:
		return append(tally.AppendJSONString(append(out, `{"unique":`...), addend.unique), '}')
	}
	out = append(append(append(out, `{"`...), tags[addend.meter]...), `":`...)
	return append(strconv.AppendUint(out, addend.quantity, 10), '}')
}

// AppendJSON writes the state as the Rust build's serde does.
func (state *State) AppendJSON(out []byte) []byte {
	out = append(append(append(out, `{"`...), tags[state.meter]...), `":`...)
	switch state.meter {
	case latest:
		out = strconv.AppendInt(append(out, `{"seconds":`...), state.at.Seconds, 10)
		out = strconv.AppendUint(append(out, `,"nanoseconds":`...), uint64(state.at.Nanoseconds), 10)
		out = strconv.AppendUint(append(out, `,"value":`...), state.value, 10)
		out = append(out, '}')
	case unique:
		out = append(out, '[')
		for index, value := range state.values {
			if index > 0 {
				out = append(out, ',')
			}
			out = tally.AppendJSONString(out, value)
		}
		out = append(out, ']')
	default:
		out = strconv.AppendUint(out, state.value, 10)
	}
	return append(out, '}')
}

// variant reads an externally tagged enum as serde_json does: a unit
// variant as a string, any other as an object of one member.
func variant(data []byte) (tag meterKind, value []byte, err error) {
	var buffer [2]tally.Member
	kind, members, err := tally.ScanObject(data, buffer[:0])
	if err != nil {
		return 0, nil, err
	}
	if kind == tally.String {
		text, _ := tally.UnquoteJSON(trimSpace(data))
		if text == "count" {
			return count, nil, nil
		}
		return 0, nil, fmt.Errorf("unknown variant %s", quoted(text))
	}
	if kind != tally.Object || len(members) != 1 {
		return 0, nil, errors.New("expected an object of one member, its meter")
	}
	for meter, name := range tags {
		if string(members[0].Name) == name {
			return meterKind(meter), members[0].Value, nil
		}
	}
	return 0, nil, fmt.Errorf("unknown variant %s", quoted(string(members[0].Name)))
}

func trimSpace(data []byte) []byte {
	isSpace := func(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }
	for len(data) > 0 && isSpace(data[0]) {
		data = data[1:]
	}
	for len(data) > 0 && isSpace(data[len(data)-1]) {
		data = data[:len(data)-1]
	}
	return data
}

func parseUint(raw []byte, bits int) (uint64, error) {
	value, err := strconv.ParseUint(string(raw), 10, bits)
	if err != nil {
		return 0, fmt.Errorf("%s is no u%d", raw, bits)
	}
	return value, nil
}

// ParseJSON reads an addend as AppendJSON writes it.
func (addend *Addend) ParseJSON(data []byte) error {
	meter, value, err := variant(data)
	if err != nil {
		return err
	}
	*addend = Addend{meter: meter}
	switch meter {
	case count:
		if value != nil && string(value) != "null" {
			return errors.New("count takes no value")
		}
	case unique:
		if value[0] != '"' {
			return fmt.Errorf("%s is no string", value)
		}
		text, lone := tally.UnquoteJSON(value)
		if lone {
			return errors.New("a lone surrogate is no text")
		}
		addend.unique = text
	default:
		addend.quantity, err = parseUint(value, 64)
	}
	return err
}

// ParseJSON reads a state as AppendJSON writes it (or as serde_json would
// read it: spaces, the latest's fields in any order, unique values in any
// order and repeated).
func (state *State) ParseJSON(data []byte) error {
	meter, value, err := variant(data)
	if err != nil {
		return err
	}
	if value == nil {
		return errors.New("a state has a value")
	}
	*state = State{meter: meter}
	switch meter {
	case latest:
		return state.parseLatest(value)
	case unique:
		state.values, err = parseStrings(value)
		return err
	}
	state.value, err = parseUint(value, 64)
	return err
}

func (state *State) parseLatest(value []byte) error {
	var buffer [3]tally.Member
	kind, members, _ := tally.ScanObject(value, buffer[:0])
	if kind != tally.Object {
		return errors.New("latest is an object")
	}
	var given [3]bool
	for _, member := range members {
		var err error
		switch string(member.Name) {
		case "seconds":
			state.at.Seconds, err = strconv.ParseInt(string(member.Value), 10, 64)
			given[0] = true
		case "nanoseconds":
			var nanoseconds uint64
			nanoseconds, err = parseUint(member.Value, 32)
			state.at.Nanoseconds = uint32(nanoseconds)
			given[1] = true
		case "value":
			state.value, err = parseUint(member.Value, 64)
			given[2] = true
		}
		if err != nil {
			return err
		}
	}
	for index, name := range [...]string{"seconds", "nanoseconds", "value"} {
		if !given[index] {
			return fmt.Errorf("missing field `%s`", name)
		}
	}
	return nil
}

// parseStrings reads a checked JSON array of strings as a set: sorted by
// bytes, each once. Values without escapes share one copy of raw.
func parseStrings(raw []byte) ([]string, error) {
	if raw[0] != '[' {
		return nil, errors.New("unique is an array")
	}
	whole := string(raw)
	var values []string
	space := func(at int) int {
		for raw[at] == ' ' || raw[at] == '\t' || raw[at] == '\n' || raw[at] == '\r' {
			at++
		}
		return at
	}
	at := space(1)
	for raw[at] != ']' {
		if raw[at] != '"' {
			return nil, errors.New("a unique value is a string")
		}
		start, escaped := at, false
		for at++; raw[at] != '"'; at++ {
			if raw[at] == '\\' {
				escaped = true
				at++
			}
		}
		at++
		if escaped {
			text, lone := tally.UnquoteJSON(raw[start:at])
			if lone {
				return nil, errors.New("a lone surrogate is no text")
			}
			values = append(values, text)
		} else {
			values = append(values, whole[start+1:at-1])
		}
		if at = space(at); raw[at] == ',' {
			at = space(at + 1)
		}
	}
	for index := 1; index < len(values); index++ {
		if values[index-1] >= values[index] {
			sort.Strings(values)
			kept := values[:1]
			for _, value := range values[1:] {
				if value != kept[len(kept)-1] {
					kept = append(kept, value)
				}
			}
			return kept, nil
		}
	}
	return values, nil
}
