// A Go plugin that looks at everything the closed WASI answers: for each
// event it emits, to `seen`, the wall-clock time, a random number, its
// arguments, its environment, and what opening a file and a directory
// gave; and it prints a line to stdout and to stderr.
package main

import (
	"fmt"
	"math/rand/v2"
	"os"
	"time"

	"tally"
)

func init() {
	tally.ExportRaw(func(events []tally.Event) []tally.Rejection {
		var records []tally.OutputRecord
		for i, event := range events {
			_, fileErr := os.ReadFile("/etc/passwd")
			_, dirErr := os.ReadDir(".")
			seen := fmt.Sprintf("%s|%d|%q|%q|%v|%v|%s",
				time.Now().UTC().Format(time.RFC3339Nano), rand.Uint64(), os.Args, os.Environ(), fileErr != nil, dirErr != nil, event.Value)
			records = append(records, tally.OutputRecord{Event: uint32(i), Value: []byte(fmt.Sprintf("%q", seen))})
		}
		fmt.Println("hello from stdout")
		fmt.Fprintln(os.Stderr, "hello from stderr")
		tally.EmitMany("seen", records)
		return nil
	})
}
