package periods

import (
	"encoding/json"
	"fmt"

	"tally"
)

// typed runs a plugin over bytes: events, addends and states decoded and
// encoded by the codecs its types choose.
type typed[E, A, S any, P Plugin[E, A, S]] struct {
	plugin       P
	decodeEvent  func(data []byte, out *E) error
	encodeAddend func(out []byte, addend *A) ([]byte, error)
	decodeAddend func(data []byte, out *A) error
	encodeState  func(out []byte, state *S) ([]byte, error)
	decodeState  func(data []byte, out *S) error
}

func newEngine[E, A, S any, P Plugin[E, A, S]](plugin P) *typed[E, A, S, P] {
	return &typed[E, A, S, P]{
		plugin: plugin,
		// encoding/json after the checks every SDK makes first.
		decodeEvent:  decoder[E](func(data []byte, out *E) error { return tally.DecodeJSONInto(data, out) }),
		encodeAddend: encoder[A](),
		decodeAddend: decoder[A](unmarshal),
		encodeState:  encoder[S](),
		decodeState:  decoder[S](unmarshal),
	}
}

// decoder is T's own ParseJSON, or fallback; tally.Value and
// json.RawMessage take the JSON as it is.
func decoder[T any](fallback func(data []byte, out *T) error) func(data []byte, out *T) error {
	var probe T
	switch any(&probe).(type) {
	case tally.JSONParser:
		return func(data []byte, out *T) error { return any(out).(tally.JSONParser).ParseJSON(data) }
	case *tally.Value:
		return func(data []byte, out *T) error {
			value, err := tally.DecodeJSON(data, tally.DecodeOptions{})
			*any(out).(*tally.Value) = value
			return err
		}
	}
	return fallback
}

// unmarshal is encoding/json's decoding (integers exact).
func unmarshal[T any](data []byte, out *T) error { return json.Unmarshal(data, out) }

// encoder is T's own AppendJSON, or tally.EncodeJSON.
func encoder[T any]() func(out []byte, value *T) ([]byte, error) {
	var probe T
	if _, ok := any(&probe).(tally.JSONAppender); ok {
		return func(out []byte, value *T) ([]byte, error) {
			return any(value).(tally.JSONAppender).AppendJSON(out), nil
		}
	}
	return func(out []byte, value *T) ([]byte, error) {
		encoded, err := tally.EncodeJSON(*value)
		return append(out, encoded...), err
	}
}

func (engine *typed[E, A, S, P]) describe(values [][]byte, each func(int, *Facts[[]byte], error)) {
	// One buffer for the batch's addends; one event value, reset per event.
	var addends []byte
	type described struct {
		facts      Facts[[]byte]
		start, end int
		err        error
	}
	out := make([]described, len(values))
	// A type's own ParseJSON replaces the whole value, so one event value
	// serves the batch (its buffers reused); encoding/json's starts anew.
	var event E
	_, parses := any(&event).(tally.JSONParser)
	var zero E
	var addend A // outside the loop: escaping once, not per event
	for index, value := range values {
		if !parses {
			event = zero
		}
		if err := engine.decodeEvent(value, &event); err != nil {
			out[index].err = err
			continue
		}
		facts, err := engine.plugin.Describe(event)
		if err != nil {
			out[index].err = err
			continue
		}
		start := len(addends)
		addend = facts.Addend
		addends, err = engine.encodeAddend(addends, &addend)
		if err != nil {
			addends = addends[:start]
			out[index].err = fmt.Errorf("its addend does not encode: %v", err)
			continue
		}
		out[index] = described{
			facts: Facts[[]byte]{ID: facts.ID, Time: facts.Time, Key: facts.Key, Customer: facts.Customer},
			start: start, end: len(addends),
		}
	}
	for index := range out {
		if out[index].err != nil {
			each(index, nil, out[index].err)
			continue
		}
		out[index].facts.Addend = addends[out[index].start:out[index].end:out[index].end]
		each(index, &out[index].facts, nil)
	}
}

func (engine *typed[E, A, S, P]) add(states, addends [][]byte, additions []Addition) ([][]byte, error) {
	refuse := func(index int, format string, args ...any) ([][]byte, error) {
		return nil, &Refusal{Addition: uint32(index), Reason: fmt.Sprintf(format, args...)}
	}
	for index, addition := range additions {
		if int(addition.Addend) >= len(addends) {
			return refuse(index, "the addition names addend %d, of %d", addition.Addend, len(addends))
		}
	}
	decoded := make([]S, len(states))
	present := make([]bool, len(states))
	for period, state := range states {
		if state == nil {
			continue
		}
		if err := engine.decodeState(state, &decoded[period]); err != nil {
			return refuse(0, "a period's state does not decode: %v", err)
		}
		present[period] = true
	}
	var addend A // outside the loop: escaping once, not per addition
	for index, addition := range additions {
		period := int(addition.Period)
		if period >= len(decoded) {
			return refuse(index, "the addition names period %d, of %d", addition.Period, len(decoded))
		}
		if err := engine.decodeAddend(addends[addition.Addend], &addend); err != nil {
			return refuse(index, "the event's addend is not the JSON this plugin makes: %v", err)
		}
		var state *S
		if present[period] {
			state = &decoded[period]
		}
		next, err := engine.plugin.Add(state, addition.Time, addend)
		if err != nil {
			return refuse(index, "%s", err.Error())
		}
		decoded[period], present[period] = next, true
	}
	// One buffer for every state written.
	var buffer []byte
	ends := make([]int, len(decoded))
	for period := range decoded {
		if !present[period] {
			return refuse(0, "period %d has neither a state nor an addition", period)
		}
		var err error
		if buffer, err = engine.encodeState(buffer, &decoded[period]); err != nil {
			panic(fmt.Sprintf("a period's state does not encode: %v", err))
		}
		ends[period] = len(buffer)
	}
	folded := make([][]byte, len(decoded))
	start := 0
	for period, end := range ends {
		folded[period] = buffer[start:end:end]
		start = end
	}
	return folded, nil
}

func (engine *typed[E, A, S, P]) value(state []byte) uint64 {
	var decoded S
	if err := engine.decodeState(state, &decoded); err != nil {
		panic(fmt.Sprintf("a period's state does not decode: %v", err))
	}
	return engine.plugin.Value(&decoded)
}
