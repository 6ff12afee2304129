package tally

import (
	"bytes"
	"unicode/utf8"
)

// JSONParser is a type that reads its own JSON (the inverse of
// JSONAppender): the period SDK (tally/periods) then skips encoding/json's
// reflection for it. ParseJSON's error is the reason a record is refused.
type JSONParser interface {
	ParseJSON(data []byte) error
}

// Member is one member of a JSON object as ScanObject finds it: its name,
// escapes resolved, and its value as written. Both alias the scanned data
// unless the name has escapes.
type Member struct {
	// Name is the member's name, escapes resolved (a lone surrogate escape
	// as WTF-8).
	Name []byte
	// NameLoneSurrogate says the name held a lone surrogate escape.
	NameLoneSurrogate bool
	// Value is the member's value as written, from its first byte to its last.
	Value []byte
	// At is where Value starts in the scanned data.
	At int
}

// ScanObject checks data in one pass, as DecodeJSON with
// AllowLoneSurrogates does (UTF-8, then RFC 8259 and at most MaxDepth
// levels: "event is not UTF-8", "event is not valid JSON"), without
// building values. When data is an object, its members are appended to
// members in order, duplicates kept. kind is data's kind.
func ScanObject(data []byte, members []Member) (kind Kind, out []Member, err error) {
	if !utf8.Valid(data) {
		return Null, members, notUTF8
	}
	s := scanner{data: data}
	s.space()
	if s.at < len(data) && data[s.at] == '{' {
		members, ok := s.object(members)
		s.space()
		if !ok || s.at != len(data) {
			return Null, members, notJSON
		}
		return Object, members, nil
	}
	kind, ok := s.value(0)
	s.space()
	if !ok || s.at != len(data) {
		return Null, members, notJSON
	}
	return kind, members, nil
}

// UnquoteJSON is the text of raw, a JSON string as written (quotes
// included, already checked, as ScanObject's values are): escapes
// resolved, a lone surrogate escape kept as WTF-8 and reported by lone.
func UnquoteJSON(raw []byte) (text string, lone bool) {
	inner := raw[1 : len(raw)-1]
	if bytes.IndexByte(inner, '\\') < 0 {
		return string(inner), false
	}
	out, lone := unescape(make([]byte, 0, len(inner)), inner)
	return string(out), lone
}

type scanner struct {
	data []byte
	at   int
}

func (s *scanner) space() {
	for s.at < len(s.data) {
		switch s.data[s.at] {
		case ' ', '\t', '\n', '\r':
			s.at++
		default:
			return
		}
	}
}

// object reads an object's members, s.at on its `{`.
func (s *scanner) object(members []Member) ([]Member, bool) {
	s.at++
	s.space()
	if s.at < len(s.data) && s.data[s.at] == '}' {
		s.at++
		return members, true
	}
	for {
		s.space()
		if s.at >= len(s.data) || s.data[s.at] != '"' {
			return members, false
		}
		s.at++
		start := s.at
		escaped, lone, ok := s.str()
		if !ok {
			return members, false
		}
		name := s.data[start : s.at-1]
		if escaped {
			name, _ = unescape(make([]byte, 0, len(name)), name)
		}
		s.space()
		if s.at >= len(s.data) || s.data[s.at] != ':' {
			return members, false
		}
		s.at++
		s.space()
		from := s.at
		if _, ok := s.value(1); !ok {
			return members, false
		}
		members = append(members, Member{Name: name, NameLoneSurrogate: lone, Value: s.data[from:s.at:s.at], At: from})
		s.space()
		if s.at < len(s.data) && s.data[s.at] == ',' {
			s.at++
			continue
		}
		if s.at < len(s.data) && s.data[s.at] == '}' {
			s.at++
			return members, true
		}
		return members, false
	}
}

// value checks one value at nesting depth (its container's).
func (s *scanner) value(depth int) (Kind, bool) {
	s.space()
	if s.at >= len(s.data) {
		return Null, false
	}
	switch c := s.data[s.at]; c {
	case '{', '[':
		if depth+1 > MaxDepth {
			return Null, false
		}
		closer, kind := byte(']'), Array
		if c == '{' {
			closer, kind = '}', Object
		}
		s.at++
		s.space()
		if s.at < len(s.data) && s.data[s.at] == closer {
			s.at++
			return kind, true
		}
		for {
			if kind == Object {
				s.space()
				if s.at >= len(s.data) || s.data[s.at] != '"' {
					return Null, false
				}
				s.at++
				if _, _, ok := s.str(); !ok {
					return Null, false
				}
				s.space()
				if s.at >= len(s.data) || s.data[s.at] != ':' {
					return Null, false
				}
				s.at++
			}
			if _, ok := s.value(depth + 1); !ok {
				return Null, false
			}
			s.space()
			if s.at < len(s.data) && s.data[s.at] == ',' {
				s.at++
				continue
			}
			if s.at < len(s.data) && s.data[s.at] == closer {
				s.at++
				return kind, true
			}
			return Null, false
		}
	case '"':
		s.at++
		_, _, ok := s.str()
		return String, ok
	case 't':
		return True, s.word("true")
	case 'f':
		return False, s.word("false")
	case 'n':
		return Null, s.word("null")
	default:
		return Number, s.number()
	}
}

func (s *scanner) word(word string) bool {
	if len(s.data)-s.at < len(word) || string(s.data[s.at:s.at+len(word)]) != word {
		return false
	}
	s.at += len(word)
	return true
}

func (s *scanner) digits() bool {
	start := s.at
	for s.at < len(s.data) && s.data[s.at] >= '0' && s.data[s.at] <= '9' {
		s.at++
	}
	return s.at > start
}

func (s *scanner) number() bool {
	if s.at < len(s.data) && s.data[s.at] == '-' {
		s.at++
	}
	switch {
	case s.at < len(s.data) && s.data[s.at] == '0':
		s.at++
	case s.at < len(s.data) && s.data[s.at] >= '1' && s.data[s.at] <= '9':
		s.digits()
	default:
		return false
	}
	if s.at < len(s.data) && s.data[s.at] == '.' {
		s.at++
		if !s.digits() {
			return false
		}
	}
	if s.at < len(s.data) && (s.data[s.at] == 'e' || s.data[s.at] == 'E') {
		s.at++
		if s.at < len(s.data) && (s.data[s.at] == '+' || s.data[s.at] == '-') {
			s.at++
		}
		if !s.digits() {
			return false
		}
	}
	return true
}

// str checks a string, s.at past its opening quote; it ends past the
// closing one. escaped: it has escapes; lone: a lone surrogate escape.
func (s *scanner) str() (escaped, lone, ok bool) {
	data := s.data
	for s.at < len(data) {
		c := data[s.at]
		switch {
		case c == '"':
			s.at++
			return escaped, lone, true
		case c < 0x20:
			return escaped, lone, false
		case c != '\\':
			s.at++
			continue
		}
		escaped = true
		if s.at+1 >= len(data) {
			return escaped, lone, false
		}
		s.at += 2
		switch data[s.at-1] {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		case 'u':
			unit, ok := hex4(data, s.at)
			if !ok {
				return escaped, lone, false
			}
			s.at += 4
			if unit >= 0xd800 && unit <= 0xdbff && len(data)-s.at >= 6 && data[s.at] == '\\' && data[s.at+1] == 'u' {
				low, ok := hex4(data, s.at+2)
				if !ok {
					return escaped, lone, false
				}
				if low >= 0xdc00 && low <= 0xdfff {
					s.at += 6
					continue
				}
			}
			if unit >= 0xd800 && unit <= 0xdfff {
				lone = true
			}
		default:
			return escaped, lone, false
		}
	}
	return escaped, lone, false
}

func hex4(data []byte, at int) (rune, bool) {
	if len(data)-at < 4 {
		return 0, false
	}
	var value rune
	for _, c := range data[at : at+4] {
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
	return value, true
}

// unescape appends the text of a checked string's inside to out.
func unescape(out, inner []byte) ([]byte, bool) {
	lone := false
	for i := 0; i < len(inner); i++ {
		c := inner[i]
		if c != '\\' {
			out = append(out, c)
			continue
		}
		i++
		switch inner[i] {
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			unit, _ := hex4(inner, i+1)
			i += 4
			if unit >= 0xd800 && unit <= 0xdbff && len(inner)-i > 6 && inner[i+1] == '\\' && inner[i+2] == 'u' {
				if low, _ := hex4(inner, i+3); low >= 0xdc00 && low <= 0xdfff {
					out = utf8.AppendRune(out, 0x10000+(unit-0xd800)<<10+(low-0xdc00))
					i += 6
					continue
				}
			}
			if unit >= 0xd800 && unit <= 0xdfff {
				// WTF-8: the surrogate's three bytes.
				lone = true
				out = append(out, byte(0xe0|unit>>12), byte(0x80|(unit>>6)&0x3f), byte(0x80|unit&0x3f))
				continue
			}
			out = utf8.AppendRune(out, unit)
		default: // `"`, `\`, `/`
			out = append(out, inner[i])
		}
	}
	return out, lone
}
