// Package tallytest is Tally's test driver for Go plugins, for `go test`:
//
//	func TestTotals(t *testing.T) {
//		plugin := tallytest.New("totals")
//		sent := plugin.Send(`{"customer":"acme","metric":"api_calls","quantity":3,"ts":"2026-11-03T10:00:00Z"}`)
//		if len(sent.DeadLetters) != 0 { t.Fatal(sent.DeadLetters) }
//	}
//
// It runs the plugin natively (the package the test is in, whose init
// called tally.Export) against an in-memory host that answers the same
// `tally:plugin` calls a component makes, so a test needs no build; `tally
// plugin build` and the host's own tests check the component. Like the
// host, it discards a batch's state changes and outputs when the plugin
// panics (and re-panics: that is a bug).
package tallytest

import (
	"fmt"
	"sort"

	"tally"
	"tally/internal/host"
)

// Record is one record a batch emitted, its key and value as text.
type Record struct {
	Output string
	Event  uint32
	Key    *string
	Value  string
}

// DeadLetter is one event a batch refused.
type DeadLetter struct {
	Offset uint64
	Reason string
}

// Sent is what one Send did.
type Sent struct {
	Outputs     []Record
	DeadLetters []DeadLetter
}

// Plugin is the plugin under test, with its state kept across sends.
type Plugin struct {
	declared map[string]bool
	state    map[string][]byte
	emitted  []Record
	logs     []string
	offset   uint64
}

// New starts the plugin for a job declaring outputs, with empty state.
func New(outputs ...string) *Plugin {
	plugin := &Plugin{declared: map[string]bool{}, state: map[string][]byte{}}
	for _, output := range outputs {
		plugin.declared[output] = true
	}
	return plugin
}

func (plugin *Plugin) calls() host.Calls {
	return host.Calls{
		GetMany: func(keys [][]byte) [][]byte {
			values := make([][]byte, len(keys))
			for i, key := range keys {
				if value, ok := plugin.state[string(key)]; ok {
					values[i] = append([]byte{}, value...)
				}
			}
			return values
		},
		PutMany: func(entries [][2][]byte) {
			for _, entry := range entries {
				plugin.state[string(entry[0])] = append([]byte{}, entry[1]...)
			}
		},
		DeleteMany: func(keys [][]byte) {
			for _, key := range keys {
				delete(plugin.state, string(key))
			}
		},
		EmitMany: func(output string, records []host.Record) {
			if !plugin.declared[output] {
				panic(fmt.Sprintf("the plugin emitted to `%s`, which the job does not declare", output))
			}
			for _, record := range records {
				out := Record{Output: output, Event: record.Event, Value: string(record.Value)}
				if record.Key != nil {
					key := string(record.Key)
					out.Key = &key
				}
				plugin.emitted = append(plugin.emitted, out)
			}
		},
		Log: func(level uint8, message string) {
			plugin.logs = append(plugin.logs, fmt.Sprintf("%s: %s", [...]string{"trace", "debug", "info", "warn", "error"}[level%5], message))
		},
	}
}

// Send sends one batch of records on partition 0.
func (plugin *Plugin) Send(records ...string) Sent {
	events := make([]tally.Event, len(records))
	for i, record := range records {
		events[i] = tally.Event{Partition: 0, Offset: plugin.offset, Value: []byte(record)}
		plugin.offset++
	}
	before := map[string][]byte{}
	for key, value := range plugin.state {
		before[key] = value
	}
	plugin.emitted = nil
	host.Host = plugin.calls()
	defer func() {
		if bug := recover(); bug != nil {
			plugin.state = before
			panic(bug)
		}
	}()
	rejections := tally.Run(events)
	sent := Sent{Outputs: plugin.emitted}
	for _, rejection := range rejections {
		sent.DeadLetters = append(sent.DeadLetters, DeadLetter{events[rejection.Index].Offset, rejection.Reason})
	}
	return sent
}

// State is the stored state of key (as the plugin's Key returned it), as JSON text; ok is false when it has none.
func (plugin *Plugin) State(key any) (string, bool) {
	encoded, err := tally.EncodeJSON(key)
	if err != nil {
		panic(err)
	}
	value, ok := plugin.state[string(encoded)]
	return string(value), ok
}

// AllState is every stored entry as [key, value] text, by key.
func (plugin *Plugin) AllState() [][2]string {
	var entries [][2]string
	for key, value := range plugin.state {
		entries = append(entries, [2]string{key, string(value)})
	}
	sort.Slice(entries, func(a, b int) bool { return entries[a][0] < entries[b][0] })
	return entries
}

// Logs are the lines logged so far, each "level: message".
func (plugin *Plugin) Logs() []string { return plugin.logs }
