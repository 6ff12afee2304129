package tally

import (
	"reflect"
	"strings"
	"testing"
)

// ScanObject accepts and refuses what DecodeJSON (lone surrogates allowed) does.
func TestScanObjectChecksAsDecodeJSONDoes(t *testing.T) {
	corpus := []string{
		`{}`, ` { "a" : 1 , "b":[true,false,null,{"c":"\u00e9\ud83d\ude00"}] } `, `[]`, `"x"`, `-0.5e+3`, `null`,
		`{"a":1,}`, `{"a" 1}`, `{,}`, `[1,]`, `01`, `1.`, `.5`, `-`, `1e`, `tru`, `"\x"`, "\"a\x01\"", `"\u12"`,
		`{"a":1} x`, `{"a":"\ud800"}`, `{"\udc00":1}`, `"\ud800\u0041"`, `"\ud800\uZZZZ"`, "{\"a\":\"\xff\"}", ``, ` `,
		strings.Repeat("[", 128) + strings.Repeat("]", 128), strings.Repeat("[", 129) + strings.Repeat("]", 129),
		`{"a":` + strings.Repeat("[", 127) + strings.Repeat("]", 127) + `}`, `{"a":` + strings.Repeat("[", 128) + strings.Repeat("]", 128) + `}`,
	}
	for _, text := range corpus {
		value, want := DecodeJSON([]byte(text), DecodeOptions{AllowLoneSurrogates: true})
		kind, _, got := ScanObject([]byte(text), nil)
		if (want == nil) != (got == nil) || (want != nil && want.Error() != got.Error()) || (want == nil && kind != value.Kind) {
			t.Errorf("%q: ScanObject %v %v, DecodeJSON %v %v", text, kind, got, value.Kind, want)
		}
	}
}

func TestScanObjectGivesMembersAsWritten(t *testing.T) {
	kind, members, err := ScanObject([]byte(`{"a": [ 1 ] ,"b\u0061":"x\"y", "a":2,"\ud800":{}}`), nil)
	if err != nil || kind != Object {
		t.Fatal(kind, err)
	}
	want := []Member{
		{Name: []byte("a"), Value: []byte("[ 1 ]"), At: 6},
		{Name: []byte("ba"), Value: []byte(`"x\"y"`), At: 23},
		{Name: []byte("a"), Value: []byte("2"), At: 35},
		{Name: []byte("\xed\xa0\x80"), NameLoneSurrogate: true, Value: []byte("{}"), At: 46},
	}
	if !reflect.DeepEqual(members, want) {
		t.Fatalf("%+v", members)
	}
}

func TestUnquoteJSONResolvesEscapes(t *testing.T) {
	for raw, want := range map[string]string{
		`"plain é"`:                "plain é",
		`"\"\\\/\b\f\n\r\t\u0001"`: "\"\\/\b\f\n\r\t\x01",
		`"Zo\u00eb \ud83d\ude00"`:  "Zoë 😀",
		`"\u2028\uffff"`:           "\u2028\uffff",
	} {
		if got, lone := UnquoteJSON([]byte(raw)); got != want || lone {
			t.Errorf("%s: %q %v", raw, got, lone)
		}
	}
	for raw, want := range map[string]string{`"\ud800"`: "\xed\xa0\x80", `"a\udfffb"`: "a\xed\xbf\xbfb", `"\ud800\u0041"`: "\xed\xa0\x80A"} {
		if got, lone := UnquoteJSON([]byte(raw)); got != want || !lone {
			t.Errorf("%s: %q %v", raw, got, lone)
		}
	}
}
