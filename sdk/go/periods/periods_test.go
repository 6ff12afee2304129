package periods_test

import (
	"encoding/json"
	"errors"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"tally"
	"tally/periods"
	"tally/periods/periodstest"
)

// Call is an event decoded by encoding/json (the SDK's default).
type Call struct {
	ID       string `json:"id"`
	Customer string `json:"customer"`
	Ms       int64  `json:"ms"`
	Weight   uint64 `json:"weight"`
}

// Weighted sums weights per period; its addend and state go through
// encoding/json too.
type Weighted struct{ limit uint64 }

type Sum struct {
	Total uint64 `json:"total"`
	Calls uint64 `json:"calls"`
}

func (Weighted) Describe(call Call) (periods.Facts[uint64], error) {
	if call.Customer == "" {
		return periods.Facts[uint64]{}, errors.New("a call has a customer")
	}
	return periods.Facts[uint64]{
		ID: call.ID, Time: periods.UnixMillis(call.Ms), Customer: call.Customer,
		Key: []periods.Field{{Name: "customer", Value: call.Customer}}, Addend: call.Weight,
	}, nil
}

func (plugin Weighted) Add(state *Sum, _ periods.Instant, weight uint64) (Sum, error) {
	if state == nil {
		state = &Sum{}
	}
	if weight > plugin.limit {
		return Sum{}, tally.Rejectf("weight %d is over %d", weight, plugin.limit)
	}
	periods.Logf(periods.LevelDebug, "adding %d", weight)
	return Sum{Total: state.Total + weight, Calls: state.Calls + 1}, nil
}

func (Weighted) Value(state *Sum) uint64 { return state.Total }

type config struct {
	Limit uint64 `json:"limit"`
}

func exportWeighted() {
	periods.Export(func(config config) (Weighted, error) {
		if config.Limit == 0 {
			return Weighted{}, errors.New("limit must be positive")
		}
		return Weighted{config.Limit}, nil
	})
}

func TestConfigureDecodesTheConfigOrRefusesTheJob(t *testing.T) {
	exportWeighted()
	if _, err := periodstest.New(`{"limit":"x"}`); err == nil || !strings.HasPrefix(err.Error(), "[plugin_config] does not fit this plugin: ") {
		t.Errorf("%v", err)
	}
	if _, err := periodstest.New(`{}`); err == nil || err.Error() != "limit must be positive" {
		t.Errorf("%v", err)
	}
	if _, err := periodstest.New(`{"limit":18446744073709551615}`); err != nil {
		t.Error(err)
	}
}

func TestDescribeDecodesStrictlyThenAsksThePlugin(t *testing.T) {
	exportWeighted()
	plugin, err := periodstest.New(`{"limit":100}`)
	if err != nil {
		t.Fatal(err)
	}
	for record, reason := range map[string]string{
		"{\"id\":\"\xff\"}": "event is not UTF-8",
		`{"id":"a",}`:       "event is not valid JSON",
		strings.Repeat("[", 129) + strings.Repeat("]", 129): "event is not valid JSON",
		`{"id":"a","ms":"soon"}`:                            "field `ms` must be of type int64",
		`{"id":"a","customer":""}`:                          "a call has a customer",
	} {
		if _, err := plugin.Describe(record); err == nil || err.Error() != reason {
			t.Errorf("%q: %v, want %s", record, err, reason)
		}
	}
	facts, err := plugin.Describe(`{"id":"a","customer":"acme","ms":-1,"weight":18446744073709551615}`)
	want := periods.Facts[[]byte]{ID: "a", Time: periods.UnixMillis(-1), Key: []periods.Field{{Name: "customer", Value: "acme"}}, Customer: "acme", Addend: []byte("18446744073709551615")}
	if err != nil || !reflect.DeepEqual(facts, want) {
		t.Fatalf("%+v %v", facts, err)
	}
}

func TestAddFoldsInOrderAndRefusesTheFirstAdditionItMust(t *testing.T) {
	exportWeighted()
	plugin, err := periodstest.New(`{"limit":100}`)
	if err != nil {
		t.Fatal(err)
	}
	addends := [][]byte{[]byte("5"), []byte("7"), []byte("500"), []byte(`"x"`)}
	folded, err := periods.Add([][]byte{[]byte(`{"total":1,"calls":1}`), nil}, addends, []periods.Addition{
		{Period: 1, Addend: 0}, {Period: 0, Addend: 1}, {Period: 1, Addend: 1},
	})
	if err != nil || string(folded[0]) != `{"total":8,"calls":2}` || string(folded[1]) != `{"total":12,"calls":2}` {
		t.Fatalf("%s %v", folded, err)
	}
	if got := periods.Value(folded[1]); got != 12 {
		t.Errorf("value %d", got)
	}
	if logs := plugin.Logs(); len(logs) != 3 || logs[0] != "debug: adding 5" {
		t.Errorf("logs %q", logs)
	}
	refusals := []struct {
		states    [][]byte
		additions []periods.Addition
		index     uint32
		reason    string
	}{
		{[][]byte{nil}, []periods.Addition{{Addend: 0}, {Addend: 2}, {Addend: 4}}, 2, "the addition names addend 4, of 4"},
		{[][]byte{nil}, []periods.Addition{{Addend: 0}, {Period: 1, Addend: 0}}, 1, "the addition names period 1, of 1"},
		{[][]byte{nil}, []periods.Addition{{Addend: 0}, {Addend: 2}, {Addend: 1}}, 1, "weight 500 is over 100"},
		{[][]byte{nil}, []periods.Addition{{Addend: 3}}, 0, "the event's addend is not the JSON this plugin makes: "},
		{[][]byte{[]byte("{")}, []periods.Addition{{Addend: 0}}, 0, "a period's state does not decode: "},
		{[][]byte{nil, nil}, []periods.Addition{{Addend: 0}}, 0, "period 1 has neither a state nor an addition"},
	}
	for _, c := range refusals {
		_, err := periods.Add(c.states, addends, c.additions)
		refusal, ok := err.(*periods.Refusal)
		if !ok || refusal.Addition != c.index || !strings.HasPrefix(refusal.Reason, c.reason) {
			t.Errorf("%+v: %#v", c.additions, err)
		}
	}
}

// Tally is a plugin whose types read and write their own JSON.
type Tally struct{}

type Count uint64

func (count *Count) ParseJSON(data []byte) error {
	value, err := strconv.ParseUint(string(data), 10, 64)
	*count = Count(value)
	return err
}

func (count *Count) AppendJSON(out []byte) []byte { return strconv.AppendUint(out, uint64(*count), 10) }

// Ping decodes itself; its refusals are its own words.
type Ping struct{ at string }

func (ping *Ping) ParseJSON(data []byte) error {
	if len(data) == 0 {
		return errors.New("an empty ping")
	}
	ping.at = string(data)
	return nil
}

func (Tally) Describe(ping Ping) (periods.Facts[Count], error) {
	return periods.Facts[Count]{ID: ping.at, Time: periods.RFC3339(ping.at), Customer: "c", Addend: 1}, nil
}

func (Tally) Add(state *Count, _ periods.Instant, one Count) (Count, error) {
	if state == nil {
		return one, nil
	}
	return *state + one, nil
}

func (Tally) Value(state *Count) uint64 { return uint64(*state) }

func TestTypesMayReadAndWriteTheirOwnJSON(t *testing.T) {
	periods.Export(func(json.RawMessage) (Tally, error) { return Tally{}, nil })
	plugin, err := periodstest.New(`{}`)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := plugin.Describe(""); err == nil || err.Error() != "an empty ping" {
		t.Errorf("%v", err)
	}
	period := plugin.Period()
	if err := period.Add("2026-11-01T00:00:00Z", "2026-11-02T00:00:00+01:00"); err != nil {
		t.Fatal(err)
	}
	if period.State() != "2" || period.Value() != 2 {
		t.Errorf("%s", period.State())
	}
	if err := period.Add("2026-11-03T00:00:00Z", "not a time"); err == nil || period.State() != "2" {
		t.Errorf("a refused record leaves the period as it was: %v %s", err, period.State())
	}
}

func TestInstantsCompareBySecondsThenNanoseconds(t *testing.T) {
	a, b, c := periods.Instant{Seconds: -1, Nanoseconds: 999_999_999}, periods.Instant{Seconds: 0}, periods.Instant{Seconds: 0, Nanoseconds: 1}
	if a.Compare(b) != -1 || b.Compare(c) != -1 || c.Compare(a) != 1 || b.Compare(b) != 0 {
		t.Error("compare")
	}
	at, err := periodstest.Time(periods.UnixMillis(-1))
	if err != nil || at != (periods.Instant{Seconds: -1, Nanoseconds: 999_000_000}) {
		t.Errorf("%+v %v", at, err)
	}
}
