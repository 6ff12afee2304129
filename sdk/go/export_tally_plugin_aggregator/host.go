//go:build wasip1

// The host's calls of a 0.1 plugin (state, output, log), set when the
// component's `process` export is linked in: package tally itself imports
// no host function, so a period plugin may use its JSON helpers.

package export_tally_plugin_aggregator

import (
	witTypes "go.bytecodealliance.org/pkg/wit/types"

	"tally/bindings/tally_plugin_log"
	"tally/bindings/tally_plugin_output"
	"tally/bindings/tally_plugin_state"
	"tally/bindings/tally_plugin_types"
	"tally/internal/host"
)

func init() {
	host.Host = host.Calls{
		GetMany: func(keys [][]byte) [][]byte {
			stored := tally_plugin_state.GetMany(keys)
			values := make([][]byte, len(stored))
			for i, value := range stored {
				if value.IsSome() {
					values[i] = value.Some()
					if values[i] == nil {
						values[i] = []byte{}
					}
				}
			}
			return values
		},
		PutMany: func(entries [][2][]byte) {
			pairs := make([]witTypes.Tuple2[[]uint8, []uint8], len(entries))
			for i, entry := range entries {
				pairs[i] = witTypes.Tuple2[[]uint8, []uint8]{F0: entry[0], F1: entry[1]}
			}
			tally_plugin_state.PutMany(pairs)
		},
		DeleteMany: tally_plugin_state.DeleteMany,
		EmitMany: func(output string, records []host.Record) {
			out := make([]tally_plugin_types.OutputRecord, len(records))
			for i, record := range records {
				key := witTypes.None[[]uint8]()
				if record.Key != nil {
					key = witTypes.Some(record.Key)
				}
				out[i] = tally_plugin_types.OutputRecord{Event: record.Event, Key: key, Value: record.Value}
			}
			tally_plugin_output.EmitMany(output, out)
		},
		Log: func(level uint8, message string) { tally_plugin_log.Log(level, message) },
	}
}
