//go:build wasip1

// Package export_tally_plugin_aggregator is the component's `process`
// export (the generated bindings call it): it hands the batch to the
// plugin tally.Export registered, after giving the closed WASI the batch's
// time and a seed from its input position, so the Go runtime's clocks and
// randomness are the same on every run over the same input.
package export_tally_plugin_aggregator

import (
	"tally"
	"tally/bindings/tally_plugin_types"
)

//go:wasmimport wasi_snapshot_preview1 tally_set_time
func setTime(nanoseconds int64)

//go:wasmimport wasi_snapshot_preview1 tally_seed
func seed(position int64)

// Process runs one batch.
func Process(events []tally_plugin_types.Event) []tally_plugin_types.Rejection {
	batch := make([]tally.Event, len(events))
	for i, event := range events {
		batch[i] = tally.Event{Partition: event.Partition, Offset: event.Offset, Value: event.Value}
		if event.TimestampMs.IsSome() {
			milliseconds := event.TimestampMs.Some()
			batch[i].TimestampMs = &milliseconds
		}
		if event.Key.IsSome() {
			batch[i].Key = event.Key.Some()
		}
	}
	if len(events) > 0 {
		if batch[0].TimestampMs != nil {
			setTime(*batch[0].TimestampMs * 1_000_000)
		}
		seed(int64(events[0].Partition)<<48 ^ int64(events[0].Offset))
	}
	rejections := tally.Run(batch)
	out := make([]tally_plugin_types.Rejection, len(rejections))
	for i, rejection := range rejections {
		out[i] = tally_plugin_types.Rejection{Index: rejection.Index, Reason: rejection.Reason}
	}
	return out
}
