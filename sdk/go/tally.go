// Package tally is Tally's Go SDK: write an aggregation plugin as a few
// functions over your own event, key and state types, and build it with
// `tally plugin build <dir>` into a component that imports nothing but
// `tally:plugin` (state, output, log).
//
//	type Click struct{ Page string; Ms uint64 }
//
//	func init() {
//		tally.Export(tally.Aggregate[Click, string, uint64]{
//			Output:  "page-times",
//			Key:     func(click Click) (string, error) { return click.Page, nil },
//			Apply:   func(total uint64, click Click) (uint64, error) { return total + click.Ms, nil },
//			Emit:    func(total uint64) any { return total },
//		})
//	}
//
// The semantics are the Rust SDK's (`sdk/rust/src/aggregate.rs`), so a
// plugin ported between them computes the same bytes: one state read and
// one write per batch, keys and states stored as JSON, an emitted record
// keyed by its state key, rejections in event order. See docs/sdk-go.md.
package tally

import (
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"

	"tally/internal/host"
)

// Event is one input record.
type Event struct {
	// Partition is the index of the source partition within the job.
	Partition uint32
	// Offset is the record's position within its partition.
	Offset uint64
	// TimestampMs is the record's time in milliseconds since the epoch, if it has one.
	TimestampMs *int64
	// Key is the record's key, if it has one (nil otherwise).
	Key []byte
	// Value is the record's payload, exactly as it was read.
	Value []byte
}

// Rejection is an event the plugin refuses, by its index in the batch.
type Rejection struct {
	Index  uint32
	Reason string
}

// Reject is why an event is refused: return it (or one wrapping it) from
// Decode, Key or Apply. Its reason reaches the dead-letter output as is.
// Any other error, or a panic, is a bug: the plugin traps, and the host
// dead-letters the event alone.
type Reject struct{ Reason string }

func (reject *Reject) Error() string { return reject.Reason }

// Rejectf is a Reject with a formatted reason.
func Rejectf(format string, args ...any) error { return &Reject{Reason: fmt.Sprintf(format, args...)} }

// Aggregate is a keyed aggregation over events E, keys K and states S.
type Aggregate[E, K, S any] struct {
	// Output is the output emitted records go to (the job declares it).
	Output string
	// Decode makes the event of a record's value; nil decodes it as JSON
	// (DecodeJSON: strict, then encoding/json into E).
	Decode func(value []byte) (E, error)
	// Key is the event's state key (stored as JSON).
	Key func(event E) (K, error)
	// Initial is the state of a key never written; nil: S's zero value.
	Initial func() S
	// Apply returns the next state (S is a value: never mutate what it shares).
	Apply func(state S, event E) (S, error)
	// Emit is what to emit after an update (nil, or returning nil: nothing).
	Emit func(state S) any
}

// A processor runs batches.
type processor interface {
	process(events []Event) []Rejection
}

var exported processor

// Export makes aggregate the plugin's `process`; call it from an init func.
func Export[E, K, S any](aggregate Aggregate[E, K, S]) {
	exported = aggregate
}

// ExportRaw makes process the plugin's `process`: the raw batch interface,
// with GetMany, PutMany, DeleteMany and EmitMany for effects.
func ExportRaw(process func(events []Event) []Rejection) {
	exported = rawProcessor(process)
}

type rawProcessor func(events []Event) []Rejection

func (process rawProcessor) process(events []Event) []Rejection { return process(events) }

// Run processes one batch with the exported plugin (the component's
// export, and tallytest, call it).
func Run(events []Event) []Rejection {
	if exported == nil {
		panic("the plugin exports nothing: call tally.Export (or ExportRaw) from an init func")
	}
	return exported.process(events)
}

// reasonOf is the reason of a refusal, or a panic for a bug.
func reasonOf(err error) string {
	var reject *Reject
	if errors.As(err, &reject) {
		return reject.Reason
	}
	panic(fmt.Sprintf("a plugin bug (return a *tally.Reject to refuse an event): %v", err))
}

type slot[K, S any] struct {
	key   []byte
	state S
	dirty bool
}

type taken[E any] struct {
	index, slot int
	event E
}

func (aggregate Aggregate[E, K, S]) process(events []Event) []Rejection {
	var rejections []Rejection
	slotOf := map[string]int{}
	var slots []slot[K, S]
	var accepted []taken[E]
	for index, event := range events {
		decoded, err := aggregate.decode(event.Value)
		if err == nil {
			var key K
			key, err = aggregate.Key(decoded)
			if err == nil {
				var encoded []byte
				encoded, err = EncodeJSON(key)
				if err != nil {
					panic(fmt.Sprintf("the key of event %d cannot be encoded: %v", index, err))
				}
				at, known := slotOf[string(encoded)]
				if !known {
					at = len(slots)
					slotOf[string(encoded)] = at
					slots = append(slots, slot[K, S]{key: encoded})
				}
				accepted = append(accepted, taken[E]{index, at, decoded})
				continue
			}
		}
		rejections = append(rejections, Rejection{uint32(index), reasonOf(err)})
	}
	if len(accepted) == 0 {
		return rejections
	}
	keys := make([][]byte, len(slots))
	for i := range slots {
		keys[i] = slots[i].key
	}
	for i, stored := range host.Host.GetMany(keys) {
		if stored == nil {
			if aggregate.Initial != nil {
				slots[i].state = aggregate.Initial()
			}
		} else if err := decodeState(stored, &slots[i].state); err != nil {
			panic(fmt.Sprintf("the stored state of key %s cannot be decoded: %v", slots[i].key, err))
		}
	}
	var records []host.Record
	for _, event := range accepted {
		target := &slots[event.slot]
		next, err := aggregate.Apply(target.state, event.event)
		if err != nil {
			rejections = append(rejections, Rejection{uint32(event.index), reasonOf(err)})
			continue
		}
		target.state, target.dirty = next, true
		if aggregate.Emit == nil {
			continue
		}
		if out := aggregate.Emit(target.state); out != nil {
			value, err := EncodeJSON(out)
			if err != nil {
				panic(fmt.Sprintf("the output of event %d cannot be encoded: %v", event.index, err))
			}
			records = append(records, host.Record{Event: uint32(event.index), Key: target.key, Value: value})
		}
	}
	var written [][2][]byte
	for _, target := range slots {
		if target.dirty {
			value, err := EncodeJSON(target.state)
			if err != nil {
				panic(fmt.Sprintf("the state of key %s cannot be encoded: %v", target.key, err))
			}
			written = append(written, [2][]byte{target.key, value})
		}
	}
	if len(written) > 0 {
		host.Host.PutMany(written)
	}
	if len(records) > 0 {
		host.Host.EmitMany(aggregate.Output, records)
	}
	sort.SliceStable(rejections, func(a, b int) bool { return rejections[a].Index < rejections[b].Index })
	return rejections
}

// decodeState reads a stored state: integers without reflection.
func decodeState(stored []byte, state any) error {
	switch state := state.(type) {
	case *uint64:
		value, err := strconv.ParseUint(string(stored), 10, 64)
		*state = value
		return err
	case *int64:
		value, err := strconv.ParseInt(string(stored), 10, 64)
		*state = value
		return err
	}
	return json.Unmarshal(stored, state)
}

func (aggregate Aggregate[E, K, S]) decode(value []byte) (E, error) {
	if aggregate.Decode != nil {
		return aggregate.Decode(value)
	}
	var event E
	err := DecodeJSONInto(value, &event)
	return event, err
}

// ---- The raw interface and logging -----------------------------------------

// OutputRecord is one record for an output, caused by event Event of the batch.
type OutputRecord = host.Record

// GetMany reads keys; a key with no value gives nil.
func GetMany(keys [][]byte) [][]byte { return host.Host.GetMany(keys) }

// PutMany writes key-value pairs, in order.
func PutMany(entries [][2][]byte) { host.Host.PutMany(entries) }

// DeleteMany deletes keys (a missing key is not an error).
func DeleteMany(keys [][]byte) { host.Host.DeleteMany(keys) }

// EmitMany emits records to output, a name the job declares.
func EmitMany(output string, records []OutputRecord) { host.Host.EmitMany(output, records) }

// Log levels.
const (
	LevelTrace uint8 = iota
	LevelDebug
	LevelInfo
	LevelWarn
	LevelError
)

// Logf writes one line to the host's log (rate-limited, labelled with the job).
func Logf(level uint8, format string, args ...any) { host.Host.Log(level, fmt.Sprintf(format, args...)) }
