// Usage billing in Go: the running total of metered usage per customer,
// metric and billing period (the UTC calendar month of the event's
// timestamp). It computes what plugins/usage-billing (Rust) computes, byte
// for byte, with the same dead-letter reasons: the rules are in
// docs/billing.md, and tests/all/languages.rs holds them to it.
//
// Input: {"customer":"acme","metric":"api_calls","quantity":3,"ts":"2026-11-03T10:00:00Z"}
package main

import (
	"fmt"
	"regexp"
	"strconv"

	"tally"
)

// Usage is one decoded event: its four fields, as the JSON gave them.
type Usage struct{ customer, metric, quantity, ts *tally.Value }

// Key is a total's state key; its fields are written in this order.
type Key struct {
	Customer string `json:"customer"`
	Metric   string `json:"metric"`
	Period   string `json:"period"`
}

// AppendJSON writes the key as encoding/json would, without its reflection.
func (key Key) AppendJSON(out []byte) []byte {
	out = tally.AppendJSONString(append(out, `{"customer":`...), key.Customer)
	out = tally.AppendJSONString(append(out, `,"metric":`...), key.Metric)
	return append(tally.AppendJSONString(append(out, `,"period":`...), key.Period), '}')
}

var fields = [...]string{"customer", "metric", "quantity", "ts"}

func decode(value []byte) (Usage, error) {
	event, err := tally.DecodeJSON(value, tally.DecodeOptions{AllowLoneSurrogates: true})
	if err != nil {
		return Usage{}, err
	}
	// A number alone is read as a float, so one out of range is not JSON.
	if event.Kind == tally.Number && !event.Finite() {
		return Usage{}, tally.Rejectf("event is not valid JSON")
	}
	if event.Kind != tally.Object {
		return Usage{}, tally.Rejectf("event must be a JSON object")
	}
	for _, field := range fields {
		if given := event.Count(field); given > 1 {
			return Usage{}, tally.Rejectf("field `%s` is given twice", field)
		} else if given == 0 {
			return Usage{}, tally.Rejectf("field `%s` is missing", field)
		}
	}
	usage := Usage{event.Get("customer"), event.Get("metric"), event.Get("quantity"), event.Get("ts")}
	for i, field := range []*tally.Value{usage.customer, usage.metric, usage.quantity, usage.ts} {
		if fields[i] == "quantity" && field.Kind != tally.Number {
			return Usage{}, tally.Rejectf("field `quantity` must be a number")
		} else if fields[i] != "quantity" && field.Kind != tally.String {
			return Usage{}, tally.Rejectf("field `%s` must be a string", fields[i])
		}
		// A lone surrogate escape is kept by the decoder (other fields may
		// hold one and are ignored), but it is no text: the event is not JSON.
		if field.LoneSurrogate {
			return Usage{}, tally.Rejectf("event is not valid JSON")
		}
	}
	return usage, nil
}

func key(usage Usage) (Key, error) {
	period, err := billingPeriod(usage.ts.Text)
	return Key{usage.customer.Text, usage.metric.Text, period}, err
}

func apply(total uint64, usage Usage) (uint64, error) {
	quantity, ok := usage.quantity.Uint64()
	if !ok {
		return 0, tally.Rejectf("quantity must be a non-negative integer, got %s", usage.quantity.Text)
	}
	if total > ^uint64(0)-quantity {
		return 0, tally.Rejectf("total would overflow adding %d", quantity)
	}
	return total + quantity, nil
}

func init() {
	tally.Export(tally.Aggregate[Usage, Key, uint64]{
		Output: "totals",
		Decode: decode,
		Key:    key,
		Apply:  apply,
		Emit:   func(total uint64) any { return total },
	})
}

var timestamp = regexp.MustCompile(`^([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt]([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.[0-9]+)?(?:[Zz]|([+-])([0-9]{2}):([0-9]{2}))$`)

// billingPeriod is `YYYY-MM` of the UTC month of RFC 3339 timestamp ts.
func billingPeriod(ts string) (string, error) {
	refuse := func() (string, error) {
		return "", tally.Rejectf("ts must be an RFC 3339 timestamp like 2026-11-03T10:00:00Z, got %s", tally.AppendJSONString(nil, ts))
	}
	parts := timestamp.FindStringSubmatch(ts)
	if parts == nil {
		return refuse()
	}
	number := func(i int) int { n, _ := strconv.Atoi(parts[i]); return n }
	year, month, day, hour, minute, second := number(1), number(2), number(3), number(4), number(5), number(6)
	offset := 0
	if parts[7] != "" {
		if number(8) > 23 || number(9) > 59 {
			return refuse()
		}
		offset = number(8)*60 + number(9)
		if parts[7] == "-" {
			offset = -offset
		}
	}
	if month < 1 || month > 12 || day < 1 || day > daysIn(year, month) || hour > 23 || minute > 59 || second > 60 {
		return refuse()
	}
	minutes := hour*60 + minute - offset
	if minutes < 0 && day == 1 {
		if month--; month == 0 {
			year, month = year-1, 12
		}
	} else if minutes >= 24*60 && day == daysIn(year, month) {
		if month++; month == 13 {
			year, month = year+1, 1
		}
	}
	return fmt.Sprintf("%04d-%02d", min(max(year, 0), 9999), month), nil
}

func daysIn(year, month int) int {
	if month == 2 && year%4 == 0 && (year%100 != 0 || year%400 == 0) {
		return 29
	}
	return [...]int{31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31}[month-1]
}
