//! `tally plugin new <dir> --lang rust|python|js|ts|go|c [--periods]`: a
//! working plugin to start from (a per-key counter; with `--periods`, a
//! period plugin summing each customer's usage per calendar period), with a
//! test in the language's own runner. The files refer to the SDKs in the
//! Tally source tree this binary was built from.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

mod periods;

/// The languages `tally plugin new` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Lang {
    /// A Rust crate on `tally-sdk`, tested with `cargo test` (tally-testing).
    Rust,
    /// A Python project on the `tally` package, tested with pytest.
    Python,
    /// A JavaScript package on the `tally` module, tested with `node --test`.
    Js,
    /// JavaScript with TypeScript types checked in the editor (JSDoc
    /// against `tally.d.ts`); built as JavaScript.
    Ts,
    /// A Go module on the `tally` package, tested with `go test`.
    Go,
    /// C on `tally.h`, tested natively with `make test`.
    C,
}

/// The Tally source tree this binary was built from.
fn source_tree() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("host/ sits in the source tree")
        .to_path_buf()
}

/// Writes a new plugin into `dir` (which must not exist or be empty): a
/// period plugin when `periods` is set.
pub fn new_plugin(dir: &Path, lang: Lang, periods: bool) -> anyhow::Result<()> {
    if dir.exists()
        && std::fs::read_dir(dir)
            .with_context(|| format!("reading `{}`", dir.display()))?
            .next()
            .is_some()
    {
        bail!("`{}` is not empty; give a new directory", dir.display());
    }
    let name = dir.file_name().and_then(|name| name.to_str()).unwrap_or("plugin").to_string();
    if name.is_empty()
        || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        || name.starts_with(|c: char| c.is_ascii_digit())
    {
        bail!(
            "the plugin's directory name {name:?} is its package name: use letters, digits, `-` and `_`, not starting with a digit"
        );
    }
    let tree = source_tree();
    let files: Vec<(&str, String)> = match (lang, periods) {
        (Lang::Rust, false) => rust_files(&name, &tree),
        (Lang::Python, false) => python_files(&name, &tree),
        (Lang::Js | Lang::Ts, false) => js_files(&name, &tree, lang == Lang::Ts),
        (Lang::Go, false) => go_files(&name, &tree),
        (Lang::C, false) => c_files(&tree),
        (Lang::Rust, true) => periods::rust_files(&name, &tree),
        (Lang::Python, true) => periods::python_files(&name, &tree),
        (Lang::Js, true) => periods::js_files(&name, &tree),
        (Lang::Ts, true) => periods::ts_files(&name, &tree),
        (Lang::Go, true) => periods::go_files(&name, &tree),
        (Lang::C, true) => periods::c_files(&tree),
    };
    for (path, text) in files {
        let path = dir.join(path);
        std::fs::create_dir_all(path.parent().expect("files sit in a directory"))
            .with_context(|| format!("creating `{}`", dir.display()))?;
        std::fs::write(&path, text).with_context(|| format!("writing `{}`", path.display()))?;
    }
    let next = match lang {
        Lang::Rust => "cargo test",
        Lang::Python => {
            "python3 -m venv .venv && .venv/bin/pip install -r requirements-dev.txt && .venv/bin/pytest"
        }
        Lang::Js | Lang::Ts => "npm install && npm test",
        Lang::Go => "go test",
        Lang::C => "make test",
    };
    let language = match lang {
        Lang::Rust => "Rust",
        Lang::Python => "Python",
        Lang::Js => "JavaScript",
        Lang::Ts => "JavaScript (with TypeScript types)",
        Lang::Go => "Go",
        Lang::C => "C",
    };
    let kind = if periods { "period plugin" } else { "plugin" };
    println!(
        "new {language} {kind} `{name}` in {}: `cd {0} && {next}`, then `tally plugin build {0}`",
        dir.display()
    );
    if periods {
        println!(
            "its test runs the plugin through `tally run`: keep this `tally` on PATH (or set TALLY_BIN)"
        );
    }
    Ok(())
}

/// A plugin crate's `Cargo.toml`, on the SDK and test driver of `tree`.
fn rust_manifest(name: &str, tree: &Path) -> String {
    let sdk = tree.join("sdk/rust");
    let testing = tree.join("testing");
    format!(
        r#"[package]
name = "{name}"
version = "0.1.0"
edition = "2024"

[lib]
crate-type = ["cdylib", "rlib"]

[dependencies]
serde = {{ version = "1", features = ["derive"] }}
serde_json = "1"
tally-sdk = {{ path = {sdk:?} }}

[dev-dependencies]
tally-testing = {{ path = {testing:?} }}

# A workspace of its own, wherever it sits.
[workspace]
"#
    )
}

fn rust_files(name: &str, tree: &Path) -> Vec<(&'static str, String)> {
    vec![
        ("Cargo.toml", rust_manifest(name, tree)),
        (
            "src/lib.rs",
            r#"//! Counts events per `key`, and emits each key's new count to `counts`.

use serde::Deserialize;
use tally_sdk::{Aggregate, Reject};

/// One input event: `{"key":"a","n":2}`.
#[derive(Deserialize)]
pub struct Event {
    key: String,
    n: u64,
}

#[derive(Default)]
pub struct Counter;

impl Aggregate for Counter {
    type Event<'a> = Event;
    type Key = String;
    type State = u64;
    type Output = u64;
    const OUTPUT: &'static str = "counts";

    fn key(&self, event: &Event) -> Result<String, Reject> {
        Ok(event.key.clone())
    }

    fn apply(&self, _key: &String, count: &u64, event: Event) -> Result<u64, Reject> {
        count.checked_add(event.n).ok_or_else(|| Reject::new(format!("the count would overflow adding {}", event.n)))
    }

    fn emit(&self, _key: &String, count: &u64) -> Option<u64> {
        Some(*count)
    }
}

tally_sdk::export!(Counter);
"#
            .to_string(),
        ),
        (
            "tests/counter.rs",
            r##"//! The plugin built into a component and run by Tally's test driver.

#[test]
fn counts_add_up_and_bad_events_are_refused() {
    let mut plugin = tally_testing::PluginTest::build(env!("CARGO_MANIFEST_DIR"), &["counts"]).unwrap();
    let sent = plugin.send([r#"{"key":"a","n":2}"#, r#"{"key":"a","n":3}"#, "not json"]);
    assert_eq!(sent.dead_letters.len(), 1);
    assert_eq!(plugin.state::<u64>(&"a".to_string()), Some(5));
}
"##
            .to_string(),
        ),
    ]
}

fn python_files(name: &str, tree: &Path) -> Vec<(&'static str, String)> {
    let sdk = tree.join("sdk/python");
    vec![
        (
            "pyproject.toml",
            format!(
                r#"[project]
name = "{name}"
version = "0.1.0"
requires-python = ">=3.11"

# `tally plugin build` makes this module into a component.
[tool.tally]
module = "app"

# The SDK, from the Tally source tree (componentize-py builds in its own copy).
[tool.pytest.ini_options]
pythonpath = [{sdk:?}]
"#
            ),
        ),
        ("requirements-dev.txt", "componentize-py==0.25.1\npytest==8.3.5\n".to_string()),
        (
            "app.py",
            r#""""Counts events per `key`, and emits each key's new count to `counts`.

Input: {"key":"a","n":2}
"""

from tally import Reject, aggregate


def key(event: dict) -> str:
    if not isinstance(event.get("key"), str):
        raise Reject("key must be a string")
    return event["key"]


def apply(count: int, event: dict) -> int:
    n = event.get("n")
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise Reject("n must be a non-negative integer")
    return count + n


Aggregator = aggregate(output="counts", key=key, initial=lambda: 0, apply=apply, emit=lambda count: count)
"#
            .to_string(),
        ),
        (
            "test_app.py",
            r#""""The plugin under pytest, through Tally's test driver."""

import app
from tally.testing import DeadLetter, PluginTest


def test_counts_add_up_and_bad_events_are_refused():
    plugin = PluginTest(app.Aggregator, outputs=["counts"])
    sent = plugin.send(['{"key":"a","n":2}', '{"key":"a","n":3}', "not json"])
    assert sent.dead_letters == [DeadLetter(2, "event is not valid JSON")]
    assert [record.value for record in sent.outputs] == ["2", "5"]
    assert plugin.state("a") == 5
"#
            .to_string(),
        ),
    ]
}

/// A Go plugin module's `go.mod`, on the SDK of `tree`.
fn go_manifest(name: &str, tree: &Path) -> String {
    let sdk = tree.join("sdk/go");
    format!(
        r#"module {name}

go 1.25

require (
	go.bytecodealliance.org/pkg v0.4.0
	tally v0.0.0
)

// The SDK, from the Tally source tree (the build stages its own copy).
replace (
	go.bytecodealliance.org/pkg => {pkg}
	tally => {sdk}
)
"#,
        pkg = sdk.join("third_party/pkg").display(),
        sdk = sdk.display()
    )
}

fn go_files(name: &str, tree: &Path) -> Vec<(&'static str, String)> {
    vec![
        ("go.mod", go_manifest(name, tree)),
        (
            "counter.go",
            r#"// Counts events per `key`, and emits each key's new count to `counts`.
// Input: {"key":"a","n":2}
package main

import "tally"

// Event is one input event.
type Event struct {
	Key string `json:"key"`
	N   uint64 `json:"n"`
}

func init() {
	tally.Export(tally.Aggregate[Event, string, uint64]{
		Output: "counts",
		Key:    func(event Event) (string, error) { return event.Key, nil },
		Apply: func(count uint64, event Event) (uint64, error) {
			if count > ^uint64(0)-event.N {
				return 0, tally.Rejectf("the count would overflow adding %d", event.N)
			}
			return count + event.N, nil
		},
		Emit: func(count uint64) any { return count },
	})
}
"#
            .to_string(),
        ),
        (
            "counter_test.go",
            r#"// The plugin under `go test`, through Tally's test driver.
package main

import (
	"testing"

	"tally/tallytest"
)

func TestCountsAddUpAndBadEventsAreRefused(t *testing.T) {
	plugin := tallytest.New("counts")
	sent := plugin.Send(`{"key":"a","n":2}`, `{"key":"a","n":3}`, "not json")
	if len(sent.DeadLetters) != 1 || sent.DeadLetters[0].Offset != 2 || sent.DeadLetters[0].Reason != "event is not valid JSON" {
		t.Fatalf("dead letters %+v", sent.DeadLetters)
	}
	if len(sent.Outputs) != 2 || sent.Outputs[1].Value != "5" {
		t.Fatalf("outputs %+v", sent.Outputs)
	}
	if count, _ := plugin.State("a"); count != "5" {
		t.Fatalf("state %s", count)
	}
}
"#
            .to_string(),
        ),
    ]
}

fn c_files(tree: &Path) -> Vec<(&'static str, String)> {
    let sdk = tree.join("sdk/c");
    vec![
        (
            "Makefile",
            format!(
                r#"# `make test` runs the plugin's test natively against Tally's in-memory
# test host; `tally plugin build .` builds the component.
SDK ?= {}
CFLAGS ?= -std=c11 -O1 -g -Wall -Wextra -Werror -fsanitize=address,undefined
SOURCES := $(filter-out test_%.c,$(wildcard *.c))

test: test_counter
	./test_counter

test_counter: $(SOURCES) test_counter.c
	$(CC) $(CFLAGS) -I$(SDK) -I$(SDK)/bindings -I$(SDK)/testing -o $@ $(SOURCES) test_counter.c $(SDK)/tally.c $(SDK)/testing/host.c

.PHONY: test
"#,
                sdk.display()
            ),
        ),
        (
            "counter.c",
            r#"/* Counts events per `key`, and emits each key's new count to `counts`.
 * Input: {"key":"a","n":2} */
#include "tally.h"

typedef struct event {
    const tally_json *key;
    uint64_t n;
} event;

static bool decode(const uint8_t *value, size_t len, void *out, tally_text *why) {
    event *e = out;
    tally_json json;
    if (!tally_json_decode(value, len, 0, &json, why)) return false;
    e->key = tally_json_get(&json, "key");
    if (!tally_json_is_string(e->key)) return tally_reject(why, "key must be a string");
    if (!tally_json_u64(tally_json_get(&json, "n"), &e->n)) return tally_reject(why, "n must be a non-negative integer");
    return true;
}

static bool key(const void *in, tally_text *key, tally_text *why) {
    (void)why;
    const event *e = in;
    tally_text_json_string(key, e->key->text, e->key->len);
    return true;
}

static void initial(void *count) { *(uint64_t *)count = 0; }

static bool read_state(const tally_json *stored, void *count) { return tally_json_u64(stored, count); }

static void write_state(const void *count, tally_text *out) { tally_text_u64(out, *(const uint64_t *)count); }

static bool apply(void *state, const void *in, tally_text *why) {
    uint64_t *count = state, n = ((const event *)in)->n;
    if (*count > UINT64_MAX - n) return tally_reject(why, "the count would overflow");
    *count += n;
    return true;
}

static bool emit(const void *count, tally_text *out) {
    write_state(count, out);
    return true;
}

static const tally_aggregate counter = {
    .output = "counts",
    .event_size = sizeof(event),
    .state_size = sizeof(uint64_t),
    .decode = decode,
    .key = key,
    .initial = initial,
    .read_state = read_state,
    .write_state = write_state,
    .apply = apply,
    .emit = emit,
};

TALLY_EXPORT(counter)
"#
            .to_string(),
        ),
        (
            "test_counter.c",
            r#"/* The plugin under a plain C test, through Tally's test driver. */
#include "tally_testing.h"

int main(void) {
    static const char *const outputs[] = {"counts"};
    tally_test_start(outputs, 1);
    tally_sent sent = tally_test_send((const char *[]){"{\"key\":\"a\",\"n\":2}", "{\"key\":\"a\",\"n\":3}", "not json"}, 3);
    TALLY_CHECK(sent.dead_letter_count == 1 && sent.dead_letters[0].offset == 2);
    TALLY_CHECK_STR(sent.dead_letters[0].reason, "event is not valid JSON");
    TALLY_CHECK(sent.output_count == 2);
    TALLY_CHECK_STR(sent.outputs[1].value, "5");
    TALLY_CHECK_STR(tally_test_state("\"a\""), "5");
    return tally_test_failures() ? 1 : 0;
}
"#
            .to_string(),
        ),
        (".gitignore", "test_counter\n".to_string()),
    ]
}

fn js_files(name: &str, tree: &Path, typed: bool) -> Vec<(&'static str, String)> {
    let sdk = tree.join("sdk/js");
    let types = if typed {
        "\n/** @typedef {{ key: string, n: bigint }} Event */\n\n/** @type {import(\"tally\").AggregateSpec<Event, string, bigint>} */\nconst counter = {\n"
    } else {
        "\nconst counter = {\n"
    };
    vec![
        (
            "package.json",
            format!(
                r#"{{
  "name": "{name}",
  "version": "0.1.0",
  "private": true,
  "type": "module",
  "main": "index.js",
  "scripts": {{ "test": "node --test" }},
  "dependencies": {{ "tally": "file:{}" }},
  "devDependencies": {{ "componentize-qjs": "0.4.5" }}
}}
"#,
                sdk.display()
            ),
        ),
        (
            "index.js",
            format!(
                r#"// Counts events per `key`, and emits each key's new count to `counts`.
// Input: {{"key":"a","n":2}}
import {{ aggregate, Reject }} from "tally";
{types}  output: "counts",
  key: (event) => {{
    if (typeof event.key !== "string") throw new Reject("key must be a string");
    return event.key;
  }},
  initial: () => 0n,
  apply: (count, event) => {{
    if (typeof event.n !== "bigint" || event.n < 0n) throw new Reject("n must be a non-negative integer");
    return count + event.n;
  }},
  emit: (count) => count,
}};

export const aggregator = aggregate(counter);
"#
            ),
        ),
        (
            "index.test.js",
            r#"// The plugin under node's test runner, through Tally's test driver.
import { test } from "node:test";
import assert from "node:assert/strict";
import { PluginTest } from "tally/testing";

test("counts add up and bad events are refused", async () => {
  const plugin = await PluginTest.load(new URL("./index.js", import.meta.url), ["counts"]);
  const sent = plugin.send(['{"key":"a","n":2}', '{"key":"a","n":3}', "not json"]);
  assert.deepEqual(sent.deadLetters, [{ offset: 2, reason: "event is not valid JSON" }]);
  assert.deepEqual(sent.outputs.map((record) => record.value), ["2", "5"]);
  assert.equal(plugin.state("a"), 5);
});
"#
            .to_string(),
        ),
    ]
}
