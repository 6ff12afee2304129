//go:build wasip1

// Package export_tally_plugin_periods is a period plugin's `describe`,
// `add` and `value` exports (`tally:plugin/periods@0.2.0`; the generated
// bindings call them): the WIT plumbing around tally/periods.
package export_tally_plugin_periods

import (
	"unsafe"

	witTypes "go.bytecodealliance.org/pkg/wit/types"

	"tally/bindings/periods/tally_plugin_periods"
	"tally/bindings/periods/tally_plugin_types"
	"tally/periods"
)

type described = witTypes.Result[tally_plugin_types.EventFacts, string]

// arena holds the text and bytes of an export's results: static memory,
// which the bindings' runtime.Pinner passes over (pinning each string and
// addend of a batch on the Go heap was some 40% of a period plugin's
// time). Each export starts it anew: the host has read the last call's
// results (and called its post-return) before it calls again. What does
// not fit stays on the heap.
var arena [1 << 20]byte

var used int

// text is a copy of s in the arena, or s when it is full.
func text(s string) string {
	if len(s) == 0 || len(arena)-used < len(s) {
		return s
	}
	start := used
	used += copy(arena[used:], s)
	return unsafe.String(&arena[start], len(s))
}

// bytes is a copy of b in the arena, or b when it is full.
func bytes(b []byte) []byte {
	if len(b) == 0 || len(arena)-used < len(b) {
		return b
	}
	start := used
	used += copy(arena[used:], b)
	return arena[start:used:used]
}

// Describe is what each event of a batch says about itself, in order.
func Describe(events []tally_plugin_types.Event) []described {
	values := make([][]byte, len(events))
	for i := range events {
		values[i] = events[i].Value
	}
	out := make([]described, len(events))
	used = 0
	periods.DescribeEach(values, func(index int, facts *periods.Facts[[]byte], err error) {
		if err != nil {
			out[index] = witTypes.Err[tally_plugin_types.EventFacts](text(err.Error()))
			return
		}
		at, _ := facts.Time.RFC3339()
		time := tally_plugin_types.MakeEventTimeRfc3339(text(at))
		if millis, ok := facts.Time.UnixMillis(); ok {
			time = tally_plugin_types.MakeEventTimeUnixMillis(millis)
		}
		key := make([]witTypes.Tuple2[string, string], len(facts.Key))
		for i, field := range facts.Key {
			key[i] = witTypes.Tuple2[string, string]{F0: text(field.Name), F1: text(field.Value)}
		}
		out[index] = witTypes.Ok[tally_plugin_types.EventFacts, string](tally_plugin_types.EventFacts{
			Id: text(facts.ID), Time: time, Key: key, Customer: text(facts.Customer), Addend: bytes(facts.Addend),
		})
	})
	return out
}

// Add folds a batch's additions into their periods' states.
func Add(
	states []witTypes.Option[[]uint8],
	addends [][]uint8,
	additions []tally_plugin_periods.Addition,
) witTypes.Result[[][]uint8, tally_plugin_periods.Refusal] {
	given := make([][]byte, len(states))
	for i, state := range states {
		if state.IsSome() {
			given[i] = state.Some()
			if given[i] == nil {
				given[i] = []byte{}
			}
		}
	}
	folds := make([]periods.Addition, len(additions))
	for i, addition := range additions {
		folds[i] = periods.Addition{
			Period: addition.Period,
			Time:   periods.Instant{Seconds: addition.Time.Seconds, Nanoseconds: addition.Time.Nanoseconds},
			Addend: addition.Addend,
		}
	}
	folded, err := periods.Add(given, addends, folds)
	if err != nil {
		refusal := err.(*periods.Refusal)
		return witTypes.Err[[][]uint8](tally_plugin_periods.Refusal{Addition: refusal.Addition, Reason: refusal.Reason})
	}
	used = 0
	for i := range folded {
		folded[i] = bytes(folded[i])
	}
	return witTypes.Ok[[][]uint8, tally_plugin_periods.Refusal](folded)
}

// Value is the value of the period whose state is state.
func Value(state []uint8) uint64 { return periods.Value(state) }
