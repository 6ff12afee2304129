// The billing plugin under `go test`, through Tally's Go test driver: the
// rules of docs/billing.md.
package main

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"tally/tallytest"
)

func usage(customer string, quantity any, ts string) string {
	return fmt.Sprintf(`{"customer":%q,"metric":"api_calls","quantity":%v,"ts":%q}`, customer, quantity, ts)
}

func TestEveryUpdateEmitsTheRunningTotalOfItsKeyByUTCMonth(t *testing.T) {
	plugin := tallytest.New("totals")
	sent := plugin.Send(
		usage("acme", 3, "2026-11-03T10:00:00Z"),
		usage("acme", 4, "2026-12-01T00:30:00+01:00"), // still November in UTC
		usage("acme", 5, "2026-12-01T00:30:00Z"),
	)
	if len(sent.DeadLetters) != 0 || len(sent.Outputs) != 3 {
		t.Fatalf("%+v", sent)
	}
	var values []string
	for _, record := range sent.Outputs {
		values = append(values, record.Value)
	}
	if !reflect.DeepEqual(values, []string{"3", "7", "5"}) {
		t.Fatalf("totals %v", values)
	}
	november := Key{"acme", "api_calls", "2026-11"}
	if *sent.Outputs[1].Key != `{"customer":"acme","metric":"api_calls","period":"2026-11"}` {
		t.Fatalf("key %s", *sent.Outputs[1].Key)
	}
	if total, _ := plugin.State(november); total != "7" {
		t.Fatalf("state %s", total)
	}
}

func TestBadEventsAreRefusedWithTheReasonsOfDocsBillingAndChangeNothing(t *testing.T) {
	plugin := tallytest.New("totals")
	sent := plugin.Send(
		usage("acme", 2, "2026-11-03T10:00:00Z"),
		`{"customer":"acme"`,
		`{"metric":"api_calls","quantity":3,"ts":"2026-11-03T10:00:00Z"}`,
		usage("acme", -3, "2026-11-03T10:00:00Z"),
		usage("acme", 2.5, "2026-11-03T10:00:00Z"),
		usage("acme", 1, "2026-02-30T10:00:00Z"),
		usage("acme", "18446744073709551615", "2026-11-03T10:00:00Z"),
		"{\"customer\":\"\xff\"}",
		`{"customer":"a","customer":"b","metric":"m","quantity":1,"ts":"2026-11-03T10:00:00Z"}`,
		"1e400",
		strings.Repeat("[", 129)+strings.Repeat("]", 129),
	)
	want := []tallytest.DeadLetter{
		{1, "event is not valid JSON"},
		{2, "field `customer` is missing"},
		{3, "quantity must be a non-negative integer, got -3"},
		{4, "quantity must be a non-negative integer, got 2.5"},
		{5, `ts must be an RFC 3339 timestamp like 2026-11-03T10:00:00Z, got "2026-02-30T10:00:00Z"`},
		{6, "total would overflow adding 18446744073709551615"},
		{7, "event is not UTF-8"},
		{8, "field `customer` is given twice"},
		{9, "event is not valid JSON"},
		{10, "event is not valid JSON"},
	}
	if !reflect.DeepEqual(sent.DeadLetters, want) {
		t.Fatalf("dead letters\n got %+v\nwant %+v", sent.DeadLetters, want)
	}
	if state := plugin.AllState(); !reflect.DeepEqual(state, [][2]string{{`{"customer":"acme","metric":"api_calls","period":"2026-11"}`, "2"}}) {
		t.Fatalf("state %v", state)
	}
}
