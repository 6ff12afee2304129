//go:build !wasip1

package periods

import "tally/internal/periodhost"

// logLine hands a log line to the native test driver, if one listens.
func logLine(level uint8, message string) {
	if periodhost.Log != nil {
		periodhost.Log(level, message)
	}
}
