package periodstest

// The host run: the plugin project built into a component and run by the
// real `tally` binary, so a test sees the FINAL and ADJUSTMENT records
// (and the dead letters) exactly as the host emits them (see the package
// documentation).

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// Run is a period job run by the `tally` binary in local mode, over one
// input file the test appends to: each Send is a later run of the same
// job, its state kept between runs.
type Run struct {
	t     *testing.T
	tally string
	dir   string // the job's directory, removed by t.Cleanup
	// How much of each output the earlier sends returned.
	periodsRead, deadLettersRead int
}

// Record is a FINAL or ADJUSTMENT record as the host writes it (the
// `value` of an output line of the job's `periods` output).
type Record struct {
	// "final" or "adjustment".
	Type string
	// The aggregation key's `customer` field ("" when the key has none).
	Customer string
	// The period's label ("2026-11", or "2026-11-03" for a daily calendar)
	// and its start and end, UTC instants in RFC 3339.
	Period, Start, End string
	// The period's value now.
	Value uint64
	// An ADJUSTMENT's previous value, and Value − Previous (0 on a FINAL).
	// A value can fall (a `latest` meter): Delta is then the difference
	// modulo 2^64, so Previous + Delta == Value always holds in uint64
	// arithmetic and int64(Delta) reads it when it fits; Fields["delta"]
	// holds the exact number as written.
	Previous, Delta uint64
	// 1 for the FINAL, then one more per ADJUSTMENT.
	Version uint64
	// The whole record: every field the host wrote (`metric`,
	// `time_zone`, `tzdata`, … beside the ones above), numbers as
	// json.Number (exact).
	Fields map[string]any
}

// DeadLetter is one input line the host dead-lettered: its offset in the
// input (the line's index, from 0, counting every line sent so far) and
// the reason (`malformed: …`, `refused: …`, `duplicate: …`, `future: …`…).
type DeadLetter struct {
	Offset uint64
	Reason string
}

// Sent is what one Send added to the job's outputs.
type Sent struct {
	Records     []Record
	DeadLetters []DeadLetter
}

// NewRun builds the period plugin project in dir (`tally plugin build`,
// once) and prepares a local job around it, in a temporary directory that
// t.Cleanup removes: periods is the job's `[periods]` table and
// pluginConfig its `[plugin_config]`, as TOML text (without the headers).
// The `tally` binary is $TALLY_BIN, else `tally` on PATH. A setup error
// fails the test.
//
// The host reads the wall clock as each line's arrival: an event time
// more than `max_future` (default 5m) past it is dead-lettered `future:`.
// A test with fixed dates can give `max_future = "36500d"` in periods.
func NewRun(t *testing.T, dir, periods, pluginConfig string) *Run {
	t.Helper()
	tally, err := tallyBinary()
	if err != nil {
		t.Fatal(err)
	}
	project, err := filepath.Abs(dir)
	if err != nil {
		t.Fatal(err)
	}
	job := t.TempDir()
	run := &Run{t: t, tally: tally, dir: job}
	if _, err := run.tallyCommand(project, "plugin", "build", project, "--out", filepath.Join(job, "plugin.wasm")); err != nil {
		t.Fatalf("building the plugin in %s: %v", project, err)
	}
	toml := "name = \"test\"\n" +
		"plugin = \"plugin.wasm\"\n" +
		"outputs = [\"periods\"]\n" +
		"[local]\n" +
		"inputs = [\"events.ndjson\"]\n" +
		"output_dir = \"out\"\n" +
		"state_dir = \"state\"\n" +
		"[periods]\n" + strings.TrimSpace(periods) + "\n" +
		"[plugin_config]\n" + strings.TrimSpace(pluginConfig) + "\n"
	if err := os.WriteFile(filepath.Join(job, "job.toml"), []byte(toml), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(job, "events.ndjson"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	return run
}

// tallyBinary is $TALLY_BIN (a path, made absolute, or a name looked up on
// PATH), else `tally` on PATH.
func tallyBinary() (string, error) {
	if bin := os.Getenv("TALLY_BIN"); bin != "" {
		if !strings.ContainsRune(bin, filepath.Separator) {
			found, err := exec.LookPath(bin)
			if err != nil {
				return "", fmt.Errorf("periodstest: TALLY_BIN is %q, which is not on PATH: %w", bin, err)
			}
			bin = found
		}
		return filepath.Abs(bin)
	}
	if bin, err := exec.LookPath("tally"); err == nil {
		return bin, nil
	}
	return "", errors.New("periodstest: no `tally` binary: set TALLY_BIN to its path, or put `tally` on PATH " +
		"(build it with `cargo install --path host` in the Tally tree)")
}

// tallyCommand runs tally with args in dir: its stdout, or an error
// naming its stderr.
func (run *Run) tallyCommand(dir string, args ...string) ([]byte, error) {
	cmd := exec.Command(run.tally, args...)
	cmd.Dir = dir
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("`%s %s` failed (%v): %s", run.tally, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}

// Send appends lines (one NDJSON event each) to the job's input and runs
// the job (`tally run`): every input read to its end, the host closes
// what the watermark passed. It returns the records and dead letters this
// run added. A failed run fails the test, naming tally's stderr.
func (run *Run) Send(lines ...string) Sent {
	run.t.Helper()
	var input strings.Builder
	for _, line := range lines {
		if strings.ContainsAny(line, "\r\n") {
			run.t.Fatalf("periodstest: a line sent holds a line break: %q", line)
		}
		input.WriteString(line)
		input.WriteByte('\n')
	}
	file, err := os.OpenFile(filepath.Join(run.dir, "events.ndjson"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		run.t.Fatal(err)
	}
	_, err = file.WriteString(input.String())
	if closeErr := file.Close(); err == nil {
		err = closeErr
	}
	if err != nil {
		run.t.Fatal(err)
	}
	if _, err := run.tallyCommand(run.dir, "run", "job.toml"); err != nil {
		run.t.Fatal(err)
	}

	var sent Sent
	periodLines, err := run.newLines("periods.ndjson", &run.periodsRead)
	if err != nil {
		run.t.Fatal(err)
	}
	for _, line := range periodLines {
		record, err := parseRecord(line)
		if err != nil {
			run.t.Fatalf("periodstest: the period record %s: %v", line, err)
		}
		sent.Records = append(sent.Records, record)
	}
	deadLines, err := run.newLines("dead-letters.ndjson", &run.deadLettersRead)
	if err != nil {
		run.t.Fatal(err)
	}
	for _, line := range deadLines {
		deadLetter, err := parseDeadLetter(line)
		if err != nil {
			run.t.Fatalf("periodstest: the dead letter %s: %v", line, err)
		}
		sent.DeadLetters = append(sent.DeadLetters, deadLetter)
	}
	return sent
}

// newLines are the complete lines of out/<name> past *read bytes, which
// it moves past them (a missing file has none).
func (run *Run) newLines(name string, read *int) ([]string, error) {
	content, err := os.ReadFile(filepath.Join(run.dir, "out", name))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if len(content) < *read {
		return nil, fmt.Errorf("periodstest: out/%s shrank from %d to %d bytes", name, *read, len(content))
	}
	fresh := content[*read:]
	end := bytes.LastIndexByte(fresh, '\n') + 1
	*read += end
	var lines []string
	for _, line := range strings.Split(string(fresh[:end]), "\n") {
		if line != "" {
			lines = append(lines, line)
		}
	}
	return lines, nil
}

// decode reads one JSON object, numbers as json.Number.
func decode(text []byte) (map[string]any, error) {
	decoder := json.NewDecoder(bytes.NewReader(text))
	decoder.UseNumber()
	var object map[string]any
	if err := decoder.Decode(&object); err != nil {
		return nil, err
	}
	if object == nil {
		return nil, errors.New("not a JSON object")
	}
	return object, nil
}

func parseRecord(line string) (Record, error) {
	outer, err := decode([]byte(line))
	if err != nil {
		return Record{}, err
	}
	fields, ok := outer["value"].(map[string]any)
	if !ok {
		return Record{}, errors.New("its value is not a JSON object")
	}
	record := Record{Fields: fields}
	for name, into := range map[string]*string{"type": &record.Type, "period": &record.Period, "start": &record.Start, "end": &record.End} {
		if *into, ok = fields[name].(string); !ok {
			return Record{}, fmt.Errorf("its %q is not a string", name)
		}
	}
	record.Customer, _ = fields["customer"].(string)
	for name, into := range map[string]*uint64{"value": &record.Value, "version": &record.Version} {
		if *into, err = unsigned(fields[name]); err != nil {
			return Record{}, fmt.Errorf("its %q: %w", name, err)
		}
	}
	if record.Type == "adjustment" {
		if record.Previous, err = unsigned(fields["previous"]); err != nil {
			return Record{}, fmt.Errorf("its \"previous\": %w", err)
		}
		number, _ := fields["delta"].(json.Number)
		magnitude, negative := strings.CutPrefix(number.String(), "-")
		delta, err := strconv.ParseUint(magnitude, 10, 64)
		if err != nil {
			return Record{}, fmt.Errorf("its \"delta\" %q is not an integer within ±(2^64 − 1)", number)
		}
		if negative {
			delta = -delta
		}
		if record.Previous+delta != record.Value {
			return Record{}, fmt.Errorf("its previous %d and delta %s do not make its value %d", record.Previous, number, record.Value)
		}
		record.Delta = delta
	}
	return record, nil
}

// unsigned is a JSON number that is an integer from 0 to 2^64 − 1.
func unsigned(value any) (uint64, error) {
	number, ok := value.(json.Number)
	if !ok {
		return 0, fmt.Errorf("%v is not a number", value)
	}
	parsed, err := strconv.ParseUint(number.String(), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s is not an integer from 0 to 2^64 − 1", number)
	}
	return parsed, nil
}

func parseDeadLetter(line string) (DeadLetter, error) {
	fields, err := decode([]byte(line))
	if err != nil {
		return DeadLetter{}, err
	}
	reason, ok := fields["reason"].(string)
	if !ok {
		return DeadLetter{}, errors.New("its \"reason\" is not a string")
	}
	source, _ := fields["source"].(map[string]any)
	offset, err := unsigned(source["offset"])
	if err != nil {
		return DeadLetter{}, fmt.Errorf("its source offset: %w", err)
	}
	return DeadLetter{Offset: offset, Reason: reason}, nil
}
