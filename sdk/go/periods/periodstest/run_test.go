package periodstest

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The period billing plugin of this tree: the host run's subject.
var billingPlugin = filepath.Join("..", "..", "..", "..", "plugins", "billing-periods-go")

func TestAHostRunShowsFinalsAdjustmentsAndDeadLettersAsTheHostWritesThem(t *testing.T) {
	// max_future: the dates are fixed, the host's clock is the machine's.
	run := NewRun(t, billingPlugin,
		`time_zones = { acme = "America/New_York", globex = "Australia/Lord_Howe" }
max_future = "36500d"`,
		`meters = { calls = "sum", gb = "latest" }`)

	sent := run.Send(
		`{"id":"g1","customer":"globex","metric":"calls","quantity":18446744073709551615,"ts":"2026-10-15T00:00:00Z"}`,
		`{"id":"a1","customer":"acme","metric":"calls","quantity":5,"ts":"2026-11-10T12:00:00Z"}`,
		`{"id":"a2","customer":"acme","metric":"calls","quantity":7,"ts":"2026-12-01T00:00:00Z"}`,
		`{"id":"a3","customer":"acme","metric":"gb","quantity":10,"ts":"2026-11-20T00:00:00Z"}`,
		`not json`,
		`{"id":"a1","customer":"acme","metric":"calls","quantity":5,"ts":"2026-11-10T12:00:00Z"}`,
		`{"id":"a4","customer":"acme","metric":"calls","quantity":1,"ts":"2026-12-03T00:00:00Z"}`,
	)
	if len(sent.Records) != 3 {
		t.Fatalf("records %+v", sent.Records)
	}
	// Lord Howe's October (its 30-minute DST began on 4 October) closes
	// first: it ends first.
	october := sent.Records[0]
	if october.Type != "final" || october.Customer != "globex" || october.Period != "2026-10" ||
		october.Start != "2026-09-30T13:30:00Z" || october.End != "2026-10-31T13:00:00Z" ||
		october.Value != 1<<64-1 || october.Version != 1 || october.Previous != 0 || october.Delta != 0 {
		t.Errorf("October %+v", october)
	}
	if october.Fields["time_zone"] != "Australia/Lord_Howe" || october.Fields["metric"] != "calls" ||
		october.Fields["value"] != json.Number("18446744073709551615") {
		t.Errorf("October's fields %v", october.Fields)
	}
	// New York's November: 721 hours (EDT ended on 1 November); its key
	// orders calls before gb.
	for i, want := range []struct {
		metric string
		value  uint64
	}{{"calls", 12}, {"gb", 10}} {
		november := sent.Records[1+i]
		if november.Type != "final" || november.Customer != "acme" || november.Period != "2026-11" ||
			november.Start != "2026-11-01T04:00:00Z" || november.End != "2026-12-01T05:00:00Z" ||
			november.Value != want.value || november.Version != 1 || november.Fields["metric"] != want.metric {
			t.Errorf("November %s: %+v", want.metric, november)
		}
	}
	wantDead := []DeadLetter{{4, "malformed: event is not valid JSON"}, {5, "duplicate: "}}
	if len(sent.DeadLetters) != 2 || sent.DeadLetters[0] != wantDead[0] || sent.DeadLetters[1].Offset != 5 ||
		!strings.HasPrefix(sent.DeadLetters[1].Reason, "duplicate:") {
		t.Errorf("dead letters %+v", sent.DeadLetters)
	}

	// A later run of the same job: only what it added. Late November
	// events adjust November; a later `latest` lowers the gb value.
	sent = run.Send(
		`{"id":"a5","customer":"acme","metric":"calls","quantity":3,"ts":"2026-11-20T00:00:00Z"}`,
		`{"id":"a6","customer":"acme","metric":"gb","quantity":4,"ts":"2026-11-29T00:00:00Z"}`,
	)
	if len(sent.DeadLetters) != 0 || len(sent.Records) != 2 {
		t.Fatalf("second send %+v", sent)
	}
	calls, gb := sent.Records[0], sent.Records[1]
	if calls.Type != "adjustment" || calls.Period != "2026-11" || calls.Value != 15 || calls.Previous != 12 ||
		calls.Delta != 3 || calls.Version != 2 || calls.Fields["metric"] != "calls" {
		t.Errorf("calls adjustment %+v", calls)
	}
	if gb.Type != "adjustment" || gb.Value != 4 || gb.Previous != 10 || int64(gb.Delta) != -6 ||
		gb.Previous+gb.Delta != gb.Value || gb.Version != 2 || gb.Fields["delta"] != json.Number("-6") {
		t.Errorf("gb adjustment %+v", gb)
	}

	// A send of nothing adds nothing; a too-old event is dead-lettered
	// with its offset counted over every line sent.
	if sent := run.Send(); len(sent.Records) != 0 || len(sent.DeadLetters) != 0 {
		t.Errorf("empty send %+v", sent)
	}
	sent = run.Send(
		`{"id":"a7","customer":"acme","metric":"calls","quantity":1,"ts":"2027-02-10T00:00:00Z"}`,
		`{"id":"a8","customer":"acme","metric":"calls","quantity":1,"ts":"2026-11-21T00:00:00Z"}`,
	)
	if len(sent.DeadLetters) != 1 || sent.DeadLetters[0].Offset != 10 || !strings.HasPrefix(sent.DeadLetters[0].Reason, "too_old:") {
		t.Errorf("too old %+v", sent.DeadLetters)
	}
	// December (calls 1) closes; November was purged (end plus 35 days).
	if len(sent.Records) != 1 || sent.Records[0].Period != "2026-12" || sent.Records[0].Value != 1 || sent.Records[0].Type != "final" {
		t.Errorf("December %+v", sent.Records)
	}
}

func TestARecordsNumbersAreExact(t *testing.T) {
	record, err := parseRecord(`{"key":{"customer":"c","period":"2026-11"},"value":{"type":"adjustment","customer":"c","period":"2026-11","time_zone":"UTC","start":"2026-11-01T00:00:00Z","end":"2026-12-01T00:00:00Z","value":0,"previous":18446744073709551615,"delta":-18446744073709551615,"version":4294967295,"tzdata":"2026f"}}`)
	if err != nil {
		t.Fatal(err)
	}
	if record.Value != 0 || record.Previous != 1<<64-1 || record.Delta != 1 || record.Version != 1<<32-1 ||
		record.Fields["delta"] != json.Number("-18446744073709551615") {
		t.Errorf("%+v", record)
	}
	record, err = parseRecord(`{"key":{},"value":{"type":"final","period":"2026-11-03","start":"a","end":"b","value":18446744073709551615,"version":1}}`)
	if err != nil || record.Customer != "" || record.Value != 1<<64-1 || record.Delta != 0 {
		t.Errorf("%+v %v", record, err)
	}
	for _, bad := range []string{
		`{"value":{"type":"final","period":"p","start":"a","end":"b","value":18446744073709551616,"version":1}}`,
		`{"value":{"type":"final","period":"p","start":"a","end":"b","value":-1,"version":1}}`,
		`{"value":{"type":"final","period":"p","start":"a","end":"b","value":1.5,"version":1}}`,
		`{"value":{"type":"adjustment","period":"p","start":"a","end":"b","value":3,"previous":1,"delta":1,"version":2}}`,
		`{"value":{"type":"final","start":"a","end":"b","value":1,"version":1}}`,
		`{"value":"x"}`,
		`[]`,
	} {
		if record, err := parseRecord(bad); err == nil {
			t.Errorf("%s read as %+v", bad, record)
		}
	}
	dead, err := parseDeadLetter(`{"reason":"refused: too big","record":"{}","source":{"partition":"events.ndjson","offset":18446744073709551615}}`)
	if err != nil || dead != (DeadLetter{1<<64 - 1, "refused: too big"}) {
		t.Errorf("%+v %v", dead, err)
	}
}

func TestWithoutTallyTheErrorSaysWhereToGetIt(t *testing.T) {
	t.Setenv("TALLY_BIN", "")
	t.Setenv("PATH", t.TempDir())
	_, err := tallyBinary()
	if err == nil || !strings.Contains(err.Error(), "TALLY_BIN") || !strings.Contains(err.Error(), "PATH") ||
		!strings.Contains(err.Error(), "cargo install --path host") {
		t.Errorf("%v", err)
	}
	t.Setenv("TALLY_BIN", "/some/tally")
	if bin, err := tallyBinary(); bin != "/some/tally" || err != nil {
		t.Errorf("%s %v", bin, err)
	}
	// A relative path is the test's, not the job directory's.
	t.Setenv("TALLY_BIN", filepath.Join("some", "tally"))
	if bin, err := tallyBinary(); !filepath.IsAbs(bin) || !strings.HasSuffix(bin, filepath.Join("periodstest", "some", "tally")) || err != nil {
		t.Errorf("%s %v", bin, err)
	}
	t.Setenv("TALLY_BIN", "tally-of-another-name")
	if _, err := tallyBinary(); err == nil || !strings.Contains(err.Error(), "tally-of-another-name") {
		t.Errorf("%v", err)
	}
}

func TestAFailedRunNamesTallysStderr(t *testing.T) {
	fake := filepath.Join(t.TempDir(), "tally")
	script := "#!/bin/sh\nif [ \"$1\" = plugin ]; then : > \"$5\"; exit 0; fi\necho 'error: the job is refused: no' >&2\nexit 3\n"
	if err := os.WriteFile(fake, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("TALLY_BIN", fake)
	run := NewRun(t, t.TempDir(), "", "")
	if _, err := run.tallyCommand(run.dir, "run", "job.toml"); err == nil || !strings.Contains(err.Error(), "the job is refused: no") {
		t.Errorf("%v", err)
	}
	job, err := os.ReadFile(filepath.Join(run.dir, "job.toml"))
	if err != nil || string(job) != "name = \"test\"\nplugin = \"plugin.wasm\"\noutputs = [\"periods\"]\n[local]\ninputs = [\"events.ndjson\"]\noutput_dir = \"out\"\nstate_dir = \"state\"\n[periods]\n\n[plugin_config]\n\n" {
		t.Errorf("%q %v", job, err)
	}
}
