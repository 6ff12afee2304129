// The period billing plugin under `go test`, through Tally's Go period
// test driver: the spec of docs/billing.md, "The period billing plugin".
package main

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"tally/periods"
	"tally/periods/periodstest"
)

const meters = `{"meters":{"calls":"sum","requests":"count","peak":"max","gb":"latest","seats":{"unique_count":"user"}}}`

func configured(t *testing.T) *periodstest.Plugin {
	t.Helper()
	plugin, err := periodstest.New(meters)
	if err != nil {
		t.Fatal(err)
	}
	return plugin
}

func event(metric, quantity, user string) string {
	return fmt.Sprintf(`{"id":"x","customer":"acme","metric":%q,"quantity":%s,"ts":"2026-11-01T00:00:00Z","user":%s}`, metric, quantity, user)
}

func at(seconds int64) periods.Instant { return periods.Instant{Seconds: seconds} }

// fold adds events (each at its time) to a new period: its state and value.
func fold(t *testing.T, events ...any) (string, uint64) {
	t.Helper()
	configured(t)
	period := (&periodstest.Plugin{}).Period()
	for i := 0; i < len(events); i += 2 {
		if err := period.AddAt(at(int64(events[i+1].(int))), events[i].(string)); err != nil {
			t.Fatalf("%s: %v", events[i], err)
		}
	}
	return period.State(), period.Value()
}

func TestEachMetersAddendStateAndValueAreTheSpecsBytes(t *testing.T) {
	plugin := configured(t)
	cases := []struct {
		metric, quantity, user string
		addend                 string
	}{
		{"calls", "18446744073709551615", `"u"`, `{"sum":18446744073709551615}`},
		{"requests", `"not a number"`, `"u"`, `"count"`},
		{"peak", "7", `"u"`, `{"max":7}`},
		{"gb", "0", `"u"`, `{"latest":0}`},
		{"seats", "1", `"Zo\u00eb \"the\" one\n\u0001\u007f\ud83d\ude00"`, `{"unique":"Zoë \"the\" one\n\u0001` + "\x7f\U0001F600" + `"}`},
	}
	for _, c := range cases {
		facts, err := plugin.Describe(event(c.metric, c.quantity, c.user))
		if err != nil {
			t.Fatal(err)
		}
		if string(facts.Addend) != c.addend {
			t.Errorf("%s: addend %s, want %s", c.metric, facts.Addend, c.addend)
		}
		want := []periods.Field{{Name: "customer", Value: "acme"}, {Name: "metric", Value: c.metric}}
		if facts.ID != "x" || facts.Customer != "acme" || facts.Time != periods.RFC3339("2026-11-01T00:00:00Z") || !reflect.DeepEqual(facts.Key, want) {
			t.Errorf("%s: facts %+v", c.metric, facts)
		}
	}
	states := []struct {
		events []any
		state  string
		value  uint64
	}{
		{[]any{event("calls", "2", `"u"`), 1, event("calls", "3", `"u"`), 2}, `{"sum":5}`, 5},
		{[]any{event("calls", "18446744073709551615", `"u"`), 1, event("calls", "0", `"u"`), 2}, `{"sum":18446744073709551615}`, 1<<64 - 1},
		{[]any{event("requests", "2", `"u"`), 1, `{"id":"y","customer":"a","metric":"requests","ts":"t"}`, 2}, `{"count":2}`, 2},
		{[]any{event("peak", "7", `"u"`), 1, event("peak", "3", `"u"`), 2}, `{"max":7}`, 7},
		{[]any{event("peak", "18446744073709551615", `"u"`), 1}, `{"max":18446744073709551615}`, 1<<64 - 1},
		// Latest by event time; a tie keeps the first added.
		{[]any{event("gb", "7", `"u"`), 5, event("gb", "3", `"u"`), 2}, `{"latest":{"seconds":5,"nanoseconds":0,"value":7}}`, 7},
		{[]any{event("gb", "7", `"u"`), 5, event("gb", "3", `"u"`), 5}, `{"latest":{"seconds":5,"nanoseconds":0,"value":7}}`, 7},
		{[]any{event("gb", "7", `"u"`), 5, event("gb", "3", `"u"`), 6}, `{"latest":{"seconds":6,"nanoseconds":0,"value":3}}`, 3},
		{[]any{event("gb", "18446744073709551615", `"u"`), -5}, `{"latest":{"seconds":-5,"nanoseconds":0,"value":18446744073709551615}}`, 1<<64 - 1},
		// Unique values by their UTF-8 bytes; an escaped string is the same string.
		{[]any{
			event("seats", "1", `"Zoë"`), 1, event("seats", "1", `"Zo\u00eb"`), 2, event("seats", "1", `"zoe"`), 3,
			event("seats", "1", `"\ud83d\ude00"`), 4, event("seats", "1", `"ｚ"`), 5, event("seats", "1", `"A\"\\\t\u001f"`), 6,
		}, `{"unique":["A\"\\\t\u001f","Zoë","zoe","ｚ","😀"]}`, 5},
	}
	for _, c := range states {
		state, value := fold(t, c.events...)
		if state != c.state || value != c.value {
			t.Errorf("state %s value %d, want %s %d", state, value, c.state, c.value)
		}
	}
}

func TestACountStopsAtTheLargestMeterable(t *testing.T) {
	configured(t)
	states := [][]byte{[]byte(`{"count":18446744073709551614}`)}
	addends := [][]byte{[]byte(`"count"`)}
	folded, err := periods.Add(states, addends, []periods.Addition{{Addend: 0}, {Addend: 0}, {Addend: 0}})
	if err != nil || string(folded[0]) != `{"count":18446744073709551615}` {
		t.Fatalf("%s %v", folded, err)
	}
}

func TestEveryRefusalOfAnEventHasTheSpecsReason(t *testing.T) {
	plugin := configured(t)
	cases := []struct{ event, reason string }{
		{"{\"id\":\"x\xff\"}", "event is not UTF-8"},
		{`{"id":"x",}`, "event is not valid JSON"},
		{`{"id":"x"} {}`, "event is not valid JSON"},
		{strings.Repeat("[", 129) + strings.Repeat("]", 129), "event is not valid JSON"},
		{`{"id":"x","customer":"a","metric":"calls","quantity":1,"ts":"t","deep":` + strings.Repeat("[", 128) + strings.Repeat("]", 128) + `}`, "event is not valid JSON"},
		{"1e400", "event is not valid JSON"},
		{`"\ud800"`, "event is not valid JSON"},
		{`{"\ud800":1,"id":"x","id":"y"}`, "event is not valid JSON"},
		{`[1]`, "event must be a JSON object"},
		{`"text"`, "event must be a JSON object"},
		{`["\ud800", 1e400]`, "event must be a JSON object"},
		{`18446744073709551616`, "event must be a JSON object"},
		{`null`, "event must be a JSON object"},
		{`{"id":"x","customer":"a","id":"y","metric":"calls","quantity":1,"ts":"t"}`, "field `id` is given twice"},
		{`{"customer":"a","metric":"calls","quantity":1,"ts":"t","customer":"b"}`, "field `id` is missing"},
		{`{"id":"x","metric":"calls","ts":"t"}`, "field `customer` is missing"},
		{`{"id":"x","customer":"a","ts":"t"}`, "field `metric` is missing"},
		{`{"id":"x","customer":"a","metric":"calls","quantity":1,"quantity":2,"ts":"t"}`, "field `quantity` is given twice"},
		{`{"id":"x","customer":"a","metric":"calls","quantity":1}`, "field `ts` is missing"},
		{`{"id":"x","customer":"a","metric":"calls","ts":"t","t\u0073":"u"}`, "field `ts` is given twice"},
		{`{"id":7,"customer":"a","metric":"calls","quantity":1,"ts":"t"}`, "field `id` must be a string"},
		{`{"id":"x","customer":null,"metric":"calls","ts":"t"}`, "field `customer` must be a string"},
		{`{"id":"x","customer":"a","metric":["calls"],"ts":"t"}`, "field `metric` must be a string"},
		{`{"id":"x","customer":"a","metric":"calls","quantity":1,"ts":5}`, "field `ts` must be a string"},
		{`{"id":"x","customer":"\ud800","metric":"calls","quantity":1,"ts":"t"}`, "event is not valid JSON"},
		{`{"id":"x","customer":"a","metric":"calls","quantity":1,"ts":"\udfff"}`, "event is not valid JSON"},
		{`{"id":"x","customer":"a","metric":"disk\n\u0001\"é","quantity":1,"ts":"t"}`, `metric "disk\n\u0001\"é" has no meter; name it in the job's [plugin_config] meters (it has: calls, gb, peak, requests, seats)`},
		{`{"id":"x","customer":"a","metric":"calls","ts":"t"}`, "field `quantity` is missing"},
		{`{"id":"x","customer":"a","metric":"calls","quantity":-3,"ts":"t"}`, "quantity must be a non-negative integer, got -3"},
		{`{"id":"x","customer":"a","metric":"peak","quantity":1.5e0,"ts":"t"}`, "quantity must be a non-negative integer, got 1.5e0"},
		{`{"id":"x","customer":"a","metric":"gb","quantity": "5" ,"ts":"t"}`, `quantity must be a non-negative integer, got "5"`},
		{`{"id":"x","customer":"a","metric":"gb","quantity":1e400,"ts":"t"}`, `quantity must be a non-negative integer, got 1e400`},
		{`{"id":"x","customer":"a","metric":"calls","quantity":18446744073709551616,"ts":"t"}`, "quantity 18446744073709551616 is over the largest meterable, 2^64 - 1"},
		{`{"id":"x","customer":"a","metric":"seats","ts":"t"}`, `field "user" (counted by unique_count) is missing`},
		{`{"id":"x","customer":"a","metric":"seats","ts":"t","user":[ 3 ]}`, `field "user" must be a string for its unique_count meter, got [ 3 ]`},
		{`{"id":"x","customer":"a","metric":"seats","ts":"t","user":"\udc00"}`, "event is not valid JSON"},
		{`{"id":"x","customer":"a","metric":"seats","ts":"t","user":"a","user":{"b": 1}}`, `field "user" must be a string for its unique_count meter, got {"b": 1}`},
	}
	for _, c := range cases {
		if _, err := plugin.Describe(c.event); err == nil || err.Error() != c.reason {
			t.Errorf("%s\n got %v\nwant %s", c.event, err, c.reason)
		}
	}
	// A count meter reads no quantity; other fields may hold what they like.
	fine := []string{
		`{"id":"x","customer":"a","metric":"requests","ts":"t","note":"\ud800","q":{}}`,
		`{"id":"x","customer":"a","metric":"requests","quantity":-1.5,"ts":"t"}`,
		`{"id":"x","customer":"a","metric":"seats","ts":"t","user":"a","user":"b"}`,
	}
	for _, event := range fine {
		if _, err := plugin.Describe(event); err != nil {
			t.Errorf("%s: %v", event, err)
		}
	}
	facts, _ := plugin.Describe(fine[2])
	if string(facts.Addend) != `{"unique":"b"}` {
		t.Errorf("the last of a field written twice counts: %s", facts.Addend)
	}
}

func TestEveryRefusalOfAnAdditionHasTheSpecsReason(t *testing.T) {
	configured(t)
	addition := []periods.Addition{{Addend: 0}}
	_, err := periods.Add([][]byte{[]byte(`{"sum":18446744073709551615}`)}, [][]byte{[]byte(`{"sum":1}`)}, addition)
	if err == nil || err.Error() != "the period's sum would pass 2^64 - 1, the largest meterable" {
		t.Errorf("sum overflow: %v", err)
	}
	for _, c := range [][3]string{
		{`{"count":3}`, `{"sum":1}`, "sum but its period was opened by count"},
		{`{"sum":3}`, `"count"`, "count but its period was opened by sum"},
		{`{"latest":{"seconds":1,"nanoseconds":2,"value":3}}`, `{"max":1}`, "max but its period was opened by latest"},
		{`{"unique":["a"]}`, `{"latest":1}`, "latest but its period was opened by unique_count"},
		{`{"max":3}`, `{"unique":"a"}`, "unique_count but its period was opened by max"},
	} {
		_, err := periods.Add([][]byte{[]byte(c[0])}, [][]byte{[]byte(c[1])}, addition)
		want := "the event's metric is metered by " + c[2] + ": a metric's meter changed while its period was open; keep a metric's meter for its periods"
		if err == nil || err.Error() != want {
			t.Errorf("%s + %s: %v", c[0], c[1], err)
		}
	}
	// The first refused addition is the call's refusal, by its index.
	states := [][]byte{nil, []byte(`{"sum":18446744073709551615}`)}
	addends := [][]byte{[]byte(`{"sum":1}`), []byte(`{"sum":0}`)}
	_, err = periods.Add(states, addends, []periods.Addition{{Period: 0, Addend: 0}, {Period: 1, Addend: 1}, {Period: 1, Addend: 0}, {Period: 1, Addend: 0}})
	if refusal, ok := err.(*periods.Refusal); !ok || refusal.Addition != 2 {
		t.Errorf("refusal %#v", err)
	}
}

func TestPeriodsFoldInOneCallEachInOrder(t *testing.T) {
	configured(t)
	states := [][]byte{[]byte(`{"unique":["b"]}`), nil, []byte(` { "latest" : { "value" : 9 , "nanoseconds" : 5 , "seconds" : 10 } } `)}
	addends := [][]byte{[]byte(`{"unique":"a"}`), []byte(`{"sum":4}`), []byte(`{"latest":1}`), []byte(`{"unique":"b"}`)}
	additions := []periods.Addition{
		{Period: 0, Time: at(1), Addend: 0},
		{Period: 1, Time: at(1), Addend: 1},
		{Period: 2, Time: periods.Instant{Seconds: 10, Nanoseconds: 5}, Addend: 2}, // a tie: kept
		{Period: 1, Time: at(1), Addend: 1},
		{Period: 0, Time: at(1), Addend: 3},
		{Period: 2, Time: periods.Instant{Seconds: 10, Nanoseconds: 6}, Addend: 2},
	}
	folded, err := periods.Add(states, addends, additions)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{`{"unique":["a","b"]}`, `{"sum":8}`, `{"latest":{"seconds":10,"nanoseconds":6,"value":1}}`}
	for i := range want {
		if string(folded[i]) != want[i] {
			t.Errorf("period %d: %s, want %s", i, folded[i], want[i])
		}
	}
	if value := periods.Value([]byte(`{"unique":["z","a","z"]}`)); value != 2 {
		t.Errorf("a set: %d", value)
	}
}

func TestTheConfigsRefusalsAreTheRustBuilds(t *testing.T) {
	hint := `write meters = { calls = "sum", seats = { unique_count = "user" } }: `
	cases := []struct{ config, err string }{
		{`{}`, hint + "missing field `meters`"},
		{`{"meter":{}}`, hint + "unknown field `meter`, expected `meters`"},
		{`{"meters":{"a":"sum"},"zz":1}`, hint + "unknown field `zz`, expected `meters`"},
		{`{"meters":"sum"}`, hint + `invalid type: string "sum", expected a map`},
		{`{"meters":5}`, hint + "invalid type: integer `5`, expected a map"},
		{`{"meters":1.5}`, hint + "invalid type: floating point `1.5`, expected a map"},
		{`{"meters":[]}`, hint + "invalid type: sequence, expected a map"},
		{`[]`, hint + "invalid type: sequence, expected struct Config"},
		{`{"meters":{"calls":5}}`, hint + "data did not match any variant of untagged enum MeterSpec"},
		{`{"meters":{"calls":{"field":"user"}}}`, hint + "data did not match any variant of untagged enum MeterSpec"},
		{`{"meters":{}}`, "meters is empty: name at least one metric's meter"},
		{`{"meters":{"calls":"avg"}}`, `meters.calls = "avg": the meters are "sum", "count", "max", "latest" and { unique_count = "<field>" }`},
		{`{"meters":{"calls":"sum:x"}}`, `meters.calls = "sum": the meters are "sum", "count", "max", "latest" and { unique_count = "<field>" }`},
		{`{"meters":{"calls":{"meter":"a\"b\n"}}}`, `meters.calls = "a\"b\n": the meters are "sum", "count", "max", "latest" and { unique_count = "<field>" }`},
		{`{"meters":{"seats":"unique_count"}}`, `meters.seats: unique_count counts the values of a field; name it: { unique_count = "user" }`},
		{`{"meters":{"seats":"unique_count:"}}`, `meters.seats: unique_count counts the values of a field; name it: { unique_count = "user" }`},
		{`{"meters":{"seats":{"meter":"unique_count"}}}`, `meters.seats: unique_count counts the values of a field; name it: { unique_count = "user" }`},
		{`{"meters":{"b":"avg","a":"unique_count"}}`, `meters.a: unique_count counts the values of a field; name it: { unique_count = "user" }`},
	}
	for _, c := range cases {
		if _, err := periodstest.New(c.config); err == nil || err.Error() != c.err {
			t.Errorf("%s\n got %v\nwant %s", c.config, err, c.err)
		}
	}
	// The three ways to write a unique_count meter, and a meter table.
	forms := `{"meters":{"a":"unique_count:user","b":{"meter":"unique_count","field":"user"},"c":{"unique_count":"user"},"d":{"meter":"sum"}}}`
	plugin, err := periodstest.New(forms)
	if err != nil {
		t.Fatal(err)
	}
	for metric, addend := range map[string]string{"a": `{"unique":"u"}`, "b": `{"unique":"u"}`, "c": `{"unique":"u"}`, "d": `{"sum":1}`} {
		facts, err := plugin.Describe(event(metric, "1", `"u"`))
		if err != nil || string(facts.Addend) != addend {
			t.Errorf("%s: %s %v", metric, facts.Addend, err)
		}
	}
}

func TestAMeterIsNoArray(t *testing.T) {
	for _, config := range []string{`{"meters":{"calls":["sum"]}}`, `{"meters":{"calls":["unique_count","user"]}}`} {
		_, err := periodstest.New(config)
		if err == nil || !strings.HasSuffix(err.Error(), "data did not match any variant of untagged enum MeterSpec") {
			t.Errorf("%s: %v", config, err)
		}
	}
}

// Through the real host (`tally plugin build`, then `tally run` per
// send): New York's November, 721 hours as EDT ends, is FINAL once a
// December event passes its end plus the grace; a late November event
// adjusts it; a malformed line is a dead letter.
func TestTheHostClosesNovemberInNewYorkAndAdjustsIt(t *testing.T) {
	// max_future: the dates are fixed, the host's clock is the machine's.
	run := periodstest.NewRun(t, ".", `time_zones = { acme = "America/New_York" }
max_future = "36500d"`, `meters = { calls = "sum" }`)
	sent := run.Send(
		`{"id":"a","customer":"acme","metric":"calls","quantity":5,"ts":"2026-11-01T04:00:00Z"}`,
		`{"id":"b","customer":"acme","metric":"calls","quantity":7,"ts":"2026-12-01T04:59:59Z"}`,
		`{"id":"c","customer":"acme","metric":"calls","quantity":1,"ts":"2026-12-02T05:00:00Z"}`,
		`{"id":"d","customer":"acme","metric":"calls",`,
	)
	if len(sent.Records) != 1 {
		t.Fatalf("records %+v", sent.Records)
	}
	final := sent.Records[0]
	if final.Type != "final" || final.Customer != "acme" || final.Period != "2026-11" ||
		final.Start != "2026-11-01T04:00:00Z" || final.End != "2026-12-01T05:00:00Z" ||
		final.Value != 12 || final.Version != 1 || final.Fields["time_zone"] != "America/New_York" {
		t.Errorf("FINAL %+v", final)
	}
	if len(sent.DeadLetters) != 1 || sent.DeadLetters[0] != (periodstest.DeadLetter{Offset: 3, Reason: "malformed: event is not valid JSON"}) {
		t.Errorf("dead letters %+v", sent.DeadLetters)
	}

	sent = run.Send(`{"id":"e","customer":"acme","metric":"calls","quantity":3,"ts":"2026-11-30T23:00:00-05:00"}`)
	if len(sent.Records) != 1 || len(sent.DeadLetters) != 0 {
		t.Fatalf("second send %+v", sent)
	}
	adjustment := sent.Records[0]
	if adjustment.Type != "adjustment" || adjustment.Period != "2026-11" || adjustment.Version != 2 ||
		adjustment.Value != 15 || adjustment.Previous != 12 || adjustment.Delta != 3 {
		t.Errorf("ADJUSTMENT %+v", adjustment)
	}
}

// BenchmarkABatch describes a batch of 1,000 events of every meter and
// folds them into their periods, as the host calls the plugin.
func BenchmarkABatch(b *testing.B) {
	if _, err := periodstest.New(meters); err != nil {
		b.Fatal(err)
	}
	metrics := []string{"calls", "requests", "peak", "gb", "seats"}
	values := make([][]byte, 1000)
	for i := range values {
		values[i] = []byte(fmt.Sprintf(`{"id":"e%d","customer":"cust%d","metric":"%s","quantity":%d,"ts":"2026-10-%02dT10:00:00Z","user":"u%d"}`, i, i%40, metrics[i%5], i*7%1000, 1+i%27, i%50))
	}
	b.ReportAllocs()
	for range b.N {
		var addends [][]byte
		var additions []periods.Addition
		period := map[string]uint32{}
		periods.DescribeEach(values, func(index int, facts *periods.Facts[[]byte], err error) {
			if err != nil {
				b.Fatal(err)
			}
			key := facts.Customer + "/" + facts.Key[1].Value
			at, known := period[key]
			if !known {
				at = uint32(len(period))
				period[key] = at
			}
			additions = append(additions, periods.Addition{Period: at, Time: at2(index), Addend: uint32(len(addends))})
			addends = append(addends, facts.Addend)
		})
		if _, err := periods.Add(make([][]byte, len(period)), addends, additions); err != nil {
			b.Fatal(err)
		}
	}
}

func at2(index int) periods.Instant { return periods.Instant{Seconds: int64(index)} }
