// Package periodhost is where a period plugin's log lines go natively
// (tally/periods/periodstest sets it); in a component they go to the
// host's `tally:plugin/log@0.2.0`.
package periodhost

// Log receives each log line natively; nil drops them.
var Log func(level uint8, message string)
