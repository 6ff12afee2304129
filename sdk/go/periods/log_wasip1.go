//go:build wasip1

package periods

import "tally/bindings/periods/tally_plugin_log"

// logLine writes a log line to the host (`tally:plugin/log@0.2.0`).
func logLine(level uint8, message string) { tally_plugin_log.Log(level, message) }
