// Package periodstest is Tally's test driver for Go period plugins, for
// `go test`:
//
//	func TestCallsPerPeriod(t *testing.T) {
//		plugin, err := periodstest.New(`{}`)
//		if err != nil { t.Fatal(err) }
//		period := plugin.Period()
//		if err := period.Add(`{"id":"1","customer":"acme","ts":"2026-11-03T10:00:00Z"}`); err != nil { t.Fatal(err) }
//		if period.Value() != 1 { t.Fatal(period.State()) }
//	}
//
// It runs the plugin natively (the package the test is in, whose init
// called periods.Export) the way the host runs its component: configured
// with the job's `[plugin_config]` as JSON, each record described into
// facts and an addend, the addend (bytes) folded into a period's state
// (bytes), the state valued. The host's own part (calendar periods in the
// customer's time zone, watermarks, de-duplication, the FINAL and
// ADJUSTMENT records) is the host's: NewRun runs the plugin through the
// real `tally` binary and shows the records as the host emits them:
//
//	func TestNovemberIsFinal(t *testing.T) {
//		run := periodstest.NewRun(t, ".", `time_zones = { acme = "America/New_York" }`, `meters = { calls = "sum" }`)
//		sent := run.Send(`{"id":"1","customer":"acme","metric":"calls","quantity":5,"ts":"2026-11-10T12:00:00Z"}`,
//			`{"id":"2","customer":"acme","metric":"calls","quantity":1,"ts":"2026-12-03T00:00:00Z"}`)
//		if sent.Records[0].Type != "final" || sent.Records[0].Value != 5 { t.Fatalf("%+v", sent) }
//	}
package periodstest

import (
	"fmt"
	"time"

	"tally/internal/periodhost"
	"tally/periods"
)

// Plugin is the exported period plugin, configured.
type Plugin struct {
	logs []string
}

// New configures the exported plugin with config, the job's
// `[plugin_config]` as JSON (`{}` for none); an error is the plugin's
// refusal of the job.
func New(config string) (*Plugin, error) {
	plugin := &Plugin{}
	periodhost.Log = func(level uint8, message string) {
		plugin.logs = append(plugin.logs, fmt.Sprintf("%s: %s", [...]string{"trace", "debug", "info", "warn", "error"}[level%5], message))
	}
	if err := periods.Configure(config); err != nil {
		return nil, err
	}
	return plugin, nil
}

// Describe is what the plugin makes of one record: its facts, the addend
// as the JSON the host keeps, or the reason the host dead-letters it with
// (after `malformed: `).
func (plugin *Plugin) Describe(record string) (periods.Facts[[]byte], error) {
	return periods.Describe([]byte(record))
}

// Logs are the lines logged so far, each "level: message".
func (plugin *Plugin) Logs() []string { return plugin.logs }

// Period is one period's state, kept as the bytes the host keeps.
type Period struct {
	state []byte // nil: no event yet
}

// Period is a period without events.
func (plugin *Plugin) Period() *Period { return &Period{} }

// Add adds records, in order, to the period, each at the time its facts
// give (read here as RFC 3339 or Unix milliseconds); the first record
// refused (by Describe or by Add) is the error, and the period then is as
// it was before the call.
func (period *Period) Add(records ...string) error {
	state := period.state
	for _, record := range records {
		facts, err := periods.Describe([]byte(record))
		if err != nil {
			return fmt.Errorf("malformed: %w", err)
		}
		at, err := Time(facts.Time)
		if err != nil {
			return err
		}
		if state, err = fold(state, at, facts.Addend); err != nil {
			return err
		}
	}
	period.state = state
	return nil
}

// AddAt adds one record at time at, whatever time its facts give.
func (period *Period) AddAt(at periods.Instant, record string) error {
	facts, err := periods.Describe([]byte(record))
	if err != nil {
		return fmt.Errorf("malformed: %w", err)
	}
	state, err := fold(period.state, at, facts.Addend)
	if err == nil {
		period.state = state
	}
	return err
}

func fold(state []byte, at periods.Instant, addend []byte) ([]byte, error) {
	folded, err := periods.Add([][]byte{state}, [][]byte{addend}, []periods.Addition{{Period: 0, Time: at, Addend: 0}})
	if err != nil {
		return nil, err
	}
	return folded[0], nil
}

// State is the period's state as JSON text ("" before its first event).
func (period *Period) State() string { return string(period.state) }

// Value is the period's value: what its FINAL and ADJUSTMENT records carry.
func (period *Period) Value() uint64 {
	if period.state == nil {
		panic("a period without events has no value")
	}
	return periods.Value(period.state)
}

// Time is an event time as an instant (RFC 3339 read by the time
// package, which the host's reading agrees with on well-formed times).
func Time(at periods.EventTime) (periods.Instant, error) {
	if ms, ok := at.UnixMillis(); ok {
		seconds, rest := ms/1000, ms%1000
		if rest < 0 {
			seconds, rest = seconds-1, rest+1000
		}
		return periods.Instant{Seconds: seconds, Nanoseconds: uint32(rest) * 1_000_000}, nil
	}
	text, _ := at.RFC3339()
	parsed, err := time.Parse(time.RFC3339Nano, text)
	if err != nil {
		return periods.Instant{}, fmt.Errorf("malformed: the event time %q is not RFC 3339: %w", text, err)
	}
	return periods.Instant{Seconds: parsed.Unix(), Nanoseconds: uint32(parsed.Nanosecond())}, nil
}
