package tally

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"unicode/utf8"
)

// MaxDepth is the most nesting a decoded value may have (as serde_json's limit).
const MaxDepth = 128

// Kind is what a JSON value is.
type Kind uint8

// The kinds of JSON values.
const (
	Null Kind = iota
	False
	True
	Number
	String
	Array
	Object
)

// Value is one JSON value, decoded strictly by DecodeJSON.
type Value struct {
	Kind Kind
	// Text is a string's text (escapes resolved) or a number's source text.
	Text string
	// LoneSurrogate says a string held a lone surrogate escape ("\ud800",
	// kept as WTF-8; only with AllowLoneSurrogates).
	LoneSurrogate bool
	// Items are an array's items, or an object's values.
	Items []Value
	// Names are an object's member names, one per value.
	Names []string
}

// Get is the last value of member name, or nil when there is none (or v
// is not an object).
func (v *Value) Get(name string) *Value {
	if v == nil || v.Kind != Object {
		return nil
	}
	for i := len(v.Names) - 1; i >= 0; i-- {
		if v.Names[i] == name {
			return &v.Items[i]
		}
	}
	return nil
}

// Count is how many times an object gives member name.
func (v *Value) Count(name string) int {
	count := 0
	if v != nil && v.Kind == Object {
		for _, given := range v.Names {
			if given == name {
				count++
			}
		}
	}
	return count
}

// Uint64 is a number written as an integer without sign, fraction or
// exponent, when it is at most 2^64 - 1.
func (v *Value) Uint64() (uint64, bool) {
	if v == nil || v.Kind != Number || len(v.Text) == 0 || len(v.Text) > 20 {
		return 0, false
	}
	var value uint64
	for _, c := range []byte(v.Text) {
		if c < '0' || c > '9' {
			return 0, false
		}
		digit := uint64(c - '0')
		if value > (^uint64(0)-digit)/10 {
			return 0, false
		}
		value = value*10 + digit
	}
	return value, true
}

// doubleOverflow is 2^1024 - 2^970: the least number that rounds to infinity.
const doubleOverflow = "179769313486231580793728971405303415079934132710037826936173778980444968292764750946649017977587207096330286416692887910946555547851940402630657488671505820681908902000708383676273854845817711531764475730270069855571366959622842914819860834936475292719074168444365510704342711559699508093042880177904174497792"

// Finite says whether a number reads as a finite double (1e400 does not),
// decided exactly.
func (v *Value) Finite() bool {
	if v == nil || v.Kind != Number {
		return false
	}
	text := strings.TrimPrefix(v.Text, "-")
	mantissa, exponentText, _ := strings.Cut(strings.ToLower(text), "e")
	integer, fraction, _ := strings.Cut(mantissa, ".")
	all := integer + fraction
	digits := strings.TrimLeft(all, "0")
	if digits == "" {
		return true
	}
	power := int64(len(integer)-(len(all)-len(digits))) - 1
	exponent, negative := int64(0), strings.HasPrefix(exponentText, "-")
	for _, c := range strings.TrimLeft(exponentText, "+-") {
		if exponent < 100_000 {
			exponent = exponent*10 + int64(c-'0')
		}
	}
	if negative {
		exponent = -exponent
	}
	if power += exponent; power != 308 {
		return power < 308
	}
	for len(digits) < len(doubleOverflow) {
		digits += "0"
	}
	return digits < doubleOverflow
}

// DecodeOptions changes what DecodeJSON accepts.
type DecodeOptions struct {
	// AllowLoneSurrogates keeps strings with lone surrogate escapes.
	AllowLoneSurrogates bool
}

var (
	notUTF8 = &Reject{Reason: "event is not UTF-8"}
	notJSON = &Reject{Reason: "event is not valid JSON"}
)

// DecodeJSON decodes one JSON value as strictly as serde_json: UTF-8 only,
// RFC 8259 (no comments, trailing commas, leading zeros, NaN), at most
// MaxDepth levels. Numbers keep their source text. It refuses with the
// reasons the other SDKs give: "event is not UTF-8", "event is not valid JSON".
func DecodeJSON(data []byte, options DecodeOptions) (Value, error) {
	if !utf8.Valid(data) {
		return Value{}, notUTF8
	}
	p := parser{data: data, options: options}
	value, ok := p.value(0)
	p.space()
	if !ok || p.at != len(data) {
		return Value{}, notJSON
	}
	return value, nil
}

// DecodeJSONInto checks data with DecodeJSON, then decodes it into out
// with encoding/json (numbers into integers exactly). Note encoding/json
// matches field names case-insensitively.
func DecodeJSONInto(data []byte, out any) error {
	if _, err := DecodeJSON(data, DecodeOptions{}); err != nil {
		return err
	}
	decoder := json.NewDecoder(bytes.NewReader(data))
	if err := decoder.Decode(out); err != nil {
		var typeError *json.UnmarshalTypeError
		if errors.As(err, &typeError) && typeError.Field != "" {
			return Rejectf("field `%s` must be of type %s", typeError.Field, typeError.Type)
		}
		return &Reject{Reason: "event does not fit its type: " + err.Error()}
	}
	return nil
}

type parser struct {
	data    []byte
	at      int
	options DecodeOptions
}

func (p *parser) space() {
	for p.at < len(p.data) {
		switch p.data[p.at] {
		case ' ', '\t', '\n', '\r':
			p.at++
		default:
			return
		}
	}
}

func (p *parser) literal(word string, kind Kind) (Value, bool) {
	if !bytes.HasPrefix(p.data[p.at:], []byte(word)) {
		return Value{}, false
	}
	p.at += len(word)
	return Value{Kind: kind}, true
}

func (p *parser) value(depth int) (Value, bool) {
	p.space()
	if p.at >= len(p.data) {
		return Value{}, false
	}
	switch p.data[p.at] {
	case '{', '[':
		return p.container(depth + 1)
	case '"':
		p.at++
		return p.string()
	case 't':
		return p.literal("true", True)
	case 'f':
		return p.literal("false", False)
	case 'n':
		return p.literal("null", Null)
	default:
		return p.number()
	}
}

func (p *parser) digits() bool {
	start := p.at
	for p.at < len(p.data) && p.data[p.at] >= '0' && p.data[p.at] <= '9' {
		p.at++
	}
	return p.at > start
}

func (p *parser) number() (Value, bool) {
	start := p.at
	if p.at < len(p.data) && p.data[p.at] == '-' {
		p.at++
	}
	switch {
	case p.at < len(p.data) && p.data[p.at] == '0':
		p.at++
	case p.at < len(p.data) && p.data[p.at] >= '1' && p.data[p.at] <= '9':
		p.digits()
	default:
		return Value{}, false
	}
	if p.at < len(p.data) && p.data[p.at] == '.' {
		p.at++
		if !p.digits() {
			return Value{}, false
		}
	}
	if p.at < len(p.data) && (p.data[p.at] == 'e' || p.data[p.at] == 'E') {
		p.at++
		if p.at < len(p.data) && (p.data[p.at] == '+' || p.data[p.at] == '-') {
			p.at++
		}
		if !p.digits() {
			return Value{}, false
		}
	}
	return Value{Kind: Number, Text: string(p.data[start:p.at])}, true
}

func (p *parser) hex4() (rune, bool) {
	if len(p.data)-p.at < 4 {
		return 0, false
	}
	var value rune
	for _, c := range p.data[p.at : p.at+4] {
		switch {
		case c >= '0' && c <= '9':
			value = value*16 + rune(c-'0')
		case c >= 'a' && c <= 'f':
			value = value*16 + rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			value = value*16 + rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	p.at += 4
	return value, true
}

// string reads a string, p.at past its opening quote.
func (p *parser) string() (Value, bool) {
	start := p.at
	for p.at < len(p.data) && p.data[p.at] != '"' && p.data[p.at] != '\\' && p.data[p.at] >= 0x20 {
		p.at++
	}
	if p.at < len(p.data) && p.data[p.at] == '"' {
		p.at++
		return Value{Kind: String, Text: string(p.data[start : p.at-1])}, true
	}
	text := append([]byte(nil), p.data[start:p.at]...)
	lone := false
	for {
		if p.at >= len(p.data) || p.data[p.at] < 0x20 {
			return Value{}, false
		}
		c := p.data[p.at]
		p.at++
		if c == '"' {
			return Value{Kind: String, Text: string(text), LoneSurrogate: lone}, true
		}
		if c != '\\' {
			text = append(text, c)
			continue
		}
		if p.at >= len(p.data) {
			return Value{}, false
		}
		escape := p.data[p.at]
		p.at++
		switch escape {
		case '"', '\\', '/':
			text = append(text, escape)
		case 'b':
			text = append(text, '\b')
		case 'f':
			text = append(text, '\f')
		case 'n':
			text = append(text, '\n')
		case 'r':
			text = append(text, '\r')
		case 't':
			text = append(text, '\t')
		case 'u':
			unit, ok := p.hex4()
			if !ok {
				return Value{}, false
			}
			if unit >= 0xd800 && unit <= 0xdbff && len(p.data)-p.at >= 6 && p.data[p.at] == '\\' && p.data[p.at+1] == 'u' {
				back := p.at
				p.at += 2
				low, ok := p.hex4()
				if !ok {
					return Value{}, false
				}
				if low >= 0xdc00 && low <= 0xdfff {
					text = utf8.AppendRune(text, 0x10000+(unit-0xd800)<<10+(low-0xdc00))
					continue
				}
				p.at = back
			}
			if unit >= 0xd800 && unit <= 0xdfff {
				if !p.options.AllowLoneSurrogates {
					return Value{}, false
				}
				lone = true
				// WTF-8: the surrogate's three bytes (utf8 would write U+FFFD).
				text = append(text, byte(0xe0|unit>>12), byte(0x80|(unit>>6)&0x3f), byte(0x80|unit&0x3f))
				continue
			}
			text = utf8.AppendRune(text, unit)
		default:
			return Value{}, false
		}
	}
}

func (p *parser) container(depth int) (Value, bool) {
	if depth > MaxDepth {
		return Value{}, false
	}
	object := p.data[p.at] == '{'
	p.at++
	out := Value{Kind: Array}
	closer := byte(']')
	if object {
		out.Kind, closer = Object, '}'
	}
	p.space()
	if p.at < len(p.data) && p.data[p.at] == closer {
		p.at++
		return out, true
	}
	for {
		if object {
			p.space()
			if p.at >= len(p.data) || p.data[p.at] != '"' {
				return Value{}, false
			}
			p.at++
			name, ok := p.string()
			if !ok {
				return Value{}, false
			}
			p.space()
			if p.at >= len(p.data) || p.data[p.at] != ':' {
				return Value{}, false
			}
			p.at++
			out.Names = append(out.Names, name.Text)
		}
		item, ok := p.value(depth)
		if !ok {
			return Value{}, false
		}
		out.Items = append(out.Items, item)
		p.space()
		if p.at < len(p.data) && p.data[p.at] == ',' {
			p.at++
			continue
		}
		if p.at < len(p.data) && p.data[p.at] == closer {
			p.at++
			return out, true
		}
		return Value{}, false
	}
}

// EncodeJSON writes value as serde_json writes it: no spaces, non-ASCII
// as is, only `"`, `\` and control characters escaped; struct fields in
// their order, integers exact. (encoding/json also escapes <, >, &,
// U+2028 and U+2029; those are undone. Floats are written as encoding/json
// writes them: 1e+21 where serde_json writes 1e21.)
func EncodeJSON(value any) ([]byte, error) {
	// The common keys and states need no reflection.
	switch value := value.(type) {
	case JSONAppender:
		return value.AppendJSON(nil), nil
	case string:
		return AppendJSONString(nil, value), nil
	case uint64:
		return strconv.AppendUint(nil, value, 10), nil
	case int64:
		return strconv.AppendInt(nil, value, 10), nil
	case int:
		return strconv.AppendInt(nil, int64(value), 10), nil
	}
	var out bytes.Buffer
	encoder := json.NewEncoder(&out)
	encoder.SetEscapeHTML(false)
	if err := encoder.Encode(value); err != nil {
		return nil, err
	}
	encoded := bytes.TrimSuffix(out.Bytes(), []byte("\n"))
	if !bytes.Contains(encoded, []byte(`\u202`)) {
		return encoded, nil
	}
	// Undo \u2028 and \u2029 (an escaped backslash before them is kept).
	unescaped := make([]byte, 0, len(encoded))
	for i := 0; i < len(encoded); i++ {
		if encoded[i] == '\\' && i+1 < len(encoded) {
			if bytes.HasPrefix(encoded[i:], []byte(`\u2028`)) || bytes.HasPrefix(encoded[i:], []byte(`\u2029`)) {
				unescaped = utf8.AppendRune(unescaped, rune(0x2028+int(encoded[i+5]-'8')))
				i += 5
				continue
			}
			unescaped = append(unescaped, encoded[i], encoded[i+1])
			i++
			continue
		}
		unescaped = append(unescaped, encoded[i])
	}
	return unescaped, nil
}

// JSONAppender is a type that writes its own JSON (as serde_json would
// write it): EncodeJSON then skips encoding/json's reflection, which is
// most of a Go plugin's time per event.
type JSONAppender interface {
	AppendJSON(out []byte) []byte
}

// AppendJSONString appends text as a JSON string, escaped as serde_json
// escapes it.
func AppendJSONString(out []byte, text string) []byte {
	const hex = "0123456789abcdef"
	out = append(out, '"')
	plain := 0
	for i := 0; i < len(text); i++ {
		c := text[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		out = append(out, text[plain:i]...)
		switch c {
		case '"', '\\':
			out = append(out, '\\', c)
		case '\b':
			out = append(out, '\\', 'b')
		case '\f':
			out = append(out, '\\', 'f')
		case '\n':
			out = append(out, '\\', 'n')
		case '\r':
			out = append(out, '\\', 'r')
		case '\t':
			out = append(out, '\\', 't')
		default:
			out = append(out, '\\', 'u', '0', '0', hex[c>>4], hex[c&15])
		}
		plain = i + 1
	}
	return append(append(out, text[plain:]...), '"')
}
