// Package periods is Tally's Go SDK for period plugins
// (`tally:plugin@0.2.0`, world `periods-plugin`): the aggregation of a job
// that declares `[periods]`.
//
// The host owns event time in such a job: it assigns each event to its
// customer's calendar period, keeps watermarks, closes periods,
// de-duplicates event ids and writes the FINAL and ADJUSTMENT records (see
// docs/periods.md). A period plugin says only what the host cannot know:
// what an event says about itself and adds to its period (Describe: its
// Facts and their addend), how an addend changes a period's state (Add;
// the SDK folds a batch's additions in order) and a period's value
// (Value). An event is read once, by Describe: the host keeps its addend
// and hands that to Add. Each is a pure function of its arguments and the
// configuration: the plugin has no state of its own.
//
//	type Call struct{ ID, Customer, TS string }
//
//	type CallsPerPeriod struct{}
//
//	func (CallsPerPeriod) Describe(call Call) (periods.Facts[struct{}], error) {
//		return periods.Facts[struct{}]{ID: call.ID, Time: periods.RFC3339(call.TS),
//			Key: []periods.Field{{"customer", call.Customer}}, Customer: call.Customer}, nil
//	}
//	func (CallsPerPeriod) Add(calls *uint64, _ periods.Instant, _ struct{}) (uint64, error) {
//		if calls == nil {
//			return 1, nil
//		}
//		return *calls + 1, nil
//	}
//	func (CallsPerPeriod) Value(calls *uint64) uint64 { return *calls }
//
//	func init() {
//		periods.Export(func(config json.RawMessage) (CallsPerPeriod, error) { return CallsPerPeriod{}, nil })
//	}
//
// `tally plugin build` builds a module whose main package imports this
// package against the period world. Events, the configuration, addends
// and states travel as JSON: by encoding/json, or by the type's own
// tally.JSONParser (ParseJSON) and tally.JSONAppender (AppendJSON), which
// skip reflection. An event type's ParseJSON is called on the same value
// for each event of a batch: it sets all of it (and may reuse its buffers). The semantics are the Rust SDK's (sdk/rust/src/periods.rs),
// so builds in either language compute the same bytes.
package periods

import (
	"fmt"
)

// EventTime is when an event happened, as found in it: RFC3339(text) or
// UnixMillis(milliseconds). The host parses it.
type EventTime struct {
	text     string
	millis   int64
	isMillis bool
}

// RFC3339 is an RFC 3339 instant with its offset (`2026-11-03T10:00:00Z`).
func RFC3339(text string) EventTime { return EventTime{text: text} }

// UnixMillis is milliseconds since the Unix epoch.
func UnixMillis(millis int64) EventTime { return EventTime{millis: millis, isMillis: true} }

// RFC3339 is the time's RFC 3339 text, when it is one.
func (time EventTime) RFC3339() (string, bool) { return time.text, !time.isMillis }

// UnixMillis is the time's milliseconds since the Unix epoch, when it is them.
func (time EventTime) UnixMillis() (int64, bool) { return time.millis, time.isMillis }

// Field is one field of an aggregation key.
type Field struct{ Name, Value string }

// Facts is what an event says about itself (its id, time, aggregation key
// and the customer whose time zone decides its period) and what it adds
// to its period (A: the plugin's addend).
type Facts[A any] struct {
	// ID is the producer's id of the event; a retry carries the same one
	// (at most 256 bytes).
	ID string
	// Time is when it happened.
	Time EventTime
	// Key is the aggregation key's fields, in order (`customer`,
	// `metric`): each period is one key's, and its records carry them.
	Key []Field
	// Customer is the customer whose time zone decides the event's period.
	Customer string
	// Addend is what the event adds to its period: the host keeps it (as
	// JSON, at most the job's `limits.max_value_bytes`) and hands it to Add
	// in place of the event.
	Addend A
}

// Instant is an event's time as the host read it: seconds since the Unix
// epoch and nanoseconds within the second.
type Instant struct {
	Seconds     int64
	Nanoseconds uint32
}

// Compare is -1, 0 or +1 as instant is before, at or after other.
func (instant Instant) Compare(other Instant) int {
	switch {
	case instant.Seconds != other.Seconds:
		return cmp(instant.Seconds < other.Seconds)
	case instant.Nanoseconds != other.Nanoseconds:
		return cmp(instant.Nanoseconds < other.Nanoseconds)
	}
	return 0
}

func cmp(less bool) int {
	if less {
		return -1
	}
	return 1
}

// Plugin is a period plugin over events E, addends A and states S.
type Plugin[E, A, S any] interface {
	// Describe is what event says about itself and adds to its period; an
	// error refuses the event (the host dead-letters it with the error's
	// text).
	Describe(event E) (Facts[A], error)
	// Add is a period's state after addend (of an event at time) is added
	// to state (nil: the period's first event); an error refuses the event,
	// which then counts for nothing. Add may change *state and return it:
	// a refusal discards the whole call.
	Add(state *S, time Instant, addend A) (S, error)
	// Value is the value of a period whose state is state: what its FINAL
	// and ADJUSTMENT records carry.
	Value(state *S) uint64
}

// Refusal is the addition a call of Add refuses: its index in the call's
// additions, and why.
type Refusal struct {
	Addition uint32
	Reason   string
}

func (refusal *Refusal) Error() string { return refusal.Reason }

// Addition is one event to fold into a period in a call of Add: the index
// of the period's state, the event's time as the host read it and the
// index of its addend.
type Addition struct {
	Period uint32
	Time   Instant
	Addend uint32
}

// An engine runs the exported plugin over bytes.
type engine interface {
	describe(values [][]byte, each func(index int, facts *Facts[[]byte], err error))
	add(states, addends [][]byte, additions []Addition) ([][]byte, error)
	value(state []byte) uint64
}

var (
	configure func(config []byte) (engine, error)
	exported  engine
)

// Export makes configure's plugin the component's: configure is called
// once per instance, before anything else, with the job file's
// `[plugin_config]` decoded into C (`{}` when the job has none; json.RawMessage
// or tally.Value take it as it is), and its error refuses the job with
// its message. Call Export from an init func.
func Export[C, E, A, S any, P Plugin[E, A, S]](configure func(config C) (P, error)) {
	decodeConfig := decoder[C](func(data []byte, out *C) error { return unmarshal(data, out) })
	exportEngine(func(config []byte) (engine, error) {
		var decoded C
		if err := decodeConfig(config, &decoded); err != nil {
			return nil, fmt.Errorf("[plugin_config] does not fit this plugin: %v", err)
		}
		plugin, err := configure(decoded)
		if err != nil {
			return nil, err
		}
		return newEngine[E, A, S](plugin), nil
	})
}

func exportEngine(make func(config []byte) (engine, error)) {
	configure, exported = make, nil
}

// Configure configures the exported plugin with the job's
// `[plugin_config]` as JSON (the component's `configure`).
func Configure(config string) error {
	if configure == nil {
		panic("the plugin exports nothing: call periods.Export from an init func")
	}
	made, err := configure([]byte(config))
	if err != nil {
		return err
	}
	exported = made
	return nil
}

func configured() engine {
	if exported == nil {
		panic("the period plugin is not configured: Configure comes first")
	}
	return exported
}

// Describe is what the exported plugin makes of one record's value: its
// facts with the addend encoded as the host keeps it, or why it is refused
// (in the words every SDK uses for a record that does not decode:
// `event is not UTF-8`, `event is not valid JSON`; see docs/billing.md).
func Describe(value []byte) (Facts[[]byte], error) {
	var facts Facts[[]byte]
	var refused error
	DescribeEach([][]byte{value}, func(_ int, described *Facts[[]byte], err error) {
		if err != nil {
			refused = err
		} else {
			facts = *described
		}
	})
	return facts, refused
}

// DescribeEach describes a batch of record values (the component's
// `describe`), calling each with every record's facts or refusal, in order.
// The facts are each's to keep.
func DescribeEach(values [][]byte, each func(index int, facts *Facts[[]byte], err error)) {
	configured().describe(values, each)
}

// Add folds additions, in order, into the periods whose states are states
// (nil: the period's first event), each addition's addend taken from
// addends (the component's `add`): each period's state after the fold, in
// order; or a *Refusal, the first addition refused, and then nothing of
// the call counts.
func Add(states, addends [][]byte, additions []Addition) ([][]byte, error) {
	return configured().add(states, addends, additions)
}

// Value is the value of the period whose state is state (the component's
// `value`); a state that does not decode is a bug (a panic).
func Value(state []byte) uint64 { return configured().value(state) }

// Level is a log line's severity.
type Level uint8

// Log levels.
const (
	LevelTrace Level = iota
	LevelDebug
	LevelInfo
	LevelWarn
	LevelError
)

// Logf writes one line to the host's log (rate-limited, labelled with the
// job).
func Logf(level Level, format string, args ...any) {
	logLine(uint8(level), fmt.Sprintf(format, args...))
}
