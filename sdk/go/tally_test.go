// The SDK under `go test`: its JSON decoder refuses what serde_json
// refuses and reads what it reads, its encoder writes what serde_json
// writes, and an aggregation reads once, writes once, keeps refused events
// out and returns rejections in event order.
package tally_test

import (
	"encoding/json"
	"math/big"
	"reflect"
	"strings"
	"testing"

	"tally"
	"tally/tallytest"
)

func TestWhatSerdeJSONRefusesIsRefused(t *testing.T) {
	refused := []string{"", " ", "{", "[1,]", `{"a":1,}`, "01", "+1", "1.", ".5", "1e", "NaN", "Infinity", "'a'", `"\x"`,
		`"\ud800"`, `["\udc00"]`, "\"a\tb\"", "[1] 2", "tru", "nul", "// c\n1", `{"a" 1}`, "{1:2}", `"\u12"`, "-", "[1 2]",
		"\ufeff1", strings.Repeat("[", 129) + strings.Repeat("]", 129)}
	for _, text := range refused {
		if _, err := tally.DecodeJSON([]byte(text), tally.DecodeOptions{}); err == nil || err.Error() != "event is not valid JSON" {
			t.Errorf("%q: %v", text, err)
		}
	}
	for _, text := range []string{"\xff", "\"\xed\xa0\x80\"", "\"\xc0\x80\"", "\"\xf4\x90\x80\x80\""} {
		if _, err := tally.DecodeJSON([]byte(text), tally.DecodeOptions{}); err == nil || err.Error() != "event is not UTF-8" {
			t.Errorf("%q: %v", text, err)
		}
	}
	read := []string{"0", "-0", "1.5e-3", "1E+2", "[]", "{}", " [ 1 , {\"a\" : null } ]\r\n\t", `"\ud834\udd1e"`, `"\u0000"`, `"\/"`, "1e400",
		strings.Repeat("[", 128) + strings.Repeat("]", 128)}
	for _, text := range read {
		if _, err := tally.DecodeJSON([]byte(text), tally.DecodeOptions{}); err != nil {
			t.Errorf("%q refused: %v", text, err)
		}
	}
	lone, err := tally.DecodeJSON([]byte(`"\ud800"`), tally.DecodeOptions{AllowLoneSurrogates: true})
	if err != nil || !lone.LoneSurrogate {
		t.Errorf("a lone surrogate allowed: %+v %v", lone, err)
	}
}

func TestDecodingAgreesWithEncodingJSON(t *testing.T) {
	text := `{"a":1,"b\u0061":"x\n\u00e9 \ud834\udd1e","a":18446744073709551615,"c":[true,false,null,-2.5e3],"d":{}}`
	value, err := tally.DecodeJSON([]byte(text), tally.DecodeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if n, ok := value.Get("a").Uint64(); !ok || n != 18446744073709551615 || value.Count("a") != 2 {
		t.Errorf("a: %v %v", n, ok)
	}
	var decoded map[string]any
	_ = json.Unmarshal([]byte(text), &decoded)
	if value.Get("ba").Text != decoded["ba"] || value.Get("c").Items[3].Text != "-2.5e3" || value.Get("missing") != nil {
		t.Errorf("%+v", value)
	}
}

func TestFiniteIsExactAtTheOverflow(t *testing.T) {
	least := new(big.Int).Sub(new(big.Int).Lsh(big.NewInt(1), 1024), new(big.Int).Lsh(big.NewInt(1), 970))
	below := new(big.Int).Sub(least, big.NewInt(1))
	for text, finite := range map[string]bool{
		"0": true, "1e-400": true, "1.7976931348623157e308": true, below.String(): true, "0.1e309": true,
		"1e309": false, "-1e400": false, least.String(): false, "0." + least.String() + "e309": false, "1.7976931348623159e308": false,
	} {
		if got := (&tally.Value{Kind: tally.Number, Text: text}).Finite(); got != finite {
			t.Errorf("%s: finite %v", text, got)
		}
	}
}

func TestEncodingMatchesSerdeJSON(t *testing.T) {
	type key struct {
		Name  string `json:"name"`
		Total uint64 `json:"total"`
	}
	got, err := tally.EncodeJSON(key{"tab\t <&> \u2028 \\u2028 \x01 \x7f é", 18446744073709551615})
	want := "{\"name\":\"tab\\t <&> \u2028 \\\\u2028 \\u0001 \x7f é\",\"total\":18446744073709551615}"
	if err != nil || string(got) != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
	for value, want := range map[any]string{"a\"b": `"a\"b"`, uint64(18446744073709551615): "18446744073709551615", int64(-5): "-5", 7: "7"} {
		if got, _ := tally.EncodeJSON(value); string(got) != want {
			t.Errorf("%v: %s", value, got)
		}
	}
}

type counted struct {
	Key string `json:"key"`
	N   int64  `json:"n"`
}

func init() {
	tally.Export(tally.Aggregate[counted, string, int64]{
		Output: "counts",
		Key:    func(event counted) (string, error) { return event.Key, nil },
		Apply: func(count int64, event counted) (int64, error) {
			if event.N < 0 {
				return 0, tally.Rejectf("n must not be negative")
			}
			if event.N == 13 {
				panic("a bug")
			}
			return count + event.N, nil
		},
		Emit: func(count int64) any { return count },
	})
}

func TestAnAggregationKeepsRefusedEventsOutAndRejectsInOrder(t *testing.T) {
	plugin := tallytest.New("counts")
	sent := plugin.Send(`{"key":"a","n":2}`, `{"key":"b","n":-1}`, "{", `{"key":"a","n":3}`, `{"key":"c","n":"x"}`)
	want := []tallytest.DeadLetter{{1, "n must not be negative"}, {2, "event is not valid JSON"}, {4, "field `n` must be of type int64"}}
	if !reflect.DeepEqual(sent.DeadLetters, want) {
		t.Errorf("dead letters %+v", sent.DeadLetters)
	}
	if len(sent.Outputs) != 2 || sent.Outputs[1].Value != "5" || *sent.Outputs[1].Key != `"a"` || sent.Outputs[1].Event != 3 {
		t.Errorf("outputs %+v", sent.Outputs)
	}
	if state := plugin.AllState(); !reflect.DeepEqual(state, [][2]string{{`"a"`, "5"}}) {
		t.Errorf("state %v", state)
	}
}

func TestABugDiscardsTheBatchAndPanics(t *testing.T) {
	plugin := tallytest.New("counts")
	plugin.Send(`{"key":"a","n":2}`)
	func() {
		defer func() {
			if recover() == nil {
				t.Error("no panic")
			}
		}()
		plugin.Send(`{"key":"a","n":5}`, `{"key":"a","n":13}`)
	}()
	if total, _ := plugin.State("a"); total != "2" {
		t.Errorf("state after a bug: %s", total)
	}
}
