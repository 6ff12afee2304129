//! The period plugin `tally plugin new --periods` writes, in each language:
//! each customer's `quantity` summed per calendar period in the customer's
//! time zone (a `sum` meter), with a test that runs it through the real
//! host (`tally run`, found as `$TALLY_BIN` or on `PATH`) and sees a
//! FINAL, then an ADJUSTMENT for a late event, and a dead letter.
//!
//! Every language's test feeds the same events, [`EVENTS`] and
//! [`LATE_EVENT`], to a job whose `[periods]` is [`PERIODS`].

use std::path::Path;

/// The job's `[periods]` table in every test: acme bills in New York time.
const PERIODS: &str = r#"time_zones = { acme = "America/New_York" }"#;

/// The first send: two November events in New York (the second at 23:00 on
/// 30 November there, 04:00 on 1 December in UTC), one on 5 December that
/// passes November's end and grace (it closes), and a line that is not JSON.
const EVENTS: [&str; 4] = [
    r#"{"id":"e1","customer":"acme","quantity":2,"ts":"2026-11-03T10:00:00Z"}"#,
    r#"{"id":"e2","customer":"acme","quantity":3,"ts":"2026-11-30T23:00:00-05:00"}"#,
    r#"{"id":"e3","customer":"acme","quantity":1,"ts":"2026-12-05T00:00:00Z"}"#,
    "not json",
];

/// The second send: a late November event, within the horizon.
const LATE_EVENT: &str =
    r#"{"id":"e4","customer":"acme","quantity":4,"ts":"2026-11-20T12:00:00Z"}"#;

/// `text` with `{periods}`, `{events}` (each event as a string literal of
/// the target language, written by `literal`, joined by `join`) and
/// `{late}` filled in.
fn fill(text: &str, literal: impl Fn(&str) -> String, join: &str) -> String {
    let events: Vec<String> = EVENTS.iter().map(|event| literal(event)).collect();
    text.replace("{periods}", &literal(PERIODS))
        .replace("{events}", &events.join(join))
        .replace("{late}", &literal(LATE_EVENT))
}

/// A double-quoted string literal (Rust, JS, Go, C and Python all read
/// these escapes the same way).
fn quoted(text: &str) -> String {
    format!("\"{}\"", text.replace('\\', "\\\\").replace('"', "\\\""))
}

pub(super) fn rust_files(name: &str, tree: &Path) -> Vec<(&'static str, String)> {
    vec![
        ("Cargo.toml", super::rust_manifest(name, tree)),
        (
            "src/lib.rs",
            r#"//! Sums each customer's `quantity` per calendar period in the customer's
//! time zone: a period plugin (`tally:plugin@0.2.0`) for a job that
//! declares `[periods]`. The host owns event time, periods, de-duplication
//! by `id` and the FINAL and ADJUSTMENT records; this plugin says what an
//! event is and how it adds up.
//!
//! Input: {"id":"e1","customer":"acme","quantity":2,"ts":"2026-11-03T10:00:00Z"}

use serde::Deserialize;
use tally_sdk::{EventTime, Facts, Instant, Periods, Reject};

/// One usage event.
#[derive(Deserialize)]
pub struct Usage {
    id: String,
    customer: String,
    quantity: u64,
    ts: String,
}

/// The plugin: no configuration of its own.
pub struct Sum;

impl Periods for Sum {
    type Config = serde_json::Value;
    type Event<'a> = Usage;
    type Addend = u64;
    type State = u64;

    fn new(_config: serde_json::Value) -> Result<Self, String> {
        Ok(Sum)
    }

    fn describe(&self, usage: Usage) -> Result<Facts<u64>, Reject> {
        Ok(Facts {
            id: usage.id,
            time: EventTime::Rfc3339(usage.ts),
            key: vec![("customer".into(), usage.customer.clone())],
            customer: usage.customer,
            addend: usage.quantity,
        })
    }

    fn add(&self, sum: Option<u64>, _time: Instant, quantity: u64) -> Result<u64, Reject> {
        sum.unwrap_or(0)
            .checked_add(quantity)
            .ok_or_else(|| Reject::new("the period's sum would pass 2^64 - 1"))
    }

    fn value(&self, sum: &u64) -> u64 {
        *sum
    }
}

tally_sdk::export_periods!(Sum);
"#
            .to_string(),
        ),
        (
            "tests/sum.rs",
            fill(
                r##"//! The plugin built into a component and run by the real host.

use tally_testing::PeriodsRun;

#[test]
fn a_month_closes_with_its_sum_and_a_late_event_adjusts_it() {
    let mut run = PeriodsRun::build(env!("CARGO_MANIFEST_DIR"), {periods}, "").unwrap();
    let sent = run.send([{events}]).unwrap();
    assert_eq!(sent.records.len(), 1, "{:?}", sent.records);
    let november = &sent.records[0];
    assert_eq!((november.kind.as_str(), november.period.as_str(), november.value), ("final", "2026-11", 5));
    assert_eq!((november.start.as_str(), november.end.as_str()), ("2026-11-01T04:00:00Z", "2026-12-01T05:00:00Z"));
    assert_eq!(sent.dead_letters.len(), 1);
    assert!(sent.dead_letters[0].reason.starts_with("malformed:"), "{:?}", sent.dead_letters);

    let sent = run.send([{late}]).unwrap();
    let adjustment = &sent.records[0];
    assert_eq!((adjustment.kind.as_str(), adjustment.version, adjustment.value), ("adjustment", 2, 9));
    assert_eq!((adjustment.previous, adjustment.delta), (Some(5), Some(4)));
}
"##,
                quoted,
                ", ",
            ),
        ),
    ]
}

pub(super) fn python_files(name: &str, tree: &Path) -> Vec<(&'static str, String)> {
    let sdk = tree.join("sdk/python");
    vec![
        (
            "pyproject.toml",
            format!(
                r#"[project]
name = "{name}"
version = "0.1.0"
requires-python = ">=3.11"

# `tally plugin build` makes this module into a period plugin
# (tally:plugin@0.2.0) for a job that declares [periods].
[tool.tally]
module = "app"
world = "periods-plugin"

# The SDK, from the Tally source tree (componentize-py builds in its own copy).
[tool.pytest.ini_options]
pythonpath = [{sdk:?}]
"#
            ),
        ),
        ("requirements-dev.txt", "componentize-py==0.25.1\npytest==8.3.5\n".to_string()),
        (
            "app.py",
            r#""""Sums each customer's `quantity` per calendar period in the customer's
time zone: a period plugin for a job that declares `[periods]`. The host
owns event time, periods, de-duplication by `id` and the FINAL and
ADJUSTMENT records; this plugin says what an event is and how it adds up.

Input: {"id":"e1","customer":"acme","quantity":2,"ts":"2026-11-03T10:00:00Z"}
"""

from tally import Reject
from tally.periods import U64_MAX, Facts, Instant, PeriodPlugin, export


class Sum(PeriodPlugin):
    def describe(self, usage) -> Facts:
        if not isinstance(usage, dict) or not all(isinstance(usage.get(field), str) for field in ("id", "customer", "ts")):
            raise Reject("want an object with id, customer and ts strings")
        quantity = usage.get("quantity")
        if type(quantity) is not int or not 0 <= quantity <= U64_MAX:
            raise Reject("quantity must be an integer from 0 to 2^64 - 1")
        return Facts(id=usage["id"], time=usage["ts"], key=[("customer", usage["customer"])],
                     customer=usage["customer"], addend=quantity)

    def add(self, total: int | None, time: Instant, quantity: int) -> int:
        total = (total or 0) + quantity
        if total > U64_MAX:
            raise Reject("the period's sum would pass 2^64 - 1")
        return total

    def value(self, total: int) -> int:
        return total


Config, Periods = export(Sum)
"#
            .to_string(),
        ),
        (
            "test_app.py",
            fill(
                r#""""The plugin built into a component and run by the real host
(`tally` on PATH, or TALLY_BIN)."""

from pathlib import Path

from tally.testing import PeriodsRun


def test_a_month_closes_with_its_sum_and_a_late_event_adjusts_it():
    with PeriodsRun(Path(__file__).parent, periods={periods}) as run:
        sent = run.send([{events}])
        [november] = sent.records
        assert (november.type, november.period, november.value) == ("final", "2026-11", 5)
        assert (november.start, november.end) == ("2026-11-01T04:00:00Z", "2026-12-01T05:00:00Z")
        [malformed] = sent.dead_letters
        assert malformed.reason.startswith("malformed:")

        [adjustment] = run.send([{late}]).records
        assert (adjustment.type, adjustment.version, adjustment.value) == ("adjustment", 2, 9)
        assert (adjustment.previous, adjustment.delta) == (5, 4)
"#,
                quoted,
                ", ",
            ),
        ),
    ]
}

/// The JavaScript (`typed`: TypeScript) package around `main`.
fn js_package(name: &str, tree: &Path, main: &str, typed: bool) -> String {
    let sdk = tree.join("sdk/js");
    let (test, typescript) = match typed {
        true => (
            "tsc -p tsconfig.test.json && node --test dist/",
            ",\n    \"@types/node\": \"20.19.9\",\n    \"typescript\": \"5.9.3\"",
        ),
        false => ("node --test", ""),
    };
    format!(
        r#"{{
  "name": "{name}",
  "version": "0.1.0",
  "private": true,
  "type": "module",
  "main": "{main}",
  "tally": {{ "world": "periods-plugin" }},
  "scripts": {{ "test": "{test}" }},
  "dependencies": {{ "tally": "file:{}" }},
  "devDependencies": {{
    "componentize-qjs": "0.4.5"{typescript}
  }}
}}
"#,
        sdk.display()
    )
}

/// The period plugin's module, in JavaScript or (`typed`) TypeScript.
fn js_module(typed: bool) -> String {
    let (class, describe, add, value) = match typed {
        false => (
            "class Sum extends Periods {",
            "describe(event) {",
            "add(total, time, quantity) {",
            "value(total) {",
        ),
        true => (
            "class Sum extends Periods<bigint, bigint, unknown, JsonEvent<Record<string, unknown>>> {",
            "describe(event: JsonEvent<Record<string, unknown>>): FactsFields<bigint> {",
            "add(total: bigint | undefined, _time: Instant, quantity: bigint): bigint {",
            "value(total: bigint): bigint {",
        ),
    };
    let imports = match typed {
        false => "import { Periods, Reject, U64_MAX, exportPeriods } from \"tally/periods\";",
        true => {
            "import { Periods, Reject, U64_MAX, exportPeriods } from \"tally/periods\";\nimport type { FactsFields, Instant, JsonEvent } from \"tally/periods\";"
        }
    };
    format!(
        r#"// Sums each customer's `quantity` per calendar period in the customer's
// time zone: a period plugin for a job that declares `[periods]`. The host
// owns event time, periods, de-duplication by `id` and the FINAL and
// ADJUSTMENT records; this plugin says what an event is and how it adds up.
// Input: {{"id":"e1","customer":"acme","quantity":2,"ts":"2026-11-03T10:00:00Z"}}
{imports}

{class}
  {describe}
    if (!event.isObject()) throw new Reject("event must be a JSON object");
    const {{ id, customer, ts }} = event.value; // JSON.parse's values
    const quantity = event.integer("quantity"); // exact: a BigInt, as written
    if (typeof id !== "string" || typeof customer !== "string" || typeof ts !== "string") throw new Reject("want id, customer and ts strings");
    if (quantity === undefined || quantity < 0n || quantity > U64_MAX) throw new Reject("quantity must be an integer from 0 to 2^64 - 1");
    return {{ id, time: ts, key: [["customer", customer]], customer, addend: quantity }};
  }}
  {add}
    const sum = (total ?? 0n) + quantity;
    if (sum > U64_MAX) throw new Reject("the period's sum would pass 2^64 - 1");
    return sum;
  }}
  {value}
    return total;
  }}
}}

export const {{ config, periods }} = exportPeriods(Sum);
"#
    )
}

/// The test, the same in JavaScript and TypeScript: `package` is the
/// package's directory as the test module sees it.
fn js_test(package: &str) -> String {
    fill(
        &r#"// The plugin built into a component and run by the real host
// (`tally` on PATH, or TALLY_BIN).
import { test } from "node:test";
import assert from "node:assert/strict";
import { PeriodsRun } from "tally/testing";

test("a month closes with its sum and a late event adjusts it", async (t) => {
  const run = await PeriodsRun.start(PACKAGE, { periods: {periods} });
  t.after(() => run.close());
  let sent = run.send([{events}]);
  assert.equal(sent.records.length, 1);
  const [november] = sent.records;
  assert.deepEqual([november.type, november.period, november.value], ["final", "2026-11", 5n]);
  assert.deepEqual([november.start, november.end], ["2026-11-01T04:00:00Z", "2026-12-01T05:00:00Z"]);
  assert.equal(sent.deadLetters.length, 1);
  assert.match(sent.deadLetters[0].reason, /^malformed:/);

  sent = run.send([{late}]);
  const [adjustment] = sent.records;
  assert.deepEqual([adjustment.type, adjustment.version, adjustment.value], ["adjustment", 2, 9n]);
  assert.deepEqual([adjustment.previous, adjustment.delta], [5n, 4n]);
});
"#
        .replace("PACKAGE", package),
        quoted,
        ", ",
    )
}

pub(super) fn js_files(name: &str, tree: &Path) -> Vec<(&'static str, String)> {
    vec![
        ("package.json", js_package(name, tree, "index.js", false)),
        ("index.js", js_module(false)),
        ("index.test.js", js_test("new URL(\".\", import.meta.url)")),
    ]
}

pub(super) fn ts_files(name: &str, tree: &Path) -> Vec<(&'static str, String)> {
    let tsconfig = |files: &str, types: &str| {
        format!(
            r#"{{
  "compilerOptions": {{
    "target": "es2022",
    "lib": ["es2022"],
    "module": "nodenext",
    "moduleResolution": "nodenext",
    "strict": true,
    "noEmitOnError": true,
    "types": [{types}],
    "rootDir": ".",
    "outDir": "dist"
  }},
  "files": [{files}]
}}
"#
        )
    };
    vec![
        ("package.json", js_package(name, tree, "index.ts", true)),
        // The build compiles `main` alone; the tests compile with node's types.
        ("tsconfig.json", tsconfig("\"index.ts\"", "")),
        ("tsconfig.test.json", tsconfig("\"index.ts\", \"index.test.ts\"", "\"node\"")),
        ("index.ts", js_module(true)),
        ("index.test.ts", js_test("new URL(\"..\", import.meta.url)")),
        (".gitignore", "dist/\nnode_modules/\n".to_string()),
    ]
}

pub(super) fn go_files(name: &str, tree: &Path) -> Vec<(&'static str, String)> {
    vec![
        ("go.mod", super::go_manifest(name, tree)),
        (
            "sum.go",
            r#"// Sums each customer's `quantity` per calendar period in the customer's
// time zone: a period plugin for a job that declares `[periods]` (its main
// package imports tally/periods). The host owns event time, periods,
// de-duplication by `id` and the FINAL and ADJUSTMENT records; this plugin
// says what an event is and how it adds up.
// Input: {"id":"e1","customer":"acme","quantity":2,"ts":"2026-11-03T10:00:00Z"}
package main

import (
	"encoding/json"

	"tally"
	"tally/periods"
)

// Usage is an event: the SDK checks it strictly, then encoding/json decodes it.
type Usage struct {
	ID       string `json:"id"`
	Customer string `json:"customer"`
	Quantity uint64 `json:"quantity"`
	TS       string `json:"ts"`
}

// Sum is the plugin: no configuration of its own.
type Sum struct{}

func (Sum) Describe(usage Usage) (periods.Facts[uint64], error) {
	if usage.ID == "" || usage.Customer == "" || usage.TS == "" {
		return periods.Facts[uint64]{}, tally.Rejectf("want id, customer and ts strings")
	}
	return periods.Facts[uint64]{ID: usage.ID, Time: periods.RFC3339(usage.TS),
		Key: []periods.Field{{Name: "customer", Value: usage.Customer}}, Customer: usage.Customer, Addend: usage.Quantity}, nil
}

func (Sum) Add(total *uint64, _ periods.Instant, quantity uint64) (uint64, error) {
	if total == nil {
		return quantity, nil
	}
	if *total > ^uint64(0)-quantity {
		return 0, tally.Rejectf("the period's sum would pass 2^64 - 1")
	}
	return *total + quantity, nil
}

func (Sum) Value(total *uint64) uint64 { return *total }

func init() {
	periods.Export(func(json.RawMessage) (Sum, error) { return Sum{}, nil })
}
"#
            .to_string(),
        ),
        (
            "sum_test.go",
            fill(
                r#"// The plugin built into a component and run by the real host
// (`tally` on PATH, or TALLY_BIN).
package main

import (
	"strings"
	"testing"

	"tally/periods/periodstest"
)

func TestAMonthClosesWithItsSumAndALateEventAdjustsIt(t *testing.T) {
	run := periodstest.NewRun(t, ".", {periods}, "")
	sent := run.Send({events})
	if len(sent.Records) != 1 {
		t.Fatalf("records %+v", sent.Records)
	}
	november := sent.Records[0]
	if november.Type != "final" || november.Period != "2026-11" || november.Value != 5 {
		t.Fatalf("November %+v", november)
	}
	if november.Start != "2026-11-01T04:00:00Z" || november.End != "2026-12-01T05:00:00Z" {
		t.Fatalf("November's bounds %+v", november)
	}
	if len(sent.DeadLetters) != 1 || !strings.HasPrefix(sent.DeadLetters[0].Reason, "malformed:") {
		t.Fatalf("dead letters %+v", sent.DeadLetters)
	}

	sent = run.Send({late})
	if len(sent.Records) != 1 {
		t.Fatalf("records %+v", sent.Records)
	}
	adjustment := sent.Records[0]
	if adjustment.Type != "adjustment" || adjustment.Version != 2 || adjustment.Value != 9 || adjustment.Previous != 5 || adjustment.Delta != 4 {
		t.Fatalf("adjustment %+v", adjustment)
	}
}
"#,
                |text| format!("`{text}`"),
                ", ",
            ),
        ),
    ]
}

pub(super) fn c_files(tree: &Path) -> Vec<(&'static str, String)> {
    let sdk = tree.join("sdk/c");
    vec![
        (
            "Makefile",
            format!(
                r#"# `make test` runs the plugin through the real host (`tally plugin build`,
# `tally run`: `tally` is $TALLY_BIN, else on PATH), natively under the
# sanitizers; `tally plugin build .` builds the component.
SDK ?= {}
CFLAGS ?= -std=c11 -O1 -g -Wall -Wextra -Werror -fsanitize=address,undefined
SOURCES := $(filter-out test_%.c,$(wildcard *.c))

test: test_sum
	./test_sum

test_sum: $(SOURCES) test_sum.c
	$(CC) $(CFLAGS) -I. -I$(SDK) -I$(SDK)/bindings -I$(SDK)/testing -o $@ $(SOURCES) test_sum.c $(SDK)/tally_periods.c $(SDK)/testing/periods_host.c $(SDK)/testing/tally_periods_run.c

.PHONY: test
"#,
                sdk.display()
            ),
        ),
        (
            "sum.c",
            r#"/* Sums each customer's `quantity` per calendar period in the customer's
 * time zone: a period plugin for a job that declares `[periods]` (it
 * includes tally_periods.h). The host owns event time, periods,
 * de-duplication by `id` and the FINAL and ADJUSTMENT records; this plugin
 * says what an event is and how it adds up.
 * Input: {"id":"e1","customer":"acme","quantity":2,"ts":"2026-11-03T10:00:00Z"} */
#include "tally_periods.h"

typedef struct { uint64_t n; } total; /* the addend and the state */

static bool describe(const tally_json *event, tally_facts *facts, void *addend, tally_text *why) {
    const tally_json *id = tally_json_get(event, "id"), *customer = tally_json_get(event, "customer"),
                     *ts = tally_json_get(event, "ts"), *quantity = tally_json_get(event, "quantity");
    if (!tally_json_is_text(id) || !tally_json_is_text(customer) || !tally_json_is_text(ts))
        return tally_reject(why, "want id, customer and ts strings");
    if (!tally_json_u64(quantity, &((total *)addend)->n))
        return tally_reject(why, "quantity must be an integer from 0 to 2^64 - 1");
    facts->id = tally_str_of(id);
    facts->time = tally_time_rfc3339(tally_str_of(ts));
    tally_facts_key(facts, "customer", tally_str_of(customer));
    facts->customer = tally_str_of(customer);
    return true;
}

static bool add(void *state, bool first, tally_instant time, const void *addend, tally_text *why) {
    (void)first, (void)time; /* the state is zeroed when `first` */
    uint64_t *sum = &((total *)state)->n, n = ((const total *)addend)->n;
    if (*sum > UINT64_MAX - n) return tally_reject(why, "the period's sum would pass 2^64 - 1");
    *sum += n;
    return true;
}

static void write_n(const void *in, tally_text *out) { tally_text_u64(out, ((const total *)in)->n); }
static bool read_n(const tally_json *json, void *out) { return tally_json_u64(json, &((total *)out)->n); }
static uint64_t value(const void *state) { return ((const total *)state)->n; }

static const tally_periods sum = {
    .addend_size = sizeof(total), .state_size = sizeof(total), .describe = describe,
    .write_addend = write_n, .read_addend = read_n, .add = add,
    .read_state = read_n, .write_state = write_n, .value = value,
};
TALLY_EXPORT_PERIODS(sum)
"#
            .to_string(),
        ),
        (
            "test_sum.c",
            fill(
                r#"/* The plugin built into a component and run by the real host. */
#include <string.h>

#include "tally_periods_run.h"
#include "tally_periods_testing.h"

#define LINES(...) ((const char *const[]){__VA_ARGS__}), (sizeof((const char *const[]){__VA_ARGS__}) / sizeof(const char *))

int main(void) {
    tally_periods_run *run = tally_periods_run_start(".", {periods}, "");
    TALLY_CHECK(run != NULL);
    if (!run) return 1;
    tally_periods_sent sent = tally_periods_run_send(run, LINES({events}));
    TALLY_CHECK(sent.ok && sent.record_count == 1 && sent.dead_letter_count == 1);
    if (sent.record_count == 1) {
        TALLY_CHECK(sent.records[0].final && sent.records[0].value == 5);
        TALLY_CHECK_STR(sent.records[0].period, "2026-11");
        TALLY_CHECK_STR(sent.records[0].start, "2026-11-01T04:00:00Z");
        TALLY_CHECK_STR(sent.records[0].end, "2026-12-01T05:00:00Z");
    }
    if (sent.dead_letter_count == 1) TALLY_CHECK(strncmp(sent.dead_letters[0].reason, "malformed:", 10) == 0);
    tally_periods_sent_free(&sent);

    sent = tally_periods_run_send(run, LINES({late}));
    TALLY_CHECK(sent.ok && sent.record_count == 1);
    if (sent.record_count == 1) {
        const tally_periods_record *adjustment = &sent.records[0];
        TALLY_CHECK(!adjustment->final && adjustment->version == 2 && adjustment->value == 9);
        TALLY_CHECK(adjustment->previous == 5 && adjustment->delta == 4 && !adjustment->delta_negative);
    }
    tally_periods_sent_free(&sent);
    tally_periods_run_end(run);
    return tally_test_failures() ? 1 : 0;
}
"#,
                quoted,
                ",\n                           ",
            ),
        ),
        (".gitignore", "test_sum\n".to_string()),
    ]
}
